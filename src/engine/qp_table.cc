#include "engine/qp_table.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <mutex>

#include "core/limits.h"
#include "engine/xrc_target.h"
#include "transport/udp_transport.h"
#include "wire/psn.h"

namespace uroce::engine {

uint32_t QpTable::allocate_num(int slot) {
  for (;;) {
    uint32_t n = 0;
    if (getrandom(&n, sizeof n, 0) != sizeof n) n = uint32_t(Clock::now().time_since_epoch().count() * 2654435761u);
    n = slot >= 0 ? uint32_t(slot) << 16 | (n & 0xFFFF) : n & wire::kPsnMask;
    if (n < 2) continue;
    std::unique_lock lock(mu_);
    if (!qps_.count(n) && reserved_.insert(n).second) return n;
  }
}

void QpTable::insert(EngineQp* qp) {
  std::unique_lock lock(mu_);
  reserved_.erase(qp->qp_num());
  qps_[qp->qp_num()] = qp;
}

void QpTable::erase_locked(EngineQp* qp) {
  qps_.erase(qp->qp_num());
  std::vector<uint32_t> emptied;
  for (auto& [group, members] : mcast_)
    if (std::erase(members, qp) && members.empty()) emptied.push_back(group);
  for (uint32_t group : emptied) leave_group_locked(group);
}

int QpTable::attach_mcast(EngineQp* qp, uint32_t group) {
  if (qp->type != IBV_QPT_UD) return EINVAL;
  std::unique_lock lock(mu_);
  auto it = mcast_.find(group);
  if (it != mcast_.end()) {
    if (std::find(it->second.begin(), it->second.end(), qp) != it->second.end()) return 0;
    if (it->second.size() >= core::kMaxMcastQpAttach) return ENOMEM;  // max_mcast_qp_attach
    it->second.push_back(qp);
    return 0;
  }
  if (mcast_.size() >= core::max_mcast_groups()) return ENOMEM;  // max_mcast_grp
  auto* udp = transport::find_layer<transport::UdpTransport>(transport_);
  if (int e = udp ? udp->set_group(group, true) : ENODEV) return e == ENOBUFS ? ENOMEM : e;  // memberships used up
  mcast_[group].push_back(qp);
  return 0;
}

int QpTable::detach_mcast(EngineQp* qp, uint32_t group) {
  std::unique_lock lock(mu_);
  auto it = mcast_.find(group);
  if (it == mcast_.end() || std::find(it->second.begin(), it->second.end(), qp) == it->second.end()) return EINVAL;
  std::erase(it->second, qp);
  if (it->second.empty()) leave_group_locked(group);
  return 0;
}

void QpTable::leave_group_locked(uint32_t group) {
  mcast_.erase(group);
  if (auto* udp = transport::find_layer<transport::UdpTransport>(transport_)) (void)udp->set_group(group, false);
}

const std::vector<EngineQp*>* QpTable::mcast_members(const transport::IpAddress& group) const {
  if (!group.is_v4()) return nullptr;  // IPv4 groups only
  auto it = mcast_.find(group.v4());
  return it == mcast_.end() ? nullptr : &it->second;
}

uint32_t QpTable::register_xrc_srq(core::Srq* srq, uint16_t port) {
  std::unique_lock lock(mu_);
  if (xrc_srqs_.empty()) xrc_srqs_.assign(kXrcSrqsPerContext, nullptr);
  for (uint32_t i = 0; i < kXrcSrqsPerContext; ++i) {
    if (xrc_srqs_[i]) continue;
    xrc_srqs_[i] = srq;
    return (uint32_t(port) << 8) | i;
  }
  return 0;
}

void QpTable::unregister_xrc_srq(core::Srq* srq) {
  std::unique_lock lock(mu_);  // as erase: waits for the burst using it
  for (core::Srq*& s : xrc_srqs_)
    if (s == srq) s = nullptr;
}

core::Srq* QpTable::find_xrc_srq(uint32_t srq_num, uint16_t port) const {
  if (xrc_srq_port(srq_num) != port || xrc_srq_index(srq_num) >= xrc_srqs_.size()) return nullptr;
  return xrc_srqs_[xrc_srq_index(srq_num)];
}

}  // namespace uroce::engine
