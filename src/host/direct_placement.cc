#include "host/direct_placement.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <thread>

#include "core/limits.h"
#include "core/log.h"
#include "core/remote_access.h"
#include "transport/shared_file.h"

namespace uroce::host {

namespace {

constexpr uint64_t kWindowMagic = 0x75726f63'506c6163ULL;         // "urocPlac"
constexpr unsigned kQpEntries = 1u << 16;                         // by QPN & 0xFFFF (the slot is the rest)
constexpr unsigned kMrEntries = core::kMaxMr + core::kMaxMw + 1;  // by key >> 8
constexpr auto kAttachRetry = std::chrono::seconds(1);

// QpEntry::flags: the QP's remote access flags, and:
constexpr uint32_t kFlagUc = 1u << 16;          // a UC QP (else RC)
constexpr uint32_t kFlagReadCredit = 1u << 17;  // max_dest_rd_atomic > 0 (READs allowed)

}  // namespace

// The shared layout. Entries are valid while their first word (qpn, key) is
// non-zero; the owner writes the other words only while it is zero and no
// placer is busy (the revocation rule in the header), so a placer that saw it
// non-zero after counting itself busy reads stable words.
struct DirectPlacement::Window {
  struct alignas(64) Busy {
    std::atomic<uint32_t> word;  // placements in progress by the slot's engine
    std::atomic<uint32_t> pid;   // the process that last reset `word`
  };
  struct QpEntry {
    std::atomic<uint32_t> qpn;  // 0: none
    std::atomic<uint32_t> dest_qpn;
    std::atomic<uint32_t> pd;
    std::atomic<uint32_t> flags;
  };
  struct MrEntry {
    std::atomic<uint32_t> key;  // 0: none
    std::atomic<uint32_t> pd;
    std::atomic<uint32_t> access;
    std::atomic<uint32_t> reserved;
    std::atomic<uint64_t> iova;
    std::atomic<uint64_t> host;
    std::atomic<uint64_t> length;
  };
  uint64_t magic;
  uint32_t owner_pid;
  uint32_t slot;
  Busy busy[kLastHostSlot + 1];
  QpEntry qps[kQpEntries];
  MrEntry mrs[kMrEntries];
};

// Tests map the busy words by this layout.
static_assert(sizeof(DirectPlacement::Window::Busy) == 64);
static_assert(offsetof(DirectPlacement::Window, busy) == 64);

// A mapped window of another engine (or this one's own).
struct DirectPlacement::Peer {
  uint32_t pid = 0;
  Window* window = nullptr;          // null: not attached (retry after retry_at)
  bool mapped = false;               // ours to unmap
  int pidfd = -1;                    // tells whether `pid` is still that process
  std::atomic<bool> refused{false};  // the kernel refused a copy (EPERM): packets only
  std::chrono::steady_clock::time_point retry_at{};

  Peer() = default;
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;
  ~Peer() {
    if (mapped) munmap(window, sizeof(Window));
    if (pidfd >= 0) close(pidfd);
  }
  bool alive() const noexcept {
    if (pidfd < 0) return true;  // our own window
    pollfd p{pidfd, POLLIN, 0};
    return poll(&p, 1, 0) == 0;  // readable once the process has exited
  }
};

std::string DirectPlacement::window_path(const HostRegistry& registry, uint32_t pid, unsigned slot) {
  return registry.path() + ".place." + std::to_string(pid) + "." + std::to_string(slot);
}

std::unique_ptr<DirectPlacement> DirectPlacement::open(HostRegistry& registry) {
  const std::string& reg = registry.path();
  size_t slash = reg.rfind('/');
  std::string dir = slash == std::string::npos ? "." : reg.substr(0, slash);
  std::string name = slash == std::string::npos ? reg : reg.substr(slash + 1);
  transport::remove_stale_files(dir, name + ".place.");

  std::string path = window_path(registry, uint32_t(getpid()), registry.slot());
  void* map = transport::create_shared_file(path, sizeof(Window), false);
  if (!map) return nullptr;
  auto* w = static_cast<Window*>(map);  // a new file: all zero
  w->owner_pid = uint32_t(getpid());
  w->slot = registry.slot();
  std::atomic_ref<uint64_t>(w->magic).store(kWindowMagic, std::memory_order_release);
  try {
    return std::unique_ptr<DirectPlacement>(new DirectPlacement(registry, std::move(path), w));
  } catch (...) {
    munmap(map, sizeof(Window));
    errno = ENOMEM;
    return nullptr;
  }
}

DirectPlacement::DirectPlacement(HostRegistry& registry, std::string path, Window* own)
    : registry_(registry),
      path_(std::move(path)),
      own_(own),
      local_(transport::LocalAddresses::snapshot()),
      peers_(kLastHostSlot + 1) {}

DirectPlacement::~DirectPlacement() {
  // Peers that still map the (unlinked) window must not place into memory
  // that outlives this engine (e.g. MRs the application never deregistered).
  for (Window::QpEntry& e : own_->qps)
    if (e.qpn.load(std::memory_order_relaxed) != 0) e.qpn.store(0, std::memory_order_seq_cst);
  for (Window::MrEntry& e : own_->mrs)
    if (e.key.load(std::memory_order_relaxed) != 0) e.key.store(0, std::memory_order_seq_cst);
  wait_for_placers();
  peers_.clear();
  ::unlink(path_.c_str());
  munmap(own_, sizeof(Window));
}

// --- target side -------------------------------------------------------------

void DirectPlacement::wait_for_placers() noexcept {
  auto deadline = std::chrono::steady_clock::now() + kRevokeWait;
  for (unsigned s = kFirstHostSlot; s <= kLastHostSlot; ++s) {
    Window::Busy& b = own_->busy[s];
    while (b.word.load(std::memory_order_seq_cst) != 0) {
      if (s != registry_.slot()) {
        // A dead placer's word, or one left by the slot's previous owner.
        if (registry_.port_of(s) == 0 || registry_.pid_of(s) != b.pid.load(std::memory_order_relaxed)) break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        LOG_WARN("same-host placement: slot %u stayed busy for %lld ms; revoking anyway", s,
                 (long long)std::chrono::duration_cast<std::chrono::milliseconds>(kRevokeWait).count());
        return;
      }
      std::this_thread::yield();
    }
  }
}

void DirectPlacement::mr_added(const core::Mr& mr) noexcept {
  uint32_t index = mr.ibmr.lkey >> 8;
  if (index == 0 || index >= kMrEntries) return;
  Window::MrEntry& e = own_->mrs[index];
  e.pd.store(mr.pd->id, std::memory_order_relaxed);
  e.access.store(mr.access, std::memory_order_relaxed);
  e.iova.store(mr.iova, std::memory_order_relaxed);
  e.host.store(reinterpret_cast<uint64_t>(mr.host), std::memory_order_relaxed);
  e.length.store(mr.length, std::memory_order_relaxed);
  e.key.store(mr.ibmr.lkey, std::memory_order_release);
}

void DirectPlacement::mr_removing(const core::Mr& mr) noexcept {
  uint32_t index = mr.ibmr.lkey >> 8;
  if (index == 0 || index >= kMrEntries) return;
  own_->mrs[index].key.store(0, std::memory_order_seq_cst);
  wait_for_placers();
}

void DirectPlacement::sync_qp(const core::Qp& qp, bool relay_proxy) noexcept {
  uint32_t qpn = qp.qp_num();
  if (qpn_slot(qpn) != registry_.slot()) return;
  Window::QpEntry& e = own_->qps[qpn & 0xFFFF];
  ibv_qp_state s = qp.state();
  bool accepts = s == IBV_QPS_RTR || s == IBV_QPS_RTS;
  bool want = accepts && (qp.type == IBV_QPT_RC || qp.type == IBV_QPT_UC) && qp.pd && !relay_proxy;
  uint32_t flags = 0, pd = 0;
  if (want) {
    flags = (qp.attr.qp_access_flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)) |
            (qp.type == IBV_QPT_UC ? kFlagUc : 0) | (qp.attr.max_dest_rd_atomic > 0 ? kFlagReadCredit : 0);
    pd = qp.pd->id;
    if (e.qpn.load(std::memory_order_relaxed) == qpn &&
        e.dest_qpn.load(std::memory_order_relaxed) == qp.attr.dest_qp_num &&
        e.pd.load(std::memory_order_relaxed) == pd && e.flags.load(std::memory_order_relaxed) == flags)
      return;  // unchanged
  }
  if (e.qpn.load(std::memory_order_relaxed) != 0) {
    e.qpn.store(0, std::memory_order_seq_cst);
    wait_for_placers();
  }
  if (!want) return;
  e.dest_qpn.store(qp.attr.dest_qp_num, std::memory_order_relaxed);
  e.pd.store(pd, std::memory_order_relaxed);
  e.flags.store(flags, std::memory_order_relaxed);
  e.qpn.store(qpn, std::memory_order_release);
}

void DirectPlacement::withdraw_qp(uint32_t qpn) noexcept {
  if (qpn_slot(qpn) != registry_.slot()) return;
  Window::QpEntry& e = own_->qps[qpn & 0xFFFF];
  if (e.qpn.load(std::memory_order_relaxed) != qpn) return;
  e.qpn.store(0, std::memory_order_seq_cst);
  wait_for_placers();
}

// --- requester side ----------------------------------------------------------

std::shared_ptr<DirectPlacement::Peer> DirectPlacement::attach(unsigned slot, uint32_t pid) noexcept {
  std::shared_ptr<Peer> p;
  try {
    p = std::make_shared<Peer>();
  } catch (...) {
    return nullptr;
  }
  p->pid = pid;
  p->retry_at = std::chrono::steady_clock::now() + kAttachRetry;
  if (slot == registry_.slot()) {
    if (pid == uint32_t(getpid())) p->window = own_;  // not in a forked child
    return p;
  }
  int fd = ::open(window_path(registry_, pid, slot).c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return p;
  struct stat st {};
  void* map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && size_t(st.st_size) == sizeof(Window))
    map = mmap(nullptr, sizeof(Window), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return p;
  auto* w = static_cast<Window*>(map);
  p->window = w;
  p->mapped = true;
  // The pidfd names the process itself: opened while the registry still
  // shows `pid` as the slot's live owner, a later exit shows on it even if
  // the number is reused.
  p->pidfd = int(syscall(SYS_pidfd_open, pid_t(pid), 0));
  bool ok = std::atomic_ref<uint64_t>(w->magic).load(std::memory_order_acquire) == kWindowMagic &&
            w->owner_pid == pid && w->slot == slot && p->pidfd >= 0 && registry_.pid_of(slot) == pid &&
            registry_.port_of(slot) != 0 && p->alive();
  if (!ok) {
    munmap(map, sizeof(Window));
    p->window = nullptr;
    p->mapped = false;
    return p;
  }
  // Whatever our slot's word holds was left by a dead previous owner.
  Window::Busy& b = w->busy[registry_.slot()];
  b.pid.store(uint32_t(getpid()), std::memory_order_relaxed);
  b.word.store(0, std::memory_order_seq_cst);
  return p;
}

std::shared_ptr<DirectPlacement::Peer> DirectPlacement::peer_for(unsigned slot) noexcept {
  if (slot < kFirstHostSlot || slot > kLastHostSlot || registry_.port_of(slot) == 0) return nullptr;
  uint32_t pid = registry_.pid_of(slot);
  if (pid == 0) return nullptr;
  std::lock_guard lock(peers_mu_);
  std::shared_ptr<Peer>& p = peers_[slot];
  if (!p || p->pid != pid || (!p->window && std::chrono::steady_clock::now() >= p->retry_at)) p = attach(slot, pid);
  if (!p || !p->window || p->refused.load(std::memory_order_relaxed)) return nullptr;
  return p;
}

bool DirectPlacement::reachable(const transport::IpAddress& dst_ip, uint32_t dest_qpn) noexcept {
  if (!local_.contains(dst_ip)) return false;
  std::shared_ptr<Peer> peer = peer_for(qpn_slot(dest_qpn));
  return peer && peer->alive();
}

bool DirectPlacement::place(const Op& op) noexcept {
  if (op.len == 0 || (op.rkey >> 8) == 0 || !local_.contains(op.dst_ip)) return false;
  std::shared_ptr<Peer> peer = peer_for(qpn_slot(op.dest_qpn));
  if (!peer || !peer->alive()) {
    declined_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  Window& w = *peer->window;
  Window::Busy& busy = w.busy[registry_.slot()];
  busy.word.fetch_add(1, std::memory_order_seq_cst);
  bool done = false;
  // The responder's checks (core/remote_access.h: the QP's state and access
  // flags, then the R_Key's region) on what the target published; any
  // failure is left to the responder.
  const Window::QpEntry& q = w.qps[op.dest_qpn & 0xFFFF];
  const Window::MrEntry& m = w.mrs[std::min<uint32_t>(op.rkey >> 8, kMrEntries - 1)];
  core::RemoteOp rop = op.read ? core::RemoteOp::kRead : core::RemoteOp::kWrite;
  uint32_t flags = q.flags.load(std::memory_order_relaxed);
  bool qp_ok = q.qpn.load(std::memory_order_seq_cst) == op.dest_qpn &&
               q.dest_qpn.load(std::memory_order_relaxed) == op.src_qpn &&
               bool(flags & kFlagUc) == (op.type == IBV_QPT_UC) &&
               core::qp_accepts(flags, (flags & kFlagReadCredit) ? 1 : 0, rop);
  if (qp_ok) {
    core::RegionGrant region{m.key.load(std::memory_order_seq_cst), m.pd.load(std::memory_order_relaxed),
                             m.iova.load(std::memory_order_relaxed), m.length.load(std::memory_order_relaxed),
                             m.access.load(std::memory_order_relaxed)};
    uint32_t pd = q.pd.load(std::memory_order_relaxed);
    if (core::check_grant(region, op.rkey, pd, op.va, op.len, core::remote_access_for(rop)) == core::KeyCheck::kOk) {
      iovec remote{reinterpret_cast<void*>(m.host.load(std::memory_order_relaxed) + (op.va - region.base)), op.len};
      ssize_t n = copier_.copy(pid_t(peer->pid), op.read, op.local, op.nlocal, remote);
      done = n == ssize_t(op.len);
      if (n < 0 && errno == EPERM) {
        LOG_INFO("same-host placement into pid %u refused (EPERM): packets instead", peer->pid);
        peer->refused.store(true, std::memory_order_relaxed);
      }
    }
  }
  busy.word.fetch_sub(1, std::memory_order_release);
  if (!done) {
    declined_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  (op.read ? reads_ : writes_).fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(op.len, std::memory_order_relaxed);
  return true;
}

}  // namespace uroce::host
