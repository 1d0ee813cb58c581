#include "base/shared_fast_mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

namespace uroce::base {
namespace {

using namespace std::chrono_literals;

TEST(SharedFastMutex, ReadersShareWritersExclude) {
  SharedFastMutex m;
  ASSERT_TRUE(m.try_lock_shared());
  ASSERT_TRUE(m.try_lock_shared());  // a second reader
  std::thread other([&] { EXPECT_FALSE(m.try_lock()); });
  other.join();
  m.unlock_shared();
  m.unlock_shared();
  ASSERT_TRUE(m.try_lock());
  std::thread reader([&] { EXPECT_FALSE(m.try_lock_shared()); });
  reader.join();
  m.unlock();
  EXPECT_TRUE(m.try_lock_shared());
  m.unlock_shared();
}

// Two writers and three readers on more threads than CPUs: the writers add
// to two plain counters under the lock, one after the other, the readers
// check under a shared lock that they are always equal. A writer let in beside a reader or another
// writer shows as a lost update or an unequal pair.
TEST(SharedFastMutex, WritersExcludeReadersAndEachOther) {
  SharedFastMutex m;
  uint64_t a = 0, b = 0;
  constexpr int kWriters = 2, kReaders = 3, kAdds = 50000;
  std::atomic<bool> writing{true};
  volatile int sink = 0;
  std::atomic<uint64_t> torn{0}, reads{0}, mid_reads{0};
  std::vector<std::thread> threads;
  // The writers start once the readers have read kReaders times between
  // them (on 2 CPUs the writers could otherwise finish before a reader ran)
  // and yield now and then outside the lock, so that readers do come in
  // between writes (mid_reads, below).
  for (int t = 0; t < kWriters; ++t)
    threads.emplace_back([&] {
      while (reads.load() < uint64_t(kReaders)) std::this_thread::yield();
      for (int i = 0; i < kAdds; ++i) {
        {
          std::lock_guard lock(m);
          a = a + 1;
          for (int k = 0; k < 50; ++k) sink = k;  // (a reader let in now sees a != b)
          b = b + 1;
        }
        if (i % 256 == 0) std::this_thread::yield();
      }
    });
  for (int t = 0; t < kReaders; ++t)
    threads.emplace_back([&] {
      while (writing.load(std::memory_order_relaxed)) {
        std::shared_lock lock(m);
        if (a != b) torn.fetch_add(1);
        if (a > 0 && a < uint64_t(kWriters) * kAdds) mid_reads.fetch_add(1, std::memory_order_relaxed);
        reads.fetch_add(1, std::memory_order_relaxed);
      }
    });
  for (int t = 0; t < kWriters; ++t) threads[size_t(t)].join();
  writing = false;
  for (size_t t = kWriters; t < threads.size(); ++t) threads[t].join();
  EXPECT_EQ(a, uint64_t(kWriters) * kAdds);
  EXPECT_EQ(b, a);
  EXPECT_EQ(torn.load(), 0u);
  // Readers that never came in while the writers were at it would test nothing.
  EXPECT_GT(mid_reads.load(), 0u);
}

// A writer waits for the reader holding the lock and is woken by its unlock;
// a reader that comes while the writer waits waits behind it (no writer
// starvation), and gets in after the writer's unlock.
TEST(SharedFastMutex, AWaitingWriterGoesBeforeLaterReaders) {
  SharedFastMutex m;
  m.lock_shared();
  std::atomic<int> order{0};
  std::atomic<int> writer_at{0}, reader_at{0};
  std::thread writer([&] {
    std::lock_guard lock(m);
    writer_at = ++order;
    std::this_thread::sleep_for(20ms);
  });
  std::this_thread::sleep_for(50ms);  // the writer waits by now, mostly
  std::thread reader([&] {
    std::shared_lock lock(m);
    reader_at = ++order;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(order.load(), 0) << "nobody may get in while the first reader holds it";
  m.unlock_shared();
  writer.join();
  reader.join();
  EXPECT_EQ(writer_at.load(), 1);
  EXPECT_EQ(reader_at.load(), 2);
}

}  // namespace
}  // namespace uroce::base
