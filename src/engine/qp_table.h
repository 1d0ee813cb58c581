// An engine's QPs by number (every packet names its QP by number), with what
// else the receive path finds by number: the UD multicast groups' members and
// the XRC SRQs.
//
// Lock contract: mu() is held shared by the receive path for a whole burst
// (and by the walks over every QP: timers, READ responses, deferred ACKs);
// every change takes it exclusively, so removing a QP or an SRQ also waits
// for the burst that may be using it. The engine keeps its lists of QPs with
// work pending (READ responses, deferred ACKs) under the same lock for the
// same reason. find, for_each, mcast_members and find_xrc_srq: caller holds
// mu() (shared or exclusive); the rest take it themselves unless named
// *_locked.
#pragma once

#include <cstdint>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/shared_fast_mutex.h"
#include "core/srq.h"
#include "engine/engine_qp.h"
#include "transport/datagram.h"

namespace uroce::engine {

class QpTable {
 public:
  // `transport`: where multicast groups are joined and left (its UDP layer).
  explicit QpTable(transport::DatagramTransport* transport) : transport_(transport) {}
  base::SharedFastMutex& mu() { return mu_; }

  // A fresh number: `slot` << 16 | 16 random bits, or 24 random bits when
  // `slot` < 0 (QP0/QP1 are never drawn). Random so that a blind sender cannot
  // guess them. Reserved from the moment it is drawn until insert takes it:
  // two threads creating QPs at once must not draw the same number, which
  // neither has inserted yet (with 16 random bits a slot this was seen). A
  // number never inserted (the QP's construction failed) stays reserved.
  uint32_t allocate_num(int slot);
  void insert(EngineQp* qp);
  // Removes `qp` and its multicast memberships (a group it was the last
  // member of is left). Caller holds mu() exclusively.
  void erase_locked(EngineQp* qp);
  EngineQp* find(uint32_t qpn) const {
    auto it = qps_.find(qpn);
    return it == qps_.end() ? nullptr : it->second;
  }
  template <class F>
  void for_each(F&& f) const {
    for (const auto& entry : qps_) f(*entry.second);
  }

  // UD multicast (ibv_attach_mcast): packets for QPN 0xFFFFFF sent to the
  // IPv4 group `group` reach every UD QP attached to it. The first attach
  // joins the group on the host socket, the last detach (or erase) leaves it.
  // attach: 0 (also when attached already), EINVAL for a non-UD QP, ENOMEM
  // past max_mcast_grp / max_mcast_qp_attach, the errno of the join; detach:
  // 0, or EINVAL when not attached.
  int attach_mcast(EngineQp* qp, uint32_t group);
  int detach_mcast(EngineQp* qp, uint32_t group);
  // The QPs attached to the IPv4 group `group`, or null.
  const std::vector<EngineQp*>* mcast_members(const transport::IpAddress& group) const;

  // XRC SRQ numbers: (`port` << 8) | index (xrc_target.h). register returns
  // the number, or 0 when kXrcSrqsPerContext exist already.
  uint32_t register_xrc_srq(core::Srq* srq, uint16_t port);
  void unregister_xrc_srq(core::Srq* srq);
  core::Srq* find_xrc_srq(uint32_t srq_num, uint16_t port) const;

 private:
  void leave_group_locked(uint32_t group);

  transport::DatagramTransport* transport_;
  base::SharedFastMutex mu_;
  std::unordered_map<uint32_t, EngineQp*> qps_;
  std::unordered_set<uint32_t> reserved_;                       // drawn, not yet inserted
  std::unordered_map<uint32_t, std::vector<EngineQp*>> mcast_;  // group -> attached QPs
  std::vector<core::Srq*> xrc_srqs_;                            // by index
};

}  // namespace uroce::engine
