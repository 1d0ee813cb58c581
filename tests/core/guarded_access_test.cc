// Accesses to registered memory whose protection changed after registration:
// the guarded routines (core/guarded_access.h) stop at a fault
// instead of ending the process, /proc/self/mem (core/proc_mem.h) finishes
// what the kernel lets it, and the copies and atomics of plain regions
// (core/mr_access.h) land as on a NIC's pinned pages or fail cleanly. Faults
// that are not ours still reach the handler installed before ours, or end
// the process (each of those in a process of its own: a death test).
#include "core/guarded_access.h"

#include <gtest/gtest.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/mr.h"
#include "core/mr_access.h"
#include "core/proc_mem.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UROCE_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define UROCE_TEST_ASAN 1
#endif

namespace uroce::core {
namespace {

const size_t kPage = size_t(sysconf(_SC_PAGESIZE));

// `count` pages of a fresh mapping, filled with a pattern; unmapped at the end.
class Pages {
 public:
  explicit Pages(size_t count, int flags = MAP_PRIVATE | MAP_ANONYMOUS, int fd = -1) : len_(count * kPage) {
    void* m = mmap(nullptr, len_, PROT_READ | PROT_WRITE, flags, fd, 0);
    base_ = m == MAP_FAILED ? nullptr : static_cast<uint8_t*>(m);
    if (base_ && fd < 0)
      for (size_t i = 0; i < len_; ++i) base_[i] = uint8_t(i * 13 + 1);
  }
  ~Pages() {
    if (base_) munmap(base_, len_);
  }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;

  uint8_t* at(size_t offset) const { return base_ + offset; }
  size_t size() const { return len_; }
  bool ok() const { return base_ != nullptr; }
  // `prot` for pages [first, first + count).
  void protect(int prot, size_t first = 0, size_t count = SIZE_MAX) const {
    size_t n = count == SIZE_MAX ? len_ / kPage - first : count;
    ASSERT_EQ(mprotect(base_ + first * kPage, n * kPage, prot), 0) << strerror(errno);
  }
  // Unmaps pages [first, end): they stay unmapped until the object goes.
  void unmap_from(size_t first) {
    ASSERT_EQ(munmap(base_ + first * kPage, len_ - first * kPage), 0);
    len_ = first * kPage;
  }

 private:
  uint8_t* base_;
  size_t len_;
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(i * 7 + seed);
  return v;
}

class GuardedAccess : public ::testing::Test {
 protected:
  void SetUp() override { arm_fault_guard(); }
};

// Expect /proc/self/mem to write a read-only private page and read a
// PROT_NONE one, and to refuse an unmapped one.
TEST_F(GuardedAccess, ProcMem) {
  Pages p(2);
  ASSERT_TRUE(p.ok());
  p.protect(PROT_READ);
  auto src = pattern(100, 5);
  ASSERT_TRUE(proc_mem_write(p.at(kPage - 50), src.data(), src.size()));
  EXPECT_EQ(memcmp(p.at(kPage - 50), src.data(), src.size()), 0);
  p.protect(PROT_NONE);
  std::vector<uint8_t> out(src.size());
  ASSERT_TRUE(proc_mem_read(out.data(), p.at(kPage - 50), out.size()));
  EXPECT_EQ(out, src);
  p.protect(PROT_READ | PROT_WRITE);
  p.unmap_from(1);
  EXPECT_FALSE(proc_mem_write(p.at(kPage - 50), src.data(), src.size()));
}

// Expect a fork()ed child's /proc/self/mem to be its own: its write lands in
// its memory, not in its parent's, though the parent had opened the file.
TEST_F(GuardedAccess, ProcMemAfterFork) {
  Pages p(1);
  ASSERT_TRUE(p.ok());
  p.protect(PROT_READ);
  const uint8_t before = *p.at(0), parents = uint8_t(before + 1), childs = uint8_t(before + 2);
  ASSERT_TRUE(proc_mem_write(p.at(0), &parents, 1));  // opened here
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(proc_mem_write(p.at(0), &childs, 1) && *p.at(0) == childs ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(*p.at(0), parents);
}

#if defined(__x86_64__)

// A plain (not on-demand) region over `p`.
Mr plain_mr(const Pages& p) {
  Mr mr;
  mr.host = p.at(0);
  mr.length = p.size();
  mr.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  return mr;
}

// Expect a copy that runs into a read-only page to stop there (the bytes
// before it copied) and report the rest, instead of a SIGSEGV.
TEST_F(GuardedAccess, CopyStopsAtReadOnlyPage) {
  Pages dst(2);
  ASSERT_TRUE(dst.ok());
  dst.protect(PROT_READ, 1);
  auto src = pattern(2 * kPage, 3);
  size_t left = guarded_copy(dst.at(0), src.data(), src.size());
  ASSERT_GT(left, 0u);
  ASSERT_LE(left, kPage);
  size_t done = src.size() - left;
  EXPECT_EQ(memcmp(dst.at(0), src.data(), done), 0);
}

// Expect a copy from a PROT_NONE page and one into an unmapped page to stop.
TEST_F(GuardedAccess, CopyStopsAtUnreadableOrUnmapped) {
  Pages p(2);
  ASSERT_TRUE(p.ok());
  p.protect(PROT_NONE);
  std::vector<uint8_t> out(kPage);
  EXPECT_EQ(guarded_copy(out.data(), p.at(0), kPage), kPage);
  p.protect(PROT_READ | PROT_WRITE);
  p.unmap_from(1);
  auto src = pattern(2 * kPage, 1);
  EXPECT_EQ(guarded_copy(p.at(0), src.data(), 2 * kPage), kPage);
  EXPECT_EQ(memcmp(p.at(0), src.data(), kPage), 0);
}

// Expect the probe to name exactly the ranges whose every page reads.
TEST_F(GuardedAccess, Readable) {
  Pages p(3);
  ASSERT_TRUE(p.ok());
  p.protect(PROT_NONE, 1, 1);
  EXPECT_TRUE(guarded_readable(p.at(0), kPage));
  EXPECT_TRUE(guarded_readable(p.at(kPage - 1), 1));
  EXPECT_FALSE(guarded_readable(p.at(kPage - 1), 2));
  EXPECT_FALSE(guarded_readable(p.at(100), 2 * kPage));
  EXPECT_FALSE(guarded_readable(p.at(kPage + 5), 1));
  EXPECT_TRUE(guarded_readable(p.at(2 * kPage), kPage));
}

// Expect the locked instructions to work on writable memory and to refuse,
// changing nothing, memory that is read-only.
TEST_F(GuardedAccess, Atomics) {
  Pages p(1);
  ASSERT_TRUE(p.ok());
  auto* v = reinterpret_cast<uint64_t*>(p.at(0));
  v[0] = 40;
  uint64_t old = 0;
  EXPECT_TRUE(guarded_fetch_add(v, 2, &old));
  EXPECT_EQ(old, 40u);
  EXPECT_TRUE(guarded_compare_swap(v, 42, 7, &old));
  EXPECT_EQ(old, 42u);
  EXPECT_TRUE(guarded_compare_swap(v, 42, 9, &old));
  EXPECT_EQ(old, 7u);
  EXPECT_EQ(v[0], 7u);
  p.protect(PROT_READ);
  EXPECT_FALSE(guarded_fetch_add(v, 1, &old));
  EXPECT_FALSE(guarded_compare_swap(v, 7, 1, &old));
  EXPECT_EQ(v[0], 7u);
}

// Expect the loads to read and the store to write accessible memory, and
// each to refuse, changing nothing, memory it cannot touch: a PROT_NONE page,
// a read-only page for the store, and a shared file's page cut from under
// its mapping (SIGBUS rather than SIGSEGV).
TEST_F(GuardedAccess, LoadsAndStores) {
  Pages p(1);
  ASSERT_TRUE(p.ok());
  auto* v = reinterpret_cast<uint64_t*>(p.at(0));
  v[0] = 0x1122334455667788;
  uint64_t word = 0;
  uint32_t half = 0;
  EXPECT_TRUE(guarded_load(v, &word));
  EXPECT_EQ(word, 0x1122334455667788u);
  EXPECT_TRUE(guarded_load(v, &half));
  EXPECT_EQ(half, 0x55667788u);
  EXPECT_TRUE(guarded_store(v, 42));
  EXPECT_EQ(v[0], 42u);
  p.protect(PROT_READ);
  EXPECT_FALSE(guarded_store(v, 7));
  EXPECT_TRUE(guarded_load(v, &word));
  EXPECT_EQ(word, 42u);
  p.protect(PROT_NONE);
  word = half = 9;
  EXPECT_FALSE(guarded_load(v, &word));
  EXPECT_FALSE(guarded_load(v, &half));
  EXPECT_EQ(word, 9u) << "nothing written on a fault";
  EXPECT_EQ(half, 9u);
  p.protect(PROT_READ | PROT_WRITE);
  EXPECT_EQ(v[0], 42u);

  int fd = memfd_create("guarded", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, off_t(kPage)), 0);
  {
    Pages shared(1, MAP_SHARED, fd);
    ASSERT_TRUE(shared.ok());
    ASSERT_TRUE(guarded_store(shared.at(0), 5));
    ASSERT_EQ(ftruncate(fd, 0), 0);
    EXPECT_FALSE(guarded_load(shared.at(0), &word));
    EXPECT_FALSE(guarded_store(shared.at(0), 6));
  }
  close(fd);
}

// Expect a copy into a plain region made read-only after registration to
// land whole, as on a NIC's pinned pages, and one from a region made
// PROT_NONE to read it whole.
TEST_F(GuardedAccess, PlainRegionKeepsItsAccess) {
  Pages p(3);
  ASSERT_TRUE(p.ok());
  Mr mr = plain_mr(p);
  p.protect(PROT_READ);
  auto src = pattern(2 * kPage + 300, 9);
  ASSERT_TRUE(copy_to_mr(mr, p.at(100), src.data(), src.size()));
  EXPECT_EQ(memcmp(p.at(100), src.data(), src.size()), 0);
  p.protect(PROT_NONE);
  EXPECT_FALSE(readable_in_place(mr, p.at(100), src.size()));
  std::vector<uint8_t> out(src.size());
  ASSERT_TRUE(copy_from_mr(mr, out.data(), p.at(100), out.size()));
  EXPECT_EQ(out, src);
  p.protect(PROT_READ);
  EXPECT_TRUE(readable_in_place(mr, p.at(100), src.size()));
}

// Expect a copy that the kernel cannot finish (unmapped memory, a read-only
// shared mapping) to fail, so that the caller reports a remote access error.
TEST_F(GuardedAccess, PlainRegionRefused) {
  Pages p(2);
  ASSERT_TRUE(p.ok());
  Mr mr = plain_mr(p);
  p.unmap_from(1);
  auto src = pattern(2 * kPage, 2);
  EXPECT_FALSE(copy_to_mr(mr, p.at(0), src.data(), src.size()));
  std::vector<uint8_t> out(src.size());
  EXPECT_FALSE(copy_from_mr(mr, out.data(), p.at(0), out.size()));

  Pages shared(1, MAP_SHARED | MAP_ANONYMOUS);
  ASSERT_TRUE(shared.ok());
  Mr smr = plain_mr(shared);
  std::vector<uint8_t> was(shared.at(0), shared.at(0) + kPage);
  shared.protect(PROT_READ);
  EXPECT_FALSE(copy_to_mr(smr, shared.at(0), src.data(), kPage));
  EXPECT_EQ(memcmp(shared.at(0), was.data(), kPage), 0);
  ASSERT_TRUE(copy_from_mr(smr, out.data(), shared.at(0), kPage));  // reading it is allowed
  EXPECT_EQ(memcmp(out.data(), was.data(), kPage), 0);
}

// Expect a file mapping past its file's end (SIGBUS territory) to fail both
// ways.
TEST_F(GuardedAccess, TruncatedFile) {
  char path[] = "/tmp/uroce_guarded_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, off_t(kPage)), 0);
  {
    Pages p(1, MAP_SHARED, fd);
    ASSERT_TRUE(p.ok());
    Mr mr = plain_mr(p);
    ASSERT_EQ(ftruncate(fd, 0), 0);
    auto src = pattern(64, 4);
    EXPECT_FALSE(copy_to_mr(mr, p.at(0), src.data(), src.size()));
    std::vector<uint8_t> out(64);
    EXPECT_FALSE(copy_from_mr(mr, out.data(), p.at(0), out.size()));
  }
  close(fd);
}

// Expect atomics on a plain region made read-only, then PROT_NONE, after
// registration to execute (also at an unaligned address), and to fail on a
// read-only shared mapping unless they would write nothing.
TEST_F(GuardedAccess, AtomicOnPlainRegion) {
  Pages p(1);
  ASSERT_TRUE(p.ok());
  Mr mr = plain_mr(p);
  auto* v = reinterpret_cast<uint64_t*>(p.at(0));
  v[0] = 40;
  v[1] = 7;
  p.protect(PROT_READ);
  uint64_t old = 0;
  ASSERT_TRUE(atomic_on_mr(mr, p.at(0), false, 2, 0, &old));
  EXPECT_EQ(old, 40u);
  EXPECT_EQ(v[0], 42u);
  ASSERT_TRUE(atomic_on_mr(mr, p.at(3), false, 0, 0, &old));  // unaligned
  p.protect(PROT_NONE);
  ASSERT_TRUE(atomic_on_mr(mr, p.at(8), true, 99, 7, &old));
  EXPECT_EQ(old, 7u);
  ASSERT_TRUE(atomic_on_mr(mr, p.at(8), true, 1, 7, &old));
  EXPECT_EQ(old, 99u);
  p.protect(PROT_READ);
  EXPECT_EQ(v[1], 99u);

  Pages shared(1, MAP_SHARED | MAP_ANONYMOUS);
  ASSERT_TRUE(shared.ok());
  Mr smr = plain_mr(shared);
  auto* s = reinterpret_cast<uint64_t*>(shared.at(0));
  s[0] = 5;
  shared.protect(PROT_READ);
  EXPECT_FALSE(atomic_on_mr(smr, shared.at(0), false, 1, 0, &old));
  EXPECT_EQ(s[0], 5u);
  ASSERT_TRUE(atomic_on_mr(smr, shared.at(0), true, 9, 6, &old));  // the compare fails: nothing to write
  EXPECT_EQ(old, 5u);
}

// Expect atomics on an on-demand-paging region to execute where its pages are
// mapped writable (also at an unaligned address), and to fail, nothing
// changed, on a read-only page and on an unmapped one (as an ODP NIC, which
// follows the page tables: no write through a read-only mapping).
TEST_F(GuardedAccess, AtomicOnOdpRegion) {
  if (!kOdpAtomics) GTEST_SKIP() << "atomics on ODP regions need the guarded instructions (x86-64)";
  Pages p(3);
  ASSERT_TRUE(p.ok());
  Mr mr = plain_mr(p);
  mr.access |= IBV_ACCESS_ON_DEMAND;
  auto* v = reinterpret_cast<uint64_t*>(p.at(0));
  v[0] = 40;
  v[1] = 0;
  uint64_t old = 0;
  ASSERT_TRUE(atomic_on_mr(mr, p.at(0), false, 2, 0, &old));
  EXPECT_EQ(old, 40u);
  EXPECT_EQ(v[0], 42u);
  ASSERT_TRUE(atomic_on_mr(mr, p.at(8), true, 99, 0, &old));
  EXPECT_EQ(old, 0u);
  EXPECT_EQ(v[1], 99u);
  ASSERT_TRUE(atomic_on_mr(mr, p.at(3), false, 1, 0, &old));  // unaligned: the word at byte 3
  EXPECT_EQ(old, uint64_t(99) << 40);                         // bytes 3-7 of v[0] (0), then 0-2 of v[1] (99, 0, 0)
  EXPECT_EQ(v[0], 42u + (uint64_t(1) << 24));

  auto* ro = reinterpret_cast<uint64_t*>(p.at(kPage));
  ro[0] = 5;
  p.protect(PROT_READ, 1, 1);
  EXPECT_FALSE(atomic_on_mr(mr, p.at(kPage), false, 1, 0, &old));
  EXPECT_FALSE(atomic_on_mr(mr, p.at(kPage) + 1, false, 1, 0, &old));
  EXPECT_EQ(ro[0], 5u);
  p.unmap_from(2);
  EXPECT_FALSE(atomic_on_mr(mr, p.at(2 * kPage), true, 1, 0, &old));
  EXPECT_FALSE(atomic_on_mr(mr, p.at(2 * kPage) + 4, false, 1, 0, &old));
}

// --- faults that are not ours (each in a fresh process: the handler that
// was there before ours is the one the test installs first) ---

sigjmp_buf g_jump;
volatile sig_atomic_t g_seen = 0;

void jump_back_info(int, siginfo_t*, void*) {
  g_seen = g_seen + 1;
  siglongjmp(g_jump, 1);
}

void jump_back_plain(int) {
  g_seen = g_seen + 1;
  siglongjmp(g_jump, 1);
}

// A write to a PROT_NONE page outside any guarded routine.
void fault_elsewhere() {
  static void* page = mmap(nullptr, kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  *static_cast<volatile uint8_t*>(page) = 1;
}

// In the child: installs `sa` for SIGSEGV, then our guard; our faults stay
// ours, another fault reaches the handler. Exits 0 if all went so.
[[noreturn]] void run_chain(const struct sigaction& sa) {
  if (sigaction(SIGSEGV, &sa, nullptr) != 0) _exit(10);
  arm_fault_guard();
  Pages p(1);
  p.protect(PROT_READ);
  uint8_t byte = 1;
  if (guarded_copy(p.at(0), &byte, 1) != 1 || g_seen != 0) _exit(11);
  if (sigsetjmp(g_jump, 1) == 0) {
    fault_elsewhere();
    _exit(12);  // not reached: the handler jumps back
  }
  _exit(g_seen == 1 ? 0 : 13);
}

// Expect a SIGSEGV of someone else's code to reach the SA_SIGINFO handler
// installed before ours.
TEST(GuardedAccessChain, ReachesEarlierSiginfoHandler) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  struct sigaction sa = {};
  sa.sa_sigaction = jump_back_info;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  EXPECT_EXIT(run_chain(sa), ::testing::ExitedWithCode(0), "");
}

// Expect the same of a plain (not SA_SIGINFO) handler.
TEST(GuardedAccessChain, ReachesEarlierPlainHandler) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  struct sigaction sa = {};
  sa.sa_handler = jump_back_plain;
  sa.sa_flags = SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  EXPECT_EXIT(run_chain(sa), ::testing::ExitedWithCode(0), "");
}

// Expect a fault that is not ours to end the process as without the guard:
// killed by SIGSEGV (the default action), or under ASan reported by ASan's
// handler, which was there before ours.
TEST(GuardedAccessChain, OtherFaultStillFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
#if defined(UROCE_TEST_ASAN)
  EXPECT_EXIT(
      {
        arm_fault_guard();
        fault_elsewhere();
      },
      [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }, "AddressSanitizer: SEGV");
#else
  EXPECT_EXIT(
      {
        arm_fault_guard();
        fault_elsewhere();
      },
      ::testing::KilledBySignal(SIGSEGV), "");
#endif
}

// Expect a SIGSEGV sent by kill (no fault to run again) to end the process
// too when the default action was in place.
TEST(GuardedAccessChain, SentSignalStillFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
#if defined(UROCE_TEST_ASAN)
  GTEST_SKIP() << "ASan's handler takes a sent SIGSEGV";
#endif
  EXPECT_EXIT(
      {
        arm_fault_guard();
        raise(SIGSEGV);
      },
      ::testing::KilledBySignal(SIGSEGV), "");
}

#endif  // __x86_64__

}  // namespace
}  // namespace uroce::core
