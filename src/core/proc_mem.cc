#include "core/proc_mem.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

namespace uroce::core {

namespace {

// The open file and the process it was opened by: pid << 32 | fd (0: none).
// One word, so that threads that race to open it agree without a lock (a
// lock held across fork() would stay held in the child).
std::atomic<uint64_t> g_mem{0};

constexpr uint64_t pack(pid_t pid, int fd) { return uint64_t(uint32_t(pid)) << 32 | uint32_t(fd); }
constexpr pid_t pid_of(uint64_t w) { return pid_t(uint32_t(w >> 32)); }
constexpr int fd_of(uint64_t w) { return int(uint32_t(w)); }

// This process's /proc/self/mem, or -1.
int mem_fd() noexcept {
  const pid_t self = getpid();
  uint64_t seen = g_mem.load(std::memory_order_acquire);
  if (seen != 0 && pid_of(seen) == self) return fd_of(seen);
  int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  if (g_mem.compare_exchange_strong(seen, pack(self, fd), std::memory_order_acq_rel)) return fd;
  close(fd);  // another thread's came first
  return pid_of(seen) == self ? fd_of(seen) : -1;
}

// pread (write false) or pwrite of n bytes at offset `at`, in as many calls
// as the kernel needs (it may stop at a page boundary).
// errno is left as it was: the caller may be the application's thread inside
// a verb that succeeds.
bool transfer(bool write, void* buf, size_t n, uintptr_t at) noexcept {
  const int saved_errno = errno;
  int fd = mem_fd();
  auto* p = static_cast<char*>(buf);
  while (fd >= 0 && n > 0) {
    ssize_t got = write ? pwrite(fd, p, n, off_t(at)) : pread(fd, p, n, off_t(at));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    p += got;
    at += size_t(got);
    n -= size_t(got);
  }
  errno = saved_errno;
  return fd >= 0 && n == 0;
}

}  // namespace

bool proc_mem_write(void* dst, const void* src, size_t n) noexcept {
  return transfer(true, const_cast<void*>(src), n, reinterpret_cast<uintptr_t>(dst));
}

bool proc_mem_read(void* dst, const void* src, size_t n) noexcept {
  return transfer(false, dst, n, reinterpret_cast<uintptr_t>(src));
}

}  // namespace uroce::core
