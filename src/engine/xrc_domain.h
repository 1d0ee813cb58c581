// The shared part of an XRC domain: one memory segment per domain holding the
// responder state of every XRC target QP of the domain. An XRC request names
// the XRC SRQ it is for (XRCETH); the process that owns that SRQ — not
// necessarily the one that created the target QP — runs the responder on the
// target QP's state here (xrc_target.h). That is what lets one client's
// target QP deliver into another client's SRQ (ibv_xsrq_pingpong -c N).
//
// A domain opened with a file (ibv_xrcd_init_attr::fd) is a POSIX shared
// memory object named after the file's device and inode, shared by every
// process that opens the same file, as the kernel shares one XRC domain per
// inode. One opened without a file (fd -1) is private to the process (heap
// memory), still shared by all of the process's device contexts.
//
// Lock contract: TargetSlot::lock and the header's lock are spin locks holding
// the pid of their holder (0 when free), taken with acquire and released with
// release ordering (std::atomic_ref on the shared words: lock-free, so valid
// across processes). A holder found dead (kill(pid, 0) fails with ESRCH) loses
// its lock. Everything in a slot except `lock` is guarded by the slot's lock;
// the header's lock guards slot allocation and the open count (a slot's
// identity — owner_pid, qp_num, home_port — changes under both). Lock order:
// QP mutex -> header lock -> slot lock -> the process's handle list mutex.
// Critical sections are short and never block.
//
// Handles (ibv_open_qp, as the kernel's ib_open_qp / ib_close_qp): the target
// QP's creator and every ibv_open_qp hold a handle on it; the slot counts them
// per device context (TargetHolder). The QP lives while any live process
// holds one: the last ibv_destroy_qp of a handle, in whatever process, frees
// the slot, and the QP object of the creator's context, if its own handle was
// destroyed first, stops answering and is reclaimed by that context
// (xrc_target.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "core/result.h"
#include "engine/engine_qp.h"

namespace uroce::engine {

// Identity of a domain: the file's device and inode; private domains have
// dev 0 and a process-unique ino.
struct XrcDomainKey {
  uint64_t dev = 0;
  uint64_t ino = 0;
  friend bool operator==(const XrcDomainKey&, const XrcDomainKey&) = default;
};

// The target QP's path to its initiator, resolved from the address vector by
// the modify that set it (any process of the host resolves it alike); the
// UDP source port is the answering context's own.
struct TargetPath {
  uint32_t mtu = 1024;  // bytes
  uint32_t dst_ip = 0;  // the initiator's address and UDP port
  uint16_t dst_port = 0;
  uint32_t src_ip = 0;  // our address on the path (the AV's source GID)
};

// A device context holding handles of a target QP (its creator's, ibv_open_qp's).
struct TargetHolder {
  uint32_t pid = 0;   // 0 = free entry
  uint16_t port = 0;  // the context's UDP port (LID): where its events are sent
  uint16_t count = 0;
};

struct TargetSlot {
  static constexpr unsigned kHolders = 16;  // contexts with handles on one target QP

  uint32_t lock = 0;       // pid of the holder, 0 = free
  uint32_t owner_pid = 0;  // process of the target QP; 0 = slot free
  uint32_t qp_num = 0;
  uint16_t home_port = 0;  // UDP port (LID) of the target QP's context
  // The QP's attributes, whichever handle modified it last: what ibv_query_qp
  // reports on every handle. attr_gen counts the modifies (the QP's own
  // context reloads its copy when it changed).
  uint32_t attr_gen = 0;
  ibv_qp_attr qp_attr;
  TargetPath path;
  std::array<TargetHolder, kHolders> holders;
  ResponderState resp;
};
static_assert(std::is_trivially_copyable_v<TargetSlot>);

// Handles on a slot's QP (caller holds the slot's lock). add: false when
// kHolders contexts hold some already.
[[nodiscard]] bool add_holder(TargetSlot& s, uint16_t port);
void drop_holder(TargetSlot& s, uint16_t port);
// Handles held by live processes.
uint32_t live_holders(const TargetSlot& s);
// Whether the slot (still) holds target QP (home_port, qp_num) of a live process.
bool slot_holds(const TargetSlot& s, uint16_t home_port, uint32_t qp_num);

class XrcDomain {
 public:
  static constexpr uint32_t kSlots = 256;    // target QPs per domain
  static constexpr uint32_t kSrqs = 1024;    // XRC SRQs per domain
  static constexpr uint32_t kOpeners = 256;  // processes with the domain open

  // Opens the domain of file descriptor `fd` (-1: a new private domain) with
  // ibv_open_xrcd's oflags. Errors as the kernel's open_xrcd: EBADF for a bad
  // fd, EAGAIN when the domain does not exist and O_CREAT is not given, EINVAL
  // when it exists and O_EXCL is given; ENOMEM/EACCES from the system. A
  // domain whose every opener died (killed without closing it) no longer
  // exists: the next O_CREAT open takes its memory over.
  using OpenResult = core::Result<std::shared_ptr<XrcDomain>>;
  static OpenResult open(int fd, int oflags);
  ~XrcDomain();  // the last opener on the host removes the shared object
  XrcDomain(const XrcDomain&) = delete;
  XrcDomain& operator=(const XrcDomain&) = delete;

  struct Header;  // the segment's bookkeeping (xrc_domain.cc)

  const XrcDomainKey& key() const { return key_; }
  // The domain `key` if this process has it open.
  static std::shared_ptr<XrcDomain> find(const XrcDomainKey& key);

  // The domain's XRC SRQs, by number, whatever process owns them: a target
  // relays only requests for SRQs listed here. add_srq is false when kSrqs
  // SRQs exist (entries of dead processes are reused).
  [[nodiscard]] bool add_srq(uint32_t srq_num);
  void remove_srq(uint32_t srq_num);
  bool has_srq(uint32_t srq_num) const;

  // A free slot for a new target QP with attributes `attr`, owned by this
  // process, its context (home_port) holding the creator's handle; nullptr
  // when all kSlots are taken (slots of dead processes are reclaimed).
  TargetSlot* allocate_slot(uint32_t qp_num, uint16_t home_port, const ibv_qp_attr& attr, uint32_t* index);
  // Frees the slot if it still holds target QP (home_port, qp_num).
  void release_slot(TargetSlot* slot, uint16_t home_port, uint32_t qp_num);
  // Drops one handle of context `port` on target QP (home_port, qp_num) and
  // frees the slot when no live process holds one any more: true then (the QP
  // is destroyed), and also when the slot no longer held that QP.
  bool drop_handle(TargetSlot* slot, uint16_t home_port, uint32_t qp_num, uint16_t port);
  // Slot `index` if it holds target QP (home_port, qp_num), else nullptr.
  TargetSlot* find_slot(uint32_t index, uint16_t home_port, uint32_t qp_num);
  // ibv_open_qp: one more handle of context `port` on the live target QP
  // numbered `qp_num`. EINVAL when the domain has no such QP (as the kernel's
  // ib_open_qp), ENOMEM when kHolders contexts hold handles on it already.
  struct OpenedTarget {
    TargetSlot* slot = nullptr;
    uint32_t index = 0;
    uint16_t home_port = 0;
  };
  core::Result<OpenedTarget> open_target(uint32_t qp_num, uint16_t port);

  // This process's open handles on the domain's target QPs (the creators'
  // and ibv_open_qp's), for their asynchronous events: `handle`, of context
  // `port`, on target QP (home_port, qp_num) in slot `index`.
  struct LocalHandle {
    EngineQp* handle;
    uint32_t index;
    uint16_t home_port;
    uint32_t qp_num;
    uint16_t port;
  };
  void add_local_handle(const LocalHandle& h);
  void remove_local_handle(EngineQp* handle);
  // Calls fn(handle, arg) for each open handle on target QP (home_port,
  // qp_num) in slot `index` held by this process's context `port`, under the
  // list's mutex (so none is destroyed meanwhile).
  void for_local_handles(uint32_t index, uint16_t home_port, uint32_t qp_num, uint16_t port,
                         void (*fn)(EngineQp&, void*), void* arg);

 private:
  XrcDomain() = default;
  static OpenResult open_private();
  static OpenResult open_file(int fd, int oflags);
  Header* header_ = nullptr;
  TargetSlot* slots_ = nullptr;
  size_t bytes_ = 0;
  bool shared_ = false;  // mapped shared memory (else heap)
  XrcDomainKey key_;
  std::mutex local_mu_;  // guards local_ (last in the lock order)
  std::vector<LocalHandle> local_;
};

// Holds a slot's lock for a scope.
class SlotLock {
 public:
  explicit SlotLock(TargetSlot& s);
  ~SlotLock();
  SlotLock(const SlotLock&) = delete;
  SlotLock& operator=(const SlotLock&) = delete;

 private:
  uint32_t& word_;
};

}  // namespace uroce::engine
