// uroce C++ API: queue pairs (RC, UC, UD).
//
//   auto qp = QueuePair::create(pd, QpType::kRc, cq, cq);
//   QpEndpoint mine = *qp->local_endpoint();      // send it to the peer, receive theirs
//   UROCE_TRY(qp->connect(theirs));               // INIT -> RTR -> RTS in one call
//   UROCE_TRY(qp->post_send(SendRequest::write(slice, remote).id(WrId{1})));
//
// or one call per state: to_init(), to_rtr(remote), to_rts(). A UD QP has no remote:
// activate_ud() (or to_init / to_rtr() / to_rts()).
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <utility>

#include "uroce/ah.hpp"
#include "uroce/cq.hpp"
#include "uroce/device.hpp"
#include "uroce/endpoint.hpp"
#include "uroce/memory.hpp"
#include "uroce/result.hpp"
#include "uroce/srq.hpp"
#include "uroce/work_request.hpp"

namespace uroce {

enum class QpType { kRc = IBV_QPT_RC, kUc = IBV_QPT_UC, kUd = IBV_QPT_UD };

// The Q_Key UD QPs use unless told otherwise (that of rdma-core's ibv_ud_pingpong).
inline constexpr std::uint32_t kDefaultQkey = 0x11111111;

struct QpCaps {
  std::uint32_t max_send_wr = 64;
  std::uint32_t max_recv_wr = 64;
  std::uint32_t max_send_sge = 4;
  std::uint32_t max_recv_sge = 4;
  std::uint32_t max_inline_data = 0;
};

struct QpOptions {
  QpCaps caps{};
  const SharedReceiveQueue* srq = nullptr;  // receives come from the SRQ instead
  bool sq_sig_all = false;                  // signal every send, even unsignaled() ones
};

// RESET -> INIT.
struct InitOptions {
  std::uint8_t port = 1;
  std::uint16_t pkey_index = 0;
  Access remote_access = Access::kRemoteWrite | Access::kRemoteRead | Access::kRemoteAtomic;  // RC/UC
  std::uint32_t qkey = kDefaultQkey;                                                          // UD
};

// INIT -> RTR (RC/UC).
struct RtrOptions {
  PathOptions path{};
  ibv_mtu mtu = ibv_mtu(0);             // 0: the port's active MTU
  std::uint8_t max_dest_rd_atomic = 0;  // 0: the device's max_qp_rd_atom (capped at 16)
  std::uint8_t min_rnr_timer = 12;
};

// RTR -> RTS.
struct RtsOptions {
  std::uint8_t timeout = 14;
  std::uint8_t retry_cnt = 7;
  std::uint8_t rnr_retry = 7;
  std::uint8_t max_rd_atomic = 0;  // 0: the device's max_qp_init_rd_atom (capped at 16)
};

struct ConnectOptions {
  InitOptions init{};
  RtrOptions rtr{};
  RtsOptions rts{};
};

class QueuePair {
 public:
  static Result<QueuePair> create(const ProtectionDomain& pd, QpType type, const CompletionQueue& send_cq,
                                  const CompletionQueue& recv_cq, const QpOptions& options = {}) {
    ibv_qp_init_attr init = init_attr(type, send_cq, recv_cq, options);
    errno = 0;
    ibv_qp* raw = ::ibv_create_qp(pd.raw(), &init);
    if (raw == nullptr) return Error::from_errno(last_errno(), "ibv_create_qp");
    return QueuePair(raw, true);
  }
  static ibv_qp_init_attr init_attr(QpType type, const CompletionQueue& send_cq, const CompletionQueue& recv_cq,
                                    const QpOptions& options) noexcept {
    ibv_qp_init_attr init{};
    init.send_cq = send_cq.raw();
    init.recv_cq = recv_cq.raw();
    init.srq = options.srq ? options.srq->raw() : nullptr;
    init.cap.max_send_wr = options.caps.max_send_wr;
    init.cap.max_recv_wr = options.srq ? 0 : options.caps.max_recv_wr;
    init.cap.max_send_sge = options.caps.max_send_sge;
    init.cap.max_recv_sge = options.srq ? 0 : options.caps.max_recv_sge;
    init.cap.max_inline_data = options.caps.max_inline_data;
    init.qp_type = ibv_qp_type(type);
    init.sq_sig_all = options.sq_sig_all ? 1 : 0;
    return init;
  }
  // A QueuePair that does not destroy `raw` (e.g. the QP an rdma_cm id owns).
  static QueuePair borrow(ibv_qp* raw) noexcept { return QueuePair(raw, false); }

  QueuePair(QueuePair&& other) noexcept
      : raw_(std::exchange(other.raw_, nullptr)), owned_(std::exchange(other.owned_, false)), psn_(other.psn_) {}
  QueuePair& operator=(QueuePair&& other) noexcept {
    if (this != &other) {
      destroy();
      raw_ = std::exchange(other.raw_, nullptr);
      owned_ = std::exchange(other.owned_, false);
      psn_ = other.psn_;
    }
    return *this;
  }
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;
  ~QueuePair() { destroy(); }

  ibv_qp* raw() const noexcept { return raw_; }
  std::uint32_t qpn() const noexcept { return raw_->qp_num; }
  QpType type() const noexcept { return QpType(raw_->qp_type); }
  // The PSN this side starts sending with (random, chosen at creation).
  std::uint32_t psn() const noexcept { return psn_; }

  // What the peer needs to connect to this QP: GID (index `gid_index`), QPN, PSN, LID
  // and, for UD, the Q_Key.
  Result<QpEndpoint> local_endpoint(std::uint8_t port = 1, int gid_index = 0, std::uint32_t qkey = kDefaultQkey) const {
    Context context = Context::borrow(raw_->context);
    auto port_attr = context.query_port(port);
    if (!port_attr) return std::move(port_attr).error();
    auto gid = context.query_gid(port, gid_index);
    if (!gid) return std::move(gid).error();
    return QpEndpoint{*gid, qpn(), psn_, type() == QpType::kUd ? qkey : 0, port_attr->lid};
  }

  Result<ibv_qp_state> state() const {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    if (auto s = status_from_rc(::ibv_query_qp(raw_, &attr, IBV_QP_STATE, &init), "ibv_query_qp"); !s)
      return std::move(s).error();
    return attr.qp_state;
  }

  // The raw transition, for attributes the options do not cover.
  Status modify(ibv_qp_attr& attr, int mask) const {
    return status_from_rc(::ibv_modify_qp(raw_, &attr, mask), "ibv_modify_qp");
  }

  Status to_init(const InitOptions& options = {}) const {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.port_num = options.port;
    attr.pkey_index = options.pkey_index;
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if (type() == QpType::kUd) {
      attr.qkey = options.qkey;
      mask |= IBV_QP_QKEY;
    } else {
      attr.qp_access_flags = unsigned(int(options.remote_access));
      mask |= IBV_QP_ACCESS_FLAGS;
    }
    return with_context(modify(attr, mask), "to_init");
  }
  // RC/UC: ready to receive from `remote`.
  Status to_rtr(const QpEndpoint& remote, const RtrOptions& options = {}) const {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = options.mtu;
    if (attr.path_mtu == 0) {
      auto port = Context::borrow(raw_->context).query_port(options.path.port);
      if (!port) return std::move(port).error();
      attr.path_mtu = port->active_mtu;
    }
    attr.dest_qp_num = remote.qpn;
    attr.rq_psn = remote.psn & 0xFFFFFF;
    attr.ah_attr = make_ah_attr(remote, options.path);
    int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (type() == QpType::kRc) {
      auto rd = rd_atomic(options.max_dest_rd_atomic, false);
      if (!rd) return std::move(rd).error();
      attr.max_dest_rd_atomic = *rd;
      attr.min_rnr_timer = options.min_rnr_timer;
      mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
    return with_context(modify(attr, mask), "to_rtr");
  }
  // UD: ready to receive.
  Status to_rtr() const {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    return with_context(modify(attr, IBV_QP_STATE), "to_rtr");
  }
  Status to_rts(const RtsOptions& options = {}) const {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = psn_;
    int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (type() == QpType::kRc) {
      auto rd = rd_atomic(options.max_rd_atomic, true);
      if (!rd) return std::move(rd).error();
      attr.timeout = options.timeout;
      attr.retry_cnt = options.retry_cnt;
      attr.rnr_retry = options.rnr_retry;
      attr.max_rd_atomic = *rd;
      mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    }
    return with_context(modify(attr, mask), "to_rts");
  }
  Status to_error() const {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    return with_context(modify(attr, IBV_QP_STATE), "to_error");
  }

  // RC/UC: RESET -> INIT -> RTR -> RTS towards `remote` in one call.
  Status connect(const QpEndpoint& remote, const ConnectOptions& options = {}) const {
    if (type() == QpType::kUd) return Error(EINVAL, "QueuePair::connect: a UD QP has no remote (use activate_ud)");
    if (auto s = to_init(options.init); !s) return s;
    if (auto s = to_rtr(remote, options.rtr); !s) return s;
    return to_rts(options.rts);
  }
  // UD: RESET -> INIT -> RTR -> RTS.
  Status activate_ud(const InitOptions& options = {}) const {
    if (type() != QpType::kUd) return Error(EINVAL, "QueuePair::activate_ud: not a UD QP");
    if (auto s = to_init(options); !s) return s;
    if (auto s = to_rtr(); !s) return s;
    return to_rts();
  }

  Status post_send(const SendRequest& request) const { return post_send(std::span<const SendRequest>(&request, 1)); }
  Status post_send(std::span<const SendRequest> requests) const {
    return detail::post_chain<ibv_send_wr>(requests, "ibv_post_send", [this](ibv_send_wr* wr, ibv_send_wr** bad) {
      return ::ibv_post_send(raw_, wr, bad);
    });
  }
  Status post_recv(const RecvRequest& request) const { return post_recv(std::span<const RecvRequest>(&request, 1)); }
  Status post_recv(std::span<const RecvRequest> requests) const {
    return detail::post_chain<ibv_recv_wr>(requests, "ibv_post_recv", [this](ibv_recv_wr* wr, ibv_recv_wr** bad) {
      return ::ibv_post_recv(raw_, wr, bad);
    });
  }

 private:
  QueuePair(ibv_qp* raw, bool owned) : raw_(raw), owned_(owned), psn_(random_psn()) {}
  static std::uint32_t random_psn() {
    std::random_device device;
    return device() & 0xFFFFFF;
  }
  void destroy() noexcept {
    if (raw_ != nullptr && owned_) ::ibv_destroy_qp(raw_);
    raw_ = nullptr;
  }
  static Status with_context(Status s, const char* step) {
    if (s) return s;
    return Error(s.error().errnum(), std::string("QueuePair::") + step + ": " + s.error().message());
  }
  // A requested rd_atomic depth, or the device's (capped at 16) for 0.
  Result<std::uint8_t> rd_atomic(std::uint8_t requested, bool initiator) const {
    if (requested != 0) return requested;
    auto device = Context::borrow(raw_->context).query_device();
    if (!device) return std::move(device).error();
    int max = initiator ? device->max_qp_init_rd_atom : device->max_qp_rd_atom;
    return std::uint8_t(std::clamp(max, 1, 16));
  }

  ibv_qp* raw_ = nullptr;
  bool owned_ = false;
  std::uint32_t psn_ = 0;
};

}  // namespace uroce
