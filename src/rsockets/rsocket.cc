#include "rsockets/rsocket.h"

#include <arpa/inet.h>
#include <byteswap.h>
#include <endian.h>
#include <fcntl.h>
#include <rdma/rsocket.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace uroce::rsockets {
namespace {

constexpr uint8_t kVersion = 1;
constexpr int kResolveTimeoutMs = 2000;
constexpr int kConnectTimeoutMs = 30000;
constexpr int kCloseWaitMs = 2000;
// Receives have bit 63 set (librdmacm's RS_WR_ID_FLAG_RECV); a send's wr_id is its imm.
constexpr uint64_t kRecvWrId = uint64_t(1) << 63;
constexpr bool kBigEndian = std::endian::native == std::endian::big;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 ? errno : 0;
}

// librdmacm's rs_value_to_scale / rs_scale_to_value: a count in 8 bits.
uint8_t value_to_scale(uint32_t v) { return uint8_t(v <= 128 ? v : 0x80 | (v >> 8)); }
uint32_t scale_to_value(uint8_t s) { return s <= 128 ? s : uint32_t(s & 0x7F) << 8; }

RsSge swapped(RsSge e) { return {bswap_64(e.addr), bswap_32(e.key), bswap_32(e.length)}; }
RsIomap swapped(RsIomap m) { return {bswap_64(m.offset), swapped(m.sge)}; }
RsSge from_be(RsSge e) { return {be64toh(e.addr), be32toh(e.key), be32toh(e.length)}; }
RsSge to_be(RsSge e) { return {htobe64(e.addr), htobe32(e.key), htobe32(e.length)}; }
uint64_t address_of(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// Both sides' REQ/REP: the peer retries and waits out RNR as long as it takes
// (7 = forever), as librdmacm asks.
rdma_conn_param conn_param(const RsConnData* data) {
  rdma_conn_param param{};
  param.private_data = data;
  param.private_data_len = sizeof *data;
  param.flow_control = 1;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  return param;
}

}  // namespace

void copy_address(const sockaddr* from, sockaddr* addr, socklen_t* addrlen) {
  socklen_t n = from->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (*addrlen) std::memcpy(addr, from, std::min(n, *addrlen));
  *addrlen = n;
}

std::shared_ptr<RSocket> RSocket::create() {
  std::shared_ptr<RSocket> rs(new RSocket());
  if (int err = rs->init_channel()) {
    errno = err;
    return nullptr;
  }
  return rs;
}

int RSocket::init_channel() {
  channel_ = rdma_create_event_channel();
  if (!channel_) return errno;
  if (int err = set_nonblocking(channel_->fd)) return err;
  if (rdma_create_id(channel_, &id_, this, RDMA_PS_TCP)) return errno;
  return 0;
}

RSocket::~RSocket() {
  if (id_ && id_->qp) rdma_destroy_qp(id_);
  for (LocalMap& m : local_maps_) {
    if (m.mr) ibv_dereg_mr(m.mr);
  }
  for (ibv_mr* mr : {rmr_, smr_, target_mr_}) {
    if (mr) ibv_dereg_mr(mr);
  }
  if (cq_) {
    if (cq_armed_) {  // an event may be queued: acknowledge it before destroying
      ibv_cq* ev_cq;
      void* ctx;
      if (ibv_get_cq_event(comp_, &ev_cq, &ctx) == 0) ibv_ack_cq_events(ev_cq, 1);
    }
    ibv_destroy_cq(cq_);
  }
  if (comp_) ibv_destroy_comp_channel(comp_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (id_) rdma_destroy_id(id_);
  if (channel_) rdma_destroy_event_channel(channel_);
}

int RSocket::bind(const sockaddr* addr) {
  if (state_ != RsState::kIdle) return EINVAL;
  return rdma_bind_addr(id_, const_cast<sockaddr*>(addr)) ? errno : 0;
}

int RSocket::listen(int backlog) {
  if (state_ != RsState::kIdle) return EINVAL;
  if (rdma_listen(id_, backlog)) return errno;
  state_ = RsState::kListening;
  return 0;
}

bool RSocket::option_int(int level, int name, int* value) const {
  for (const Option& o : options) {
    if (o.level != level || o.name != name || o.value.size() < sizeof(int)) continue;
    std::memcpy(value, o.value.data(), sizeof(int));
    return true;
  }
  return false;
}

RSocket::Sizes RSocket::sizes_from_options() const {
  Sizes z;
  int v;
  if (option_int(SOL_SOCKET, SO_RCVBUF, &v) && v > 0)
    z.rbuf = std::clamp(uint32_t(v) << 1, 2 * kSendLowWater, kMaxBufBytes) & ~63u;
  if (option_int(SOL_SOCKET, SO_SNDBUF, &v) && v > 0)
    z.sbuf = std::clamp(uint32_t(v) << 1, 2 * kSendLowWater, kMaxBufBytes) & ~63u;
  if (option_int(SOL_RDMA, RDMA_IOMAPSIZE, &v))
    z.iomaps = uint16_t(scale_to_value(value_to_scale(uint32_t(std::clamp<int>(v, 0, kMaxIoMaps)))));
  // As librdmacm, read as unsigned: a negative value is the largest.
  if (option_int(SOL_RDMA, RDMA_SQSIZE, &v)) z.sq = uint16_t(std::min<uint32_t>(uint32_t(v), kQueueMax));
  if (option_int(SOL_RDMA, RDMA_RQSIZE, &v)) z.rq = uint16_t(std::min<uint32_t>(uint32_t(v), kQueueMax));
  if (option_int(SOL_RDMA, RDMA_INLINE, &v)) z.inline_bytes = std::min<uint32_t>(uint32_t(v), kQueueMax);
  return z;
}

uint32_t RSocket::queue_option(int name) const {
  Sizes z = sizes_from_options();
  if (cq_) z.sq = sq_size_, z.rq = rq_size_, z.inline_bytes = sq_inline_;
  return name == RDMA_SQSIZE ? z.sq : name == RDMA_RQSIZE ? z.rq : z.inline_bytes;
}

namespace {
// librdmacm's rs_set_qp_size: a queue within kQueueMin and the device's limit.
uint16_t fit_queue(uint16_t asked, uint16_t max) {
  if (asked > max) return max;
  return std::max(asked, kQueueMin);
}
}  // namespace

// Waits on the channel (non-blocking fd) for one event; the wanted one
// returns 0 (its private data copied out), REJECTED is ECONNREFUSED, any
// other failure event its errno.
int RSocket::wait_event(rdma_cm_event_type want, int timeout_ms, uint8_t* private_data, size_t* private_len) {
  int64_t deadline = now_ms() + timeout_ms;
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(channel_, &ev) == 0) {
      rdma_cm_event_type type = ev->event;
      int status = ev->status;
      if (type == want && private_data && private_len) {
        size_t n = std::min<size_t>(*private_len, ev->param.conn.private_data_len);
        if (ev->param.conn.private_data) std::memcpy(private_data, ev->param.conn.private_data, n);
        *private_len = ev->param.conn.private_data ? n : 0;
      }
      rdma_ack_cm_event(ev);
      if (type == want) return 0;
      switch (type) {
        case RDMA_CM_EVENT_REJECTED:
          return ECONNREFUSED;
        case RDMA_CM_EVENT_ADDR_ERROR:
        case RDMA_CM_EVENT_ROUTE_ERROR:
        case RDMA_CM_EVENT_UNREACHABLE:
          return status < 0 ? -status : EHOSTUNREACH;
        case RDMA_CM_EVENT_CONNECT_ERROR:
          return ECONNREFUSED;
        default:
          continue;  // not for this step
      }
    }
    if (errno != EAGAIN && errno != EINTR) return errno;
    int left = int(deadline - now_ms());
    if (left <= 0) return ETIMEDOUT;
    pollfd p{channel_->fd, POLLIN, 0};
    ::poll(&p, 1, left);
  }
}

int RSocket::connect(const sockaddr* addr) {
  if (state_ == RsState::kConnected) return EISCONN;
  if (state_ != RsState::kIdle) return EINVAL;
  if (rdma_resolve_addr(id_, nullptr, const_cast<sockaddr*>(addr), kResolveTimeoutMs)) return errno;
  if (int err = wait_event(RDMA_CM_EVENT_ADDR_RESOLVED, kResolveTimeoutMs * 2, nullptr, nullptr)) return err;
  if (rdma_resolve_route(id_, kResolveTimeoutMs)) return errno;
  if (int err = wait_event(RDMA_CM_EVENT_ROUTE_RESOLVED, kResolveTimeoutMs * 2, nullptr, nullptr)) return err;
  if (int err = setup_connection(id_, sizes_from_options())) return err;
  RsConnData mine = conn_data();
  rdma_conn_param param = conn_param(&mine);
  if (rdma_connect(id_, &param)) return errno;
  uint8_t reply[256];
  size_t reply_len = sizeof reply;
  if (int err = wait_event(RDMA_CM_EVENT_ESTABLISHED, kConnectTimeoutMs, reply, &reply_len)) return err;
  if (int err = save_conn_data(reply, reply_len)) {
    rdma_disconnect(id_);
    return err;
  }
  state_ = RsState::kConnected;
  return 0;
}

// This side's half of the CM exchange (librdmacm's rs_format_conn_data).
RsConnData RSocket::conn_data() const {
  RsConnData c{};
  c.version = kVersion;
  c.flags = kConnFlagIomap | (kBigEndian ? kConnFlagNet : 0);
  c.credits = htobe16(rq_size_);
  c.target_iomap_size = value_to_scale(iomap_size_);
  c.target_sgl = to_be({address_of(target_area_.data()), target_mr_->rkey, kSglSize});
  c.data_buf = to_be({address_of(rbuf_.data()), rmr_->rkey, half()});
  return c;
}

// The peer's half (librdmacm's rs_save_conn_data): where to write first, its
// target buffer list, and how many messages it takes before it gives credits.
int RSocket::save_conn_data(const uint8_t* data, size_t len) {
  RsConnData c;
  if (len < sizeof c) return EPROTO;
  std::memcpy(&c, data, sizeof c);
  if (c.version != kVersion) return ENOTSUP;
  remote_sgl_ = from_be(c.target_sgl);
  if (remote_sgl_.length == 0) return EPROTO;
  remote_sge_ = 1;
  swap_ = ((c.flags & kConnFlagNet) != 0) != kBigEndian;
  if (c.flags & kConnFlagIomap) {
    remote_iomap_ = {remote_sgl_.addr + sizeof(RsSge) * remote_sgl_.length, remote_sgl_.key,
                     scale_to_value(c.target_iomap_size)};
  }
  sgl_[0] = from_be(c.data_buf);
  sseq_comp_ = be16toh(c.credits);
  local_maps_.resize(std::min(remote_iomap_.length, kMaxIoMaps));
  peer_maps_.assign(iomap_size_, RsIomap{});
  return 0;
}

int RSocket::accept(std::shared_ptr<RSocket>* out, sockaddr* addr, socklen_t* addrlen) {
  if (state_ != RsState::kListening) return EINVAL;
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(channel_, &ev)) return errno;  // EAGAIN: none pending
  if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
    rdma_ack_cm_event(ev);
    return EAGAIN;
  }
  rdma_cm_id* new_id = ev->id;
  uint8_t request[256];
  size_t request_len =
      ev->param.conn.private_data ? std::min<size_t>(ev->param.conn.private_data_len, sizeof request) : 0;
  if (request_len) std::memcpy(request, ev->param.conn.private_data, request_len);
  rdma_ack_cm_event(ev);
  std::shared_ptr<RSocket> rs(new RSocket());
  rs->channel_ = rdma_create_event_channel();
  int err = rs->channel_ ? set_nonblocking(rs->channel_->fd) : errno;
  if (!err && rdma_migrate_id(new_id, rs->channel_)) err = errno;
  if (err) {
    rdma_reject(new_id, nullptr, 0);
    rdma_destroy_id(new_id);
    return err;
  }
  rs->id_ = new_id;
  new_id->context = rs.get();
  if ((err = rs->setup_connection(new_id, sizes_from_options())) || (err = rs->save_conn_data(request, request_len))) {
    rdma_reject(new_id, nullptr, 0);
    return err == EPROTO || err == ENOTSUP ? ECONNABORTED : err;  // ~RSocket destroys the id
  }
  RsConnData mine = rs->conn_data();
  rdma_conn_param param = conn_param(&mine);
  if (rdma_accept(new_id, &param)) return errno;
  if ((err = rs->wait_event(RDMA_CM_EVENT_ESTABLISHED, kConnectTimeoutMs, nullptr, nullptr))) return err;
  rs->state_ = RsState::kConnected;
  if (addr && addrlen) copy_address(rdma_get_peer_addr(new_id), addr, addrlen);
  *out = std::move(rs);
  return 0;
}

int RSocket::setup_connection(rdma_cm_id* id, const Sizes& sizes) {
  iomap_size_ = sizes.iomaps;
  rbuf_size_ = sizes.rbuf;
  sbuf_size_ = sizes.sbuf;
  ibv_device_attr dev{};
  if (int err = ibv_query_device(id->verbs, &dev)) return err;
  uint16_t max = uint16_t(std::clamp<int>(dev.max_qp_wr, kQueueMin, kQueueMax));
  sq_size_ = fit_queue(sizes.sq, max);
  rq_size_ = fit_queue(sizes.rq, max);
  sq_inline_ = std::max<uint32_t>(sizes.inline_bytes, sizeof(RsIomap));  // control messages go inline
  pd_ = ibv_alloc_pd(id->verbs);
  comp_ = pd_ ? ibv_create_comp_channel(id->verbs) : nullptr;
  if (!comp_) return errno ? errno : ENOMEM;
  if (int err = set_nonblocking(comp_->fd)) return err;
  cq_ = ibv_create_cq(id->verbs, sq_size_ + rq_size_, this, comp_, 0);
  if (!cq_) return errno;
  ibv_qp_init_attr attr{};
  attr.send_cq = cq_;
  attr.recv_cq = cq_;
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 1;
  attr.cap.max_send_wr = sq_size_;
  attr.cap.max_recv_wr = rq_size_;
  attr.cap.max_send_sge = 2;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = sq_inline_;
  if (rdma_create_qp(id, pd_, &attr)) return errno;
  sq_inline_ = attr.cap.max_inline_data;
  if (sq_inline_ < sizeof(RsIomap)) return ENOTSUP;  // credits and announcements go inline
  if (int err = register_buffers()) return err;
  for (uint16_t i = 0; i < rq_size_; ++i) {
    if (int err = post_recv()) return err;
  }
  return 0;
}

// The receive buffer and the target buffer list, which the peer writes, and
// the send buffer (librdmacm's rs_init_bufs).
int RSocket::register_buffers() {
  rbuf_.assign(rbuf_size_, 0);
  sbuf_.assign(sbuf_size_, 0);
  target_area_.assign(sizeof(RsSge) * kSglSize + sizeof(RsIomap) * iomap_size_, 0);
  const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  rmr_ = ibv_reg_mr(pd_, rbuf_.data(), rbuf_.size(), remote);
  target_mr_ = rmr_ ? ibv_reg_mr(pd_, target_area_.data(), target_area_.size(), remote) : nullptr;
  smr_ = target_mr_ ? ibv_reg_mr(pd_, sbuf_.data(), sbuf_.size(), IBV_ACCESS_LOCAL_WRITE) : nullptr;
  if (!smr_) return errno;
  rbuf_free_offset_ = half();
  rbuf_bytes_avail_ = half();
  sbuf_bytes_avail_ = sbuf_size_;
  sqe_avail_ = sq_size_ - ctrl_max_seqno_;
  rseq_comp_ = rq_size_ / 2;
  return 0;
}

int RSocket::post_recv() {
  ibv_recv_wr wr{};
  wr.wr_id = kRecvWrId;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(id_->qp, &wr, &bad);
}

int RSocket::post_write(uint32_t msg, bool with_imm, const ibv_sge* sge, int nsge, int flags, uint64_t addr,
                        uint32_t rkey) {
  ibv_send_wr wr{};
  wr.wr_id = msg;
  wr.sg_list = const_cast<ibv_sge*>(sge);
  wr.num_sge = nsge;
  wr.opcode = with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = flags | IBV_SEND_SIGNALED;
  if (with_imm) wr.imm_data = htonl(msg);
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(id_->qp, &wr, &bad);
}

int RSocket::post_msg(uint32_t msg) { return post_write(msg, true, nullptr, 0, 0, 0, 0); }

// A message that takes a send WQE and `len` bytes of the send buffer, both
// given back at its completion (take_send_completion): data, a riowrite, an
// iomap announcement.
int RSocket::post_counted(uint32_t msg, bool with_imm, const void* data, uint32_t len, uint64_t addr, uint32_t rkey) {
  ibv_sge sge[2];
  int flags;
  int nsge = stage(static_cast<const uint8_t*>(data), len, sge, &flags);
  --sqe_avail_;
  sbuf_bytes_avail_ -= len;
  return post_write(msg, with_imm, sge, nsge, flags, addr, rkey);
}

// The bytes of one message: inline when short, else copied into the send
// ring (two pieces where it wraps). Returns the number of SGEs.
int RSocket::stage(const uint8_t* data, uint32_t len, ibv_sge sge[2], int* flags) {
  if (len <= sq_inline_) {
    sge[0] = {address_of(data), len, 0};
    *flags = IBV_SEND_INLINE;
    return 1;
  }
  *flags = 0;
  uint32_t first = std::min(len, sbuf_size_ - sbuf_head_);
  std::memcpy(sbuf_.data() + sbuf_head_, data, first);
  sge[0] = {address_of(sbuf_.data() + sbuf_head_), first, smr_->lkey};
  sbuf_head_ = (sbuf_head_ + first) % sbuf_size_;
  if (first == len) return 1;
  std::memcpy(sbuf_.data(), data + first, len - first);
  sge[1] = {address_of(sbuf_.data()), len - first, smr_->lkey};
  sbuf_head_ = len - first;
  return 2;
}

bool RSocket::can_send() const {
  return sqe_avail_ > 0 && sbuf_bytes_avail_ >= kSendLowWater && sseq_no_ != sseq_comp_ &&
         sgl_[target_sge_].length != 0;
}

// How much the next message carries: librdmacm's sizes (2 KiB, doubling to
// 64 KiB within one send), within the free send buffer and `limit`.
uint32_t RSocket::next_transfer(uint32_t* olen, size_t left, uint64_t limit) const {
  uint64_t n = left;
  if (*olen < left) {
    n = *olen;
    if (*olen < kMaxTransfer) *olen <<= 1;
  }
  return uint32_t(std::min<uint64_t>({n, sbuf_bytes_avail_, limit}));
}

// One data message into the peer's receive buffer, where its current target
// entry says (librdmacm's rs_write_data: the entry moves before the post).
int RSocket::write_data(const uint8_t* data, uint32_t len) {
  RsSge& t = sgl_[target_sge_];
  uint64_t addr = t.addr;
  uint32_t key = t.key;
  t.addr += len;
  t.length -= len;
  if (t.length == 0) target_sge_ = (target_sge_ + 1) % kSglSize;
  ++sseq_no_;
  return post_counted(rs_msg(RsOp::kData, len), true, data, len, addr, key);
}

// librdmacm's rs_give_credits and rs_send_credits: once half the messages
// the peer may send were read, or half the buffer is free, a kSgl message
// raises the peer's limit, and a free half goes with it as the next target
// entry.
void RSocket::give_credits() {
  if (!connected() || local_closed_ || peer_closed_ || error_ || !ctrl_avail()) return;
  const bool half_free = rbuf_bytes_avail_ >= half();
  if (!half_free && int16_t(uint16_t(rseq_no_ - rseq_comp_)) < 0) return;
  ++ctrl_seqno_;
  rseq_comp_ = uint16_t(rseq_no_ + rq_size_ / 2);
  const uint32_t msg = rs_msg(RsOp::kSgl, uint32_t(rseq_no_) + rq_size_);
  int err;
  if (!half_free) {
    err = post_msg(msg);
  } else {
    RsSge entry{address_of(rbuf_.data() + rbuf_free_offset_), rmr_->rkey, half()};
    if (swap_) entry = swapped(entry);
    ibv_sge sge{address_of(&entry), sizeof entry, 0};
    err = post_write(msg, true, &sge, 1, IBV_SEND_INLINE, remote_sgl_.addr + remote_sge_ * sizeof(RsSge),
                     remote_sgl_.key);
    rbuf_bytes_avail_ -= half();
    rbuf_free_offset_ = (rbuf_free_offset_ + half()) % rbuf_size_;
    if (++remote_sge_ >= remote_sgl_.length) remote_sge_ = 0;
  }
  if (err) error_ = err;
}

bool RSocket::progress() {
  if (!cq_) return false;
  bool moved = false;
  // CM events first: the CQ is polled after a DISCONNECTED, so every message
  // that arrived before it (its sender saw it acknowledged before it
  // disconnected) is in rmsg_ when recv sees the end of the stream.
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(channel_, &ev) == 0) {
    handle_cm_event(ev);
    moved = true;
  }
  ibv_wc wc[32];
  int n;
  uint32_t recvs = 0;
  while ((n = ibv_poll_cq(cq_, 32, wc)) > 0) {
    moved = true;
    for (int i = 0; i < n; ++i) {
      if (!(wc[i].wr_id & kRecvWrId)) {
        take_send_completion(wc[i]);
      } else if (wc[i].status == IBV_WC_SUCCESS) {
        take_recv_completion(wc[i]);
        ++recvs;
      } else if (wc[i].status != IBV_WC_WR_FLUSH_ERR && !error_) {
        error_ = ECONNRESET;  // (flushes after a disconnect are the end, not an error)
      }
    }
  }
  for (; recvs > 0 && !peer_closed_ && !local_closed_ && !error_; --recvs) {
    if (int err = post_recv()) error_ = err;
  }
  give_credits();
  return moved;
}

// librdmacm's rs_poll_cq for a send: its resources come back.
void RSocket::take_send_completion(const ibv_wc& wc) {
  const uint32_t msg = uint32_t(wc.wr_id);
  switch (rs_msg_op(msg)) {
    case RsOp::kSgl:
    case RsOp::kCtrl:
      ++ctrl_max_seqno_;
      break;
    case RsOp::kIomapSgl:
      ++sqe_avail_;
      sbuf_bytes_avail_ += sizeof(RsIomap);
      break;
    default:
      ++sqe_avail_;
      sbuf_bytes_avail_ += rs_msg_data(msg);
      break;
  }
  if (wc.status != IBV_WC_SUCCESS && wc.status != IBV_WC_WR_FLUSH_ERR && !error_) error_ = ECONNRESET;
}

// A message from the peer: the op in its immediate data says what it is.
void RSocket::take_recv_completion(const ibv_wc& wc) {
  if (!(wc.wc_flags & IBV_WC_WITH_IMM)) {
    error_ = EPROTO;  // the protocol sends immediate data only
    return;
  }
  const uint32_t msg = ntohl(wc.imm_data);
  const uint32_t datum = rs_msg_data(msg);
  switch (rs_msg_op(msg)) {
    case RsOp::kSgl:
      sseq_comp_ = uint16_t(datum);
      refresh_target_sgl();
      break;
    case RsOp::kIomapSgl:
      take_iomap(datum);
      break;
    case RsOp::kCtrl:
      if (datum == kCtrlDisconnect) {
        peer_closed_ = true;
      } else if (datum == kCtrlShutdown) {
        readable_ = false;  // the end of the peer's stream, after what rmsg_ holds
      }
      break;
    case RsOp::kWrite:
      break;
    default:
      if (datum > half() || rmsg_.size() >= rq_size_) {
        error_ = EPROTO;  // never longer than a target entry, never more than the credits given
        return;
      }
      rmsg_.push_back({datum});
      break;
  }
}

// A kSgl may come with a new target entry, written into target_area_ before
// its completion: an entry this side used up takes it (and clears it there,
// so that it is not taken twice). The peer writes an entry only after this
// side used it up (librdmacm's invariant), so none is read while it changes.
void RSocket::refresh_target_sgl() {
  auto* area = reinterpret_cast<RsSge*>(target_area_.data());
  for (uint32_t i = 0; i < kSglSize; ++i) {
    if (sgl_[i].length != 0) continue;
    RsSge e;
    std::memcpy(&e, &area[i], sizeof e);
    if (swap_) e = swapped(e);
    if (e.length == 0) continue;
    sgl_[i] = e;
    std::memset(&area[i], 0, sizeof e);
  }
}

// A kIomapSgl: the peer wrote the announcement of a region into slot `index`
// of the target iomap table.
void RSocket::take_iomap(uint32_t index) {
  if (index >= peer_maps_.size()) return;
  RsIomap m;
  std::memcpy(&m, target_area_.data() + sizeof(RsSge) * kSglSize + sizeof(RsIomap) * index, sizeof m);
  peer_maps_[index] = swap_ ? swapped(m) : m;
}

void RSocket::handle_cm_event(rdma_cm_event* ev) {
  switch (ev->event) {
    case RDMA_CM_EVENT_DISCONNECTED:
      peer_closed_ = true;
      if (!local_closed_) rdma_disconnect(id_);
      break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      error_ = ENODEV;
      break;
    default:
      break;
  }
  rdma_ack_cm_event(ev);
}

int RSocket::block(std::unique_lock<std::mutex>* lock, int timeout_ms) {
  std::vector<pollfd> fds;
  wait_fds(&fds);
  if (progress()) return 0;  // something arrived before the CQ was armed: no wait
  lock->unlock();
  int n = ::poll(fds.data(), fds.size(), timeout_ms);
  int err = n < 0 ? errno : 0;
  lock->lock();
  drain_channel();
  progress();
  return err;
}

void RSocket::wait_fds(std::vector<pollfd>* out) {
  if (cq_ && !cq_armed_) cq_armed_ = ibv_req_notify_cq(cq_, 0) == 0;
  out->push_back({channel_->fd, POLLIN, 0});
  if (comp_) out->push_back({comp_->fd, POLLIN, 0});
}

void RSocket::drain_channel() {
  if (!comp_ || !cq_armed_) return;
  ibv_cq* ev_cq;
  void* ctx;
  if (ibv_get_cq_event(comp_, &ev_cq, &ctx) == 0) {
    ibv_ack_cq_events(ev_cq, 1);
    cq_armed_ = false;
  }
}

int RSocket::wait_send_room(std::unique_lock<std::mutex>* lock, bool nb) {
  for (;;) {
    progress();
    if (error_) return error_;
    if (!writable_ || local_closed_ || peer_closed_ || !connected())
      return connected() || peer_closed_ ? EPIPE : ENOTCONN;
    if (can_send()) return 0;
    if (nb) return EAGAIN;
    if (int err = block(lock, -1); err && err != EINTR) return err;
  }
}

ssize_t RSocket::send(const uint8_t* buf, size_t len, bool nb) {
  std::unique_lock lock(mu_, std::adopt_lock);
  size_t done = 0;
  int err = send_iomaps(&lock, nb);
  uint32_t olen = kFirstTransfer;
  while (!err && done < len && !(err = wait_send_room(&lock, nb))) {
    uint32_t n = next_transfer(&olen, len - done, sgl_[target_sge_].length);
    if ((err = write_data(buf + done, n))) break;
    done += n;
  }
  lock.release();
  if (done > 0) return ssize_t(done);
  return -err;
}

// Copies what the peer sent, in order, into buf: consumed (the buffer space
// and the message count go back towards the peer's credits) or only peeked.
size_t RSocket::copy_out(uint8_t* buf, size_t len, bool consume) {
  size_t done = 0;
  uint32_t off = rbuf_offset_;
  for (size_t i = 0; done < len && i < rmsg_.size();) {
    uint32_t n = uint32_t(std::min<size_t>(len - done, rmsg_[i].len));
    for (uint32_t k = 0; k < n;) {
      if (off == rbuf_size_) off = 0;
      uint32_t c = std::min(n - k, rbuf_size_ - off);
      std::memcpy(buf + done + k, rbuf_.data() + off, c);
      off += c;
      k += c;
    }
    done += n;
    if (!consume) {
      ++i;
      continue;
    }
    rbuf_bytes_avail_ += n;
    rmsg_[i].len -= n;
    if (rmsg_[i].len == 0) {
      rmsg_.pop_front();
      ++rseq_no_;
    }
  }
  if (consume) rbuf_offset_ = off;
  return done;
}

ssize_t RSocket::recv(uint8_t* buf, size_t len, bool nb, bool peek, bool wait_all) {
  std::unique_lock lock(mu_, std::adopt_lock);
  size_t done = 0;
  int err = 0;
  for (;;) {
    progress();
    if (peek) {
      done = copy_out(buf, len, false);
    } else {
      done += copy_out(buf + done, len - done, true);
      give_credits();
    }
    if (done == len || (done > 0 && (!wait_all || peek))) break;
    if (!readable_ || peer_closed_ || local_closed_) break;  // end of stream
    if (error_) {
      err = error_;
      break;
    }
    if (!connected()) {
      err = ENOTCONN;
      break;
    }
    if (nb) {
      err = EAGAIN;
      break;
    }
    if ((err = block(&lock, -1)) && err != EINTR) break;
    err = 0;
  }
  lock.release();
  if (done > 0 || !err) return ssize_t(done);
  return -err;
}

// The control message of a shutdown, once a control slot is free (bounded wait).
void RSocket::send_ctrl(std::unique_lock<std::mutex>* lock, uint32_t ctrl, int64_t deadline) {
  if (peer_closed_ || local_closed_ || error_ || (ctrl == kCtrlShutdown && shutdown_sent_)) return;
  while (!ctrl_avail() && !error_ && !peer_closed_ && now_ms() < deadline) (void)block(lock, 10);
  if (!ctrl_avail() || error_ || peer_closed_) return;
  ++ctrl_seqno_;
  if (post_msg(rs_msg(RsOp::kCtrl, ctrl)) == 0) shutdown_sent_ = true;
}

int RSocket::shutdown(int how) {
  if (state_ != RsState::kConnected) return ENOTCONN;
  if (local_closed_) return 0;
  std::unique_lock lock(mu_, std::adopt_lock);
  uint32_t ctrl = kCtrlDisconnect;
  if (how == SHUT_RDWR) {
    readable_ = writable_ = false;
  } else if (how == SHUT_WR) {
    writable_ = false;
    if (readable_) ctrl = kCtrlShutdown;
  } else {
    readable_ = false;
  }
  if (how != SHUT_RD || !writable_) {
    int64_t deadline = now_ms() + kCloseWaitMs;
    send_ctrl(&lock, ctrl, deadline);
    // What was sent must arrive before the disconnect: wait (bounded) for every completion.
    while (!all_sends_done() && !error_ && !peer_closed_ && now_ms() < deadline) (void)block(&lock, 10);
    if (ctrl == kCtrlDisconnect) {
      local_closed_ = true;
      rdma_disconnect(id_);
    }
  }
  lock.release();
  return 0;
}

short RSocket::ready_events(short events) {
  progress();
  short r = 0;
  if (state_ == RsState::kListening) {
    // A CONNECT_REQUEST is queued on the (non-blocking) channel iff its fd is readable.
    pollfd p{channel_->fd, POLLIN, 0};
    if (::poll(&p, 1, 0) == 1) r |= POLLIN;
    return short(r & (events | POLLERR | POLLHUP));
  }
  if (state_ != RsState::kConnected) return 0;
  const bool closed = peer_closed_ || local_closed_;
  if (!rmsg_.empty() || !readable_ || closed) r |= POLLIN;
  // Hung up once nothing is left to read: a peer that sent its last bytes and
  // closed must not make a poller give up on bytes it has not read yet.
  if (closed && rmsg_.empty()) r |= POLLHUP;
  if (error_) r |= POLLERR;
  if (writable_ && !closed && can_send()) r |= POLLOUT;
  return short(r & (events | POLLERR | POLLHUP));
}

}  // namespace uroce::rsockets

namespace uroce::rsockets {

// riomap: a region the peer may riowrite, announced (by send_iomaps) before
// this side's next send or riowrite, in one of the slots of the peer's
// target iomap table. Without PROT_WRITE only the offset is returned: a
// local source needs no registration here.
int RSocket::iomap(void* buf, size_t len, int prot, int64_t offset, int64_t* out) {
  if (state_ != RsState::kConnected || !pd_) return ENOTCONN;
  if (prot & ~(PROT_WRITE | PROT_NONE)) return EINVAL;
  if (offset == -1) offset = int64_t(reinterpret_cast<uintptr_t>(buf));  // as librdmacm
  *out = offset;
  if (!(prot & PROT_WRITE)) return 0;
  auto slot = std::find_if(local_maps_.begin(), local_maps_.end(), [](const LocalMap& m) { return !m.mr; });
  if (slot == local_maps_.end()) return ENOMEM;  // as librdmacm: the peer's table is full
  ibv_mr* mr = ibv_reg_mr(pd_, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr) return errno;
  *slot = {uint64_t(offset), mr, false};
  return 0;
}

int RSocket::iounmap(void* buf, size_t len) {
  auto it = std::find_if(local_maps_.begin(), local_maps_.end(),
                         [&](const LocalMap& m) { return m.mr && m.mr->addr == buf && m.mr->length == len; });
  if (it == local_maps_.end()) return EINVAL;
  ibv_dereg_mr(it->mr);
  *it = {};
  return 0;
}

// librdmacm's rs_send_iomaps: each new region's RsIomap, RDMA-written with
// imm kIomapSgl into its slot of the peer's table (a message: one credit).
int RSocket::send_iomaps(std::unique_lock<std::mutex>* lock, bool nb) {
  for (size_t index = 0; index < local_maps_.size(); ++index) {
    LocalMap& m = local_maps_[index];
    if (!m.mr || m.announced) continue;
    if (int err = wait_send_room(lock, nb)) return err;
    RsIomap iom{m.offset, {address_of(m.mr->addr), m.mr->rkey, uint32_t(m.mr->length)}};
    if (swap_) iom = swapped(iom);
    ++sseq_no_;
    if (int err = post_counted(rs_msg(RsOp::kIomapSgl, uint32_t(index)), true, &iom, sizeof iom,
                               remote_iomap_.addr + index * sizeof(RsIomap), remote_iomap_.key))
      return err;
    m.announced = true;
  }
  return 0;
}

const RsIomap* RSocket::peer_map_at(uint64_t pos) const {
  for (const RsIomap& m : peer_maps_) {
    if (m.sge.length != 0 && pos >= m.offset && pos - m.offset < m.sge.length) return &m;
  }
  return nullptr;
}

// riowrite: plain RDMA WRITEs into a region the peer announced (librdmacm's
// rs_write_direct); stops short (0 bytes if nothing) where the peer
// announced no region.
ssize_t RSocket::iowrite(const uint8_t* buf, size_t count, uint64_t offset, bool nb) {
  std::unique_lock lock(mu_, std::adopt_lock);
  size_t done = 0;
  int err = send_iomaps(&lock, nb);
  uint32_t olen = kFirstTransfer;
  while (!err && done < count && !(err = wait_send_room(&lock, nb))) {
    uint64_t pos = offset + done;
    const RsIomap* iom = peer_map_at(pos);
    if (!iom) break;
    uint32_t n = next_transfer(&olen, count - done, iom->sge.length - (pos - iom->offset));
    if ((err = post_counted(rs_msg(RsOp::kWrite, n), false, buf + done, n, iom->sge.addr + (pos - iom->offset),
                            iom->sge.key)))
      break;
    done += n;
  }
  lock.release();
  if (done > 0 || !err) return ssize_t(done);
  return -err;
}

}  // namespace uroce::rsockets
