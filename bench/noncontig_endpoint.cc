#include "noncontig_endpoint.h"

#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "noncontig_layout.h"

namespace noncontig {

namespace {

constexpr int kCqDepth = 2 * kMaxBatchWrs + 64;
constexpr uint32_t kQueueDepth = kMaxBatchWrs + 64;

uint8_t* map_region(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::memset(p, 0, bytes);  // fault the pages in before anything is measured
  return static_cast<uint8_t*>(p);
}

}  // namespace

Endpoint::~Endpoint() {
  if (qp_) ibv_destroy_qp(qp_);
  if (cq_) {
    if (unacked_events_) ibv_ack_cq_events(cq_, unacked_events_);
    ibv_destroy_cq(cq_);
  }
  if (channel_) ibv_destroy_comp_channel(channel_);
  if (scattered_mr_) ibv_dereg_mr(scattered_mr_);
  if (contig_mr_) ibv_dereg_mr(contig_mr_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (ctx_) ibv_close_device(ctx_);
  if (scattered_) munmap(scattered_, kScatteredBytes);
  if (contig_) munmap(contig_, kContigBytes);
}

bool Endpoint::open(const EndpointOptions& o) {
  opt_ = o;
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (!list || num < 1) {
    std::fprintf(stderr, "noncontig: no RDMA device (run under `uroce run`?)\n");
    if (list) ibv_free_device_list(list);
    return false;
  }
  ibv_device* dev = nullptr;
  for (int i = 0; i < num && !dev; ++i)
    if (!o.device || std::strcmp(ibv_get_device_name(list[i]), o.device) == 0) dev = list[i];
  ctx_ = dev ? ibv_open_device(dev) : nullptr;
  ibv_free_device_list(list);
  if (!ctx_) {
    std::fprintf(stderr, "noncontig: cannot open device %s\n", o.device ? o.device : "(first)");
    return false;
  }
  ibv_device_attr da{};
  ibv_port_attr pa{};
  if (ibv_query_device(ctx_, &da) || ibv_query_port(ctx_, o.port, &pa) ||
      ibv_query_gid(ctx_, o.port, o.gid_index, &gid_)) {
    std::fprintf(stderr, "noncontig: ibv_query_device/port/gid (port %u, gid index %d) failed\n", o.port, o.gid_index);
    return false;
  }
  lid_ = pa.lid;
  mtu_ = pa.active_mtu;
  max_send_sge_ = std::min<uint32_t>(kMaxN, uint32_t(std::max(da.max_sge, 1)));
  max_recv_sge_ = max_send_sge_;
  max_read_sge_ = std::min<uint32_t>(max_send_sge_, uint32_t(std::max(da.max_sge_rd, 1)));
  max_rd_atomic_ = std::clamp<uint32_t>(uint32_t(da.max_qp_rd_atom), 1, 16);
  psn_ = std::random_device{}() & 0xFFFFFF;

  scattered_ = map_region(kScatteredBytes);
  contig_ = map_region(kContigBytes);
  pd_ = ibv_alloc_pd(ctx_);
  if (!scattered_ || !contig_ || !pd_) {
    std::fprintf(stderr, "noncontig: out of memory or ibv_alloc_pd failed\n");
    return false;
  }
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  scattered_mr_ = ibv_reg_mr(pd_, scattered_, kScatteredBytes, access);
  contig_mr_ = ibv_reg_mr(pd_, contig_, kContigBytes, access);
  channel_ = ibv_create_comp_channel(ctx_);
  cq_ = channel_ ? ibv_create_cq(ctx_, kCqDepth, nullptr, channel_, 0) : nullptr;
  if (!scattered_mr_ || !contig_mr_ || !cq_) {
    std::fprintf(stderr, "noncontig: ibv_reg_mr/ibv_create_cq: %s\n", std::strerror(errno));
    return false;
  }
  ibv_qp_init_attr ia{};
  ia.send_cq = cq_;
  ia.recv_cq = cq_;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = std::min<uint32_t>(kQueueDepth, uint32_t(da.max_qp_wr));
  ia.cap.max_recv_wr = ia.cap.max_send_wr;
  ia.cap.max_send_sge = max_send_sge_;
  ia.cap.max_recv_sge = max_recv_sge_;
  qp_ = ibv_create_qp(pd_, &ia);
  if (!qp_) {
    std::fprintf(stderr, "noncontig: ibv_create_qp (%u WRs, %u SGEs): %s\n", ia.cap.max_send_wr, max_send_sge_,
                 std::strerror(errno));
    return false;
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = o.port;
  a.qp_access_flags = access;
  if (int rc = ibv_modify_qp(qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    std::fprintf(stderr, "noncontig: RESET->INIT: %s\n", std::strerror(rc));
    return false;
  }
  return true;
}

Hello Endpoint::hello() const {
  Hello h{};
  h.gid = gid_;
  h.lid = lid_;
  h.qpn = qp_->qp_num;
  h.psn = psn_;
  h.mtu = mtu_;
  h.scattered = reinterpret_cast<uintptr_t>(scattered_);
  h.scattered_rkey = scattered_mr_->rkey;
  h.contig = reinterpret_cast<uintptr_t>(contig_);
  h.contig_rkey = contig_mr_->rkey;
  h.max_sge = std::min(max_send_sge_, max_recv_sge_);
  h.max_read_sge = max_read_sge_;
  return h;
}

bool Endpoint::connect(const Hello& peer) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = std::min(mtu_, ibv_mtu(peer.mtu));
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = uint8_t(max_rd_atomic_);
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = peer.gid;
  a.ah_attr.grh.sgid_index = uint8_t(opt_.gid_index);
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.dlid = uint16_t(peer.lid);
  a.ah_attr.port_num = opt_.port;
  if (int rc = ibv_modify_qp(qp_, &a,
                             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    std::fprintf(stderr, "noncontig: INIT->RTR: %s\n", std::strerror(rc));
    return false;
  }
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = psn_;
  a.max_rd_atomic = uint8_t(max_rd_atomic_);
  if (int rc = ibv_modify_qp(qp_, &a,
                             IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                 IBV_QP_MAX_QP_RD_ATOMIC)) {
    std::fprintf(stderr, "noncontig: RTR->RTS: %s\n", std::strerror(rc));
    return false;
  }
  return true;
}

int Endpoint::poll_some() {
  int n = ibv_poll_cq(cq_, 16, pending_);
  if (n < 0) std::fprintf(stderr, "noncontig: ibv_poll_cq failed\n");
  pending_count_ = std::max(n, 0);
  return n;
}

// Arms the CQ, looks once more (a completion that came before the arming raises no event),
// then sleeps on the channel's fd until an event or the timeout.
bool Endpoint::block(int timeout_ms) {
  if (ibv_req_notify_cq(cq_, 0)) {
    std::fprintf(stderr, "noncontig: ibv_req_notify_cq failed\n");
    return false;
  }
  if (poll_some() != 0) return true;
  pollfd p{channel_->fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return true;  // the caller checks its deadline
  ibv_cq* cq = nullptr;
  void* cq_context = nullptr;
  if (ibv_get_cq_event(channel_, &cq, &cq_context)) {
    std::fprintf(stderr, "noncontig: ibv_get_cq_event failed\n");
    return false;
  }
  if (++unacked_events_ == 64) ibv_ack_cq_events(cq_, unacked_events_), unacked_events_ = 0;
  return true;
}

bool Endpoint::poll(ibv_wc& wc, int timeout_ms) {
  if (pending_next_ == pending_count_) {
    pending_next_ = pending_count_ = 0;
    auto start = std::chrono::steady_clock::now();
    auto spin_end = start + std::chrono::microseconds(opt_.spin_us);
    auto deadline = start + std::chrono::milliseconds(timeout_ms);
    for (unsigned tries = 1;; ++tries) {
      int n = poll_some();
      if (n < 0) return false;
      if (n > 0) break;
      if (tries % 64 != 0) continue;
      auto now = std::chrono::steady_clock::now();
      if (now > deadline) {
        std::fprintf(stderr, "noncontig: no completion within %d ms\n", timeout_ms);
        return false;
      }
      if (opt_.spin_us >= 0 && now > spin_end && !block(10)) return false;
      if (pending_count_ > 0) break;
    }
  }
  wc = pending_[pending_next_++];
  if (wc.status != IBV_WC_SUCCESS) {
    std::fprintf(stderr, "noncontig: completion error: %s (opcode %d, wr_id %llu)\n", ibv_wc_status_str(wc.status),
                 int(wc.opcode), static_cast<unsigned long long>(wc.wr_id));
    return false;
  }
  return true;
}

}  // namespace noncontig
