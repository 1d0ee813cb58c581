// The futex calls base's locks sleep and wake on (process-private words).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace uroce::base {

// Sleeps while `*word` is `seen` (the kernel compares, atomically with the
// sleep); returns at once if it is not, and on a wake-up or a signal.
inline void futex_wait(std::atomic<uint32_t>& word, uint32_t seen) noexcept {
  syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
}

// Wakes up to `count` threads sleeping on `word`.
inline void futex_wake(std::atomic<uint32_t>& word, int count) noexcept {
  syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0);
}

}  // namespace uroce::base
