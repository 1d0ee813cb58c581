// One CM connection: a non-blocking TCP socket carrying 256-byte CM MADs
// (design §6). Framing is trivial because every MAD has the same size. The
// link knows nothing of CM states; CmService drives it under its mutex, the
// progress thread reads it when epoll says so.
#pragma once

#include <cstdint>
#include <vector>

#include "rdmacm/cm_messages.h"

namespace uroce::rdmacm {

struct CmId;

class TcpLink {
 public:
  enum class Phase : uint8_t {
    kConnecting,  // active: TCP connect in progress
    kGreeting,    // active: connected, waiting for the listener's ClassPortInfo
    kOpen,        // MADs flow
  };

  // Takes ownership of fd (non-blocking) and registers it with epoll under token.
  TcpLink(int epoll_fd, int fd, uint64_t token, Phase phase);
  ~TcpLink();  // closes the socket (after a best-effort flush)
  TcpLink(const TcpLink&) = delete;
  TcpLink& operator=(const TcpLink&) = delete;

  int fd() const { return fd_; }
  uint64_t token() const { return token_; }
  Phase phase = Phase::kConnecting;
  bool dead = false;  // the peer is gone: sends are dropped

  CmId* owner = nullptr;     // the id this connection belongs to
  CmId* listener = nullptr;  // passive: the listener that accepted it (until a REQ names an id)
  uint32_t local_ip = 0;     // host order, known once connected
  uint32_t peer_ip = 0;
  PortInfoMessage peer_port_info;  // active: what the greeting said
  bool have_peer_port_info = false;

  // Queues one MAD and writes what the socket takes. Returns an errno (0 ok).
  [[nodiscard]] int send(const Mad& mad);
  // Writes queued bytes (EPOLLOUT). Returns an errno (0 ok).
  [[nodiscard]] int flush();
  // Reads what is available and appends every complete MAD to `out`.
  // Returns 0, an errno, or ECONNRESET when the peer closed the connection.
  [[nodiscard]] int receive(std::vector<Mad>* out);
  // Completion of a non-blocking connect: 0 or the connect error.
  [[nodiscard]] int connect_result();
  // Records the local and peer addresses (after connect or accept).
  void learn_addresses();

 private:
  void watch_output(bool on);
  int epoll_fd_;
  int fd_;
  uint64_t token_;
  bool watching_output_ = false;
  std::vector<uint8_t> in_;
  std::vector<uint8_t> out_;
};

}  // namespace uroce::rdmacm
