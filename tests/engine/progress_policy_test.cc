// The progress thread's waiting policy (engine/progress_policy.h), without a
// thread or a clock: each case steps a ProgressPolicy through the calls the
// loop makes, at chosen instants.
#include "engine/progress_policy.h"

#include <gtest/gtest.h>

namespace uroce::engine {
namespace {

using Wait = ProgressPolicy::Wait;
using std::chrono::microseconds;
using std::chrono::milliseconds;

constexpr auto kNever = [] { return false; };  // no application thread runnable
const Clock::time_point t0 = Clock::time_point{} + std::chrono::hours(1);

// An idle thread with no poller / Expect sleeps with a tick while timers are
// (or may be) armed and for 50 ms after the last activity, then deep sleep.
TEST(ProgressPolicy, SleepsAndOnlyDeeplyAfterAQuietWhileWithoutTimers) {
  ProgressPolicy p(Clock::duration::zero(), false, t0);
  EXPECT_EQ(p.how_to_wait(t0, false), Wait::kSleep);
  EXPECT_FALSE(p.may_sleep_deeply(t0 + milliseconds(60), false));  // timers armed until they ran
  EXPECT_TRUE(p.timers_due(t0));
  p.timers_ran(t0, false);
  EXPECT_FALSE(p.timers_due(t0 + microseconds(999)));
  EXPECT_TRUE(p.timers_due(t0 + milliseconds(1)));
  EXPECT_FALSE(p.may_sleep_deeply(t0 + milliseconds(49), false));
  EXPECT_TRUE(p.may_sleep_deeply(t0 + milliseconds(50), false));
  EXPECT_FALSE(p.may_sleep_deeply(t0 + milliseconds(50), true));  // tombstones to reclaim
  p.turn_ended(t0 + milliseconds(50), 1, kNever);                 // a datagram: active again
  EXPECT_FALSE(p.may_sleep_deeply(t0 + milliseconds(99), false));
}

// A turn that left more to do / Expect no wait; a poller active / Expect naps.
TEST(ProgressPolicy, BusyGoesOnAndAPollerMeansNaps) {
  ProgressPolicy p(Clock::duration::zero(), false, t0);
  p.turn_taken(t0, 64, false, true);
  EXPECT_EQ(p.how_to_wait(t0, true), Wait::kNone);
  p.turn_taken(t0, 0, false, false);
  EXPECT_EQ(p.how_to_wait(t0, true), Wait::kNap);
  EXPECT_EQ(p.how_to_wait(t0, false), Wait::kSleep);
}

// A poller active: after a nap the thread looks at the sockets only if the
// port received nothing since its last look (the poller may have stopped);
// a drain request always takes the turn.
TEST(ProgressPolicy, TakesTheTurnFromAPollerOnlyWhenNothingWasReceived) {
  ProgressPolicy p(Clock::duration::zero(), false, t0);
  EXPECT_TRUE(p.take_turn(t0, true, false, 0));    // nothing since the start
  EXPECT_FALSE(p.take_turn(t0, true, false, 10));  // the poller received 10
  EXPECT_FALSE(p.busy());
  EXPECT_TRUE(p.take_turn(t0, true, false, 10));   // then nothing more
  EXPECT_TRUE(p.take_turn(t0, true, true, 20));    // a drain
  EXPECT_TRUE(p.take_turn(t0, false, false, 30));  // no poller
}

// Datagrams found waiting after a nap / Expect the sockets kept for 1 ms, then
// found again at the first nap after it / 2, 4 ... up to 50 ms; found again
// later than that / Expect 1 ms again.
TEST(ProgressPolicy, HoldAfterDatagramsFoundAtANapDoublesUpTo50Ms) {
  ProgressPolicy p(Clock::duration::zero(), false, t0);
  Clock::time_point t = t0 + std::chrono::seconds(1);  // (within 2 ms of the start counts as "again")
  p.turn_taken(t, 3, true, false);
  EXPECT_EQ(p.how_to_wait(t + microseconds(999), true), Wait::kSleep);  // holding: no nap
  EXPECT_EQ(p.how_to_wait(t + milliseconds(1), true), Wait::kNap);
  EXPECT_TRUE(p.take_turn(t + microseconds(999), true, false, 99));  // holding: its own turn
  EXPECT_EQ(p.how_to_wait(t + milliseconds(1), true), Wait::kNap);
  Clock::duration expect = milliseconds(1);
  for (int i = 0; i < 8; ++i) {
    t += expect;  // the first nap after the hold
    p.turn_taken(t, 1, true, false);
    expect = std::min<Clock::duration>(2 * expect, milliseconds(50));
    EXPECT_EQ(p.how_to_wait(t + expect - microseconds(1), true), Wait::kSleep) << i;
    EXPECT_EQ(p.how_to_wait(t + expect, true), Wait::kNap) << i;
  }
  t += milliseconds(200);  // much later
  p.turn_taken(t, 1, true, false);
  EXPECT_EQ(p.how_to_wait(t + milliseconds(1), true), Wait::kNap);
  p.turn_taken(t + milliseconds(5), 1, false, false);  // received without a nap: no hold
  EXPECT_EQ(p.how_to_wait(t + milliseconds(5), true), Wait::kNap);
}

// UROCE_POLL=spin:50: after a turn with datagrams / Expect no wait for 50 us.
TEST(ProgressPolicy, SpinPollsAfterDatagrams) {
  ProgressPolicy p(microseconds(50), false, t0);
  p.turn_ended(t0, 100, kNever);
  EXPECT_EQ(p.how_to_wait(t0 + microseconds(49), false), Wait::kNone);
  EXPECT_EQ(p.how_to_wait(t0 + microseconds(50), false), Wait::kSleep);
}

// UROCE_POLL=auto:50: after a small burst, polls while no application thread
// is runnable; after a large burst, or once one is runnable, sleeps; asks
// again only after kSpinBackoff.
TEST(ProgressPolicy, AutoSpinOnlyAfterSmallBurstsWhileNoApplicationRuns) {
  ProgressPolicy p(microseconds(50), true, t0);
  int asked = 0;
  auto runnable = [&](bool answer) {
    return [&asked, answer] {
      ++asked;
      return answer;
    };
  };
  p.turn_ended(t0, 9, runnable(false));  // a stream's burst
  EXPECT_EQ(p.how_to_wait(t0, false), Wait::kSleep);
  EXPECT_EQ(asked, 0);
  p.turn_ended(t0, 2, runnable(false));  // an exchange's
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(p.how_to_wait(t0 + microseconds(10), false), Wait::kNone);
  p.turn_ended(t0 + microseconds(10), 0, runnable(true));  // not asked again before kSpinCheck
  EXPECT_EQ(asked, 1);
  p.turn_ended(t0 + microseconds(20), 0, runnable(true));
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(p.how_to_wait(t0 + microseconds(20), false), Wait::kSleep);
  p.turn_ended(t0 + milliseconds(1), 2, runnable(false));  // within kSpinBackoff: not asked
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(p.how_to_wait(t0 + milliseconds(1), false), Wait::kSleep);
}

}  // namespace
}  // namespace uroce::engine
