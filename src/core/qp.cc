#include "core/qp.h"

#include <cerrno>
#include <cstring>

#include "core/ah.h"
#include "core/context.h"
#include "core/cq.h"
#include "core/limits.h"
#include "core/mr.h"
#include "core/qp_attr_rules.h"
#include "core/wr_opcode.h"
#include "wire/psn.h"

namespace uroce::core {

int validate_qp_caps(ibv_qp_type type, const ibv_qp_cap& r, QpCaps* out) {
  (void)type;
  if (r.max_send_wr > kMaxQpWr || r.max_recv_wr > kMaxQpWr || r.max_send_sge > kMaxSge || r.max_recv_sge > kMaxSge ||
      r.max_inline_data > kMaxInlineData)
    return EINVAL;
  out->max_send_wr = round_up_pow2(r.max_send_wr ? r.max_send_wr : 1);
  out->max_recv_wr = round_up_pow2(r.max_recv_wr ? r.max_recv_wr : 1);
  out->max_send_sge = r.max_send_sge ? r.max_send_sge : 1;
  out->max_recv_sge = r.max_recv_sge ? r.max_recv_sge : 1;
  // Inline data is copied into the WQE; report at least a useful minimum, as
  // rxe rounds it up to the WQE size.
  out->max_inline_data = r.max_inline_data < 64 ? 64 : r.max_inline_data;
  return 0;
}

Qp::Qp(Context* c, Pd* p, Cq* scq, Cq* rcq, ibv_qp_type t, const QpCaps& cp, bool sig_all, uint32_t qp_num,
       void* qp_context)
    : ctx(c), pd(p), send_cq(scq), recv_cq(rcq), type(t), sq_sig_all(sig_all), caps(cp) {
  ibv_qp& q = ibqp.qp_base;
  q.context = c->ib();
  q.qp_context = qp_context;
  q.pd = p ? &p->ibpd : nullptr;  // XRC targets have none
  q.send_cq = scq ? reinterpret_cast<ibv_cq*>(&scq->ibcq) : nullptr;
  q.recv_cq = rcq ? reinterpret_cast<ibv_cq*>(&rcq->ibcq) : nullptr;
  q.handle = qp_num;
  q.qp_num = qp_num;
  q.state = IBV_QPS_RESET;
  q.qp_type = t;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  attr.qp_state = IBV_QPS_RESET;
  attr.path_mtu = IBV_MTU_1024;
  attr.port_num = 1;
  sq.init(cp.max_send_wr, cp.max_send_sge, cp.max_inline_data);
  rq.init(cp.max_recv_wr, cp.max_recv_sge);
}

Qp::~Qp() = default;

namespace {

int check_values(const Context& ctx, const ibv_qp_attr& a, int mask) {
  if ((mask & IBV_QP_PORT) && a.port_num != 1) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && a.pkey_index != 0) return EINVAL;
  // Only the remote bits mean something for a QP; the other access flags of
  // memory registration (ON_DEMAND, MW_BIND, ...) are accepted and ignored, as
  // rxe and mlx5 do (rdma-core's pyverbs passes an MR's flags here).
  if ((mask & IBV_QP_ACCESS_FLAGS) && (a.qp_access_flags & ~kSupportedAccess)) return EINVAL;
  if (mask & IBV_QP_AV) {
    // RoCE needs a GRH: the GID is the IP address (rxe rejects AVs without one).
    if (!a.ah_attr.is_global) return EINVAL;
    if (a.ah_attr.port_num != 0 && a.ah_attr.port_num != 1) return EINVAL;
    if (!gid_pair_valid(ctx, a.ah_attr.grh.sgid_index, a.ah_attr.grh.dgid)) return EINVAL;
  }
  if ((mask & IBV_QP_PATH_MTU) && (a.path_mtu < IBV_MTU_256 || a.path_mtu > Context::kMaxMtu)) return EINVAL;
  if ((mask & IBV_QP_TIMEOUT) && a.timeout > 31) return EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && a.retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && a.rnr_retry > 7) return EINVAL;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_DEST_QPN) && a.dest_qp_num > wire::kPsnMask) return EINVAL;
  if ((mask & IBV_QP_QKEY) && (a.qkey & 0x80000000u)) return EPERM;  // privileged Q_Key
  if ((mask & IBV_QP_CAP)) return EINVAL;                            // resizing work queues is not supported
  return 0;
}

}  // namespace

int modify_qp_attrs(ibv_qp_type type, const Context& ctx, ibv_qp_attr& attr, const ibv_qp_attr& a, int mask) {
  ibv_qp_state cur = attr.qp_state;
  ibv_qp_state next = (mask & IBV_QP_STATE) ? a.qp_state : cur;
  if ((mask & IBV_QP_CUR_STATE) && a.cur_qp_state != cur) return EINVAL;
  if (int e = check_modify_mask(type, cur, next, mask)) return e;
  if (int e = check_values(ctx, a, mask)) return e;

  if (mask & IBV_QP_ACCESS_FLAGS) attr.qp_access_flags = a.qp_access_flags;
  if (mask & IBV_QP_PKEY_INDEX) attr.pkey_index = a.pkey_index;
  if (mask & IBV_QP_PORT) attr.port_num = a.port_num;
  if (mask & IBV_QP_QKEY) attr.qkey = a.qkey;
  if (mask & IBV_QP_AV) attr.ah_attr = a.ah_attr;
  if (mask & IBV_QP_PATH_MTU) attr.path_mtu = a.path_mtu;
  if (mask & IBV_QP_TIMEOUT) attr.timeout = a.timeout;
  if (mask & IBV_QP_RETRY_CNT) attr.retry_cnt = a.retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) attr.rnr_retry = a.rnr_retry;
  if (mask & IBV_QP_RQ_PSN) attr.rq_psn = a.rq_psn & wire::kPsnMask;
  if (mask & IBV_QP_SQ_PSN) attr.sq_psn = a.sq_psn & wire::kPsnMask;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) attr.max_rd_atomic = a.max_rd_atomic;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) attr.min_rnr_timer = a.min_rnr_timer;
  if (mask & IBV_QP_DEST_QPN) attr.dest_qp_num = a.dest_qp_num;
  if (mask & IBV_QP_ALT_PATH) attr.alt_ah_attr = a.alt_ah_attr;
  if (mask & IBV_QP_PATH_MIG_STATE) attr.path_mig_state = a.path_mig_state;
  if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) attr.en_sqd_async_notify = a.en_sqd_async_notify;
  attr.qp_state = next;
  attr.cur_qp_state = next;
  return 0;
}

int Qp::apply_modify(const ibv_qp_attr& a, int mask) {
  if (int e = modify_qp_attrs(type, *ctx, attr, a, mask)) return e;
  set_state(attr.qp_state);
  return 0;
}

void Qp::query(ibv_qp_attr* a, ibv_qp_init_attr* init) const {
  *a = attr;
  a->cap.max_send_wr = caps.max_send_wr;
  a->cap.max_recv_wr = caps.max_recv_wr;
  a->cap.max_send_sge = caps.max_send_sge;
  a->cap.max_recv_sge = caps.max_recv_sge;
  a->cap.max_inline_data = caps.max_inline_data;
  a->sq_draining = 0;
  if (init) {
    std::memset(init, 0, sizeof *init);
    init->qp_context = ibqp.qp_base.qp_context;
    init->send_cq = ibqp.qp_base.send_cq;
    init->recv_cq = ibqp.qp_base.recv_cq;
    init->srq = ibqp.qp_base.srq;
    init->cap = a->cap;
    init->qp_type = type;
    init->sq_sig_all = sq_sig_all;
  }
}

// From the opcode table (core/wr_opcode.h). An opcode the QP type does not
// allow is EINVAL (IBA 9.4: UD sends only; UC no READ, atomics or SEND with
// Invalidate); one uroce does not implement (TSO, driver opcodes) is
// EOPNOTSUPP, as is any opcode on a QP type without sends here, except on UD,
// where anything but a SEND is EINVAL.
int Qp::check_send_opcode(const ibv_send_wr& wr) const {
  if (!wr_qp_type_bit(type)) return EOPNOTSUPP;
  if (wr_allowed(type, wr.opcode)) return 0;
  return type == IBV_QPT_UD || wr_opcode_info(wr.opcode).qp_types ? EINVAL : EOPNOTSUPP;
}

int Qp::enqueue_send(const ibv_send_wr& in, bool type1_bind) {
  // Local operations (bind, invalidate) move no data: their SGEs are ignored.
  ibv_send_wr local;
  const ibv_send_wr* p = &in;
  if (wr_has(in.opcode, kWrLocal)) {
    local = in;
    local.num_sge = 0;
    local.sg_list = nullptr;
    p = &local;
  }
  const ibv_send_wr& wr = *p;
  if (int e = check_send_opcode(wr)) return e;
  if (wr.num_sge < 0 || uint32_t(wr.num_sge) > caps.max_send_sge) return EINVAL;
  if (sq.full()) return ENOMEM;
  uint64_t total = 0;
  for (int i = 0; i < wr.num_sge; ++i) total += wr.sg_list[i].length;
  if (total > kMaxMsgSize) return EINVAL;
  // Atomics read and write exactly 8 bytes (as rxe: the local buffer is checked
  // at post; remote alignment is the responder's check, IBA 9.4.5).
  if (is_atomic(wr.opcode) && total != 8) return EINVAL;
  // UD: one packet per message, to the address handle's destination.
  const Ah* ah = nullptr;
  if (type == IBV_QPT_UD) {
    if (!wr.wr.ud.ah || total > mtu_bytes(ctx->active_mtu())) return EINVAL;
    ah = Ah::from(wr.wr.ud.ah);
  }
  bool is_inline = (wr.send_flags & IBV_SEND_INLINE) && !is_read_or_atomic(wr.opcode);
  if (is_inline && total > caps.max_inline_data) return EINVAL;

  uint32_t index = sq.posted;
  SendWqe& w = sq.at(index);
  w = SendWqe{};
  w.wr_id = wr.wr_id;
  w.opcode = wr.opcode;
  w.send_flags = wr.send_flags;
  w.imm_data = wr.imm_data;  // union with invalidate_rkey (SEND_WITH_INV, LOCAL_INV)
  w.invalidate_rkey = wr.invalidate_rkey;
  if (is_atomic(wr.opcode)) {
    w.remote_addr = wr.wr.atomic.remote_addr;
    w.rkey = wr.wr.atomic.rkey;
    w.compare_add = wr.wr.atomic.compare_add;
    w.swap = wr.wr.atomic.swap;
  } else if (wr.opcode == IBV_WR_BIND_MW) {
    // Type 2 windows are bound through the send queue; type 1 by ibv_bind_mw.
    if (!wr.bind_mw.mw || wr.bind_mw.mw->type != (type1_bind ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2)) return EINVAL;
    const ibv_mw_bind_info& bi = wr.bind_mw.bind_info;
    w.bind_mw = Mr::from(wr.bind_mw.mw);
    w.bind = MwBind{wr.bind_mw.rkey, bi.mr ? bi.mr->lkey : 0, bi.addr, bi.length, bi.mw_access_flags};
  } else if (ah) {
    w.ud = UdDest{ah->attr.grh.dgid, ah->dst_port, ah->attr.grh.sgid_index, wr.wr.ud.remote_qpn, wr.wr.ud.remote_qkey};
  } else {
    w.remote_addr = wr.wr.rdma.remote_addr;
    w.rkey = wr.wr.rdma.rkey;
  }
  if (type == IBV_QPT_XRC_SEND) w.remote_srqn = wr.qp_type.xrc.remote_srqn & 0xFFFFFF;
  w.length = uint32_t(total);
  w.is_inline = is_inline;
  w.signaled = sq_sig_all || (wr.send_flags & IBV_SEND_SIGNALED);
  if (is_inline) {
    // Inline data is copied now; no lkey is checked (IBA: inline needs none).
    uint8_t* dst = sq.inline_buf(index);
    for (int i = 0; i < wr.num_sge; ++i) {
      // An empty entry may have a null address (UCX's inline sends do): no copy, no UB.
      if (wr.sg_list[i].length == 0) continue;
      std::memcpy(dst, reinterpret_cast<const void*>(wr.sg_list[i].addr), wr.sg_list[i].length);
      dst += wr.sg_list[i].length;
    }
    w.num_sge = 0;
  } else {
    Sge* s = sq.sges(index);
    for (int i = 0; i < wr.num_sge; ++i) s[i] = Sge{wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
    w.num_sge = uint16_t(wr.num_sge);
  }
  ++sq.posted;
  return 0;
}

int Qp::enqueue_recv(const ibv_recv_wr& wr) {
  if (wr.num_sge < 0 || uint32_t(wr.num_sge) > caps.max_recv_sge) return EINVAL;
  if (rq.full()) return ENOMEM;
  rq.push(wr);
  return 0;
}

}  // namespace uroce::core
