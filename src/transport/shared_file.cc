#include "transport/shared_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace uroce::transport {

bool process_alive(uint32_t pid) noexcept { return pid != 0 && (::kill(pid_t(pid), 0) == 0 || errno != ESRCH); }

void remove_stale_files(const std::string& folder, std::string_view prefix) {
  DIR* d = ::opendir(folder.c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    if (std::string_view(e->d_name).substr(0, prefix.size()) != prefix) continue;
    long pid = std::strtol(e->d_name + prefix.size(), nullptr, 10);
    if (pid > 0 && !process_alive(uint32_t(pid))) ::unlinkat(::dirfd(d), e->d_name, 0);
  }
  ::closedir(d);
}

namespace {
// posix_fallocate of every range: 0 or its errno.
int allocate(int fd, std::span<const ByteRange> ranges) {
  for (const ByteRange& r : ranges)
    if (int e = posix_fallocate(fd, off_t(r.offset), off_t(r.len))) return e;
  return 0;
}
}  // namespace

void* create_shared_file(const std::string& path, size_t bytes, bool exclusive, std::span<const ByteRange> reserve) {
  int flags = O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (exclusive ? O_EXCL : O_TRUNC);
  int fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0) return nullptr;  // (nothing of ours to remove)
  int err = ::ftruncate(fd, off_t(bytes)) == 0 ? allocate(fd, reserve) : errno;
  void* map = err ? MAP_FAILED : ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!err && map == MAP_FAILED) err = errno;
  ::close(fd);
  if (!err) return map;
  ::unlink(path.c_str());
  errno = err;
  return nullptr;
}

}  // namespace uroce::transport
