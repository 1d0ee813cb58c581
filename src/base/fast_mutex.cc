#include "base/fast_mutex.h"

#if !defined(UROCE_TSAN)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace uroce::base {

// Sleeps while the word says 2, marking it 2 each time it looks (it may not
// be the only sleeper). No spinning first, as glibc's default mutex: on a
// machine with few CPUs a spinning waiter takes the CPU its holder needs.
void FastMutex::lock_contended() noexcept {
  while (state_.exchange(2, std::memory_order_acquire) != 0)
    syscall(SYS_futex, &state_, FUTEX_WAIT_PRIVATE, 2, nullptr, nullptr, 0);
}

void FastMutex::wake_one() noexcept { syscall(SYS_futex, &state_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0); }

}  // namespace uroce::base
#endif
