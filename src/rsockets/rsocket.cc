#include "rsockets/rsocket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace uroce::rsockets {
namespace {

constexpr uint32_t kVersion = 1;
constexpr int kResolveTimeoutMs = 2000;
constexpr int kConnectTimeoutMs = 30000;
constexpr uint32_t kSqDepth = kSendSlots + kCtrlRecvs + 1;
constexpr uint32_t kRqDepth = kRecvBufs + kCtrlRecvs + kMaxIoMaps;
// Send wr_ids have bit 32 set (receives: the buffer's slot), so that a flushed
// completion, whose opcode is undefined, still says which queue it is from.
constexpr uint64_t kSendWrId = uint64_t(1) << 32;
constexpr uint64_t kCtrlWrId = kSendWrId | 0xFFFFFFFF;  // a credit update's or FIN's send

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 ? errno : 0;
}

// Both sides' REQ/REP: this side's hello as private data; the peer retries
// and waits out RNR as long as it takes (7 = forever).
rdma_conn_param hello_param() {
  static const RsHello hello{kHelloMagic, kVersion, kRecvBufs, kBufBytes};
  rdma_conn_param param{};
  param.private_data = &hello;
  param.private_data_len = sizeof hello;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  return param;
}

}  // namespace

void copy_address(const sockaddr* from, sockaddr* addr, socklen_t* addrlen) {
  socklen_t n = from->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  std::memcpy(addr, from, std::min(n, *addrlen));
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
  for (IoRegion& r : local_maps_) ibv_dereg_mr(r.mr);
  if (recv_mr_) ibv_dereg_mr(recv_mr_);
  if (send_mr_) ibv_dereg_mr(send_mr_);
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
        *private_len = n;
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
  if (int err = setup_connection(id_)) return err;
  rdma_conn_param param = hello_param();
  if (rdma_connect(id_, &param)) return errno;
  uint8_t reply[64];
  size_t reply_len = sizeof reply;
  if (int err = wait_event(RDMA_CM_EVENT_ESTABLISHED, kConnectTimeoutMs, reply, &reply_len)) return err;
  if (int err = check_hello(reply, reply_len)) {
    rdma_disconnect(id_);
    return err;
  }
  state_ = RsState::kConnected;
  return 0;
}

int RSocket::check_hello(const uint8_t* data, size_t len) const {
  RsHello h{};
  if (len < sizeof h) return EPROTO;
  std::memcpy(&h, data, sizeof h);
  // A peer must offer at least our own window: credits assume kRecvBufs buffers of kBufBytes.
  if (h.magic != kHelloMagic || h.version != kVersion || h.recv_bufs < kRecvBufs || h.buf_bytes < kBufBytes)
    return EPROTO;
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
  int hello_err =
      check_hello(static_cast<const uint8_t*>(ev->param.conn.private_data), ev->param.conn.private_data_len);
  rdma_ack_cm_event(ev);
  if (hello_err) {
    rdma_reject(new_id, nullptr, 0);
    rdma_destroy_id(new_id);
    return ECONNABORTED;
  }
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
  if ((err = rs->setup_connection(new_id))) {
    rdma_reject(new_id, nullptr, 0);
    return err;  // ~RSocket destroys the id
  }
  rdma_conn_param param = hello_param();
  if (rdma_accept(new_id, &param)) return errno;
  if ((err = rs->wait_event(RDMA_CM_EVENT_ESTABLISHED, kConnectTimeoutMs, nullptr, nullptr))) return err;
  rs->state_ = RsState::kConnected;
  if (addr && addrlen) copy_address(rdma_get_peer_addr(new_id), addr, addrlen);
  *out = std::move(rs);
  return 0;
}

int RSocket::setup_connection(rdma_cm_id* id) {
  pd_ = ibv_alloc_pd(id->verbs);
  comp_ = pd_ ? ibv_create_comp_channel(id->verbs) : nullptr;
  if (!comp_) return errno ? errno : ENOMEM;
  if (int err = set_nonblocking(comp_->fd)) return err;
  cq_ = ibv_create_cq(id->verbs, int(kSqDepth + kRqDepth), this, comp_, 0);
  if (!cq_) return errno;
  recv_area_.assign(size_t(kRqDepth) * kBufBytes, 0);
  send_area_.assign(size_t(kSendSlots) * kBufBytes, 0);
  recv_mr_ = ibv_reg_mr(pd_, recv_area_.data(), recv_area_.size(), IBV_ACCESS_LOCAL_WRITE);
  send_mr_ = ibv_reg_mr(pd_, send_area_.data(), send_area_.size(), 0);
  if (!recv_mr_ || !send_mr_) return errno;
  ibv_qp_init_attr attr{};
  attr.send_cq = cq_;
  attr.recv_cq = cq_;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = kSqDepth;
  attr.cap.max_recv_wr = kRqDepth;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, pd_, &attr)) return errno;
  for (uint32_t slot = 0; slot < kRqDepth; ++slot) {
    if (int err = post_recv(slot)) return err;
  }
  return 0;
}

int RSocket::post_recv(uint32_t slot) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(recv_area_.data() + size_t(slot) * kBufBytes), kBufBytes, recv_mr_->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(id_->qp, &wr, &bad);
}

int RSocket::post_send(SendKind kind, const uint8_t* data, uint32_t len) {
  ibv_send_wr wr{};
  ibv_sge sge{};
  wr.wr_id = kCtrlWrId;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  if (kind == SendKind::kData || kind == SendKind::kIomap) {
    uint32_t slot = send_posted_ % kSendSlots;
    uint8_t* dst = send_area_.data() + size_t(slot) * kBufBytes;
    std::memcpy(dst, data, len);
    sge = {reinterpret_cast<uintptr_t>(dst), len, send_mr_->lkey};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.wr_id = kSendWrId | slot;
  }
  if (kind == SendKind::kFin || kind == SendKind::kIomap) wr.opcode = IBV_WR_SEND;
  if (wr.opcode == IBV_WR_SEND_WITH_IMM) wr.imm_data = htonl(consumed_);
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (int err = ibv_post_send(id_->qp, &wr, &bad)) return err;
  if (wr.opcode == IBV_WR_SEND_WITH_IMM) consumed_told_ = consumed_;
  ++sq_busy_;
  if (kind == SendKind::kData || kind == SendKind::kIomap) ++send_posted_;
  if (kind == SendKind::kData) ++sent_data_;
  return 0;
}

void RSocket::maybe_send_credits() {
  if (state_ != RsState::kConnected || error_ || local_closed_) return;
  if (consumed_ - consumed_told_ < kCreditBatch || sq_busy_ >= kSqDepth) return;
  if (int err = post_send(SendKind::kCredits, nullptr, 0)) error_ = err;
}

bool RSocket::progress() {
  if (!cq_) return false;
  bool moved = false;
  // CM events first: the CQ is polled after a DISCONNECTED, so every message
  // that arrived before it (its sender saw it acknowledged before it
  // disconnected) is in ready_ when recv sees the end of the stream.
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(channel_, &ev) == 0) {
    handle_cm_event(ev);
    moved = true;
  }
  ibv_wc wc[32];
  int n;
  while ((n = ibv_poll_cq(cq_, 32, wc)) > 0) {
    moved = true;
    for (int i = 0; i < n; ++i) {
      const ibv_wc& c = wc[i];
      const bool is_send = (c.wr_id & kSendWrId) != 0;
      if (is_send) --sq_busy_;
      if (c.status != IBV_WC_SUCCESS) {
        // Flushes after a disconnect are the end of the connection, not an error.
        if (c.status != IBV_WC_WR_FLUSH_ERR && !error_) error_ = ECONNRESET;
        if (is_send && c.wr_id != kCtrlWrId) ++send_done_;
        continue;
      }
      if (is_send) {
        if (c.wr_id != kCtrlWrId) ++send_done_;
        continue;
      }
      if (c.wc_flags & IBV_WC_WITH_IMM) peer_consumed_ = ntohl(c.imm_data);
      uint32_t slot = uint32_t(c.wr_id);
      if (c.byte_len > 0 && !(c.wc_flags & IBV_WC_WITH_IMM)) {  // a riomap announcement
        IomapMsg m{};
        std::memcpy(&m, recv_area_.data() + size_t(slot) * kBufBytes, std::min<size_t>(sizeof m, c.byte_len));
        if (c.byte_len == sizeof m && m.magic == kIomapMagic) {
          // A new region replaces every older one it overlaps (their owner unmapped them).
          std::erase_if(remote_maps_,
                        [&](const IoRegion& r) { return r.offset < m.offset + m.len && m.offset < r.offset + r.len; });
          if (remote_maps_.size() < kMaxIoMaps) remote_maps_.push_back({m.offset, m.addr, m.len, m.rkey, nullptr});
        }
        if (int err = post_recv(slot)) error_ = err;
      } else if (c.byte_len == 0) {
        if (!(c.wc_flags & IBV_WC_WITH_IMM)) fin_received_ = true;
        if (int err = post_recv(slot)) error_ = err;  // a credit update or FIN: its buffer goes back at once
      } else {
        ready_.push_back({slot, c.byte_len});
      }
    }
  }
  return moved;
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

int RSocket::wait_send_room(std::unique_lock<std::mutex>* lock, bool need_credit, bool nb) {
  for (;;) {
    progress();
    if (error_) return error_;
    if (fin_sent_ || local_closed_ || peer_closed_ || state_ != RsState::kConnected)
      return state_ == RsState::kConnected || peer_closed_ ? EPIPE : ENOTCONN;
    if ((!need_credit || credits() > 0) && send_posted_ - send_done_ < kSendSlots && sq_busy_ < kSqDepth) return 0;
    if (nb) return EAGAIN;
    if (int err = block(lock, -1); err && err != EINTR) return err;
  }
}

ssize_t RSocket::send(const uint8_t* buf, size_t len, bool nb) {
  std::unique_lock lock(mu_, std::adopt_lock);
  size_t done = 0;
  int err = 0;
  while (done < len && !(err = wait_send_room(&lock, true, nb))) {
    uint32_t chunk = uint32_t(std::min<size_t>(len - done, kBufBytes));
    if ((err = post_send(SendKind::kData, buf + done, chunk))) break;
    done += chunk;
  }
  lock.release();
  if (done > 0) return ssize_t(done);
  return -err;
}

ssize_t RSocket::recv(uint8_t* buf, size_t len, bool nb, bool peek, bool wait_all) {
  std::unique_lock lock(mu_, std::adopt_lock);
  size_t done = 0;
  int err = 0;
  for (;;) {
    progress();
    if (!peek) {
      while (done < len && !ready_.empty()) {
        Ready& r = ready_.front();
        uint32_t n = uint32_t(std::min<size_t>(len - done, r.len - r.offset));
        std::memcpy(buf + done, recv_area_.data() + size_t(r.slot) * kBufBytes + r.offset, n);
        done += n;
        r.offset += n;
        if (r.offset == r.len) {
          if ((err = post_recv(r.slot))) break;
          ++consumed_;
          ready_.pop_front();
        }
      }
      maybe_send_credits();
    } else {
      for (const Ready& r : ready_) {
        if (done == len) break;
        uint32_t n = uint32_t(std::min<size_t>(len - done, r.len - r.offset));
        std::memcpy(buf + done, recv_area_.data() + size_t(r.slot) * kBufBytes + r.offset, n);
        done += n;
      }
    }
    if (err || done == len || (done > 0 && (!wait_all || peek))) break;
    if (fin_received_ || peer_closed_ || local_closed_) break;  // end of stream
    if (error_) {
      err = error_;
      break;
    }
    if (state_ != RsState::kConnected) {
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

int RSocket::shutdown(int how) {
  if (how == SHUT_RD) return 0;  // nothing to stop: unread data is simply not read
  if (state_ != RsState::kConnected) return ENOTCONN;
  if (local_closed_) return 0;
  std::unique_lock lock(mu_, std::adopt_lock);
  int64_t deadline = now_ms() + 2000;
  if (!fin_sent_ && !peer_closed_ && !error_) {
    while (sq_busy_ >= kSqDepth && !error_ && !peer_closed_ && now_ms() < deadline) (void)block(&lock, 10);
    if (sq_busy_ < kSqDepth && post_send(SendKind::kFin, nullptr, 0) == 0) fin_sent_ = true;
  }
  if (how == SHUT_RDWR) {
    // What was sent must arrive before the disconnect: wait (bounded) for the sends' completions.
    while (sq_busy_ > 0 && !error_ && !peer_closed_ && now_ms() < deadline) (void)block(&lock, 10);
    local_closed_ = true;
    rdma_disconnect(id_);
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
  if (!ready_.empty() || peer_closed_ || fin_received_) r |= POLLIN;
  // Hung up once nothing is left to read: a peer that sent its last bytes and
  // closed must not make a poller give up on bytes it has not read yet.
  if ((peer_closed_ || local_closed_) && ready_.empty()) r |= POLLHUP;
  if (error_) r |= POLLERR;
  if (!peer_closed_ && !local_closed_ && !fin_sent_ && credits() > 0 && send_posted_ - send_done_ < kSendSlots)
    r |= POLLOUT;
  return short(r & (events | POLLERR | POLLHUP));
}

}  // namespace uroce::rsockets

namespace uroce::rsockets {

int RSocket::iomap(void* buf, size_t len, int prot, int64_t offset, int64_t* out) {
  if (state_ != RsState::kConnected || !pd_) return ENOTCONN;
  if (prot & ~(PROT_WRITE | PROT_NONE)) return EINVAL;
  if (offset == -1) offset = int64_t(reinterpret_cast<uintptr_t>(buf));  // as librdmacm
  *out = offset;
  if (!(prot & PROT_WRITE)) return 0;  // a local source for riowrite: uroce copies anyway
  if (local_maps_.size() >= kMaxIoMaps) return ENOMEM;
  ibv_mr* mr = ibv_reg_mr(pd_, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr) return errno;
  std::unique_lock lock(mu_, std::adopt_lock);
  int err = wait_send_room(&lock, false, false);
  lock.release();
  IomapMsg m{kIomapMagic, mr->rkey, uint64_t(offset), reinterpret_cast<uintptr_t>(buf), len};
  if (!err) err = post_send(SendKind::kIomap, reinterpret_cast<const uint8_t*>(&m), sizeof m);
  if (err) {
    ibv_dereg_mr(mr);
    return err;
  }
  local_maps_.push_back({uint64_t(offset), m.addr, len, mr->rkey, mr});
  return 0;
}

int RSocket::iounmap(void* buf, size_t len) {
  auto it = std::find_if(local_maps_.begin(), local_maps_.end(),
                         [&](const IoRegion& r) { return r.addr == reinterpret_cast<uintptr_t>(buf) && r.len == len; });
  if (it == local_maps_.end()) return EINVAL;
  ibv_dereg_mr(it->mr);
  local_maps_.erase(it);
  return 0;
}

ssize_t RSocket::iowrite(const uint8_t* buf, size_t count, uint64_t offset, bool nb) {
  std::unique_lock lock(mu_, std::adopt_lock);
  size_t done = 0;
  int err = 0;
  while (done < count && !(err = wait_send_room(&lock, false, nb))) {
    uint64_t pos = offset + done;
    auto region = std::find_if(remote_maps_.begin(), remote_maps_.end(),
                               [&](const IoRegion& r) { return pos >= r.offset && pos - r.offset < r.len; });
    if (region == remote_maps_.end()) {
      err = EINVAL;  // the peer mapped nothing there
      break;
    }
    uint32_t chunk = uint32_t(std::min<uint64_t>({count - done, kBufBytes, region->len - (pos - region->offset)}));
    uint32_t slot = send_posted_ % kSendSlots;
    uint8_t* src = send_area_.data() + size_t(slot) * kBufBytes;
    std::memcpy(src, buf + done, chunk);
    ibv_sge sge{reinterpret_cast<uintptr_t>(src), chunk, send_mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = kSendWrId | slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = region->addr + (pos - region->offset);
    wr.wr.rdma.rkey = region->rkey;
    ibv_send_wr* bad = nullptr;
    if ((err = ibv_post_send(id_->qp, &wr, &bad))) break;
    ++sq_busy_;
    ++send_posted_;
    done += chunk;
  }
  lock.release();
  if (done > 0) return ssize_t(done);
  return -err;
}

}  // namespace uroce::rsockets
