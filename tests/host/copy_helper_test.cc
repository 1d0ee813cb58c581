// CopyHelper (copy_helper.h): a large cross-process copy is cut in two at a
// page boundary and both halves land; small ones are not cut; a copy that
// meets unmapped memory does not report every byte; concurrent callers each
// get their own bytes. The "other process" is this one (process_vm_* on
// one's own pid needs no permission).
#include "host/copy_helper.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

namespace uroce::host {
namespace {

// Whether this process may run on two CPUs (else the helper never splits).
bool can_split() {
  cpu_set_t cpus;
  return sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) >= 2;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(i * 7 + seed + (i >> 12));
  return v;
}

// Write: 1 MiB from three local pieces into one remote range at an odd offset.
// Expect: the whole count, the bytes in place, one split copy.
TEST(CopyHelper, LargeWriteIsSplitAndComplete) {
  CopyHelper h;
  std::vector<uint8_t> src = pattern(1 << 20, 3), dst((1 << 20) + 8192, 0);
  iovec local[3] = {{src.data(), 1000}, {src.data() + 1000, 600000}, {src.data() + 601000, src.size() - 601000}};
  iovec remote{dst.data() + 123, src.size()};
  EXPECT_EQ(h.copy(getpid(), false, local, 3, remote), ssize_t(src.size()));
  EXPECT_EQ(std::memcmp(dst.data() + 123, src.data(), src.size()), 0);
  EXPECT_EQ(dst[122], 0);
  EXPECT_EQ(dst[123 + src.size()], 0);
  EXPECT_EQ(h.split_copies(), can_split() ? 1u : 0u);
}

// Read: 512 KiB into two local pieces. Expect: the bytes; a small read is not split.
TEST(CopyHelper, ReadIsSplitSmallOnesAreNot) {
  CopyHelper h;
  std::vector<uint8_t> remote_buf = pattern(512 * 1024, 9), a(100 * 1024), b(412 * 1024);
  iovec local[2] = {{a.data(), a.size()}, {b.data(), b.size()}};
  EXPECT_EQ(h.copy(getpid(), true, local, 2, iovec{remote_buf.data(), remote_buf.size()}), ssize_t(remote_buf.size()));
  EXPECT_EQ(std::memcmp(a.data(), remote_buf.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(b.data(), remote_buf.data() + a.size(), b.size()), 0);
  EXPECT_EQ(h.split_copies(), can_split() ? 1u : 0u);

  std::vector<uint8_t> small(4096);
  iovec one{small.data(), small.size()};
  EXPECT_EQ(h.copy(getpid(), true, &one, 1, iovec{remote_buf.data(), small.size()}), 4096);
  EXPECT_EQ(h.split_copies(), can_split() ? 1u : 0u);
}

// Write: 256 KiB into a range whose second half is unmapped. Expect: not the
// full count (an error or a short copy), whichever half the helper took.
TEST(CopyHelper, UnmappedRemoteMemoryIsNotReportedCopied) {
  CopyHelper h;
  const size_t len = 256 * 1024;
  auto* map = static_cast<uint8_t*>(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(map, MAP_FAILED);
  ASSERT_EQ(munmap(map + len / 2, len / 2), 0);
  std::vector<uint8_t> src = pattern(len, 1);
  iovec local{src.data(), len};
  EXPECT_NE(h.copy(getpid(), false, &local, 1, iovec{map, len}), ssize_t(len));
  EXPECT_EQ(std::memcmp(map, src.data(), 4096), 0);  // the mapped start was written
  munmap(map, len / 2);
}

// Two threads copying 200 distinct 128 KiB blocks each through one helper.
// Expect: every block in place.
TEST(CopyHelper, ConcurrentCallersEachGetTheirBytes) {
  CopyHelper h;
  const size_t block = 128 * 1024;
  std::vector<uint8_t> src[2] = {pattern(block, 11), pattern(block, 77)};
  std::vector<uint8_t> dst[2] = {std::vector<uint8_t>(block), std::vector<uint8_t>(block)};
  bool ok[2] = {true, true};
  auto worker = [&](int t) {
    for (int i = 0; i < 200; ++i) {
      std::memset(dst[t].data(), 0, block);
      iovec local{src[t].data(), block};
      if (h.copy(getpid(), false, &local, 1, iovec{dst[t].data(), block}) != ssize_t(block) || dst[t] != src[t])
        ok[t] = false;
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  EXPECT_TRUE(ok[0]);
  EXPECT_TRUE(ok[1]);
  if (can_split()) {
    EXPECT_GT(h.split_copies(), 0u);
  }
}

}  // namespace
}  // namespace uroce::host
