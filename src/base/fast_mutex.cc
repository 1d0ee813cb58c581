#include "base/fast_mutex.h"

#if !defined(UROCE_TSAN)
#include "base/futex.h"

namespace uroce::base {

// Sleeps while the word says 2, marking it 2 each time it looks (it may not
// be the only sleeper). No spinning first, as glibc's default mutex: on a
// machine with few CPUs a spinning waiter takes the CPU its holder needs.
void FastMutex::lock_contended() noexcept {
  while (state_.exchange(2, std::memory_order_acquire) != 0) futex_wait(state_, 2);
}

void FastMutex::wake_one() noexcept { futex_wake(state_, 1); }

}  // namespace uroce::base
#endif
