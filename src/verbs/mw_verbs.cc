// Memory windows (ibv_alloc_mw, ibv_bind_mw): reached through the context ops
// that verbs.h's inline functions call.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <type_traits>

#include "engine/engine_context.h"
#include "engine/roles.h"
#include "verbs/export.h"
#include "verbs/ops.h"

using uroce::core::Mr;
using uroce::core::Pd;
using uroce::engine::EngineContext;
using uroce::engine::EngineQp;

namespace uroce::verbs {

ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type) {
  return abi_guard<ibv_mw*>(nullptr, [&]() -> ibv_mw* {
    // A C caller may pass any integer: read it as one (loading an enum outside
    // its values is undefined in C++), and refuse what is no window type.
    std::underlying_type_t<ibv_mw_type> raw;
    std::memcpy(&raw, &type, sizeof raw);
    if (raw != IBV_MW_TYPE_1 && raw != IBV_MW_TYPE_2) {
      errno = EINVAL;
      return nullptr;
    }
    auto r = EngineContext::from(pd->context)->mrs.add_window(Pd::from(pd), ibv_mw_type(raw));
    if (!r.ok()) {
      errno = r.err();
      return nullptr;
    }
    return &(*r)->ibmw;
  });
}

int dealloc_mw(ibv_mw* mw) {
  return abi_guard_errno([&] { return EngineContext::from(mw->context)->mrs.remove(Mr::from(mw)); });
}

// Type 1 bind: a send-queue operation like IBV_WR_BIND_MW (so its completion
// is ordered with the QP's other work); the window gets the next key tag.
int bind_mw(ibv_qp* ibqp, ibv_mw* mw, ibv_mw_bind* mw_bind) noexcept {
  EngineQp* qp = static_cast<EngineQp*>(core::Qp::from(ibqp));
  ibv_send_wr wr{};
  wr.wr_id = mw_bind->wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = mw_bind->send_flags;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = mw_bind->bind_info;
  std::lock_guard lock(qp->mu);
  if (qp->state() != IBV_QPS_RTS && qp->state() != IBV_QPS_SQD) return EINVAL;
  if (int e = qp->enqueue_send(wr, /*type1_bind=*/true)) return e;
  mw->rkey = wr.bind_mw.rkey;
  engine::requester_run(*qp, engine::TxBatch::local());
  return 0;
}

}  // namespace uroce::verbs
