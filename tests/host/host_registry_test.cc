// The host registry (host_registry.h): engines of one host claim distinct
// QP-number slots, find each other's private ports, and a slot whose owner
// closed or was killed reads as free; a file that is not a registry is
// refused with the documented errno, and garbage in the records never makes
// port_of() read out of bounds.
#include "host/host_registry.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace uroce::host {
namespace {

constexpr uint32_t kFileBytes = 4096;  // the registry's size (host_registry.cc)
constexpr int kChildTimeoutMs = 5000;

class HostRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "uroce-host-registry-test-" + std::to_string(getpid());
    ::unlink(path_.c_str());
    ::setenv("UROCE_HOST_REGISTRY", path_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("UROCE_HOST_REGISTRY");
    ::unlink(path_.c_str());
  }

  static std::unique_ptr<HostRegistry> open_ok(uint16_t port) {
    auto r = HostRegistry::open(port);
    EXPECT_TRUE(r.ok()) << std::strerror(r.err());
    return r.ok() ? std::move(*r) : nullptr;
  }
  static int open_err(uint16_t port) {
    auto r = HostRegistry::open(port);
    return r.err();
  }
  // Writes `len` bytes of `byte` at `offset` of the file, as a corrupting process would.
  void scribble(off_t offset, size_t len, uint8_t byte) {
    std::vector<uint8_t> junk(len, byte);
    int fd = ::open(path_.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(::pwrite(fd, junk.data(), len, offset), ssize_t(len));
    ::close(fd);
  }
  void truncate_to(off_t bytes) { ASSERT_EQ(::truncate(path_.c_str(), bytes), 0) << std::strerror(errno); }

  std::string path_;
};

bool in_range(unsigned slot) { return slot >= kFirstHostSlot && slot <= kLastHostSlot; }

TEST_F(HostRegistryTest, TwoEnginesOfOneProcessGetDistinctSlotsAndFindEachOther) {
  auto a = open_ok(1111);
  auto b = open_ok(2222);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->path(), path_);
  EXPECT_TRUE(in_range(a->slot()));
  EXPECT_TRUE(in_range(b->slot()));
  EXPECT_NE(a->slot(), b->slot());  // OFD locks of two opens conflict within a process
  EXPECT_EQ(a->port_of(b->slot()), 2222);
  EXPECT_EQ(b->port_of(a->slot()), 1111);
  EXPECT_EQ(a->port_of(a->slot()), 1111);
  EXPECT_EQ(a->pid_of(b->slot()), uint32_t(getpid()));
  // A QP number names its slot in its top 8 bits.
  EXPECT_EQ(qpn_slot(uint32_t(b->slot()) << 16 | 0xBEEF), b->slot());
}

TEST_F(HostRegistryTest, SlotsOutOfRangeAndFreeSlotsHaveNoPort) {
  auto a = open_ok(1111);
  ASSERT_TRUE(a);
  for (unsigned slot : {0u, 255u, 256u, 0xFFFFu, ~0u}) {
    EXPECT_EQ(a->port_of(slot), 0) << slot;
    EXPECT_EQ(a->pid_of(slot), 0u) << slot;
    a->invalidate(slot);  // no effect, no fault
  }
  EXPECT_EQ(a->port_of(a->slot() + 1), 0);
}

TEST_F(HostRegistryTest, ClosedEngineFreesItsSlotForTheNextOpen) {
  auto a = open_ok(1111);
  auto b = open_ok(2222);
  ASSERT_TRUE(a && b);
  const unsigned freed = b->slot();
  ASSERT_EQ(a->port_of(freed), 2222);  // now cached as alive
  b.reset();
  EXPECT_EQ(a->port_of(freed), 0);  // the port was cleared before the lock went
  a->invalidate(freed);
  EXPECT_EQ(a->port_of(freed), 0);
  auto c = open_ok(3333);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->slot(), freed);  // the first free slot
  // A new port in the slot is a new owner: seen without waiting for the cache.
  EXPECT_EQ(a->port_of(freed), 3333);
}

// A child claims a slot, reports it, and waits until killed.
pid_t spawn_slot_owner(uint16_t port, int* slot_fd) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::alarm(30);  // never outlives a test that lost track of it
    auto r = HostRegistry::open(port);
    unsigned slot = r.ok() ? (*r)->slot() : 0;
    if (::write(fds[1], &slot, sizeof slot) != sizeof slot) ::_exit(1);
    for (;;) ::pause();
  }
  ::close(fds[1]);
  *slot_fd = fds[0];
  return pid;
}

unsigned read_slot(int fd) {
  pollfd p{fd, POLLIN, 0};
  unsigned slot = 0;
  if (::poll(&p, 1, kChildTimeoutMs) != 1 || ::read(fd, &slot, sizeof slot) != sizeof slot) return 0;
  return slot;
}

TEST_F(HostRegistryTest, KilledProcessSlotReadsDeadAndIsClaimedAgain) {
  auto a = open_ok(1111);
  ASSERT_TRUE(a);
  int slot_fd = -1;
  pid_t child = spawn_slot_owner(4444, &slot_fd);
  ASSERT_GT(child, 0);
  const unsigned slot = read_slot(slot_fd);
  ::close(slot_fd);
  EXPECT_TRUE(in_range(slot));
  EXPECT_NE(slot, a->slot());
  EXPECT_EQ(a->port_of(slot), 4444);
  EXPECT_EQ(a->pid_of(slot), uint32_t(child));
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);  // its files, hence its lock, are gone
  EXPECT_TRUE(WIFSIGNALED(status));
  a->invalidate(slot);
  EXPECT_EQ(a->port_of(slot), 0);  // the port word is stale, the lock tells
  auto b = open_ok(5555);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->slot(), slot);
  EXPECT_EQ(a->port_of(slot), 5555);
}

TEST_F(HostRegistryTest, ForkedChildClosingAnInheritedRegistryKeepsTheParentsSlot) {
  auto a = open_ok(1111);
  ASSERT_TRUE(a);
  const unsigned slot = a->slot();
  pid_t child = ::fork();
  if (child == 0) {
    a.reset();  // shares the parent's open file description, hence its lock
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  auto b = open_ok(2222);
  ASSERT_TRUE(b);
  EXPECT_NE(b->slot(), slot);
  EXPECT_EQ(b->port_of(slot), 1111);
}

TEST_F(HostRegistryTest, EverySlotTakenIsEnospc) {
  std::vector<std::unique_ptr<HostRegistry>> all;
  for (unsigned n = kFirstHostSlot; n <= kLastHostSlot; ++n) {
    all.push_back(open_ok(uint16_t(10000 + n)));
    ASSERT_TRUE(all.back());
    ASSERT_EQ(all.back()->slot(), n);
  }
  EXPECT_EQ(open_err(9999), ENOSPC);
  EXPECT_EQ(all.front()->port_of(kLastHostSlot), 10000 + kLastHostSlot);
  all[99].reset();
  auto again = open_ok(9999);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->slot(), 100u);
}

TEST_F(HostRegistryTest, FileOfAnotherKindIsEproto) {
  { auto a = open_ok(1111); }
  scribble(0, 8, 'X');  // magic
  EXPECT_EQ(open_err(1111), EPROTO);
  truncate_to(0);  // empty: initialized afresh
  { auto a = open_ok(1111); }
  scribble(8, 4, 0x7F);  // version
  EXPECT_EQ(open_err(1111), EPROTO);
}

TEST_F(HostRegistryTest, FileOfAnotherSizeIsEproto) {
  { auto a = open_ok(1111); }
  truncate_to(100);
  EXPECT_EQ(open_err(1111), EPROTO);
  truncate_to(kFileBytes * 2);
  EXPECT_EQ(open_err(1111), EPROTO);
  truncate_to(kFileBytes);  // header intact, the rest zero: fine
  EXPECT_TRUE(open_ok(1111));
}

TEST_F(HostRegistryTest, AllZeroHeaderIsInitialized) {
  // An opener that died between sizing the file and writing its header.
  int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(::ftruncate(fd, kFileBytes), 0);
  ::close(fd);
  auto a = open_ok(1111);
  ASSERT_TRUE(a);
  EXPECT_TRUE(in_range(a->slot()));
}

TEST_F(HostRegistryTest, NotARegularFileIsRefused) {
  ASSERT_EQ(::mkfifo(path_.c_str(), 0600), 0) << std::strerror(errno);
  EXPECT_EQ(open_err(1111), EACCES);  // and did not block on the FIFO
  ::unlink(path_.c_str());
  std::string target = path_ + ".target";
  ASSERT_EQ(::symlink(target.c_str(), path_.c_str()), 0);
  EXPECT_EQ(open_err(1111), ELOOP);  // never follows a link
  ::unlink(target.c_str());
}

TEST_F(HostRegistryTest, GarbageInTheRecordsIsReadButNeverOutOfBounds) {
  auto a = open_ok(1111);
  auto b = open_ok(2222);
  ASSERT_TRUE(a && b);
  scribble(64, kFileBytes - 64, 0xFF);       // every record: port 0xFFFFFFFF, pid 0xFFFFFFFF
  EXPECT_EQ(a->port_of(a->slot()), 1111);    // its own port is its own
  EXPECT_EQ(a->port_of(b->slot()), 0xFFFF);  // alive: whatever port word is there
  for (unsigned slot = 0; slot <= 300; ++slot) {
    a->invalidate(slot);
    if (slot != a->slot() && slot != b->slot()) {
      EXPECT_EQ(a->port_of(slot), 0) << slot;  // no live owner
    }
  }
  b.reset();  // still releases cleanly
  a->invalidate(2);
  EXPECT_EQ(a->port_of(2), 0);
}

TEST(HostRegistryPath, NamedAfterUserAndNetworkNamespace) {
  ::unsetenv("UROCE_HOST_REGISTRY");
  auto p = HostRegistry::default_path();
  ASSERT_TRUE(p.ok()) << std::strerror(p.err());
  struct stat ns;
  ASSERT_EQ(::stat("/proc/self/ns/net", &ns), 0);
  EXPECT_EQ(*p, "/dev/shm/uroce-host-" + std::to_string(geteuid()) + "-" + std::to_string(ns.st_ino));
}

}  // namespace
}  // namespace uroce::host
