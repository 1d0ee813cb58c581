// The CM MADs an engine's receiving thread hands the connection manager
// (engine/gsi.h, "Order"), kept in the order they came.
//
// A MAD that only reports an event (an RTU's ESTABLISHED, a DREQ's
// DISCONNECTED) is handled right in the engine's thread when the CM is free,
// in its place among the data; the rest waits here for the progress thread.
// A MAD is handled in place only while nothing received before it waits:
// otherwise it would overtake that one. Under load the CM's mutex is often
// taken when an RTU comes, so the RTU waits here; a DREQ right behind it
// (rdma_disconnect just after ESTABLISHED) then found the CM free and
// reported DISCONNECTED while the id still waited for its RTU, and the RTU,
// handled next, found the connection gone: the passive side never saw
// ESTABLISHED (rdmacm.cycles_1000 over QP1 under load). In the IB CM's state
// machine (IBA 12.9) the active side sends its DREQ from Established, after
// its RTU; the passive side, taking them in that order, goes from REP Sent to
// Established on the RTU and only then to DREQ Rcvd.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include "engine/gsi.h"

namespace uroce::rdmacm {

class MadInbox {
 public:
  enum class Offer { kHandled, kQueued, kDropped };

  explicit MadInbox(size_t max) : max_(max) { queue_.reserve(max); }

  // Hands `mad` to `in_place` (called with `cm_mu` held; false: it is for the
  // progress thread) when `cm_mu` is free and nothing waits before it, else
  // queues it (kQueued: wake the progress thread), or drops it when full
  // (the peer's CM resends). Lock order: `cm_mu`, then the inbox's own.
  template <class InPlace>
  Offer offer(std::mutex& cm_mu, const engine::GsiMad& mad, InPlace&& in_place) {
    if (cm_mu.try_lock()) {
      std::lock_guard cm_lock(cm_mu, std::adopt_lock);
      if (!waiting() && in_place(mad)) return Offer::kHandled;
    }
    std::lock_guard lock(mu_);
    if (queue_.size() >= max_) return Offer::kDropped;
    queue_.push_back(mad);
    return Offer::kQueued;
  }

  // The progress thread (with the CM's mutex held, so that no MAD is handled
  // in place meanwhile): everything queued, in order, into `out` (empty),
  // which keeps its capacity as the queue does: nothing allocated per MAD.
  void take(std::vector<engine::GsiMad>& out) {
    std::lock_guard lock(mu_);
    out.swap(queue_);
  }

 private:
  bool waiting() {
    std::lock_guard lock(mu_);
    return !queue_.empty();
  }

  std::mutex mu_;
  std::vector<engine::GsiMad> queue_;
  const size_t max_;
};

}  // namespace uroce::rdmacm
