// FastMutex: a mutex for the data path's short critical sections (a CQ's
// ring, a QP's state, an outbound ring's producer side). Uncontended, a lock
// and an unlock are one atomic operation each and no call into libc (glibc's
// pthread mutex: ~60 instructions and 7.5-10 ns a pair on the VMs measured,
// this 5.3 ns; docs/measurements.md). Contended, a waiter sleeps on a futex.
//
// The state word: 0 free, 1 locked, 2 locked and someone may sleep on it
// (Drepper, "Futexes Are Tricky", mutex 2/3). unlock() stores 0 and wakes one
// sleeper if the word said 2; a woken thread takes the lock as 2, since
// others may still sleep. Not recursive, no owner check; not for use with
// std::condition_variable (it needs std::mutex).
//
// Under ThreadSanitizer it is std::mutex, which the sanitizer understands.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "base/sanitizers.h"

namespace uroce::base {

#if defined(UROCE_TSAN)
using FastMutex = std::mutex;
#else
class FastMutex {
 public:
  FastMutex() = default;
  FastMutex(const FastMutex&) = delete;
  FastMutex& operator=(const FastMutex&) = delete;

  void lock() noexcept {
    uint32_t free = 0;
    if (!state_.compare_exchange_strong(free, 1, std::memory_order_acquire)) lock_contended();
  }
  bool try_lock() noexcept {
    uint32_t free = 0;
    return state_.compare_exchange_strong(free, 1, std::memory_order_acquire);
  }
  void unlock() noexcept {
    if (state_.exchange(0, std::memory_order_release) == 2) wake_one();
  }

 private:
  void lock_contended() noexcept;
  void wake_one() noexcept;
  std::atomic<uint32_t> state_{0};
};
#endif

}  // namespace uroce::base
