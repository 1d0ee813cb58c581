// The device file of uroce's device, for programs that look for it.
//
// UCX (1.13) lists a verbs device only if /dev/infiniband/<dev_name> is a
// character device that access(R_OK | W_OK) allows (uct_ib_device_is_accessible).
// uroce has no device node and needs none (design §1: no root, no kernel
// support), so its library answers those two questions itself — for exactly
// the paths of its own devices (/dev/infiniband/uverbsN, N < the number of
// uroce devices) and nothing else: stat() reports a character device (major
// 231, minor 192 + N, as the kernel's uverbs nodes, mode 0666, owned by the
// caller), access() grants read and write. Every other path goes to the
// kernel unchanged (fstatat/faccessat). Opening the path still fails (ENOENT):
// nothing in uroce needs it opened.
//
// The definitions carry glibc's symbol versions (src/verbs/interpose.map), so
// that they take the place of libc's for programs run under `uroce run` (which
// preloads this library) and for programs linked with it ahead of libc.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/device.h"

namespace {

constexpr char kPrefix[] = "/dev/infiniband/uverbs";
constexpr unsigned kUverbsMajor = 231, kUverbsMinorBase = 192;

// The index N of a path /dev/infiniband/uverbsN naming a uroce device, or -1.
int own_device(const char* path) {
  if (!path || std::strncmp(path, kPrefix, sizeof kPrefix - 1) != 0) return -1;
  const char* p = path + sizeof kPrefix - 1;
  if (*p < '0' || *p > '9') return -1;
  unsigned n = 0;
  for (; *p >= '0' && *p <= '9'; ++p) {
    n = n * 10 + unsigned(*p - '0');
    if (n > 1000) return -1;
  }
  if (*p != '\0' || n >= uroce::core::devices().size()) return -1;
  return int(n);
}

template <class Stat>
void fill(Stat* st, int index) {
  std::memset(st, 0, sizeof *st);
  st->st_mode = S_IFCHR | 0666;
  st->st_rdev = makedev(kUverbsMajor, kUverbsMinorBase + unsigned(index));
  st->st_uid = geteuid();
  st->st_gid = getegid();
  st->st_nlink = 1;
  st->st_blksize = 4096;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int stat(const char* __restrict path, struct stat* __restrict st) noexcept {
  int n = own_device(path);
  if (n < 0) return fstatat(AT_FDCWD, path, st, 0);
  fill(st, n);
  return 0;
}

__attribute__((visibility("default"))) int stat64(const char* __restrict path, struct stat64* __restrict st) noexcept {
  int n = own_device(path);
  if (n < 0) return fstatat64(AT_FDCWD, path, st, 0);
  fill(st, n);
  return 0;
}

__attribute__((visibility("default"))) int access(const char* path, int mode) noexcept {
  if (own_device(path) < 0) return faccessat(AT_FDCWD, path, mode, 0);
  if (mode & X_OK) {
    errno = EACCES;
    return -1;
  }
  return 0;
}

}  // extern "C"
