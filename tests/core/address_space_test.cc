// The registration range check (core/address_space.h): parsing /proc/self/maps
// lines, the pure coverage check over a list of mappings, and the live reading
// of this process's mappings.
#include "core/address_space.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <vector>

namespace uroce::core {
namespace {

TEST(ParseMapsLine, FieldsAndPermissions) {
  Mapping m;
  ASSERT_TRUE(parse_maps_line("7f0000001000-7f0000003000 rw-p 00000000 00:00 0 ", &m));
  EXPECT_EQ(m.start, 0x7f0000001000u);
  EXPECT_EQ(m.end, 0x7f0000003000u);
  EXPECT_TRUE(m.readable);
  EXPECT_TRUE(m.writable);
  ASSERT_TRUE(parse_maps_line("55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 1234   /usr/bin/cat", &m));
  EXPECT_TRUE(m.readable);
  EXPECT_FALSE(m.writable);
  ASSERT_TRUE(parse_maps_line("ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0  [vsyscall]", &m));
  EXPECT_EQ(m.end, 0xffffffffff601000u);
  EXPECT_FALSE(m.readable);
  EXPECT_FALSE(m.writable);
  ASSERT_TRUE(parse_maps_line("1000-2000 -w-s 00000000 00:05 7 /dev/zero (deleted)", &m));
  EXPECT_FALSE(m.readable);
  EXPECT_TRUE(m.writable);
}

TEST(ParseMapsLine, MalformedIsRejected) {
  Mapping m;
  EXPECT_FALSE(parse_maps_line("", &m));
  EXPECT_FALSE(parse_maps_line("1000-2000", &m));
  EXPECT_FALSE(parse_maps_line("1000 2000 rw-p", &m));
  EXPECT_FALSE(parse_maps_line("zz00-2000 rw-p 0 0:0 0", &m));
  EXPECT_FALSE(parse_maps_line("3000-2000 rw-p 0 0:0 0", &m));  // end before start
  EXPECT_FALSE(parse_maps_line("1000-2000 xy-p 0 0:0 0", &m));
  EXPECT_FALSE(parse_maps_line("1000-2000 r", &m));
}

// Three mappings: [0x1000,0x3000) rw, [0x3000,0x4000) r, hole, [0x6000,0x7000)
// none, [0x7000,0x8000) rw.
const std::vector<Mapping> kMaps = {
    {0x1000, 0x3000, true, true},
    {0x3000, 0x4000, true, false},
    {0x6000, 0x7000, false, false},
    {0x7000, 0x8000, true, true},
};

TEST(CheckRangeMapped, InsideOneMapping) {
  EXPECT_EQ(check_range_mapped(kMaps, 0x1000, 0x2000, true), 0);
  EXPECT_EQ(check_range_mapped(kMaps, 0x1fff, 1, true), 0);
  EXPECT_EQ(check_range_mapped(kMaps, 0x7000, 0x1000, true), 0);
}

TEST(CheckRangeMapped, AcrossAdjacentMappings) {
  EXPECT_EQ(check_range_mapped(kMaps, 0x2000, 0x2000, false), 0);  // rw then r, read only
  EXPECT_EQ(check_range_mapped(kMaps, 0x2fff, 2, false), 0);
  EXPECT_EQ(check_range_mapped(kMaps, 0x2000, 0x2000, true), EFAULT);  // the r part is not writable
}

TEST(CheckRangeMapped, HolesAndEnds) {
  EXPECT_EQ(check_range_mapped(kMaps, 0x0fff, 2, false), EFAULT);       // starts before the first
  EXPECT_EQ(check_range_mapped(kMaps, 0x3000, 0x1001, false), EFAULT);  // one byte into the hole
  EXPECT_EQ(check_range_mapped(kMaps, 0x4000, 0x10, false), EFAULT);    // inside the hole
  EXPECT_EQ(check_range_mapped(kMaps, 0x7fff, 2, false), EFAULT);       // past the last
  EXPECT_EQ(check_range_mapped(kMaps, 0x9000, 1, false), EFAULT);
  EXPECT_EQ(check_range_mapped({}, 0x1000, 1, false), EFAULT);
}

TEST(CheckRangeMapped, Permissions) {
  EXPECT_EQ(check_range_mapped(kMaps, 0x3000, 0x1000, false), 0);
  EXPECT_EQ(check_range_mapped(kMaps, 0x3000, 0x1000, true), EFAULT);   // read-only, write needed
  EXPECT_EQ(check_range_mapped(kMaps, 0x6000, 0x10, false), EFAULT);    // PROT_NONE
  EXPECT_EQ(check_range_mapped(kMaps, 0x6fff, 0x1001, false), EFAULT);  // starts in PROT_NONE
  EXPECT_EQ(check_range_mapped(kMaps, 0x5fff, 0x1, false), EFAULT);
}

TEST(CheckRangeMapped, EmptyRangeAndTopOfAddressSpace) {
  EXPECT_EQ(check_range_mapped(kMaps, 0x4000, 0, true), 0);
  const std::vector<Mapping> high = {{0xffffffffffffe000u, 0xfffffffffffff000u, true, true}};
  EXPECT_EQ(check_range_mapped(high, 0xffffffffffffe000u, 0x1000, true), 0);
}

// The live mappings of this process: a fresh mapping is found with its
// permissions; after munmap it is gone.
TEST(ReadMappings, SeesThisProcess) {
  const size_t pg = size_t(sysconf(_SC_PAGESIZE));
  auto* p = static_cast<uint8_t*>(mmap(nullptr, 3 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(mprotect(p + pg, pg, PROT_READ), 0);  // splits it: rw, r, rw
  const uint64_t a = reinterpret_cast<uint64_t>(p);
  std::vector<Mapping> maps;
  ASSERT_EQ(read_mappings(a, 3 * pg, &maps), 0);
  ASSERT_FALSE(maps.empty());
  EXPECT_LE(maps.front().start, a);
  EXPECT_GE(maps.back().end, a + 3 * pg);
  EXPECT_EQ(check_range_mapped(maps, a, 3 * pg, false), 0);
  EXPECT_EQ(check_range_mapped(maps, a, 3 * pg, true), EFAULT);
  EXPECT_EQ(check_range_mapped(maps, a, pg, true), 0);
  ASSERT_EQ(munmap(p + pg, pg), 0);
  ASSERT_EQ(read_mappings(a, 3 * pg, &maps), 0);
  EXPECT_EQ(check_range_mapped(maps, a, 3 * pg, false), EFAULT);
  EXPECT_EQ(check_range_mapped(maps, a + 2 * pg, pg, true), 0);
  munmap(p, pg);
  munmap(p + 2 * pg, pg);
}

// The ioctl lookup (where the kernel has PROCMAP_QUERY) and the text walk
// report the same mappings, here for the whole address space below 2^47.
TEST(ReadMappings, LookupAndTextAgree) {
  const size_t pg = size_t(sysconf(_SC_PAGESIZE));
  auto* p = static_cast<uint8_t*>(mmap(nullptr, 4 * pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(mprotect(p + pg, pg, PROT_READ), 0);
  ASSERT_EQ(mprotect(p + 2 * pg, pg, PROT_READ | PROT_WRITE), 0);
  // Only this test's own region is compared: other threads (a sanitizer's
  // runtime among them) may map memory elsewhere between the two reads.
  std::vector<Mapping> a, b;
  ASSERT_EQ(read_mappings(reinterpret_cast<uint64_t>(p), 4 * pg, &a), 0);
  ASSERT_EQ(read_mappings_from_text(reinterpret_cast<uint64_t>(p), 4 * pg, &b), 0);
  ASSERT_GE(a.size(), 3u);  // PROT_NONE, read-only and read-write pieces (neighbours may merge)
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].start, b[i].start) << i;
    EXPECT_EQ(a[i].end, b[i].end) << i;
    EXPECT_EQ(a[i].readable, b[i].readable) << i;
    EXPECT_EQ(a[i].writable, b[i].writable) << i;
  }
  munmap(p, 4 * pg);
}

}  // namespace
}  // namespace uroce::core
