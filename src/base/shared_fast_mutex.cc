#include "base/shared_fast_mutex.h"

#if !defined(UROCE_TSAN)
#include <climits>

#include "base/futex.h"

namespace uroce::base {

// A reader waits while a writer holds the lock or waits for it.
void SharedFastMutex::lock_shared_slow() noexcept {
  for (;;) {
    uint32_t s = state_.load(std::memory_order_relaxed);
    if (s & kWriterBits) {
      sleep_while(s);
    } else if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire)) {
      return;
    }
  }
}

// A writer takes the lock when no one holds it (a kWriterWaiting left by
// itself or another writer is taken along: the others, woken by every
// unlock, set it again), else announces itself and sleeps.
void SharedFastMutex::lock_slow() noexcept {
  for (;;) {
    uint32_t s = state_.load(std::memory_order_relaxed);
    if ((s & ~kWriterWaiting) == 0) {
      if (state_.compare_exchange_weak(s, kWriter, std::memory_order_acquire)) return;
    } else if ((s & kWriterWaiting) || state_.compare_exchange_weak(s, s | kWriterWaiting, std::memory_order_relaxed)) {
      sleep_while(s | kWriterWaiting);
    }
  }
}

// Sleeps unless the word has moved from `seen`. The count goes up (an RMW:
// ordered before the kernel's look at the word) before the sleep, so that an
// unlock that changed the word either is seen by the kernel's compare or sees
// the count (wake_all).
void SharedFastMutex::sleep_while(uint32_t seen) noexcept {
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  futex_wait(state_, seen);
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
}

void SharedFastMutex::wake_all() noexcept {
  if (sleepers_.load(std::memory_order_seq_cst) != 0) futex_wake(state_, INT_MAX);
}

}  // namespace uroce::base
#endif
