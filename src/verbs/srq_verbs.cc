// Shared receive queues and asynchronous events.
#include <infiniband/verbs.h>
#include <unistd.h>

#include <memory>

#include "core/cq.h"
#include "core/pd.h"
#include "core/srq.h"
#include "core/xrcd.h"
#include "engine/engine_context.h"
#include "engine/xrc_target.h"
#include "verbs/export.h"
#include "verbs/ops.h"

using uroce::core::Pd;
using uroce::core::Srq;
using uroce::engine::EngineContext;
using uroce::verbs::abi_guard;
using uroce::verbs::abi_guard_errno;

namespace uroce::verbs {

ibv_srq* create_srq(ibv_pd* ibpd, ibv_srq_attr* granted, void* srq_context) {
  const ibv_srq_attr attr = *granted;
  if (int e = core::validate_srq_attr(attr)) {
    errno = e;
    return nullptr;
  }
  EngineContext* ctx = EngineContext::from(ibpd->context);
  core::Reservation slot(ctx, core::Resource::kSrq);  // max_srq
  if (slot.error()) {
    errno = slot.error();
    return nullptr;
  }
  auto srq = std::make_unique<Srq>(ctx, Pd::from(ibpd), attr.max_wr, attr.max_sge);
  if (attr.srq_limit) {
    ibv_srq_attr limit{};
    limit.srq_limit = attr.srq_limit;
    (void)srq->modify(limit, IBV_SRQ_LIMIT);
  }
  srq->ibsrq.context = ibpd->context;
  srq->ibsrq.srq_context = srq_context;
  srq->ibsrq.pd = ibpd;
  Pd::from(ibpd)->users.fetch_add(1);
  srq->query(granted);  // report what was granted (the attributes are in/out)
  slot.keep();
  return &srq.release()->ibsrq;
}

int post_srq_recv(ibv_srq* ibsrq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) noexcept {
  Srq* srq = Srq::from(ibsrq);
  for (; wr; wr = wr->next) {
    if (int e = srq->post(*wr)) {
      *bad_wr = wr;
      return e;
    }
  }
  return 0;
}

}  // namespace uroce::verbs

UROCE_API ibv_srq* ibv_create_srq(ibv_pd* ibpd, ibv_srq_init_attr* init) {
  return abi_guard<ibv_srq*>(nullptr, [&]() -> ibv_srq* {
    if (!ibpd || !init) {
      errno = EINVAL;
      return nullptr;
    }
    return uroce::verbs::create_srq(ibpd, &init->attr, init->srq_context);
  });
}

UROCE_API int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  return abi_guard_errno([&] {
    if (!srq || !attr) return EINVAL;
    return Srq::from(srq)->modify(*attr, mask);
  });
}

UROCE_API int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  return abi_guard_errno([&] {
    if (!srq || !attr) return EINVAL;
    Srq::from(srq)->query(attr);
    return 0;
  });
}

UROCE_API int ibv_destroy_srq(ibv_srq* ibsrq) {
  return abi_guard_errno([&] {
    if (!ibsrq) return EINVAL;
    Srq* srq = Srq::from(ibsrq);
    if (srq->qp_users.load() != 0) return EBUSY;
    if (srq->xrcd) {
      EngineContext::from(ibsrq->context)->unregister_xrc_srq(srq);  // no request reaches it after this
      uroce::engine::xrc_domain_of(srq)->remove_srq(srq->srq_num);
      srq->xrc_cq->qp_users.fetch_sub(1);
      srq->xrcd->users.fetch_sub(1);
    }
    srq->pd->users.fetch_sub(1);
    srq->ctx->release(uroce::core::Resource::kSrq);
    delete srq;
    return 0;
  });
}

UROCE_API int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  if (!context || !event) {
    errno = EINVAL;
    return -1;
  }
  // One plain read, as rdma-core: blocks unless the application made async_fd
  // non-blocking (then EAGAIN); a signal that interrupts it is EINTR.
  ssize_t n = read(context->async_fd, event, sizeof *event);
  if (n == ssize_t(sizeof *event)) return 0;
  if (n >= 0) errno = EIO;
  return -1;
}

UROCE_API void ibv_ack_async_event(ibv_async_event*) {}  // events own no resources here
