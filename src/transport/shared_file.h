// Shared files: the segments uroce's processes of one user share on a host,
// under /dev/shm (shared-memory rings, direct-placement windows, live
// counters; the host registry and XRC domains open theirs their own way, as
// several processes create them at once). One way to make one, one check that
// the process a file names is alive, one cleanup of files left by processes
// that are gone.
//
// A file that belongs to one process is named `<prefix><pid>...`: whoever
// opens the next one removes those whose process is gone (killed before it
// could remove its own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace uroce::transport {

// True unless `pid` names no process (kill(pid, 0) fails with ESRCH). 0 is
// never alive. A process of another user counts as alive (EPERM).
bool process_alive(uint32_t pid) noexcept;

// Removes `folder`'s files named `<prefix><pid>...` whose process is gone.
void remove_stale_files(const std::string& folder, std::string_view prefix);

// Creates `path` (mode 0600, not through a symbolic link; truncated if it
// exists unless `exclusive`, which refuses an existing one with EEXIST),
// `bytes` long and reads as zeros, and maps it shared. The `reserve` ranges
// are allocated now, so that a full /dev/shm is an error here rather than a
// SIGBUS when they are first touched (the rest stays sparse). Null with errno
// set on failure, the file then removed.
struct ByteRange {
  size_t offset, len;
};
void* create_shared_file(const std::string& path, size_t bytes, bool exclusive,
                         std::span<const ByteRange> reserve = {});

}  // namespace uroce::transport
