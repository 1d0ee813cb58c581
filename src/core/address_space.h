// What the process's address space holds, as the kernel's pinning of a memory
// region sees it (ib_umem_get -> pin_user_pages: every page of the range must
// be mapped, readable, and writable when the MR's access needs write).
//
// uroce pins nothing (design §5), so registration checks the range against
// the mappings /proc/self/maps reports, asked afresh on every registration
// (the control path; nothing is cached, so nothing goes stale).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace uroce::core {

// One mapping: a line of /proc/<pid>/maps (proc(5)), [start, end).
struct Mapping {
  uint64_t start = 0;
  uint64_t end = 0;
  bool readable = false;
  bool writable = false;
};

// Parses "start-end perms offset dev inode [path]"; false if malformed.
bool parse_maps_line(std::string_view line, Mapping* out);

// Whether every byte of [addr, addr + length) lies in `maps` (sorted by
// address, non-overlapping; adjacent mappings may split the range) with read
// access, and write access if `need_write`. 0, or EFAULT as pin_user_pages
// answers for a hole, a mapping without read (PROT_NONE) or a read-only
// mapping asked for write. An empty range is always 0.
int check_range_mapped(std::span<const Mapping> maps, uint64_t addr, uint64_t length, bool need_write);

// The process's current mappings that overlap [addr, addr + length), in
// address order: by the PROCMAP_QUERY ioctl on /proc/self/maps (Linux 6.11;
// a lookup per mapping of the range), else from its text (a walk over every
// mapping up to the range). Returns 0, or the errno of opening or reading it.
int read_mappings(uint64_t addr, uint64_t length, std::vector<Mapping>* out);
// The text walk alone (tests compare the two).
int read_mappings_from_text(uint64_t addr, uint64_t length, std::vector<Mapping>* out);

}  // namespace uroce::core
