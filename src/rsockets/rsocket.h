// rsockets: stream sockets over RDMA (librdmacm's rsocket(7) API: rsocket,
// rconnect, rsend, rrecv, rpoll, ...), built on uroce's own rdma_cm and verbs
// ABI, so that rstream and TCP programs under librspreload run over uroce.
//
// One RSocket is one RC connection set up with rdma_cm, with its own event
// channel (whose fd is the rsocket's number, as in librdmacm: a real,
// process-unique descriptor), PD, CQ and completion channel.
//
// The wire protocol is librdmacm's (rdma-core librdmacm/rsocket.c, its RoCE
// and InfiniBand form), so that an rsocket on uroce talks to one on a RoCE NIC
// or the kernel's rxe:
// - the CM REQ and REP carry an RsConnData: where the peer may write (its
//   receive buffer's first half) and the address of its target buffer list;
// - data moves by RDMA WRITE WITH IMM into the peer's receive buffer (imm: op
//   kData and the length; each such message takes one of the peer's
//   zero-length receives), at the place the peer's target SGL entries say;
// - the receiver gives the buffer back half by half: an RDMA WRITE WITH IMM of
//   a new RsSge into the sender's target SGL (imm: op kSgl and the sequence
//   number up to which the sender may send), or the imm alone;
// - riomap'ed regions are announced by an RDMA WRITE WITH IMM of an RsIomap
//   into the peer's target iomap table (op kIomapSgl), which riowrite then
//   writes by plain RDMA WRITEs;
// - rshutdown and rclose send op kCtrl (kShutdown: the end of the stream,
//   kDisconnect: the connection's end) before the CM disconnect.
// At most kCtrlSlots control messages (kSgl, kCtrl) are outstanding; every
// send is signalled, and its wr_id is its imm (rs_poll_cq's accounting).
//
// Not implemented (ENOSYS with a message): datagram rsockets (SOCK_DGRAM).
// Non-blocking rconnect completes before it returns. The buffer sizes are
// librdmacm's defaults; as there, SO_RCVBUF and SO_SNDBUF set before the
// connection make the buffers twice the value, RDMA_IOMAPSIZE how many
// regions the peer may announce, RDMA_SQSIZE and RDMA_RQSIZE the queues
// (kQueueMin up to the device's max_qp_wr; the receive queue is the credit the
// peer is given) and RDMA_INLINE the inline size. Unlike librdmacm, the inline
// size is at least sizeof(RsIomap): uroce sends its control messages inline,
// where librdmacm keeps a buffer for them when RDMA_INLINE is smaller. The
// iWARP form (SENDs instead of immediate data) is not spoken: uroce is RoCE.
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

inline constexpr uint32_t kBufBytes = 1 << 17;     // receive and send buffer (librdmacm's def_mem, def_wmem)
inline constexpr uint32_t kMaxBufBytes = 1 << 26;  // SO_RCVBUF's and SO_SNDBUF's limit here
inline constexpr uint16_t kQueueSize = 384;        // send and receive queue (def_sqsize, def_rqsize)
inline constexpr uint16_t kQueueMin = 16;          // RS_QP_MIN_SIZE
inline constexpr uint16_t kQueueMax = 0xFFFE;      // RS_QP_MAX_SIZE (also RDMA_INLINE's limit)
inline constexpr uint32_t kInlineBytes = 64;       // def_inline
inline constexpr uint32_t kCtrlSlots = 4;          // RS_QP_CTRL_SIZE
inline constexpr uint32_t kSglSize = 2;            // RS_SGL_SIZE: target entries, one per buffer half
inline constexpr uint32_t kSendLowWater = 2048;    // RS_SNDLOWAT
inline constexpr uint32_t kFirstTransfer = 2048;   // RS_OLAP_START_SIZE: a send's first message
inline constexpr uint32_t kMaxTransfer = 1 << 16;  // RS_MAX_TRANSFER
inline constexpr uint32_t kMaxIoMaps = 128;        // RDMA_IOMAPSIZE's limit here

// librdmacm's wire structures. An RsSge or RsIomap written into the peer's
// memory is in the writer's byte order (RsConnData::flags says which); the
// RsConnData's own fields are big-endian.
struct RsSge {
  uint64_t addr;
  uint32_t key;
  uint32_t length;
};
struct RsIomap {
  uint64_t offset;
  RsSge sge;
};
struct RsConnData {
  uint8_t version;  // 1
  uint8_t flags;    // kConnFlagNet, kConnFlagIomap
  uint16_t credits;
  uint8_t reserved[3];
  uint8_t target_iomap_size;  // scaled (rs_value_to_scale)
  RsSge target_sgl;
  RsSge data_buf;
};
static_assert(sizeof(RsSge) == 16 && sizeof(RsIomap) == 24 && sizeof(RsConnData) == 40);
inline constexpr uint8_t kConnFlagNet = 1;    // the sender is big-endian
inline constexpr uint8_t kConnFlagIomap = 2;  // a target iomap table follows the target SGL

// The immediate data: an op in the top three bits, its datum below.
enum class RsOp : uint32_t { kData = 0, kWrite = 2, kSgl = 4, kIomapSgl = 6, kCtrl = 7 };
enum RsCtrl : uint32_t { kCtrlDisconnect = 0, kCtrlKeepalive = 1, kCtrlShutdown = 2 };
constexpr uint32_t rs_msg(RsOp op, uint32_t data) { return (uint32_t(op) << 29) | data; }
constexpr RsOp rs_msg_op(uint32_t msg) { return RsOp(msg >> 29); }
constexpr uint32_t rs_msg_data(uint32_t msg) { return msg & 0x1FFFFFFF; }

// Copies `from` into a caller's (addr, *addrlen) as accept(2) and
// getsockname(2) do: truncated to *addrlen, which is set to the full length
// (addr may be NULL when *addrlen is 0: librspreload asks the length so).
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
  // As librdmacm's rshutdown: SHUT_WR sends kCtrlShutdown after the data sent
  // so far (kCtrlDisconnect if this side no longer reads); SHUT_RDWR sends
  // kCtrlDisconnect, waits (bounded) for every send's completion and
  // disconnects; SHUT_RD ends reading (and disconnects once writing ended too).
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
  // Options set with rsetsockopt, reported back by rgetsockopt; of them only
  // SO_RCVBUF, SO_SNDBUF and the SOL_RDMA ones, read when the connection is set
  // up (sizes_from_options), change anything.
  struct Option {
    int level, name;
    std::vector<uint8_t> value;
  };
  std::vector<Option> options;
  rdma_cm_id* id() const { return id_; }
  // RDMA_SQSIZE, RDMA_RQSIZE or RDMA_INLINE as rgetsockopt reports it, as
  // librdmacm: what the connection uses once set up, before that what the
  // options (else the defaults) ask for.
  uint32_t queue_option(int name) const;

 private:
  RSocket() = default;
  int init_channel();
  // What the options set before the connection change (as librdmacm): the
  // buffers (SO_RCVBUF, SO_SNDBUF: twice the value), RDMA_IOMAPSIZE, and the
  // queues and inline size (at most kQueueMax here; setup_connection fits
  // them to the device).
  struct Sizes {
    uint32_t rbuf = kBufBytes, sbuf = kBufBytes;
    uint16_t iomaps = 0;
    uint16_t sq = kQueueSize, rq = kQueueSize;
    uint32_t inline_bytes = kInlineBytes;
  };
  Sizes sizes_from_options() const;
  bool option_int(int level, int name, int* value) const;
  // PD, CQ, QP, buffers and their MRs, the receives.
  int setup_connection(rdma_cm_id* id, const Sizes& sizes);
  int register_buffers();
  int post_recv();
  int wait_event(rdma_cm_event_type want, int timeout_ms, uint8_t* private_data, size_t* private_len);
  RsConnData conn_data() const;
  int save_conn_data(const uint8_t* data, size_t len);
  // Polls the CM channel and the CQ without blocking (a fatal error of the
  // connection goes to error_), gives credits when due; true if it took anything.
  bool progress();
  void handle_cm_event(rdma_cm_event* ev);
  void take_send_completion(const ibv_wc& wc);
  void take_recv_completion(const ibv_wc& wc);
  void refresh_target_sgl();
  void take_iomap(uint32_t index);
  // Waits (mutex released) until progress may change something, at most timeout_ms.
  int block(std::unique_lock<std::mutex>* lock, int timeout_ms);

  // The sending side (librdmacm's rs_can_send and what it checks).
  bool connected() const { return state_ == RsState::kConnected; }
  bool can_send() const;
  bool ctrl_avail() const { return ctrl_seqno_ != ctrl_max_seqno_; }
  bool all_sends_done() const { return (ctrl_max_seqno_ - ctrl_seqno_) + sqe_avail_ == sq_size_; }
  // Waits (unless nb) until can_send: 0, EAGAIN, or why the connection cannot send.
  int wait_send_room(std::unique_lock<std::mutex>* lock, bool nb);
  uint32_t next_transfer(uint32_t* olen, size_t left, uint64_t limit) const;
  // Copies `len` bytes into the send buffer (wrapping: two SGEs) or leaves them inline.
  int stage(const uint8_t* data, uint32_t len, ibv_sge sge[2], int* flags);
  int post_write(uint32_t msg, bool with_imm, const ibv_sge* sge, int nsge, int flags, uint64_t addr, uint32_t rkey);
  int post_msg(uint32_t msg);  // a control message: the imm alone
  int post_counted(uint32_t msg, bool with_imm, const void* data, uint32_t len, uint64_t addr, uint32_t rkey);
  int write_data(const uint8_t* data, uint32_t len);
  void give_credits();
  int send_iomaps(std::unique_lock<std::mutex>* lock, bool nb);
  const RsIomap* peer_map_at(uint64_t pos) const;
  size_t copy_out(uint8_t* buf, size_t len, bool consume);
  void send_ctrl(std::unique_lock<std::mutex>* lock, uint32_t ctrl, int64_t deadline);

  std::mutex mu_;
  RsState state_ = RsState::kIdle;
  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* comp_ = nullptr;
  ibv_cq* cq_ = nullptr;
  bool cq_armed_ = false;
  uint16_t sq_size_ = kQueueSize, rq_size_ = kQueueSize;
  uint32_t sq_inline_ = kInlineBytes;

  // Receiving: the buffer the peer writes (given back by halves), read in
  // order from rbuf_offset_; each message's length in rmsg_ until read.
  uint32_t rbuf_size_ = kBufBytes;
  uint32_t half() const { return rbuf_size_ / 2; }
  std::vector<uint8_t> rbuf_;
  ibv_mr* rmr_ = nullptr;
  uint32_t rbuf_offset_ = 0;       // the next byte to read
  uint32_t rbuf_free_offset_ = 0;  // the half to give next
  uint32_t rbuf_bytes_avail_ = 0;  // read and not yet given back
  struct RMsg {
    uint32_t len;
  };
  std::deque<RMsg> rmsg_;
  uint16_t rseq_no_ = 0, rseq_comp_ = 0;  // messages read; when to give credits next

  // Where this side may write: the target buffer list (RsSge[kSglSize], then
  // RsIomap[iomap_size_]) that the peer writes, and local copies of its entries.
  std::vector<uint8_t> target_area_;
  ibv_mr* target_mr_ = nullptr;
  uint16_t iomap_size_ = 0;
  RsSge sgl_[kSglSize] = {};
  uint32_t target_sge_ = 0;
  std::vector<RsIomap> peer_maps_;
  bool swap_ = false;                     // the peer's byte order is not ours
  uint16_t sseq_no_ = 0, sseq_comp_ = 0;  // data messages sent; the peer's limit

  // The peer's target buffer list, for credits and iomap announcements.
  RsSge remote_sgl_ = {}, remote_iomap_ = {};
  uint32_t remote_sge_ = 1;

  // Sending: a ring of sbuf_size_ bytes staged for RDMA WRITEs.
  uint32_t sbuf_size_ = kBufBytes;
  std::vector<uint8_t> sbuf_;
  ibv_mr* smr_ = nullptr;
  uint32_t sbuf_head_ = 0;         // where the next staged bytes go
  uint32_t sbuf_bytes_avail_ = 0;  // not in flight
  uint32_t sqe_avail_ = 0;         // send WQEs free for data
  uint32_t ctrl_seqno_ = 0, ctrl_max_seqno_ = kCtrlSlots;

  bool readable_ = true, writable_ = true;
  bool shutdown_sent_ = false;  // a kCtrl message of this side's shutdown went
  bool peer_closed_ = false;    // the peer's kCtrlDisconnect or CM DISCONNECTED
  bool local_closed_ = false;   // this side disconnected
  int error_ = 0;               // a fatal error of the connection (ECONNRESET, ...)

  // riomap'ed regions the peer may write, one per slot of its target iomap table.
  struct LocalMap {
    uint64_t offset = 0;
    ibv_mr* mr = nullptr;
    bool announced = false;
  };
  std::vector<LocalMap> local_maps_;
};

}  // namespace uroce::rsockets
