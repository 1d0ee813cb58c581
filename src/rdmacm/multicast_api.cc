// rdma_cm multicast: rdma_join_multicast, rdma_join_multicast_ex and
// rdma_leave_multicast for UD ids (RDMA_PS_UDP), as librdmacm does them over
// RoCE: the group is an IPv4 multicast address, its GID the IPv4-mapped one
// (cma_iboe_set_mgid), the id's QP is attached to it (ibv_attach_mcast) and
// RDMA_CM_EVENT_MULTICAST_JOIN carries the address handle, QPN 0xFFFFFF and
// the Q_Key to send to it. No subnet manager to ask: a join completes at once.
#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <cerrno>

#include "rdmacm/api_util.h"
#include "rdmacm/cm_service.h"

using uroce::rdmacm::cm_call;
using uroce::rdmacm::CmId;
using uroce::rdmacm::CmService;

namespace {

constexpr uint32_t kMulticastQpn = 0xFFFFFF;

// The IPv4 multicast group of `addr` (host order), or 0.
uint32_t group_of(const sockaddr* addr) {
  if (!addr || addr->sa_family != AF_INET) return 0;
  uint32_t ip = ntohl(reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr);
  return IN_MULTICAST(ip) ? ip : 0;
}

ibv_gid group_gid(uint32_t group) {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xff;
  g.raw[12] = uint8_t(group >> 24);
  g.raw[13] = uint8_t(group >> 16);
  g.raw[14] = uint8_t(group >> 8);
  g.raw[15] = uint8_t(group);
  return g;
}

// Called with the service's mutex held.
int join(CmId* id, const sockaddr* addr, uint32_t flags, void* context) {
  uint32_t group = group_of(addr);
  if (!group) return EINVAL;  // IPv4 multicast groups only (no IPv6 in uroce yet)
  if (!id->port.device || id->abi.ps != RDMA_PS_UDP) return EINVAL;  // bound or resolved UD ids
  if (std::any_of(id->multicast.begin(), id->multicast.end(), [&](const auto& m) { return m.group == group; }))
    return EADDRINUSE;
  ibv_gid gid = group_gid(group);
  // A send-only member sends to the group but receives nothing from it.
  bool attach = id->abi.qp && !(flags & RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER);
  if (attach)
    if (int e = ibv_attach_mcast(id->abi.qp, &gid, 0)) return e;
  id->multicast.push_back({group, attach ? id->abi.qp : nullptr});
  uroce::rdmacm::EventParams p;
  p.ud = true;
  p.ud_context = context;  // librdmacm hands the join's context back here
  p.ah_attr.is_global = 1;
  p.ah_attr.grh.dgid = gid;
  p.ah_attr.grh.sgid_index = id->port.gid_index;
  p.ah_attr.grh.hop_limit = uroce::rdmacm::kHopLimit;
  p.ah_attr.grh.traffic_class = id->tos.value_or(0);
  p.ah_attr.port_num = 1;
  p.qp_num = kMulticastQpn;
  p.qkey = RDMA_UDP_QKEY;
  CmService::get().queue_event(id, RDMA_CM_EVENT_MULTICAST_JOIN, 0, p);
  return 0;
}

int join_and_wait(rdma_cm_id* id, const sockaddr* addr, uint32_t flags, void* context) {
  if (!id) return EINVAL;
  auto& s = CmService::get();
  {
    std::lock_guard lock(s.mu);
    if (int err = join(CmId::from(id), addr, flags, context)) return err;
  }
  return s.complete_sync(CmId::from(id));
}

}  // namespace

namespace uroce::rdmacm {

// Leaves every group (rdma_destroy_id); the service's mutex is held.
void leave_all_multicast(CmId* id) {
  for (const CmId::Multicast& m : id->multicast) {
    ibv_gid gid = group_gid(m.group);
    if (m.attached_qp && m.attached_qp == id->abi.qp) (void)ibv_detach_mcast(m.attached_qp, &gid, 0);
  }
  id->multicast.clear();
}

}  // namespace uroce::rdmacm

UROCE_API int rdma_join_multicast(rdma_cm_id* id, sockaddr* addr, void* context) {
  return cm_call([&] { return join_and_wait(id, addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context); });
}

UROCE_API int rdma_join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* attr, void* context) {
  return cm_call([&] {
    constexpr uint32_t kNeeded = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
    if (!attr || (attr->comp_mask & kNeeded) != kNeeded || (attr->comp_mask & ~kNeeded)) return EINVAL;
    if (attr->join_flags != RDMA_MC_JOIN_FLAG_FULLMEMBER && attr->join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
      return EINVAL;
    return join_and_wait(id, attr->addr, attr->join_flags, context);
  });
}

UROCE_API int rdma_leave_multicast(rdma_cm_id* id, sockaddr* addr) {
  return cm_call([&] {
    uint32_t group = group_of(addr);
    if (!id || !group) return EINVAL;
    auto& s = CmService::get();
    std::lock_guard lock(s.mu);
    CmId* cm = CmId::from(id);
    auto it = std::find_if(cm->multicast.begin(), cm->multicast.end(), [&](const auto& m) { return m.group == group; });
    if (it == cm->multicast.end()) return EADDRNOTAVAIL;
    ibv_gid gid = group_gid(group);
    // Not if the QP it attached was destroyed since (rdma_destroy_qp clears id->qp).
    if (it->attached_qp && it->attached_qp == id->qp) (void)ibv_detach_mcast(it->attached_qp, &gid, 0);
    cm->multicast.erase(it);
    return 0;
  });
}
