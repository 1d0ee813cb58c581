// What remains of destroyed RC QPs for a short while (like TCP's TIME_WAIT):
// enough to acknowledge the peer's retransmissions of requests a QP had
// already received, so that a peer whose last ACK was lost still completes
// its final WQE after this side tore down (and, typically, exited).
//
// A tombstone answers while its peer keeps retransmitting: it expires once
// the peer has been quiet for kIdle, and in any case kMaxAge after the QP was
// destroyed; at most kMax exist (the oldest gives way). A closing device waits
// up to kLingerMax until every peer has been quiet for its tombstone's period
// (quiet(): the time the peer may take to resend, four local ACK timeouts, once
// it was heard resending or from the start on a path that lost or reordered
// packets; else kQuiet).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "engine/engine_qp.h"
#include "engine/live_counters.h"
#include "transport/datagram.h"
#include "wire/headers.h"

namespace uroce::engine {

class TxBatch;

struct Tombstone {
  uint32_t qp_num = 0;
  uint32_t dest_qp_num = 0;
  uint32_t epsn = 0;
  uint32_t msn = 0;
  Path path;
  Clock::time_point created;
  Clock::time_point last_heard;
  Clock::duration quiet{};       // how long the peer must be silent before a close stops waiting
  Clock::duration resend_gap{};  // `quiet` once the peer was heard resending (tombstones.cc, add)
};

class Tombstones {
 public:
  static constexpr auto kQuiet = std::chrono::milliseconds(30);
  static constexpr auto kIdle = std::chrono::seconds(1);
  static constexpr auto kMaxAge = std::chrono::seconds(10);
  static constexpr auto kLingerMax = std::chrono::milliseconds(500);
  static constexpr size_t kMax = 1024;

  // Keeps answering for `qp`, a connected RC QP being destroyed (others: nothing).
  void add(const EngineQp& qp);
  // Whether any exists (relaxed: the receive path's and the timers' fast test).
  bool any() const { return any_.load(std::memory_order_relaxed); }
  size_t count();
  // Drops those that expired at `now`.
  void prune(Clock::time_point now);
  // A packet for no live QP: false when no tombstone has its QPN; else true,
  // with a duplicate request from the connected peer acknowledged into `tx`
  // and one from another path counted in `stats`.
  bool answer(const transport::RxDatagram& d, const wire::PacketView& pkt, TxBatch& tx, Stats& stats);
  // Whether every peer has been quiet for its tombstone's period at `now`.
  bool quiet(Clock::time_point now);

 private:
  std::mutex mu_;
  std::unordered_map<uint32_t, Tombstone> by_qpn_;  // guarded by mu_
  std::atomic<bool> any_{false};
};

}  // namespace uroce::engine
