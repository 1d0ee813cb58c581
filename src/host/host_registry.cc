#include "host/host_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace uroce::host {

struct HostRegistry::Record {
  uint32_t port;  // the owner's private UDP port; 0 = none (written by the lock holder only)
  uint32_t pid;   // diagnostics
};

namespace {

constexpr uint64_t kMagic = 0x3154534F484F5255ull;  // "UROHOST1"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kRecords = kLastHostSlot + 1;  // indexed by slot; 0 unused
constexpr off_t kInitLockByte = 0;                // no slot is 0
constexpr unsigned kInitLockTries = 1000;         // 1 ms apart: a second at most

struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t file_bytes;
  uint32_t records;
  uint32_t reserved[11];
};
static_assert(sizeof(Header) == 64);

constexpr size_t kRecordsOffset = sizeof(Header);
constexpr uint32_t kFileBytes = 4096;
static_assert(kRecordsOffset + kRecords * sizeof(HostRegistry::Record) <= kFileBytes);

constexpr Header kHeader{kMagic, kVersion, kFileBytes, kRecords, {}};

uint32_t load(uint32_t& word, std::memory_order mo) { return std::atomic_ref<uint32_t>(word).load(mo); }
void store(uint32_t& word, uint32_t v, std::memory_order mo) { std::atomic_ref<uint32_t>(word).store(v, mo); }

// CLOCK_MONOTONIC_COARSE is read in the vDSO: no system call.
uint64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1000u + uint64_t(ts.tv_nsec) / 1'000'000u;
}

// Exclusive (F_WRLCK) or release (F_UNLCK) of one byte, owned by the open
// file description, not by the process; never waits. 0 or errno (EAGAIN or
// EACCES: another description holds it).
int set_lock(int fd, off_t byte, short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  return fcntl(fd, F_OFD_SETLK, &fl) == 0 ? 0 : errno;
}

bool is_taken(int err) { return err == EAGAIN || err == EACCES; }

// Bounded: an opener holds the initialization lock for a few system calls,
// and a dead one loses it; one that holds it forever must not block us.
int take_init_lock(int fd) {
  for (unsigned n = 0;; ++n) {
    int err = set_lock(fd, kInitLockByte, F_WRLCK);
    if (!is_taken(err)) return err;
    if (n == kInitLockTries) return ETIMEDOUT;
    timespec ms{0, 1'000'000};
    nanosleep(&ms, nullptr);
  }
}

int write_header(int fd) {
  if (ftruncate(fd, kFileBytes) != 0) return errno;
  return pwrite(fd, &kHeader, sizeof kHeader, 0) == ssize_t(sizeof kHeader) ? 0 : EIO;
}

// Under the initialization lock: a new (empty) file gets its size and
// header; an existing one must be a registry of this build. An all-zero
// header of the right size is one whose initializer died before writing it.
int init_or_validate(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return errno;
  if (st.st_size == 0) return write_header(fd);
  if (st.st_size != kFileBytes) return EPROTO;
  Header h;
  if (pread(fd, &h, sizeof h, 0) != ssize_t(sizeof h)) return EPROTO;
  if (h.magic == 0 && h.version == 0) return write_header(fd);
  bool ours = h.magic == kMagic && h.version == kVersion && h.file_bytes == kFileBytes && h.records == kRecords;
  return ours ? 0 : EPROTO;
}

// Opens `path` as a registry file of this user: never follows a symbolic
// link, never blocks on a FIFO, and refuses another user's file.
int open_file(const std::string& path, int* fd_out) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd < 0) return errno;
  struct stat st;
  int err = fstat(fd, &st) != 0 ? errno : 0;
  if (err == 0 && (!S_ISREG(st.st_mode) || st.st_uid != geteuid())) err = EACCES;
  if (err == 0 && (err = take_init_lock(fd)) == 0) {
    err = init_or_validate(fd);
    set_lock(fd, kInitLockByte, F_UNLCK);
  }
  if (err != 0) {
    close(fd);
    return err;
  }
  *fd_out = fd;
  return 0;
}

// The first slot whose lock this description can take; 0 when all are taken
// (*err ENOSPC) or on a system error (*err its errno).
unsigned claim_slot(int fd, int* err) {
  for (unsigned s = kFirstHostSlot; s <= kLastHostSlot; ++s) {
    *err = set_lock(fd, off_t(s), F_WRLCK);
    if (*err == 0) return s;
    if (!is_taken(*err)) return 0;
  }
  *err = ENOSPC;
  return 0;
}

}  // namespace

core::Result<std::string> HostRegistry::default_path() {
  if (const char* p = std::getenv("UROCE_HOST_REGISTRY"); p && *p) return std::string(p);
  struct stat ns;
  if (stat("/proc/self/ns/net", &ns) != 0) return core::Result<std::string>::error(errno);
  char name[80];
  std::snprintf(name, sizeof name, "/dev/shm/uroce-host-%u-%llu", unsigned(geteuid()),
                static_cast<unsigned long long>(ns.st_ino));
  return std::string(name);
}

core::Result<std::unique_ptr<HostRegistry>> HostRegistry::open(uint16_t private_port) {
  auto path = default_path();
  if (!path.ok()) return core::Result<std::unique_ptr<HostRegistry>>::error(path.err());
  return open_at(*path, private_port);
}

core::Result<std::unique_ptr<HostRegistry>> HostRegistry::open_at(const std::string& path, uint16_t private_port) {
  using R = core::Result<std::unique_ptr<HostRegistry>>;
  int fd = -1;
  if (int err = open_file(path, &fd)) return R::error(err);
  void* map = mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = map == MAP_FAILED ? errno : 0;
  unsigned slot = err == 0 ? claim_slot(fd, &err) : 0;
  if (err != 0) {
    if (map != MAP_FAILED) munmap(map, kFileBytes);
    close(fd);
    return R::error(err);
  }
  return std::unique_ptr<HostRegistry>(new HostRegistry(fd, map, slot, private_port, path));
}

HostRegistry::HostRegistry(int fd, void* map, unsigned slot, uint16_t port, std::string path)
    : fd_(fd),
      map_(map),
      records_(reinterpret_cast<Record*>(static_cast<char*>(map) + kRecordsOffset)),
      slot_(slot),
      port_(port),
      opener_pid_(uint32_t(getpid())),
      path_(std::move(path)) {
  // We hold the slot's lock: the records are ours to write. The port last,
  // so that a reader that sees it sees the pid too.
  store(records_[slot_].pid, opener_pid_, std::memory_order_relaxed);
  store(records_[slot_].port, port_, std::memory_order_release);
}

HostRegistry::~HostRegistry() {
  // A forked child shares the open file description, hence the lock, with
  // the engine's process: only that process gives the slot up.
  if (uint32_t(getpid()) == opener_pid_) {
    store(records_[slot_].port, 0, std::memory_order_release);
    store(records_[slot_].pid, 0, std::memory_order_relaxed);
    set_lock(fd_, off_t(slot_), F_UNLCK);
  }
  munmap(map_, kFileBytes);
  close(fd_);
}

bool HostRegistry::lock_held(unsigned slot) const noexcept {
  // A lock of our own description would not conflict: callers exclude slot_.
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = off_t(slot);
  fl.l_len = 1;
  if (fcntl(fd_, F_OFD_GETLK, &fl) != 0) return false;
  return fl.l_type != F_UNLCK;
}

uint16_t HostRegistry::port_of(unsigned slot) noexcept {
  if (slot < kFirstHostSlot || slot > kLastHostSlot) return 0;
  if (slot == slot_) return port_;
  // Whatever a corrupting process left there: at worst a misdirected packet.
  const uint16_t port = uint16_t(load(records_[slot].port, std::memory_order_acquire));
  if (port == 0) return 0;
  const uint64_t stamp = now_ms() + 1;
  const uint64_t seen = liveness_[slot].load(std::memory_order_relaxed);
  // A new port in the slot means a new owner: check again at once.
  if (seen != 0 && ((seen >> 1) & 0xFFFF) == port && stamp - (seen >> 17) < kRecheckMs) return (seen & 1) ? port : 0;
  const bool alive = lock_held(slot);
  liveness_[slot].store(stamp << 17 | uint64_t(port) << 1 | uint64_t(alive), std::memory_order_relaxed);
  return alive ? port : 0;
}

void HostRegistry::invalidate(unsigned slot) noexcept {
  if (slot <= kLastHostSlot) liveness_[slot].store(0, std::memory_order_relaxed);
}

uint32_t HostRegistry::pid_of(unsigned slot) const noexcept {
  if (slot < kFirstHostSlot || slot > kLastHostSlot) return 0;
  return load(records_[slot].pid, std::memory_order_relaxed);
}

}  // namespace uroce::host
