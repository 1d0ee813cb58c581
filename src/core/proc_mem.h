// The process's own memory through /proc/self/mem: the kernel's debugger
// access (FOLL_FORCE), which reads a PROT_NONE page and writes a read-only
// page of a private mapping (breaking copy-on-write, as a breakpoint does) —
// what a NIC's DMA into the pages it pinned at registration does. The kernel
// refuses an unmapped address, a hole of a file mapping, a read-only page of
// a shared mapping, and every forced access where proc_mem.force_override
// (Linux 6.12 on) forbids them; then false.
//
// Not for the data path's common case: one system call per call (and a
// getpid). The file is opened once per process (O_CLOEXEC) and kept; a
// fork()ed child opens its own, since the descriptor it inherits reaches the
// parent's memory, and leaves that one open (it may have closed the number
// and opened something else under it).
#pragma once

#include <cstddef>

namespace uroce::core {

// Writes n bytes from `src` at address `dst` of this process.
[[nodiscard]] bool proc_mem_write(void* dst, const void* src, size_t n) noexcept;
// Reads n bytes at address `src` of this process into `dst`.
[[nodiscard]] bool proc_mem_read(void* dst, const void* src, size_t n) noexcept;

}  // namespace uroce::core
