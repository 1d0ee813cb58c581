// Accesses to registered memory from the engine: copies between it and the
// engine's buffers, and atomics (design §5: nothing outside a live registered
// range is touched, and a peer cannot crash the process).
//
// Regions registered without IBV_ACCESS_ON_DEMAND were checked at
// registration to be mapped with the access their flags need (as the kernel's
// pinning checks them), and behave as a NIC's pinned pages from then on: the
// application may still mprotect them, or truncate the file they map. They
// are copied by guarded_copy (core/guarded_access.h: a rep movsb whose fault
// ends the copy early instead of the process); the bytes past a fault go
// through /proc/self/mem (core/proc_mem.h), which writes a read-only private
// page and reads a PROT_NONE one as the NIC's DMA would. Only where the kernel
// refuses that too (unmapped, a read-only shared mapping, a truncated file)
// does the access fail, and the caller reports the IBA remote access error.
// The common case costs one call and the rep movsb.
//
// On-demand-paging regions follow the process's page tables, as a NIC's ODP
// does: they may be registered over unmapped memory, and the application may
// munmap or mprotect them at any time. Their bytes are copied with
// process_vm_readv/process_vm_writev on this very process, which fail with
// EFAULT on an unmapped page or one without the access (no FOLL_FORCE). The
// cost is one system call per copy (about 1-2 us) for ODP regions only.
// Atomics on ODP regions are the locked instruction that survives a fault
// (core/guarded_access.h), so x86-64 only (kOdpAtomics: the device reports
// IBV_ODP_SUPPORT_ATOMIC); at an unaligned address, reads and writes by
// process_vm_* under one lock.
//
// Callers hold the MR table's shared lock (core/mr.h) across the access.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/mr.h"

namespace uroce::core {

// Whether atomics reach ODP regions: only where the locked instruction survives a fault.
#if defined(__x86_64__)
inline constexpr bool kOdpAtomics = true;
#else
inline constexpr bool kOdpAtomics = false;
#endif

// True for an on-demand-paging region (a window: of the MR it is bound to).
bool is_on_demand(const Mr& mr) noexcept;

// Copies n bytes from `src` (inside `mr`) to `dst`; false if the memory
// cannot be read (`dst` may then hold some of the bytes).
[[nodiscard]] bool copy_from_mr(const Mr& mr, void* dst, const void* src, size_t n) noexcept;
// Copies n bytes from `src` to `dst` (inside `mr`); false if the memory
// cannot be written (some of the bytes may have been).
[[nodiscard]] bool copy_to_mr(const Mr& mr, void* dst, const void* src, size_t n) noexcept;

// Whether [p, p+n) inside `mr` may be read in place, later and by plain
// loads (TxBatch: referenced by a packet, or stored by the ICRC's pass): a
// plain region's pages that can be read now (one load a page). False for an
// ODP region, or a page made unreadable since registration; the caller then
// copies with copy_from_mr. A page made unreadable between this answer and
// the read still ends the process: what an application does to a region
// while a peer reads it is only safe through copy_from_mr.
[[nodiscard]] bool readable_in_place(const Mr& mr, const void* p, size_t n) noexcept;

// An IBA atomic on the 8 bytes at `dst` (inside `mr`): FETCH_AND_ADD of
// `swap_add`, or with `cas` CMP_AND_SWP (`swap_add` stored if the value is
// `compare`); the value found in *orig. Atomic against every other atomic of
// the process, whatever QP it came through (IBV_ATOMIC_HCA), as long as the
// memory's protection does not change meanwhile (mr_access.cc). False,
// nothing changed, if the memory cannot be read and written, and for ODP
// regions where kOdpAtomics is false.
[[nodiscard]] bool atomic_on_mr(const Mr& mr, uint8_t* dst, bool cas, uint64_t swap_add, uint64_t compare,
                                uint64_t* orig) noexcept;

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
