// One CM connection: a non-blocking TCP socket carrying 256-byte CM MADs
// (design §6), framed by MadFramer. The link knows nothing of CM states;
// CmService drives it under its mutex, the progress thread reads it when
// epoll says so.
//
// Whatever the peer does, a link holds little memory: input is read at most
// kReadBudget bytes per readiness event (the rest waits in the kernel's
// socket buffer, so a peer that floods is slowed down by TCP, not buffered
// here) and only an incomplete MAD is kept between reads; output is bounded
// by kMaxQueuedOutput (a peer that does not read its answers loses the link).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "rdmacm/cm_messages.h"
#include "rdmacm/mad_framer.h"
#include "rdmacm/sockaddr_util.h"

namespace uroce::rdmacm {

struct CmId;

class TcpLink {
 public:
  static constexpr size_t kReadBudget = 16 * kMadSize;
  static constexpr size_t kMaxQueuedOutput = 64 * kMadSize;

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

  CmId* owner = nullptr;          // the id this connection belongs to
  CmId* listener = nullptr;       // passive: the listener that accepted it (until a REQ names an id)
  transport::IpAddress local_ip;  // known once connected (an IPv4 peer of a dual-stack listener: IPv4)
  transport::IpAddress peer_ip;
  PortInfoMessage peer_port_info;  // active: what the greeting said
  bool have_peer_port_info = false;
  // Passive, until a REQ (or SIDR_REQ) names an id: when the link is closed
  // if none has come (CmService::expire_pending_links).
  std::chrono::steady_clock::time_point request_deadline{};

  // Queues one MAD and writes what the socket takes. Returns an errno (0 ok).
  // ENOBUFS if the peer has left more than kMaxQueuedOutput unread: the link
  // is then shut down, which the progress thread handles as a lost link.
  [[nodiscard]] int send(const Mad& mad);
  // Writes queued bytes (EPOLLOUT). Returns an errno (0 ok).
  [[nodiscard]] int flush();
  // Reads at most kReadBudget bytes and appends every MAD they complete to
  // `out` (level-triggered epoll calls again for the rest). Returns 0, EPROTO
  // after a malformed MAD (the MADs before it are in `out`), ECONNRESET when
  // the peer closed the connection, or another errno.
  [[nodiscard]] int receive(std::vector<DecodedMad>* out);
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
  MadFramer in_;
  std::vector<uint8_t> out_;
};

}  // namespace uroce::rdmacm
