// rsockets: stream sockets over RDMA (librdmacm's rsocket(7) API: rsocket,
// rconnect, rsend, rrecv, rpoll, ...), built on uroce's own rdma_cm and verbs
// ABI, so that rstream and TCP programs under librspreload run over uroce.
//
// One RSocket is one RC connection set up with rdma_cm, with its own event
// channel (whose fd is the rsocket's number, as in librdmacm: a real,
// process-unique descriptor), PD, CQ and completion channel.
//
// Data path: every message is a SEND_WITH_IMM of at most kBufBytes from one of
// kSendSlots registered send buffers into one of the peer's kRecvBufs data
// receive buffers (byte_len > 0). Flow control is by credits: a side may have
// at most kRecvBufs data messages that the peer has not yet consumed; the imm
// of every message carries the sender's count of data buffers it consumed
// (mod 2^32), and a receiver that consumed kCreditBatch buffers since it last
// said so, with no data to carry it, sends a zero-length SEND_WITH_IMM (a
// credit update). Credit updates land in the kCtrlRecvs extra receive buffers
// beyond the data ones; a side sends at most kCtrlRecvs of them per window of
// its peer's data, and each is consumed (and its buffer reposted) as soon as
// it is polled, so they never starve the data ones. Wire format (not
// librdmacm's): the private data of the CM REQ/REP is an RsHello.
//
// riomap(PROT_WRITE) registers a region for the peer to write and announces
// it with a SEND without imm carrying an IomapMsg (it lands in one of
// kMaxIoMaps more receive buffers); riowrite RDMA-WRITEs (through a send
// buffer) into a region the peer announced, ordered with the sends.
//
// Not implemented (ENOSYS with a message): datagram rsockets (SOCK_DGRAM).
// Non-blocking rconnect completes before it returns. riounmap does not tell
// the peer: a riowrite to the region before the peer hears of a new one
// replacing it fails the connection (as a write to a deregistered MR does).
//
// Locking: each RSocket has one mutex, held by every operation on it except
// while it waits in poll(2); the table of rsockets has its own (rsocket_api.cc).
#pragma once

#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

namespace uroce::rsockets {

inline constexpr uint32_t kBufBytes = 64 * 1024;  // one message at most
inline constexpr uint32_t kRecvBufs = 16;         // data receive buffers = credits
inline constexpr uint32_t kCtrlRecvs = 5;         // extra receive buffers: credit updates, FIN
inline constexpr uint32_t kSendSlots = 16;
inline constexpr uint32_t kMaxIoMaps = 4;  // riomap'ed regions a socket may have at once
inline constexpr uint32_t kCreditBatch = kRecvBufs / (kCtrlRecvs - 1);

// The CM REQ/REP private data (at most 56 bytes in a REQ).
struct RsHello {
  uint32_t magic;  // kHelloMagic
  uint32_t version;
  uint32_t recv_bufs;  // data buffers the sender of this hello posted
  uint32_t buf_bytes;
};
inline constexpr uint32_t kHelloMagic = 0x75527353;  // "uRsS"

// The announcement of a riomap'ed region.
struct IomapMsg {
  uint32_t magic;  // kIomapMagic
  uint32_t rkey;
  uint64_t offset;  // the riowrite offset of the region's first byte
  uint64_t addr;
  uint64_t len;
};
inline constexpr uint32_t kIomapMagic = 0x49326d4d;

// Copies `from` into a caller's (addr, *addrlen) as accept(2) and
// getsockname(2) do: truncated to *addrlen, which is set to the full length.
void copy_address(const sockaddr* from, sockaddr* addr, socklen_t* addrlen);

enum class RsState : uint8_t { kIdle, kListening, kConnected, kClosed, kError };

class RSocket {
 public:
  // A new unconnected socket (rsocket()); nullptr + errno on failure.
  static std::shared_ptr<RSocket> create();
  ~RSocket();
  RSocket(const RSocket&) = delete;
  RSocket& operator=(const RSocket&) = delete;

  int fd() const { return channel_->fd; }
  std::mutex& mutex() { return mu_; }

  // Each returns 0 or an errno value (the caller sets errno, returns -1).
  int bind(const sockaddr* addr);
  int listen(int backlog);
  int connect(const sockaddr* addr);
  // Accepts one connection: *out is the new socket.
  int accept(std::shared_ptr<RSocket>* out, sockaddr* addr, socklen_t* addrlen);
  // SHUT_WR: FIN after the data sent so far; SHUT_RDWR: FIN, then the
  // disconnect once every send completed (bounded wait); SHUT_RD: nothing.
  int shutdown(int how);

  // >= 0 bytes, or -errno.
  ssize_t send(const uint8_t* buf, size_t len, bool nonblocking);
  ssize_t recv(uint8_t* buf, size_t len, bool nonblocking, bool peek, bool wait_all);

  // riomap / riounmap / riowrite: 0 or an errno value; iowrite >= 0 bytes or -errno.
  int iomap(void* buf, size_t len, int prot, int64_t offset, int64_t* out);
  int iounmap(void* buf, size_t len);
  ssize_t iowrite(const uint8_t* buf, size_t count, uint64_t offset, bool nonblocking);

  // Readiness for rpoll: the POLLIN/POLLOUT/POLLHUP/POLLERR bits now (after progress).
  short ready_events(short events);
  // The descriptors to poll(2) for a change of ready_events, arming the CQ
  // notification first; appended to `out`.
  void wait_fds(std::vector<pollfd>* out);
  // After poll(2) returned: consumes the completion-channel event, if any.
  void drain_channel();

  bool nonblocking = false;
  int pending_error = 0;  // SO_ERROR
  // Options set with rsetsockopt, reported back by rgetsockopt (uroce's
  // buffers and queues have fixed sizes: none changes its behaviour).
  struct Option {
    int level, name;
    std::vector<uint8_t> value;
  };
  std::vector<Option> options;
  rdma_cm_id* id() const { return id_; }

 private:
  RSocket() = default;
  int init_channel();
  int setup_connection(rdma_cm_id* id);  // PD, CQ, QP, MRs, receives
  int post_recv(uint32_t slot);
  int wait_event(rdma_cm_event_type want, int timeout_ms, uint8_t* private_data, size_t* private_len);
  int check_hello(const uint8_t* data, size_t len) const;
  // Polls the CM channel and the CQ without blocking (a fatal error of the
  // connection goes to error_); true if it took anything from either.
  bool progress();
  void handle_cm_event(rdma_cm_event* ev);
  // Waits (mutex released) until progress may change something, at most timeout_ms.
  int block(std::unique_lock<std::mutex>* lock, int timeout_ms);
  uint32_t credits() const { return kRecvBufs - (sent_data_ - peer_consumed_); }
  // Waits (unless nb) until a send buffer and a send WQE are free, and a
  // credit if need_credit: 0, EAGAIN, or why the connection cannot send.
  int wait_send_room(std::unique_lock<std::mutex>* lock, bool need_credit, bool nb);
  enum class SendKind { kData, kCredits, kFin, kIomap };
  int post_send(SendKind kind, const uint8_t* data, uint32_t len);
  void maybe_send_credits();

  std::mutex mu_;
  RsState state_ = RsState::kIdle;
  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* comp_ = nullptr;
  ibv_cq* cq_ = nullptr;
  bool cq_armed_ = false;
  std::vector<uint8_t> recv_area_, send_area_;
  ibv_mr* recv_mr_ = nullptr;
  ibv_mr* send_mr_ = nullptr;

  struct Ready {  // a received data buffer not yet fully read
    uint32_t slot;
    uint32_t len;
    uint32_t offset = 0;
  };
  std::deque<Ready> ready_;
  uint32_t consumed_ = 0;                     // data buffers this side consumed (mod 2^32)
  uint32_t consumed_told_ = 0;                // the last count sent to the peer
  uint32_t sent_data_ = 0;                    // data messages sent (mod 2^32)
  uint32_t peer_consumed_ = 0;                // the peer's consumed count, from its imm
  uint32_t send_posted_ = 0, send_done_ = 0;  // data send slots used / completed
  uint32_t sq_busy_ = 0;                      // send WQEs not completed (data + credit updates)
  bool peer_closed_ = false;                  // DISCONNECTED
  bool local_closed_ = false;                 // this side disconnected
  bool fin_sent_ = false;                     // SHUT_WR: no more sends
  bool fin_received_ = false;                 // the peer's SHUT_WR: end of stream after ready_
  int error_ = 0;                             // a fatal error of the connection (ECONNRESET, ...)

  struct IoRegion {
    uint64_t offset, addr, len;
    uint32_t rkey;
    ibv_mr* mr;  // local regions only
  };
  std::vector<IoRegion> local_maps_, remote_maps_;
};

}  // namespace uroce::rsockets
