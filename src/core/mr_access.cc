#include "core/mr_access.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cstring>

namespace uroce::core {

namespace {

// process_vm_* on this process: EFAULT instead of a signal for memory that is
// not mapped with the needed access. Short transfers are retried for the rest
// (the calls may stop at a page boundary).
bool vm_copy(void* dst, const void* src, size_t n, bool to_mr) noexcept {
  const pid_t self = getpid();  // not cached: a fork()ed child is another process
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  while (n > 0) {
    iovec local{to_mr ? const_cast<uint8_t*>(s) : d, n};
    iovec remote{to_mr ? d : const_cast<uint8_t*>(s), n};
    ssize_t got =
        to_mr ? process_vm_writev(self, &local, 1, &remote, 1, 0) : process_vm_readv(self, &local, 1, &remote, 1, 0);
    if (got <= 0) return false;
    d += got;
    s += got;
    n -= size_t(got);
  }
  return true;
}

}  // namespace

bool is_on_demand(const Mr& mr) noexcept {
  const Mr& m = mr.is_window && mr.parent ? *mr.parent : mr;
  return m.access & IBV_ACCESS_ON_DEMAND;
}

bool copy_from_mr(const Mr& mr, void* dst, const void* src, size_t n) noexcept {
  if (n == 0) return true;
  if (is_on_demand(mr)) return vm_copy(dst, src, n, false);
  std::memcpy(dst, src, n);
  return true;
}

bool copy_to_mr(const Mr& mr, void* dst, const void* src, size_t n) noexcept {
  if (n == 0) return true;
  if (is_on_demand(mr)) return vm_copy(dst, src, n, true);
  std::memcpy(dst, src, n);
  return true;
}

}  // namespace uroce::core
