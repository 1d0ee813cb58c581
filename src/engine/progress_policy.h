// The progress thread's waiting policy (progress_loop.cc; docs/architecture.md,
// "How the progress thread waits"): before each turn, whether it naps (an
// application thread polls a CQ and receives for itself), sleeps on its
// sockets (with a timer tick, or deeply when nothing needs one), or goes on at
// once (more to do, or polling for the next datagram of an exchange); whether
// it takes the receive turn from a poller; how long it keeps the sockets after
// finding datagrams a poller left. A plain struct with no thread and no clock
// of its own (each call is given `now`), so that its tests run without either.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "engine/clock.h"

namespace uroce::engine {

class ProgressPolicy {
 public:
  static constexpr auto kTimerTick = std::chrono::milliseconds(1);
  static constexpr auto kQuietBeforeDeepSleep = std::chrono::milliseconds(50);
  // UROCE_POLL=auto (host/spin_advisor.h): a polling progress thread looks every
  // kSpinCheck whether an application thread has become runnable. One found
  // runnable is taken to stay so for kSpinBackoff (a thread spinning on
  // memory): each look costs a few us that would delay it after every datagram.
  static constexpr auto kSpinCheck = std::chrono::microseconds(20);
  static constexpr auto kSpinBackoff = std::chrono::milliseconds(2);
  // ... and only after a receive turn of at most kSpinBurst datagrams: a
  // request-response exchange, whose next request a wake-up would delay. A
  // stream's receiver gets larger bursts, and keeps getting them without a
  // wake-up; polling its socket would contend with the sender's softirq that
  // fills it.
  static constexpr size_t kSpinBurst = 8;
  // After the progress thread had to receive datagrams itself because no
  // application thread was polling, it keeps watching the sockets for a while
  // (a WRITE target that spins on memory polls its CQ between WRITEs, but
  // only the progress thread can take the WRITEs). The hold starts short and
  // doubles each time datagrams are found waiting again at the first nap after
  // it: a poller that was only descheduled once (a loaded machine) loses the
  // sockets for kMinHold, a WRITE target that never takes its own datagrams
  // for kMaxHold at a time (then one datagram waits for a nap again).
  static constexpr auto kMinHold = std::chrono::milliseconds(1);
  static constexpr auto kMaxHold = std::chrono::milliseconds(50);

  enum class Wait : uint8_t {
    kNap,    // on the eventfd alone: arrivals are the poller's
    kSleep,  // on the sockets, a tick long, or deeply (may_sleep_deeply)
    kNone,   // straight on: more to do, or polling (UROCE_POLL)
  };

  // `spin`: UROCE_POLL's polling time after a datagram (0: none); `spin_auto`:
  // only while no application thread is runnable, after small bursts.
  ProgressPolicy(Clock::duration spin, bool spin_auto, Clock::time_point now)
      : spin_(spin),
        spin_auto_(spin_auto),
        next_timers_(now),
        last_active_(now),
        self_receive_until_(now),
        spin_until_(now),
        next_check_(now) {}

  Wait how_to_wait(Clock::time_point now, bool poller_active) const {
    if (busy_) return Wait::kNone;
    if (now >= self_receive_until_ && poller_active) return Wait::kNap;
    return spin_.count() == 0 || now >= spin_until_ ? Wait::kSleep : Wait::kNone;
  }
  // Whether a kSleep may be without a tick: no timer armed at the last run,
  // nothing else to tick for (`ticking`: tombstones, kept XRC handles), and
  // quiet for kQuietBeforeDeepSleep (a ping-pong disarms its timer after every
  // message, and waking the thread at every post would cost a system call and
  // a context switch on the critical path).
  bool may_sleep_deeply(Clock::time_point now, bool ticking) const {
    return !timers_armed_ && !ticking && now - last_active_ >= kQuietBeforeDeepSleep;
  }
  // Whether this thread takes the receive turn after its wait. When a poller
  // receives (and no drain is asked for), only if nothing was received since
  // the last such look (`rx_packets`, the port's count, unchanged): a poller
  // that stopped polling (it spins on memory, say) must not leave datagrams
  // waiting. Not taking it leaves the thread idle (not busy).
  bool take_turn(Clock::time_point now, bool poller_active, bool drain_due, uint64_t rx_packets) {
    if (drain_due || now < self_receive_until_ || !poller_active) return true;
    bool take = rx_packets == rx_at_nap_;
    rx_at_nap_ = rx_packets;
    if (!take) busy_ = false;
    return take;
  }
  // The receive turn's outcome: `received` datagrams, `busy` (more at once).
  // Datagrams that waited through a nap: watch the sockets for `hold`.
  void turn_taken(Clock::time_point now, size_t received, bool napped, bool busy) {
    busy_ = busy;
    if (!received || !napped) return;
    bool again = now - self_receive_until_ < 2 * kMinHold;  // at the first nap after the last hold
    hold_ = again ? std::min<Clock::duration>(2 * hold_, kMaxHold) : Clock::duration(kMinHold);
    self_receive_until_ = now + hold_;
  }
  bool busy() const { return busy_; }

  // Timers run every kTimerTick (at once after a deep sleep).
  bool timers_due(Clock::time_point now) const { return now >= next_timers_; }
  void timers_ran(Clock::time_point now, bool still_armed) {
    timers_armed_ = still_armed;
    next_timers_ = now + kTimerTick;
  }

  // The turn's end: activity noted, polling started after a small burst and
  // kept on only while `application_runnable()` says no (UROCE_POLL=auto, which
  // it is asked at most every kSpinCheck, or kSpinBackoff after a yes).
  template <class Runnable>
  void turn_ended(Clock::time_point now, size_t received, Runnable application_runnable) {
    if (timers_armed_ || received) last_active_ = now;
    if (received && (!spin_auto_ || received <= kSpinBurst)) spin_until_ = now + spin_;
    if (!spin_auto_ || now >= spin_until_) return;
    if (now >= next_check_) {
      spin_ok_ = !application_runnable();
      next_check_ = now + (spin_ok_ ? Clock::duration(kSpinCheck) : Clock::duration(kSpinBackoff));
    }
    if (!spin_ok_) spin_until_ = now;
  }

 private:
  const Clock::duration spin_;
  const bool spin_auto_;
  Clock::time_point next_timers_;
  Clock::time_point last_active_;         // a timer armed or a datagram received
  Clock::time_point self_receive_until_;  // see kMinHold
  Clock::time_point spin_until_;
  Clock::time_point next_check_;  // of application_runnable
  Clock::duration hold_ = kMinHold;
  uint64_t rx_at_nap_ = 0;    // rx_packets at the last look while a poller received
  bool timers_armed_ = true;  // until timers_ran says otherwise
  bool busy_ = false;         // more to receive or send at once
  bool spin_ok_ = false;      // no application thread was runnable at the last check
};

}  // namespace uroce::engine
