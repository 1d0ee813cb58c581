// SharedFastMutex: a reader-writer lock for tables the data path reads on
// every packet and the control path rarely changes (the MR table, the QP
// table). Uncontended, a shared lock and its unlock are one atomic operation
// each and no call into libc (glibc's rwlock, std::shared_mutex: ~120
// instructions a pair, three pairs in a same-host round trip's path).
//
// The state word: the readers holding it (low 30 bits), kWriterWaiting (a
// writer waits: new readers wait behind it, so that a stream of readers
// cannot starve it) and kWriter (held exclusively). Waiters sleep on the
// word's futex; `sleepers_` counts them, so that an unlock calls into the
// kernel only when someone may sleep. Every waiter re-reads the word when
// woken (writers are rare: an unlock that may have sleepers wakes them all).
// Not recursive, no owner check.
//
// Under ThreadSanitizer it is std::shared_mutex, which the sanitizer understands.
#pragma once

#include <atomic>
#include <cstdint>
#include <shared_mutex>

#include "base/sanitizers.h"

namespace uroce::base {

#if defined(UROCE_TSAN)
using SharedFastMutex = std::shared_mutex;
#else
class SharedFastMutex {
 public:
  SharedFastMutex() = default;
  SharedFastMutex(const SharedFastMutex&) = delete;
  SharedFastMutex& operator=(const SharedFastMutex&) = delete;

  void lock_shared() noexcept {
    uint32_t s = state_.load(std::memory_order_relaxed);
    if ((s & kWriterBits) || !state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire)) lock_shared_slow();
  }
  bool try_lock_shared() noexcept {
    uint32_t s = state_.load(std::memory_order_relaxed);
    while (!(s & kWriterBits))
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire)) return true;
    return false;
  }
  void unlock_shared() noexcept {
    uint32_t s = state_.fetch_sub(1, std::memory_order_seq_cst) - 1;  // (before the look at sleepers_)
    if ((s & kReaders) == 0 && (s & kWriterWaiting)) wake_all();      // the last reader before a writer
  }

  void lock() noexcept {
    uint32_t s = 0;
    if (!state_.compare_exchange_strong(s, kWriter, std::memory_order_acquire)) lock_slow();
  }
  bool try_lock() noexcept {
    uint32_t s = state_.load(std::memory_order_relaxed);
    while (s == 0 || s == kWriterWaiting)
      if (state_.compare_exchange_weak(s, kWriter, std::memory_order_acquire)) return true;
    return false;
  }
  void unlock() noexcept {
    state_.exchange(0, std::memory_order_seq_cst);  // (before the look at sleepers_)
    wake_all();
  }

 private:
  static constexpr uint32_t kWriter = 1u << 31;
  static constexpr uint32_t kWriterWaiting = 1u << 30;
  static constexpr uint32_t kWriterBits = kWriter | kWriterWaiting;
  static constexpr uint32_t kReaders = kWriterWaiting - 1;

  void lock_shared_slow() noexcept;
  void lock_slow() noexcept;
  void sleep_while(uint32_t seen) noexcept;
  void wake_all() noexcept;

  std::atomic<uint32_t> state_{0};
  std::atomic<uint32_t> sleepers_{0};
};
#endif

}  // namespace uroce::base
