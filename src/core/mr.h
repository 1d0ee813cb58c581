// Memory regions: records of (address, length, access, keys). Every local and
// remote access is checked against them (design §5); nothing outside a
// registered range is ever read or written. Nothing is pinned.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "base/shared_fast_mutex.h"
#include "core/container_of.h"
#include "core/limits.h"
#include "core/pd.h"
#include "core/result.h"

namespace uroce::core {

struct Sge;
struct Dm;

struct Mr {
  ibv_mr ibmr{};  // ABI object (addr, length, lkey, rkey); lkey is the current key
  Pd* pd = nullptr;
  uint8_t* host = nullptr;  // where iova maps to in this process
  uint64_t iova = 0;        // address remote peers use
  uint64_t length = 0;
  unsigned access = 0;
  // Device memory MRs (ibv_reg_dm_mr) are zero-based: local addresses, like
  // remote ones, are iovas (offsets into the MR), not host addresses.
  Dm* dm = nullptr;
  // Where local addresses (lkey semantics) of this MR start.
  uint64_t local_base() const { return dm ? iova : reinterpret_cast<uint64_t>(host); }
  // The host pointer of address `va` under lkey (remote: rkey) semantics;
  // integer arithmetic, so an implicit ODP MR (host 0) makes no null offset.
  uint8_t* host_at(uint64_t va, bool remote) const {
    return reinterpret_cast<uint8_t*>(reinterpret_cast<uintptr_t>(host) + (va - (remote ? iova : local_base())));
  }

  // Memory windows (ibv_alloc_mw) are records of the same table: a window's
  // range and access come from its bind, inside the `parent` MR, and its key
  // is valid only while bound (IBA 10.6.7).
  ibv_mw ibmw{};  // ABI object of a window
  bool is_window = false;
  bool bound = false;
  // Type 2 windows are bound through a QP's send queue and usable only by
  // requests arriving on that QP (IBA 10.6.7.2, the QP association of
  // IBV_DEVICE_MEM_WINDOW_TYPE_2B; the PD association is pd).
  uint32_t bound_qpn = 0;
  Mr* parent = nullptr;
  int windows = 0;  // MR: windows bound to it (deregistration -> EBUSY)

  static Mr* from(ibv_mr* m) { return UROCE_CONTAINER_OF(m, Mr, ibmr); }
  static Mr* from(ibv_mw* w) { return UROCE_CONTAINER_OF(w, Mr, ibmw); }
};

// A bind of a window (ibv_bind_mw, IBV_WR_BIND_MW).
struct MwBind {
  uint32_t new_rkey = 0;  // same table index as the window's key
  uint32_t mr_lkey = 0;
  uint64_t addr = 0;  // local address inside the MR (length 0: unbind)
  uint64_t length = 0;
  unsigned access = 0;  // IBV_ACCESS_REMOTE_* (| IBV_ACCESS_ZERO_BASED)
};

// What ibv_rereg_mr changes (flags: IBV_REREG_MR_CHANGE_*); the fields a
// flag does not name are ignored.
struct MrChange {
  int flags = 0;
  Pd* pd = nullptr;
  void* addr = nullptr;  // the new range; its iova is addr, as ibv_rereg_mr's
  uint64_t length = 0;
  unsigned access = 0;
};

// Outcome of a key check, named after what IBA reports for it.
enum class KeyCheck : uint8_t {
  kOk,
  kBadKey,        // no MR with this key
  kPdMismatch,    // MR belongs to another PD
  kOutOfBounds,   // range not inside the MR
  kNoPermission,  // access flag missing
};

// Told of every MR (not window) that becomes valid or is about to stop
// being valid, under the table's exclusive lock: the same-host placement
// window (host/direct_placement.h) publishes MRs to other processes, and
// mr_removing returns only once none of them can still write through it.
class MrObserver {
 public:
  virtual void mr_added(const Mr& mr) noexcept = 0;
  virtual void mr_removing(const Mr& mr) noexcept = 0;

 protected:
  ~MrObserver() = default;
};

// Access flags uroce accepts on registration.
inline constexpr unsigned kSupportedAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                             IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
                                             IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB | IBV_ACCESS_RELAXED_ORDERING;

// Registration-time validation (rdma-core/kernel rules): remote write or
// atomic access needs local write.
int validate_mr_access(unsigned access);

// The range check of registration, as the kernel's pinning (ib_umem_get):
// a range whose end wraps around the address space (or whose last page
// does) is EINVAL; unless the MR is on-demand (IBV_ACCESS_ON_DEMAND, which
// may name unmapped memory), a range not wholly mapped, or mapped without
// read access, or read-only when `access` needs write (ib_access_writable:
// LOCAL_WRITE, REMOTE_WRITE, REMOTE_ATOMIC, MW_BIND), is EFAULT. The
// mappings are read afresh (/proc/self/maps); where they cannot be read,
// the range is accepted.
int validate_mr_range(const void* addr, uint64_t length, unsigned access);

// The table of a context's MRs and memory windows, indexed by key.
//
// Keys: key >> 8 is the table slot; the low 8 bits are a variant (the
// consumer-owned "key" byte that ibv_inc_rkey steps), drawn at random for
// every new MR or window and always different from the last variant of its
// slot (as rxe: index << 8 | rxe_get_next_key(last_key)), so a key
// is not guessable from the order of registrations and a stale key of a
// reused slot never matches. A window's bind sets the variant the
// application chose (ibv_inc_rkey) within the same slot. Key 0 is never
// valid (slot 0 is unused).
//
// Limits: at most max_mr MRs and max_mw windows (ENOMEM beyond).
//
// Lock contract and the MR lifetime rule: every byte of registered memory
// is read or written only while the shared lock is held and the key has been
// checked under it (with_range, scatter, or read_lock + check_locked), and
// only through core/mr_access.h (safe for on-demand regions). No pointer into
// registered memory outlives the lock: packets copy their payload into the
// sender's TxBatch while it is held, and retransmissions, READ replays and
// READ response slices look the key up again. Registration, deregistration,
// binds and invalidations take the exclusive lock, so once ibv_dereg_mr,
// ibv_dealloc_mw or an invalidation returns, no access to that memory through
// that key is in progress and none can start (engine tests:
// Hardening.NoByteReadAfterDeregistration, BatchedPacketsHoldCopies).
class MrTable {
 public:
  explicit MrTable(uint32_t max_mr = kMaxMr, uint32_t max_mw = kMaxMw);

  // Validates access and range (validate_mr_access, validate_mr_range), then
  // registers; EINVAL/EFAULT as those, ENOMEM at max_mr.
  // Implicit ODP (addr null, length SIZE_MAX, IBV_ACCESS_ON_DEMAND): one MR for
  // the whole address space. `dm`: an MR on device memory (zero-based).
  [[nodiscard]] Result<Mr*> add(Pd* pd, void* addr, uint64_t length, uint64_t iova, unsigned access, Dm* dm = nullptr);
  [[nodiscard]] int remove(Mr* mr);  // EBUSY while windows are bound to it
  // ibv_rereg_mr: moves `mr` to another PD, gives it other access flags
  // (validate_mr_access) and/or another range (validate_mr_range), its keys
  // unchanged. All or nothing: EINVAL for a window, a device memory or an
  // implicit ODP MR, an unknown flag or a bad argument, EFAULT for an
  // unmapped range, EBUSY while windows are bound to it (their ranges are
  // inside its old one).
  [[nodiscard]] int rereg(Mr* mr, const MrChange& change);

  // The MR (not window) whose ibv_mr::handle is `handle`, or null
  // (ibv_import_mr; the pointer is the caller's to keep valid).
  Mr* find_mr(uint32_t handle) const;

  [[nodiscard]] Result<Mr*> add_window(Pd* pd, ibv_mw_type type);
  // Binds (or, with length 0, unbinds) a window through QP `qpn`; EINVAL for
  // a bad MR, range, access or key (the caller reports IBV_WC_MW_BIND_ERR).
  [[nodiscard]] int bind_window(Mr* mw, const Pd* pd, const MwBind& bind, uint32_t qpn);
  // Local or remote invalidation of a type 2 window's key (EINVAL if none).
  [[nodiscard]] int invalidate(uint32_t rkey, const Pd* pd);

  // Checks [va, va+len) against the MR named by `key` and, when allowed, calls
  // f(mr, host_pointer) under the shared lock (copies through the pointer go
  // through core/mr_access.h with that MR). `remote` selects rkey semantics
  // (va is an iova) vs lkey semantics (va is a local address); `qpn` is the
  // QP a remote request arrived on (a type 2 window answers only its own).
  template <class F>
  KeyCheck with_range(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, unsigned need, bool remote, uint32_t qpn,
                      F&& f) const {
    std::shared_lock lock(mu_);
    const Mr* mr = nullptr;
    KeyCheck c = check_locked(key, pd, va, len, need, remote, &mr, qpn);
    if (c == KeyCheck::kOk) f(*mr, mr->host_at(va, remote));
    return c;
  }

  KeyCheck check(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, unsigned need, bool remote,
                 uint32_t qpn = 0) const;

  // Copies `len` bytes into a scatter list (local keys, LOCAL_WRITE), starting
  // `offset` bytes into it. False, with nothing past the failing entry
  // written, if an entry's key check fails or the list is too short.
  bool scatter(const Pd* pd, const Sge* sge, uint16_t num_sge, uint32_t offset, const uint8_t* data,
               uint32_t len) const;

  // Holds the table shared while a caller copies through several ranges.
  std::shared_lock<base::SharedFastMutex> read_lock() const { return std::shared_lock(mu_); }
  KeyCheck check_locked(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, unsigned need, bool remote,
                        const Mr** out, uint32_t qpn = 0) const;
  // Sets (or, with null, clears) the observer; told of the MRs already
  // registered at once.
  void set_observer(MrObserver* observer);

 private:
  // A free slot and a fresh key for it (ENOMEM at the MR or window limit).
  int take_slot_locked(bool window, uint32_t* key);
  uint8_t random_byte_locked();
  void unbind_locked(Mr* mw);

  mutable base::SharedFastMutex mu_;
  MrObserver* observer_ = nullptr;
  std::vector<Mr*> slots_{nullptr};   // slot 0 unused: key 0 is never valid
  std::vector<uint8_t> variants_{0};  // last key variant of each slot
  std::vector<uint32_t> free_;
  uint64_t rng_state_;  // splitmix64, seeded from getrandom
  const uint32_t max_mr_, max_mw_;
  uint32_t mrs_ = 0, windows_ = 0;
};

}  // namespace uroce::core
