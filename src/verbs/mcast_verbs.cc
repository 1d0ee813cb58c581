// UD multicast: ibv_attach_mcast / ibv_detach_mcast (engine: EngineContext::
// attach_mcast). On RoCEv2 over IPv4 a multicast group is an IPv4 multicast
// address (224.0.0.0/4) in an IPv4-mapped GID (::ffff:224.x.y.z, as rdma_cm's
// cma_iboe_set_mgid makes it); packets to it go to UDP 4791 of that address.
#include <infiniband/verbs.h>

#include <cerrno>

#include "core/device.h"
#include "engine/engine_context.h"
#include "engine/engine_qp.h"
#include "verbs/export.h"

using uroce::engine::EngineContext;
using uroce::engine::EngineQp;
using uroce::verbs::abi_guard_errno;

namespace {

// The group of an IPv4-mapped multicast GID; false for anything else.
bool multicast_group(const ibv_gid* gid, uint32_t* group) {
  return gid && uroce::core::gid_to_ipv4(*gid, group) && (*group >> 28) == 0xE;
}

EngineQp* engine_qp(ibv_qp* qp) { return static_cast<EngineQp*>(uroce::core::Qp::from(qp)); }

}  // namespace

// The LID is ignored, as on every RoCE device (the GID names the group).
UROCE_API int ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t /*lid*/) {
  return abi_guard_errno([&] {
    uint32_t group = 0;
    if (!qp || !multicast_group(gid, &group)) return EINVAL;
    return EngineContext::from(qp->context)->attach_mcast(engine_qp(qp), group);
  });
}

UROCE_API int ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t /*lid*/) {
  return abi_guard_errno([&] {
    uint32_t group = 0;
    if (!qp || !multicast_group(gid, &group)) return EINVAL;
    return EngineContext::from(qp->context)->detach_mcast(engine_qp(qp), group);
  });
}
