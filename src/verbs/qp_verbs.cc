// Queue pairs: create/modify/query/destroy and the posting data path.
#include <infiniband/verbs.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/cq.h"
#include "core/qp_attr_rules.h"
#include "core/srq.h"
#include "engine/engine_context.h"
#include "engine/post_send.h"
#include "engine/roles.h"
#include "engine/xrc_target.h"
#include "verbs/export.h"
#include "verbs/ops.h"

using uroce::core::Cq;
using uroce::core::Pd;
using uroce::engine::EngineContext;
using uroce::engine::EngineQp;
using uroce::verbs::abi_guard;
using uroce::verbs::abi_guard_errno;

namespace {

EngineQp* engine_qp(ibv_qp* qp) { return static_cast<EngineQp*>(uroce::core::Qp::from(qp)); }

}  // namespace

UROCE_API ibv_qp* ibv_create_qp(ibv_pd* ibpd, ibv_qp_init_attr* init) {
  return abi_guard<ibv_qp*>(nullptr, [&]() -> ibv_qp* {
    if (!ibpd || !init) {
      errno = EINVAL;
      return nullptr;
    }
    if (init->qp_type == IBV_QPT_XRC_SEND || init->qp_type == IBV_QPT_XRC_RECV) {
      // ibv_create_qp_ex passes a PD-only ibv_qp_init_attr_ex here. An initiator
      // needs no more; a target needs its XRC domain, which only the _ex form
      // has (EINVAL without it).
      ibv_qp_init_attr_ex ex{};
      ex.qp_context = init->qp_context;
      ex.send_cq = init->send_cq;
      ex.cap = init->cap;
      ex.qp_type = init->qp_type;
      ex.sq_sig_all = init->sq_sig_all;
      ex.comp_mask = IBV_QP_INIT_ATTR_PD;
      ex.pd = ibpd;
      ibv_qp* qp = uroce::verbs::create_xrc_qp(ibpd->context, &ex);
      if (qp) init->cap = ex.cap;
      return qp;
    }
    if (init->qp_type != IBV_QPT_RC && init->qp_type != IBV_QPT_UC && init->qp_type != IBV_QPT_UD) {
      errno = EOPNOTSUPP;  // raw packet: see docs/architecture.md, "Not implemented"
      return nullptr;
    }
    if (!init->send_cq || !init->recv_cq) {
      errno = EINVAL;
      return nullptr;
    }
    uroce::core::QpCaps caps;
    if (int e = uroce::core::validate_qp_caps(init->qp_type, init->cap, &caps)) {
      errno = e;
      return nullptr;
    }
    EngineContext* ctx = EngineContext::from(ibpd->context);
    uroce::core::Reservation slot(ctx, uroce::core::Resource::kQp);  // max_qp
    if (slot.error()) {
      errno = slot.error();
      return nullptr;
    }
    Pd* pd = Pd::from(ibpd);
    Cq* scq = Cq::from(init->send_cq);
    Cq* rcq = Cq::from(init->recv_cq);
    auto* qp = new EngineQp(ctx, pd, scq, rcq, init->qp_type, caps, init->sq_sig_all != 0, ctx->allocate_qp_num(),
                            init->qp_context);
    pd->users.fetch_add(1);
    scq->qp_users.fetch_add(1);
    rcq->qp_users.fetch_add(1);
    if (init->srq) {
      qp->srq = uroce::core::Srq::from(init->srq);
      qp->srq->qp_users.fetch_add(1);
    }
    qp->ibqp.qp_base.pd = ibpd;  // as libibverbs: the PD (or parent domain) it was created with
    ctx->register_qp(qp);
    slot.keep();
    // Report what was granted (verbs: cap is an in/out parameter).
    init->cap.max_send_wr = caps.max_send_wr;
    init->cap.max_recv_wr = caps.max_recv_wr;
    init->cap.max_send_sge = caps.max_send_sge;
    init->cap.max_recv_sge = caps.max_recv_sge;
    init->cap.max_inline_data = caps.max_inline_data;
    return &qp->ibqp.qp_base;
  });
}

UROCE_API int ibv_modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int attr_mask) {
  return abi_guard_errno([&] {
    if (!ibqp || !attr) return EINVAL;
    EngineQp* qp = engine_qp(ibqp);
    attr_mask = uroce::core::without_ignored_attrs(qp->type, attr_mask);  // as the kernel's uverbs
    // A disconnect (ERR) flushes the queues: first let the progress thread
    // take in what had already arrived, so that messages the peer delivered
    // are completed (and acknowledged) rather than flushed.
    if ((attr_mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_ERR) qp->engine()->drain_received();
    std::lock_guard lock(qp->mu);
    return qp->modify(*attr, attr_mask);
  });
}

UROCE_API int ibv_query_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr) {
  return abi_guard_errno([&] {
    (void)attr_mask;  // every attribute is reported, as rxe does
    if (!ibqp || !attr) return EINVAL;
    EngineQp* qp = engine_qp(ibqp);
    std::lock_guard lock(qp->mu);
    if (qp->xrc) return uroce::engine::xrc_target_query(*qp, attr, init_attr);  // any handle on a target
    qp->query(attr, init_attr);
    return 0;
  });
}

namespace {

// A connected QP destroyed with sends not yet acknowledged (or not yet sent)
// first lets them finish, as an adapter would already have put them on the
// wire: programs post unsignaled or inline sends and tear down at once
// (libfabric's rxm and UCX complete an inject before it is acknowledged), and
// a datagram lost just then would otherwise never be retransmitted, leaving
// the peer waiting for it forever. Bounded by the QP's own retry budget
// (timeout x (retry_cnt + 1)) and by kDrainMax; only while the QP can send.
constexpr auto kDrainMax = std::chrono::milliseconds(500);

void drain_sends(EngineQp& qp) {
  if (qp.type != IBV_QPT_RC && qp.type != IBV_QPT_UC && qp.type != IBV_QPT_XRC_SEND) return;
  auto budget = std::min<std::chrono::steady_clock::duration>(kDrainMax, qp.local_ack_timeout() * 8);
  auto deadline = std::chrono::steady_clock::now() + budget;
  for (;;) {
    {
      std::lock_guard lock(qp.mu);
      ibv_qp_state st = qp.state();
      if ((st != IBV_QPS_RTS && st != IBV_QPS_SQD) || qp.sq.empty()) return;
    }
    if (std::chrono::steady_clock::now() >= deadline) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

UROCE_API int ibv_destroy_qp(ibv_qp* ibqp) {
  return abi_guard_errno([&] {
    if (!ibqp) return EINVAL;
    EngineQp* qp = engine_qp(ibqp);
    EngineContext* ctx = qp->engine();
    // XRC targets: a handle drops its reference; the QP goes with the last one
    // (ib_close_qp). An opened handle is no QP of its context.
    if (qp->xrc) {
      switch (uroce::engine::xrc_target_close(*qp)) {
        case uroce::engine::HandleClose::kHandleOnly:
          delete qp;
          return 0;
        case uroce::engine::HandleClose::kQpKept:
          return 0;
        case uroce::engine::HandleClose::kDestroyQp:
          break;
      }
    }
    drain_sends(*qp);
    ctx->retire_qp(qp);  // after this the progress thread never sees it again
    // XRC initiators have no receive CQ; targets have neither CQs nor a PD.
    // Completions the QP already produced stay in its CQs, as rxe keeps them:
    // libfabric's verbs provider destroys a connection's QP and then polls its
    // CQ for what is left (a message that arrived just before the peer
    // disconnected, or an SRQ buffer it must get back).
    for (Cq* cq : {qp->send_cq, qp->recv_cq}) {
      if (cq) cq->qp_users.fetch_sub(1);
    }
    if (qp->pd) qp->pd->users.fetch_sub(1);
    if (qp->srq) qp->srq->qp_users.fetch_sub(1);
    uroce::engine::xrc_target_detach(*qp);  // XRC targets: frees the shared slot
    ctx->release(uroce::core::Resource::kQp);
    delete qp;
    return 0;
  });
}

namespace uroce::verbs {

// Posting itself is the engine's (engine/post_send.h), shared with ibv_wr_complete.
int post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad_wr) noexcept {
  return engine::post_send(*engine_qp(ibqp), wr, bad_wr, engine::PostMode::kEach);
}

int post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) noexcept {
  EngineQp* qp = engine_qp(ibqp);
  std::lock_guard lock(qp->mu);
  // A QP on an SRQ has no receive queue, nor has an XRC QP (its SRQs have).
  if (qp->state() == IBV_QPS_RESET || qp->srq || qp->type == IBV_QPT_XRC_SEND || qp->type == IBV_QPT_XRC_RECV) {
    *bad_wr = wr;
    return EINVAL;
  }
  int err = 0;
  for (; wr; wr = wr->next) {
    if ((err = qp->enqueue_recv(*wr)) != 0) {
      *bad_wr = wr;
      break;
    }
  }
  if (qp->state() == IBV_QPS_ERR) qp->flush_recv_queue();
  return err;
}

}  // namespace uroce::verbs
