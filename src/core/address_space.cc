#include "core/address_space.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <string>

namespace uroce::core {

namespace {

bool parse_hex(std::string_view s, uint64_t* v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, 16);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

// Calls on_line(line) for each complete line of `fd`; stops when it returns
// false. Returns 0 or the read's errno.
template <class F>
int for_each_line(int fd, F&& on_line) {
  std::string buf;
  char chunk[16384];
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return 0;
    buf.append(chunk, size_t(n));
    size_t begin = 0;
    for (size_t nl; (nl = buf.find('\n', begin)) != std::string::npos; begin = nl + 1)
      if (!on_line(std::string_view(buf).substr(begin, nl - begin))) return 0;
    buf.erase(0, begin);
  }
}

}  // namespace

bool parse_maps_line(std::string_view line, Mapping* out) {
  size_t dash = line.find('-');
  size_t space = line.find(' ');
  if (dash == std::string_view::npos || space == std::string_view::npos || dash > space) return false;
  if (line.size() < space + 5) return false;  // "rwxp" follows the range
  Mapping m;
  if (!parse_hex(line.substr(0, dash), &m.start) || !parse_hex(line.substr(dash + 1, space - dash - 1), &m.end) ||
      m.end < m.start)
    return false;
  std::string_view perms = line.substr(space + 1, 4);
  if (perms[0] != 'r' && perms[0] != '-') return false;
  if (perms[1] != 'w' && perms[1] != '-') return false;
  m.readable = perms[0] == 'r';
  m.writable = perms[1] == 'w';
  *out = m;
  return true;
}

int check_range_mapped(std::span<const Mapping> maps, uint64_t addr, uint64_t length, bool need_write) {
  if (length == 0) return 0;
  uint64_t cursor = addr;  // first byte not yet found mapped
  const uint64_t last = addr + (length - 1);
  for (const Mapping& m : maps) {
    if (m.end <= cursor) continue;
    if (m.start > cursor) return EFAULT;  // a hole
    // pin_user_pages (check_vma_flags): FOLL_WRITE needs VM_WRITE; uroce also
    // reads every registered range (sends, READ responses), so it needs read.
    if (!m.readable || (need_write && !m.writable)) return EFAULT;
    if (m.end - 1 >= last) return 0;
    cursor = m.end;
  }
  return EFAULT;  // the range runs past the last mapping
}

namespace {

// PROCMAP_QUERY (Linux 6.11, <linux/fs.h>; declared here for older headers):
// the mapping covering an address, or the next one, without the text of
// /proc/self/maps — a lookup instead of a walk over every mapping.
struct ProcmapQuery {
  uint64_t size, query_flags, query_addr;
  uint64_t vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kQueryReadable = 0x01, kQueryWritable = 0x02, kQueryCoveringOrNext = 0x10;

// Mappings overlapping [addr, last] by PROCMAP_QUERY. ENOTTY (or EINVAL) if
// the kernel does not have it.
int query_mappings(int fd, uint64_t addr, uint64_t last, std::vector<Mapping>* out) {
  for (uint64_t cursor = addr;;) {
    ProcmapQuery q{};
    q.size = sizeof q;
    q.query_flags = kQueryCoveringOrNext;
    q.query_addr = cursor;
    if (ioctl(fd, kProcmapQuery, &q) != 0) return errno == ENOENT ? 0 : errno;  // ENOENT: none after
    if (q.vma_start > last) return 0;
    out->push_back({q.vma_start, q.vma_end, (q.vma_flags & kQueryReadable) != 0, (q.vma_flags & kQueryWritable) != 0});
    if (q.vma_end == 0 || q.vma_end - 1 >= last) return 0;
    cursor = q.vma_end;
  }
}

// The same from the text, whose lines come in address order.
int parse_mappings(int fd, uint64_t addr, uint64_t last, std::vector<Mapping>* out) {
  return for_each_line(fd, [&](std::string_view line) {
    Mapping m;
    if (!parse_maps_line(line, &m)) return true;
    if (m.start > last) return false;  // past the range: the rest is too
    if (m.end > addr) out->push_back(m);
    return true;
  });
}

}  // namespace

int read_mappings(uint64_t addr, uint64_t length, std::vector<Mapping>* out) {
  out->clear();
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const uint64_t last = length ? addr + (length - 1) : addr;
  static std::atomic<bool> have_query{true};
  int err = ENOTTY;
  if (have_query.load(std::memory_order_relaxed)) {
    err = query_mappings(fd, addr, last, out);
    if (err == ENOTTY || err == EINVAL) have_query.store(false, std::memory_order_relaxed);
  }
  if (err == ENOTTY || err == EINVAL) {
    out->clear();
    err = parse_mappings(fd, addr, last, out);
  }
  close(fd);
  return err;
}

int read_mappings_from_text(uint64_t addr, uint64_t length, std::vector<Mapping>* out) {
  out->clear();
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = parse_mappings(fd, addr, length ? addr + (length - 1) : addr, out);
  close(fd);
  return err;
}

}  // namespace uroce::core
