#include "base/fast_mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace uroce::base {
namespace {

TEST(FastMutex, TryLockFailsWhileHeldAndSucceedsAfter) {
  FastMutex m;
  ASSERT_TRUE(m.try_lock());
  std::thread other([&] { EXPECT_FALSE(m.try_lock()); });
  other.join();
  m.unlock();
  EXPECT_TRUE(m.try_lock());
  m.unlock();
}

// Four threads, each adding 200,000 times under the lock to a counter that
// is not atomic: any lost update (two holders at once) shows in the total.
// More threads than this machine's CPUs, so holders are preempted and
// waiters sleep on the futex.
TEST(FastMutex, ExcludesUnderContention) {
  FastMutex m;
  uint64_t counter = 0;
  constexpr int kThreads = 4, kAdds = 200000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) {
        std::lock_guard lock(m);
        counter = counter + 1;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter, uint64_t(kThreads) * kAdds);
}

// A waiter that found the lock held sleeps until the holder unlocks, and is
// woken by it: it gets the lock only after the unlock, and does get it.
TEST(FastMutex, AWaiterSleepsUntilTheUnlockWakesIt) {
  FastMutex m;
  std::atomic<bool> waiting{false}, released{false}, got{false};
  m.lock();
  std::thread waiter([&] {
    waiting = true;
    std::lock_guard lock(m);
    EXPECT_TRUE(released.load());
    got = true;
  });
  while (!waiting) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the waiter is asleep by now, mostly
  EXPECT_FALSE(got.load());
  released = true;
  m.unlock();
  waiter.join();
  EXPECT_TRUE(got.load());
}

}  // namespace
}  // namespace uroce::base
