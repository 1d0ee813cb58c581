#include "engine/xrc_domain.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <map>
#include <mutex>
#include <new>
#include <utility>

#include "core/log.h"
#include "transport/shared_file.h"

namespace uroce::engine {

namespace {

constexpr uint64_t kMagic = 0x31444352584F5255ull;  // "UROXRCD1"

using transport::process_alive;

void spin_lock(uint32_t& word) {
  std::atomic_ref<uint32_t> lock(word);
  const uint32_t self = uint32_t(getpid());
  for (unsigned n = 0;; ++n) {
    uint32_t holder = 0;
    if (lock.compare_exchange_weak(holder, self, std::memory_order_acquire)) return;
    // A holder that died inside its critical section loses the lock.
    if (holder != 0 && (n & 1023) == 1023 && !process_alive(holder))
      lock.compare_exchange_strong(holder, 0, std::memory_order_relaxed);
    sched_yield();
  }
}

void spin_unlock(uint32_t& word) { std::atomic_ref<uint32_t>(word).store(0, std::memory_order_release); }

// Domains this process has open, so that every open of one file shares a mapping.
std::mutex g_open_mu;
std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<XrcDomain>> g_open;
std::atomic<uint64_t> g_private_count{0};

}  // namespace

struct XrcDomain::Header {
  uint64_t magic;
  uint64_t bytes;  // segment size: a segment of another uroce build is replaced
  uint32_t ready;  // set (release) once the creator has initialized the segment
  uint32_t lock;
  uint32_t removed;  // the object was unlinked: openers must start over
  // The processes that have it open and how many XrcDomain objects each holds
  // (pid 0 = free entry); under `lock`. Entries of dead processes are pruned.
  uint32_t opener_pid[XrcDomain::kOpeners];
  uint32_t opener_count[XrcDomain::kOpeners];
  // The domain's XRC SRQs (numbers; 0 = free entry) and their processes.
  // Written under `lock`, read without it (relaxed loads).
  uint32_t srq_num[XrcDomain::kSrqs];
  uint32_t srq_pid[XrcDomain::kSrqs];
};

namespace {

// Forgets openers and SRQs of processes that died without closing (caller
// holds the header lock); returns how many processes still have it open.
uint32_t prune_dead(XrcDomain::Header* h) {
  uint32_t live = 0;
  for (uint32_t i = 0; i < XrcDomain::kOpeners; ++i) {
    if (h->opener_pid[i] == 0) continue;
    if (process_alive(h->opener_pid[i])) {
      ++live;
    } else {
      h->opener_pid[i] = 0;
      h->opener_count[i] = 0;
    }
  }
  for (uint32_t i = 0; i < XrcDomain::kSrqs; ++i)
    if (h->srq_num[i] != 0 && !process_alive(h->srq_pid[i]))
      std::atomic_ref<uint32_t>(h->srq_num[i]).store(0, std::memory_order_relaxed);
  return live;
}

// Counts one more open by this process; false when kOpeners processes have it.
bool add_opener(XrcDomain::Header* h) {
  const uint32_t self = uint32_t(getpid());
  uint32_t free_entry = XrcDomain::kOpeners;
  for (uint32_t i = 0; i < XrcDomain::kOpeners; ++i) {
    if (h->opener_pid[i] == self) {
      ++h->opener_count[i];
      return true;
    }
    if (h->opener_pid[i] == 0 && free_entry == XrcDomain::kOpeners) free_entry = i;
  }
  if (free_entry == XrcDomain::kOpeners) return false;
  h->opener_pid[free_entry] = self;
  h->opener_count[free_entry] = 1;
  return true;
}

void drop_opener(XrcDomain::Header* h) {
  const uint32_t self = uint32_t(getpid());
  for (uint32_t i = 0; i < XrcDomain::kOpeners; ++i) {
    if (h->opener_pid[i] != self) continue;
    if (--h->opener_count[i] == 0) h->opener_pid[i] = 0;
    return;
  }
}

}  // namespace

SlotLock::SlotLock(TargetSlot& s) : word_(s.lock) { spin_lock(word_); }
SlotLock::~SlotLock() { spin_unlock(word_); }

XrcDomain::OpenResult XrcDomain::open(int fd, int oflags) { return fd == -1 ? open_private() : open_file(fd, oflags); }

XrcDomain::OpenResult XrcDomain::open_private() {
  size_t bytes = sizeof(Header) + sizeof(TargetSlot) * kSlots;
  auto d = std::shared_ptr<XrcDomain>(new (std::nothrow) XrcDomain());
  void* mem = ::operator new(bytes, std::nothrow);
  if (!d || !mem) {
    ::operator delete(mem);
    return OpenResult::error(ENOMEM);
  }
  d->header_ = new (mem) Header{};
  d->header_->magic = kMagic;
  d->header_->bytes = bytes;
  d->header_->ready = 1;
  d->slots_ = new (static_cast<uint8_t*>(mem) + sizeof(Header)) TargetSlot[kSlots];
  d->bytes_ = bytes;
  d->key_ = XrcDomainKey{0, (uint64_t(getpid()) << 32) | ++g_private_count};
  std::lock_guard open_lock(g_open_mu);
  g_open[std::make_pair(d->key_.dev, d->key_.ino)] = d;
  return d;
}

namespace {

// A file descriptor, closed at the end of its scope.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// A shared mapping, unmapped at the end of its scope unless released.
class ScopedMapping {
 public:
  ScopedMapping(void* mem, size_t bytes) : mem_(mem == MAP_FAILED ? nullptr : mem), bytes_(bytes) {}
  ~ScopedMapping() {
    if (mem_) munmap(mem_, bytes_);
  }
  ScopedMapping(const ScopedMapping&) = delete;
  ScopedMapping& operator=(const ScopedMapping&) = delete;
  void* get() const { return mem_; }
  void* release() { return std::exchange(mem_, nullptr); }

 private:
  void* mem_;
  size_t bytes_;
};

// The shared memory object of a domain file's inode (device, inode number).
struct SegmentName {
  SegmentName(uint64_t dev, uint64_t ino) {
    std::snprintf(text, sizeof text, "/uroce-xrcd-%llx-%llx", (unsigned long long)dev, (unsigned long long)ino);
  }
  char text[96];
};

// Holds a segment header's lock for a scope.
class HeaderLock {
 public:
  explicit HeaderLock(uint32_t& word) : word_(word) { spin_lock(word_); }
  ~HeaderLock() { spin_unlock(word_); }
  HeaderLock(const HeaderLock&) = delete;
  HeaderLock& operator=(const HeaderLock&) = delete;

 private:
  uint32_t& word_;
};

// Waits, in 1 ms naps for up to a second, until `done()`: a creator in another
// process is between two steps. True if it happened.
template <class Done>
bool wait_for_creator(Done done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    usleep(1000);
  }
  return done();
}

// What one attempt at opening the object came to: the mapped, initialized
// segment with this process counted among its openers, an error, or a retry
// (the object was removed or replaced meanwhile).
struct Attempt {
  void* mem = nullptr;
  int error = 0;
  bool retry = false;
};

Attempt failed(int error) { return Attempt{nullptr, error, false}; }
Attempt again() { return Attempt{nullptr, 0, true}; }

// Counts this process among the openers of the mapped object `name`, which
// it `created` or found: the creator marks it ready, a later opener waits for
// that. An object of another build or one being removed: a retry.
Attempt join(ScopedMapping& map, const char* name, int oflags, size_t bytes, bool created) {
  auto* h = static_cast<XrcDomain::Header*>(map.get());
  std::atomic_ref<uint32_t> ready(h->ready);
  if (created) {
    // ftruncate zero-filled the segment: zero is the free state of every
    // slot (no lock holder, no owner).
    h->magic = kMagic;
    h->bytes = bytes;
    ready.store(1, std::memory_order_release);
  }
  if (!wait_for_creator([&] { return ready.load(std::memory_order_acquire) != 0; })) return failed(EAGAIN);
  if (h->magic != kMagic || h->bytes != bytes) {  // left behind by another build
    shm_unlink(name);
    return again();
  }
  HeaderLock lock(h->lock);
  if (h->removed) return again();  // its last user removed it while we opened it
  // A domain all of whose openers died does not exist any more (the next
  // O_CREAT open takes it over; target slots and SRQ entries of the dead are
  // reclaimed as they are needed).
  bool exists = prune_dead(h) > 0;
  if (!created && !exists && !(oflags & O_CREAT)) return failed(EAGAIN);
  if (!created && exists && (oflags & O_EXCL)) return failed(EINVAL);
  if (!add_opener(h)) return failed(ENOMEM);
  return Attempt{map.release(), 0, false};
}

// Opens the object `name`, creating it (sized to `bytes`, zero-filled) when
// it does not exist and `oflags` has O_CREAT.
Attempt attach(const char* name, int oflags, size_t bytes) {
  bool created = true;
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    created = false;
    fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0) return again();  // removed in between
  } else if (fd < 0) {
    return failed(errno);
  }
  ScopedFd shm(fd);
  if (created && !(oflags & O_CREAT)) {  // it did not exist: the caller did not ask to create it
    shm_unlink(name);
    return failed(EAGAIN);
  }
  if (created && ftruncate(shm.get(), off_t(bytes)) != 0) {
    int e = errno;
    shm_unlink(name);
    return failed(e);
  }
  // A creator in another process may not have sized the object yet: touching
  // pages past its end would fault, so wait (bounded) for the size first. A
  // size of another uroce build's segment: replaced.
  off_t size = created ? off_t(bytes) : 0;
  wait_for_creator([&] {
    struct stat st;
    if (fstat(shm.get(), &st) != 0) return true;  // (size stays 0: EAGAIN below)
    size = st.st_size;
    return size != 0;
  });
  if (size != 0 && size_t(size) != bytes) {
    shm_unlink(name);
    return again();
  }
  if (size == 0) return failed(EAGAIN);
  ScopedMapping map(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, shm.get(), 0), bytes);
  if (!map.get()) return failed(ENOMEM);
  return join(map, name, oflags, bytes, created);
}

}  // namespace

// The shared memory object of the file's inode: created with O_CREAT, sized
// and marked ready by its creator; an object of another build is replaced; one
// its last user removed while we opened it is opened anew.
XrcDomain::OpenResult XrcDomain::open_file(int fd, int oflags) {
  size_t bytes = sizeof(Header) + sizeof(TargetSlot) * kSlots;
  struct stat st;
  if (fstat(fd, &st) != 0) return OpenResult::error(EBADF);
  std::lock_guard open_lock(g_open_mu);
  auto file_key = std::make_pair(uint64_t(st.st_dev), uint64_t(st.st_ino));
  if (auto it = g_open.find(file_key); it != g_open.end()) {
    if (auto d = it->second.lock()) {
      if (oflags & O_EXCL) return OpenResult::error(EINVAL);
      return d;
    }
  }
  SegmentName name(file_key.first, file_key.second);
  for (int attempt = 0; attempt < 100; ++attempt) {
    Attempt a = attach(name.text, oflags, bytes);
    if (a.retry) continue;
    if (a.error) return OpenResult::error(a.error);
    ScopedMapping map(a.mem, bytes);
    auto d = std::shared_ptr<XrcDomain>(new (std::nothrow) XrcDomain());
    if (!d) {
      HeaderLock lock(static_cast<Header*>(map.get())->lock);
      drop_opener(static_cast<Header*>(map.get()));
      return OpenResult::error(ENOMEM);
    }
    d->header_ = static_cast<Header*>(map.release());
    d->slots_ = reinterpret_cast<TargetSlot*>(reinterpret_cast<uint8_t*>(d->header_) + sizeof(Header));
    d->bytes_ = bytes;
    d->shared_ = true;
    d->key_ = XrcDomainKey{file_key.first, file_key.second};
    g_open[file_key] = d;
    return d;
  }
  return OpenResult::error(EAGAIN);
}

std::shared_ptr<XrcDomain> XrcDomain::find(const XrcDomainKey& key) {
  std::lock_guard open_lock(g_open_mu);
  auto it = g_open.find(std::make_pair(key.dev, key.ino));
  return it == g_open.end() ? nullptr : it->second.lock();
}

// Entries of closed domains stay in g_open as expired weak pointers (a later
// open of the same file replaces its entry): erasing them here could deadlock
// when the last reference is dropped inside open() or find().
XrcDomain::~XrcDomain() {
  if (!shared_) {
    ::operator delete(header_);
    return;
  }
  // The slots of this process's target QPs were released when they were destroyed.
  {
    HeaderLock lock(header_->lock);
    drop_opener(header_);
    if (prune_dead(header_) == 0) {
      header_->removed = 1;
      shm_unlink(SegmentName(key_.dev, key_.ino).text);
    }
  }
  munmap(header_, bytes_);
}

bool XrcDomain::add_srq(uint32_t srq_num) {
  HeaderLock lock(header_->lock);
  for (uint32_t i = 0; i < kSrqs; ++i) {
    uint32_t& num = header_->srq_num[i];
    if (num != 0 && process_alive(header_->srq_pid[i])) continue;
    header_->srq_pid[i] = uint32_t(getpid());
    std::atomic_ref<uint32_t>(num).store(srq_num, std::memory_order_relaxed);
    return true;
  }
  return false;
}

void XrcDomain::remove_srq(uint32_t srq_num) {
  HeaderLock lock(header_->lock);
  for (uint32_t i = 0; i < kSrqs; ++i) {
    if (header_->srq_num[i] == srq_num && header_->srq_pid[i] == uint32_t(getpid()))
      std::atomic_ref<uint32_t>(header_->srq_num[i]).store(0, std::memory_order_relaxed);
  }
}

bool XrcDomain::has_srq(uint32_t srq_num) const {
  for (uint32_t i = 0; i < kSrqs; ++i)
    if (std::atomic_ref<uint32_t>(header_->srq_num[i]).load(std::memory_order_relaxed) == srq_num) return true;
  return false;
}

TargetSlot* XrcDomain::allocate_slot(uint32_t qp_num, uint16_t home_port, const ibv_qp_attr& attr, uint32_t* index) {
  HeaderLock lock(header_->lock);
  for (uint32_t i = 0; i < kSlots; ++i) {
    TargetSlot& s = slots_[i];
    if (s.owner_pid != 0 && process_alive(s.owner_pid)) continue;
    SlotLock l(s);
    s.owner_pid = uint32_t(getpid());
    s.qp_num = qp_num;
    s.home_port = home_port;
    s.attr_gen = 0;
    s.qp_attr = attr;
    s.path = TargetPath{};
    s.holders = {};
    s.holders[0] = TargetHolder{uint32_t(getpid()), home_port, 1};
    s.resp = ResponderState{};
    *index = i;
    return &s;
  }
  return nullptr;
}

namespace {
// Caller holds the header's and the slot's locks.
void clear_slot(TargetSlot& s) {
  s.owner_pid = 0;
  s.qp_num = 0;
  s.home_port = 0;
  s.holders = {};
}
}  // namespace

void XrcDomain::release_slot(TargetSlot* slot, uint16_t home_port, uint32_t qp_num) {
  HeaderLock lock(header_->lock);
  SlotLock l(*slot);
  if (slot->home_port == home_port && slot->qp_num == qp_num && slot->owner_pid != 0) clear_slot(*slot);
}

bool XrcDomain::drop_handle(TargetSlot* slot, uint16_t home_port, uint32_t qp_num, uint16_t port) {
  HeaderLock lock(header_->lock);
  SlotLock l(*slot);
  if (slot->home_port != home_port || slot->qp_num != qp_num || slot->owner_pid == 0) return true;
  drop_holder(*slot, port);
  bool gone = live_holders(*slot) == 0;
  if (gone) clear_slot(*slot);
  return gone;
}

TargetSlot* XrcDomain::find_slot(uint32_t index, uint16_t home_port, uint32_t qp_num) {
  if (index >= kSlots) return nullptr;
  TargetSlot& s = slots_[index];
  // Read without the lock: the caller re-checks under it (see xrc_target.cc).
  uint32_t pid = std::atomic_ref<uint32_t>(s.owner_pid).load(std::memory_order_relaxed);
  if (pid == 0 || s.home_port != home_port || s.qp_num != qp_num) return nullptr;
  return &s;
}

core::Result<XrcDomain::OpenedTarget> XrcDomain::open_target(uint32_t qp_num, uint16_t port) {
  using R = core::Result<OpenedTarget>;
  if (qp_num == 0) return R::error(EINVAL);
  for (uint32_t i = 0; i < kSlots; ++i) {
    TargetSlot& s = slots_[i];
    // Unlocked reads pick the candidates; the lock decides.
    if (std::atomic_ref<uint32_t>(s.owner_pid).load(std::memory_order_relaxed) == 0 ||
        std::atomic_ref<uint32_t>(s.qp_num).load(std::memory_order_relaxed) != qp_num)
      continue;
    SlotLock l(s);
    if (!slot_holds(s, s.home_port, qp_num) || live_holders(s) == 0) continue;
    if (!add_holder(s, port)) return R::error(ENOMEM);
    return OpenedTarget{&s, i, s.home_port};
  }
  return R::error(EINVAL);
}

void XrcDomain::add_local_handle(const LocalHandle& h) {
  std::lock_guard lock(local_mu_);
  local_.push_back(h);
}

void XrcDomain::remove_local_handle(EngineQp* handle) {
  std::lock_guard lock(local_mu_);
  std::erase_if(local_, [handle](const LocalHandle& h) { return h.handle == handle; });
}

void XrcDomain::for_local_handles(uint32_t index, uint16_t home_port, uint32_t qp_num, uint16_t port,
                                  void (*fn)(EngineQp&, void*), void* arg) {
  std::lock_guard lock(local_mu_);
  for (const LocalHandle& h : local_)
    if (h.index == index && h.home_port == home_port && h.qp_num == qp_num && h.port == port) fn(*h.handle, arg);
}

bool add_holder(TargetSlot& s, uint16_t port) {
  const uint32_t self = uint32_t(getpid());
  TargetHolder* free_entry = nullptr;
  for (TargetHolder& h : s.holders) {
    if (h.count != 0 && h.pid == self && h.port == port) {
      if (h.count == UINT16_MAX) return false;
      ++h.count;
      return true;
    }
    // Entries of dead processes are free again.
    if (!free_entry && (h.count == 0 || !process_alive(h.pid))) free_entry = &h;
  }
  if (!free_entry) return false;
  *free_entry = TargetHolder{self, port, 1};
  return true;
}

void drop_holder(TargetSlot& s, uint16_t port) {
  const uint32_t self = uint32_t(getpid());
  for (TargetHolder& h : s.holders) {
    if (h.count == 0 || h.pid != self || h.port != port) continue;
    if (--h.count == 0) h = TargetHolder{};
    return;
  }
}

uint32_t live_holders(const TargetSlot& s) {
  const uint32_t self = uint32_t(getpid());
  uint32_t n = 0;
  for (const TargetHolder& h : s.holders)
    if (h.count != 0 && (h.pid == self || process_alive(h.pid))) n += h.count;
  return n;
}

bool slot_holds(const TargetSlot& s, uint16_t home_port, uint32_t qp_num) {
  return s.owner_pid != 0 && s.home_port == home_port && s.qp_num == qp_num &&
         (s.owner_pid == uint32_t(getpid()) || process_alive(s.owner_pid));
}

}  // namespace uroce::engine
