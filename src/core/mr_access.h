// Copies between registered memory and the engine's buffers (design §5:
// nothing outside a live registered range is touched, and a peer cannot crash
// the process).
//
// Regions registered without IBV_ACCESS_ON_DEMAND were checked at
// registration to be mapped with the access their flags need (as the kernel's
// pinning checks them), so they are copied with memcpy. On-demand-paging
// regions may be registered over unmapped memory, and the application may
// munmap or mprotect them at any time: their bytes are copied with
// process_vm_readv/process_vm_writev on this very process, which fail with
// EFAULT where memcpy would raise SIGSEGV. The cost is one system call per
// copy (about 1-2 us) for ODP regions only; atomics on ODP regions are not
// offered (the device does not report IBV_ODP_SUPPORT_ATOMIC).
//
// Callers hold the MR table's shared lock (core/mr.h) across the copy.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/mr.h"

namespace uroce::core {

// True for an on-demand-paging region (a window: of the MR it is bound to).
bool is_on_demand(const Mr& mr) noexcept;

// Copies n bytes from `src` (inside `mr`) to `dst`; false if the memory
// cannot be read (ODP regions only; nothing is copied past the fault).
[[nodiscard]] bool copy_from_mr(const Mr& mr, void* dst, const void* src, size_t n) noexcept;
// Copies n bytes from `src` to `dst` (inside `mr`); false if the memory
// cannot be written.
[[nodiscard]] bool copy_to_mr(const Mr& mr, void* dst, const void* src, size_t n) noexcept;

// The receive path's hint after a copy into a region (a WRITE's target, a
// SEND's or READ response's buffers): a message's next packet most likely
// lands right behind it, so the first min(n, kWriteAhead) bytes at `next`
// (the caller's n: what lies in the same region or SGE) are fetched for
// writing while that packet is received and checked. A target in DRAM
// (ib_write_bw -q 64: 64 MiB of targets) otherwise makes each packet's stores
// wait for their lines. Nothing is read or written. Always inlined: GCC
// dropped the calls to an out-of-line function holding nothing but prefetches.
inline constexpr size_t kWriteAhead = 4096;  // one MTU-4096 packet's payload
[[gnu::always_inline]] inline void prefetch_for_write(const uint8_t* next, size_t n) noexcept {
  for (size_t at = 0; at < n && at < kWriteAhead; at += 64) __builtin_prefetch(next + at, 1, 3);
}

}  // namespace uroce::core
