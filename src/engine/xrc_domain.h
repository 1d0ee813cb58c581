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
// the header's lock guards slot allocation and the open count. Lock order:
// QP mutex -> slot lock. Critical sections are short and never block.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/engine_qp.h"

namespace uroce::engine {

// Identity of a domain: the file's device and inode; private domains have
// dev 0 and a process-unique ino.
struct XrcDomainKey {
  uint64_t dev = 0;
  uint64_t ino = 0;
  friend bool operator==(const XrcDomainKey&, const XrcDomainKey&) = default;
};

// What a process other than the target QP's own needs of its attributes.
struct TargetAttrs {
  int32_t state = 0;  // ibv_qp_state
  uint32_t dest_qp_num = 0;
  uint32_t access = 0;  // qp_access_flags
  uint32_t max_dest_rd_atomic = 0;
  uint32_t min_rnr_timer = 0;
  uint32_t mtu = 1024;  // bytes
  uint32_t dst_ip = 0;  // the initiator's address and UDP port
  uint16_t dst_port = 0;
  uint32_t src_ip = 0;  // our address on the path (the AV's source GID)
};

struct TargetSlot {
  uint32_t lock = 0;       // pid of the holder, 0 = free
  uint32_t owner_pid = 0;  // process of the target QP; 0 = slot free
  uint32_t qp_num = 0;
  uint16_t home_port = 0;  // UDP port (LID) of the target QP's context
  TargetAttrs attrs;
  ResponderState resp;
};

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
  static std::shared_ptr<XrcDomain> open(int fd, int oflags, int* err);
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

  // A free slot for a new target QP, initialized and owned by this process;
  // nullptr when all kSlots are taken (slots of dead processes are reclaimed).
  TargetSlot* allocate_slot(uint32_t qp_num, uint16_t home_port, uint32_t* index);
  void release_slot(TargetSlot* slot);
  // Slot `index` if it holds target QP (home_port, qp_num), else nullptr.
  TargetSlot* find_slot(uint32_t index, uint16_t home_port, uint32_t qp_num);

 private:
  XrcDomain() = default;
  static std::shared_ptr<XrcDomain> open_private(int* err);
  static std::shared_ptr<XrcDomain> open_file(int fd, int oflags, int* err);
  Header* header_ = nullptr;
  TargetSlot* slots_ = nullptr;
  size_t bytes_ = 0;
  bool shared_ = false;  // mapped shared memory (else heap)
  XrcDomainKey key_;
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
