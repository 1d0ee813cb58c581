// Accesses to registered memory that may fault without ending the process.
// A NIC pins a region's pages at registration and reaches them
// whatever the process later does to its own mappings; uroce reaches them
// with the CPU, so a region made read-only or PROT_NONE after registration,
// or a file mapping whose file was truncated, raised SIGSEGV or SIGBUS in the
// copy a peer's request made.
//
// As the kernel's exception tables for copy_from_user: a few instructions,
// written in assembly (guarded_access.cc), may fault. A process-wide SIGSEGV
// and SIGBUS handler, installed once by arm_fault_guard(), compares the
// faulting instruction pointer with theirs; on a match it moves it to the
// routine's fixup, which reports the failure to the caller, and returns. No
// state is shared with the routines (no thread-local, no longjmp): the
// handler is async-signal-safe and the routines cost what the bare
// instruction costs. Any other fault is passed on to the handler installed
// before ours: a function is called, the default action is restored and the
// access runs again to end the process as it would have without us. So a
// sanitizer's or the application's handler installed before the first
// registration still sees its faults; one installed after it (without
// chaining to ours) takes our faults too, and those end the process again.
//
// The same routines reach a page of another process's shared segment that
// its owner may give back (a same-host mailbox, engine/mailbox.h): touched
// again, a punched page of a full /dev/shm raises SIGBUS.
//
// x86-64 only: elsewhere the routines are plain accesses, and a fault ends
// the process as before.
#pragma once

#include <signal.h>

#include <cstddef>
#include <cstdint>

#if !defined(__x86_64__)
#include <atomic>
#include <cstring>
#endif

#if defined(__x86_64__)
// The routines themselves (guarded_access.cc), called directly: one call and
// the access on the data path.
extern "C" {
[[gnu::visibility("hidden")]] size_t uroce_guarded_copy(void* dst, const void* src, size_t n) noexcept;
[[gnu::visibility("hidden")]] bool uroce_guarded_readable(const void* p, size_t n) noexcept;
[[gnu::visibility("hidden")]] bool uroce_guarded_fetch_add(uint64_t* p, uint64_t add, uint64_t* old) noexcept;
[[gnu::visibility("hidden")]] bool uroce_guarded_compare_swap(uint64_t* p, uint64_t compare, uint64_t swap,
                                                              uint64_t* old) noexcept;
[[gnu::visibility("hidden")]] bool uroce_guarded_load64(const void* p, uint64_t* out) noexcept;
[[gnu::visibility("hidden")]] bool uroce_guarded_load32(const void* p, uint32_t* out) noexcept;
[[gnu::visibility("hidden")]] bool uroce_guarded_store64(void* p, uint64_t value) noexcept;
}
#endif

namespace uroce::core {

// Installs the handler (the first call; later ones return at once). Thread
// safe. Called at registration, before any access that may fault.
void arm_fault_guard() noexcept;

// Fills `set` with what a thread of uroce's own blocks (the application's
// signals are not ours to take): every signal but SIGSEGV and SIGBUS. A
// fault whose signal is blocked ends the process without calling any
// handler, so a thread that may touch registered memory keeps them open.
void blockable_signals(sigset_t* set) noexcept;

#if defined(__x86_64__)

// memcpy that stops at the first fault: the bytes NOT copied (0: all). The
// bytes before the fault are copied.
inline size_t guarded_copy(void* dst, const void* src, size_t n) noexcept { return uroce_guarded_copy(dst, src, n); }
// Whether every page of [p, p+n) (n > 0) can be read now: one load a page.
inline bool guarded_readable(const void* p, size_t n) noexcept { return uroce_guarded_readable(p, n); }
// Locked fetch-and-add / compare-and-swap (sequentially consistent) of the
// 8-byte aligned `*p`, the value found in *old; false when the memory cannot
// be written (nothing changed).
inline bool guarded_fetch_add(uint64_t* p, uint64_t add, uint64_t* old) noexcept {
  return uroce_guarded_fetch_add(p, add, old);
}
inline bool guarded_compare_swap(uint64_t* p, uint64_t compare, uint64_t swap, uint64_t* old) noexcept {
  return uroce_guarded_compare_swap(p, compare, swap, old);
}
// One load or store of the naturally aligned word at `p` (a plain mov:
// single-copy atomic, an acquire load and a release store on x86-64, and a
// call the compiler orders as any other); false when the memory cannot be
// read or written (for a store: nothing changed). For memory another
// process may take away under us: a page of a shared file punched or
// truncated, whose next touch needs a page the file system may not have.
inline bool guarded_load(const void* p, uint64_t* out) noexcept { return uroce_guarded_load64(p, out); }
inline bool guarded_load(const void* p, uint32_t* out) noexcept { return uroce_guarded_load32(p, out); }
inline bool guarded_store(void* p, uint64_t value) noexcept { return uroce_guarded_store64(p, value); }

#else

inline size_t guarded_copy(void* dst, const void* src, size_t n) noexcept {
  std::memcpy(dst, src, n);
  return 0;
}
inline bool guarded_readable(const void*, size_t) noexcept { return true; }
inline bool guarded_fetch_add(uint64_t* p, uint64_t add, uint64_t* old) noexcept {
  *old = std::atomic_ref<uint64_t>(*p).fetch_add(add);
  return true;
}
inline bool guarded_compare_swap(uint64_t* p, uint64_t compare, uint64_t swap, uint64_t* old) noexcept {
  std::atomic_ref<uint64_t>(*p).compare_exchange_strong(compare, swap);
  *old = compare;
  return true;
}
inline bool guarded_load(const void* p, uint64_t* out) noexcept {
  *out = std::atomic_ref<uint64_t>(*static_cast<uint64_t*>(const_cast<void*>(p))).load(std::memory_order_acquire);
  return true;
}
inline bool guarded_load(const void* p, uint32_t* out) noexcept {
  *out = std::atomic_ref<uint32_t>(*static_cast<uint32_t*>(const_cast<void*>(p))).load(std::memory_order_acquire);
  return true;
}
inline bool guarded_store(void* p, uint64_t value) noexcept {
  std::atomic_ref<uint64_t>(*static_cast<uint64_t*>(p)).store(value, std::memory_order_release);
  return true;
}

#endif

}  // namespace uroce::core
