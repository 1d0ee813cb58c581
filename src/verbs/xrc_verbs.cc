// XRC (IBA Vol. 1 Annex A14, rdma-core's verbs_context XRC ops): domains, XRC SRQs and
// their numbers, initiator (IBV_QPT_XRC_SEND) and target (IBV_QPT_XRC_RECV)
// QPs. The engine side is engine/xrc_target.h.
#include <fcntl.h>
#include <infiniband/verbs.h>

#include <memory>

#include "core/cq.h"
#include "core/pd.h"
#include "core/srq.h"
#include "engine/engine_context.h"
#include "engine/xrc_target.h"
#include "verbs/export.h"
#include "verbs/ops.h"

namespace uroce::verbs {

using core::Cq;
using core::Pd;
using core::Srq;
using engine::EngineContext;
using engine::EngineQp;
using engine::EngineXrcd;

namespace {

template <typename T>
T* fail(int e) {
  errno = e;
  return nullptr;
}

EngineXrcd* engine_xrcd(ibv_xrcd* x) { return static_cast<EngineXrcd*>(core::Xrcd::from(x)); }

ibv_qp* create_initiator(EngineContext* ctx, ibv_qp_init_attr_ex* attr) {
  // An initiator is an RC send queue: PD and send CQ, no receive side.
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd || attr->pd->context != ctx->ib() || !attr->send_cq)
    return fail<ibv_qp>(EINVAL);
  ibv_qp_cap cap = attr->cap;
  cap.max_recv_wr = cap.max_recv_sge = 0;
  core::QpCaps caps;
  if (int e = core::validate_qp_caps(attr->qp_type, cap, &caps)) return fail<ibv_qp>(e);
  Pd* pd = Pd::from(attr->pd);
  Cq* scq = Cq::from(attr->send_cq);
  auto* qp = new EngineQp(ctx, pd, scq, nullptr, IBV_QPT_XRC_SEND, caps, attr->sq_sig_all != 0, ctx->allocate_qp_num(),
                          attr->qp_context);
  pd->users.fetch_add(1);
  scq->qp_users.fetch_add(1);
  ctx->register_qp(qp);
  attr->cap.max_send_wr = caps.max_send_wr;
  attr->cap.max_send_sge = caps.max_send_sge;
  attr->cap.max_inline_data = caps.max_inline_data;
  attr->cap.max_recv_wr = attr->cap.max_recv_sge = 0;
  return &qp->ibqp.qp_base;
}

ibv_qp* create_target(EngineContext* ctx, ibv_qp_init_attr_ex* attr) {
  // A target has only its domain: receives, PD and CQ are the XRC SRQs'.
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd || attr->xrcd->context != ctx->ib())
    return fail<ibv_qp>(EINVAL);
  EngineXrcd* xrcd = engine_xrcd(attr->xrcd);
  core::QpCaps caps{1, 1, 1, 1, 0};
  auto qp = std::make_unique<EngineQp>(ctx, nullptr, nullptr, nullptr, IBV_QPT_XRC_RECV, caps, false,
                                       ctx->allocate_qp_num(), attr->qp_context);
  if (int e = engine::xrc_target_attach(*qp, *xrcd)) return fail<ibv_qp>(e);
  ctx->register_qp(qp.get());
  attr->cap = ibv_qp_cap{};
  return &qp.release()->ibqp.qp_base;
}

}  // namespace

ibv_qp* create_xrc_qp(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  EngineContext* ctx = EngineContext::from(context);
  core::Reservation slot(ctx, core::Resource::kQp);  // max_qp counts XRC QPs too
  if (slot.error()) return fail<ibv_qp>(slot.error());
  ibv_qp* qp = attr->qp_type == IBV_QPT_XRC_SEND ? create_initiator(ctx, attr) : create_target(ctx, attr);
  if (qp) slot.keep();
  return qp;
}

ibv_xrcd* open_xrcd(ibv_context* context, ibv_xrcd_init_attr* attr) {
  return abi_guard<ibv_xrcd*>(nullptr, [&]() -> ibv_xrcd* {
    if (!context || !attr) return fail<ibv_xrcd>(EINVAL);
    // As rdma-core's ibv_cmd_open_xrcd: unknown bits, then both FD and OFLAGS required.
    if (attr->comp_mask >= IBV_XRCD_INIT_ATTR_RESERVED) return fail<ibv_xrcd>(EOPNOTSUPP);
    if (!(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS))
      return fail<ibv_xrcd>(EINVAL);
    if (attr->oflags & ~(O_CREAT | O_EXCL)) return fail<ibv_xrcd>(EINVAL);
    auto domain = engine::XrcDomain::open(attr->fd, attr->oflags);
    if (!domain.ok()) return fail<ibv_xrcd>(domain.err());
    auto* x = new EngineXrcd();
    x->domain = std::move(*domain);
    x->ctx = EngineContext::from(context);
    x->ibxrcd.context = context;
    return &x->ibxrcd;
  });
}

ibv_qp* open_qp(ibv_context* context, ibv_qp_open_attr* attr) {
  return abi_guard<ibv_qp*>(nullptr, [&]() -> ibv_qp* {
    if (!context || !attr) return fail<ibv_qp>(EINVAL);
    // As rdma-core's ibv_cmd_open_qp: unknown bits, then NUM, XRCD and TYPE
    // required (qp_context is taken as given, as there).
    if (attr->comp_mask >= IBV_QP_OPEN_ATTR_RESERVED) return fail<ibv_qp>(EOPNOTSUPP);
    constexpr uint32_t kRequired = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
    if ((attr->comp_mask & kRequired) != kRequired) return fail<ibv_qp>(EINVAL);
    // As the kernel's ib_uverbs_open_qp / ib_open_qp: an XRC domain of this
    // context, a target QP type, a QP number the domain has a target QP of.
    if (!attr->xrcd || attr->xrcd->context != context || attr->qp_type != IBV_QPT_XRC_RECV) return fail<ibv_qp>(EINVAL);
    auto qp = engine::xrc_target_open(*EngineContext::from(context), *engine_xrcd(attr->xrcd), attr->qp_num,
                                      attr->qp_context);
    if (!qp.ok()) return fail<ibv_qp>(qp.err());
    return &(*qp)->ibqp.qp_base;
  });
}

int close_xrcd(ibv_xrcd* ibxrcd) noexcept {
  if (!ibxrcd) return EINVAL;
  EngineXrcd* x = engine_xrcd(ibxrcd);
  if (x->users.load() != 0) return EBUSY;
  delete x;
  return 0;
}

ibv_srq* create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  return abi_guard<ibv_srq*>(nullptr, [&]() -> ibv_srq* {
    if (!context || !attr) return fail<ibv_srq>(EINVAL);
    constexpr uint32_t kKnown = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
                                IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
    if (attr->comp_mask & ~kKnown) return fail<ibv_srq>(EOPNOTSUPP);
    ibv_srq_type type = (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? attr->srq_type : IBV_SRQT_BASIC;
    if (type == IBV_SRQT_TM) return fail<ibv_srq>(EOPNOTSUPP);  // tag matching: not implemented
    if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC) return fail<ibv_srq>(EINVAL);
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd || attr->pd->context != context)
      return fail<ibv_srq>(EINVAL);
    if (type == IBV_SRQT_BASIC) return create_srq(attr->pd, &attr->attr, attr->srq_context);
    // An XRC SRQ needs its domain and the CQ its completions go to.
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd || attr->xrcd->context != context ||
        !(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->cq || attr->cq->context != context)
      return fail<ibv_srq>(EINVAL);
    ibv_srq* s = create_srq(attr->pd, &attr->attr, attr->srq_context);
    if (!s) return nullptr;
    Srq* srq = Srq::from(s);
    EngineContext* ctx = EngineContext::from(context);
    EngineXrcd* xrcd = engine_xrcd(attr->xrcd);
    srq->xrcd = xrcd;
    srq->xrc_cq = Cq::from(attr->cq);
    srq->srq_num = ctx->register_xrc_srq(srq);
    // ENOMEM: the context's kXrcSrqsPerContext numbers, or the domain's kSrqs, are in use.
    if (srq->srq_num == 0 || !xrcd->domain->add_srq(srq->srq_num)) {
      if (srq->srq_num) ctx->unregister_xrc_srq(srq);
      srq->xrcd = nullptr;
      srq->xrc_cq = nullptr;
      (void)ibv_destroy_srq(s);
      return fail<ibv_srq>(ENOMEM);
    }
    srq->xrcd->users.fetch_add(1);
    srq->xrc_cq->qp_users.fetch_add(1);
    return s;
  });
}

int get_srq_num(ibv_srq* ibsrq, uint32_t* srq_num) noexcept {
  if (!ibsrq || !srq_num) return EINVAL;
  Srq* srq = Srq::from(ibsrq);
  if (!srq->xrcd) return EINVAL;  // only XRC SRQs are addressed by number
  *srq_num = srq->srq_num;
  return 0;
}

}  // namespace uroce::verbs
