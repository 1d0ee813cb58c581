#include "core/mr_access.h"

#include <sys/uio.h>
#include <unistd.h>

#include <mutex>

#include "core/guarded_access.h"
#include "core/proc_mem.h"

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

// The bytes of a plain region's copy past a fault (`left` of `n`), through
// /proc/self/mem: as on the pages a NIC pinned, unless the kernel refuses.
[[gnu::cold, gnu::noinline]] bool finish_copy(void* dst, const void* src, size_t n, size_t left, bool to_mr) noexcept {
  auto* d = static_cast<uint8_t*>(dst) + (n - left);
  auto* s = static_cast<const uint8_t*>(src) + (n - left);
  return to_mr ? proc_mem_write(d, s, left) : proc_mem_read(d, s, left);
}

bool plain_copy(void* dst, const void* src, size_t n, bool to_mr) noexcept {
  size_t left = guarded_copy(dst, src, n);
  return left == 0 || finish_copy(dst, src, n, left, to_mr);
}

// An atomic by reads and writes under one lock, copied as the region's other
// accesses are (plain_copy, or vm_copy for ODP): at an address that is not
// 8-byte aligned (an MR registered with an unaligned iova), or where the
// locked instruction faulted on a plain region (memory this process may no
// longer write). Such atomics are atomic against each other; against the
// locked instruction only while both see the same protection.
[[gnu::noinline]] bool locked_atomic(uint8_t* dst, bool cas, uint64_t swap_add, uint64_t compare, uint64_t* orig,
                                     bool on_demand) noexcept {
  static std::mutex mu;
  std::lock_guard lock(mu);
  auto copy = on_demand ? vm_copy : plain_copy;
  uint64_t old;
  if (!copy(&old, dst, sizeof old, false)) return false;
  uint64_t now = cas ? (old == compare ? swap_add : old) : old + swap_add;
  if (now != old && !copy(dst, &now, sizeof now, true)) return false;  // (a failed compare writes nothing)
  *orig = old;
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
  return plain_copy(dst, src, n, false);
}

bool copy_to_mr(const Mr& mr, void* dst, const void* src, size_t n) noexcept {
  if (n == 0) return true;
  if (is_on_demand(mr)) return vm_copy(dst, src, n, true);
  return plain_copy(dst, src, n, true);
}

bool readable_in_place(const Mr& mr, const void* p, size_t n) noexcept {
  return !is_on_demand(mr) && (n == 0 || guarded_readable(p, n));
}

bool atomic_on_mr(const Mr& mr, uint8_t* dst, bool cas, uint64_t swap_add, uint64_t compare, uint64_t* orig) noexcept {
  const bool on_demand = is_on_demand(mr);
  if (on_demand && !kOdpAtomics) return false;
  if ((reinterpret_cast<uintptr_t>(dst) & 7) == 0) {
    auto* p = reinterpret_cast<uint64_t*>(dst);
    if (cas ? guarded_compare_swap(p, compare, swap_add, orig) : guarded_fetch_add(p, swap_add, orig)) return true;
    // The locked instruction faulted: an ODP region's page is unmapped or not writable
    // (vm_copy would fail as well); a plain region's may still be written as pinned.
    if (on_demand) return false;
  }
  return locked_atomic(dst, cas, swap_add, compare, orig, on_demand);
}

}  // namespace uroce::core
