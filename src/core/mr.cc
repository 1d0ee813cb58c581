#include "core/mr.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/address_space.h"
#include "core/dm.h"
#include "core/guarded_access.h"
#include "core/limits.h"
#include "core/log.h"
#include "core/mr_access.h"
#include "core/remote_access.h"
#include "core/work_queue.h"

namespace uroce::core {

int validate_mr_access(unsigned access) {
  if (access & ~kSupportedAccess) return EINVAL;
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  return 0;
}

int validate_mr_range(const void* addr, uint64_t length, unsigned access) {
  // ib_umem_get / ib_umem_odp_get: the end, and the end rounded up to a
  // page, must not wrap (EINVAL).
  const uint64_t start = reinterpret_cast<uint64_t>(addr);
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  uint64_t end;
  if (__builtin_add_overflow(start, length, &end) || end > ~(page - 1)) return EINVAL;
  if (access & IBV_ACCESS_ON_DEMAND) return 0;  // ODP may register unmapped memory
  std::vector<Mapping> maps;
  if (int e = read_mappings(start, length, &maps)) {
    static std::once_flag warned;
    std::call_once(warned, [e] { LOG_WARN("cannot read /proc/self/maps (%s): MR ranges unchecked", strerror(e)); });
    return 0;
  }
  // ib_access_writable(): these flags make the kernel pin with FOLL_WRITE.
  const bool need_write =
      access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND);
  return check_range_mapped(maps, start, length, need_write);
}

MrTable::MrTable(uint32_t max_mr, uint32_t max_mw) : max_mr_(max_mr), max_mw_(max_mw) {
  if (getrandom(&rng_state_, sizeof rng_state_, GRND_NONBLOCK) != ssize_t(sizeof rng_state_))
    rng_state_ = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^ uint64_t(getpid()) << 32 ^
                 reinterpret_cast<uint64_t>(this);
}

uint8_t MrTable::random_byte_locked() {
  // splitmix64 (Steele, Lea, Flood 2014)
  uint64_t z = (rng_state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return uint8_t((z ^ (z >> 31)) >> 56);
}

int MrTable::take_slot_locked(bool window, uint32_t* key) {
  if (window ? windows_ >= max_mw_ : mrs_ >= max_mr_) return ENOMEM;
  uint32_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    index = uint32_t(slots_.size());
    slots_.push_back(nullptr);
    variants_.push_back(random_byte_locked());
  }
  // One of the 255 variants other than the slot's last one, uniformly.
  uint8_t variant = uint8_t(variants_[index] + 1 + random_byte_locked() % 255);
  variants_[index] = variant;
  ++(window ? windows_ : mrs_);
  *key = index << 8 | variant;
  return 0;
}

Result<Mr*> MrTable::add(Pd* pd, void* addr, uint64_t length, uint64_t iova, unsigned access, Dm* dm) {
  if (int e = validate_mr_access(access)) return Result<Mr*>::error(e);
  // ibv_reg_mr(3): implicit ODP is addr NULL, length SIZE_MAX, ON_DEMAND.
  bool implicit = !addr && length == SIZE_MAX && (access & IBV_ACCESS_ON_DEMAND) && iova == 0;
  if (!implicit) {
    if (length > kMaxMrSize) return Result<Mr*>::error(EINVAL);
    if (!addr && length) return Result<Mr*>::error(EINVAL);
    if (int e = validate_mr_range(addr, length, access)) return Result<Mr*>::error(e);
  }
  auto* mr = new (std::nothrow) Mr;
  if (!mr) return Result<Mr*>::error(ENOMEM);
  arm_fault_guard();  // before the first access a peer may make (core/mr_access.h)
  std::unique_lock lock(mu_);
  uint32_t key;
  if (int e = take_slot_locked(false, &key)) {
    delete mr;
    return Result<Mr*>::error(e);
  }
  uint32_t index = key >> 8;
  mr->pd = pd;
  mr->host = static_cast<uint8_t*>(addr);
  mr->iova = iova;
  mr->length = length;
  mr->access = access;
  mr->dm = dm;
  if (dm) dm->mrs.fetch_add(1);
  mr->ibmr.context = pd->ibpd.context;
  mr->ibmr.pd = &pd->ibpd;
  mr->ibmr.addr = addr;
  mr->ibmr.length = length;
  mr->ibmr.handle = index;
  mr->ibmr.lkey = key;
  mr->ibmr.rkey = key;
  slots_[index] = mr;
  pd->users.fetch_add(1);
  if (observer_) observer_->mr_added(*mr);
  return mr;
}

Mr* MrTable::find_mr(uint32_t handle) const {
  std::shared_lock lock(mu_);
  if (handle == 0 || handle >= slots_.size() || !slots_[handle] || slots_[handle]->is_window) return nullptr;
  return slots_[handle];
}

void MrTable::set_observer(MrObserver* observer) {
  std::unique_lock lock(mu_);
  observer_ = observer;
  if (!observer_) return;
  for (const Mr* mr : slots_)
    if (mr && !mr->is_window) observer_->mr_added(*mr);
}

Result<Mr*> MrTable::add_window(Pd* pd, ibv_mw_type type) {
  if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) return Result<Mr*>::error(EINVAL);
  auto* mw = new (std::nothrow) Mr;
  if (!mw) return Result<Mr*>::error(ENOMEM);
  std::unique_lock lock(mu_);
  uint32_t key;
  if (int e = take_slot_locked(true, &key)) {
    delete mw;
    return Result<Mr*>::error(e);
  }
  uint32_t index = key >> 8;
  mw->pd = pd;
  mw->is_window = true;
  mw->ibmr.lkey = mw->ibmr.rkey = key;
  mw->ibmw.context = pd->ibpd.context;
  mw->ibmw.pd = &pd->ibpd;
  mw->ibmw.rkey = key;
  mw->ibmw.handle = index;
  mw->ibmw.type = type;
  slots_[index] = mw;
  pd->users.fetch_add(1);
  return mw;
}

void MrTable::unbind_locked(Mr* mw) {
  if (mw->bound && mw->parent) --mw->parent->windows;
  mw->bound = false;
  mw->parent = nullptr;
}

// What a bind may grant. IBV_ACCESS_LOCAL_WRITE is accepted and has no effect
// (a window's key is remote only): applications pass it (rdma-core's pyverbs
// tests do), rxe ignores the bits it does not use and mlx5 maps it.
constexpr unsigned kWindowAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
                                   IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ZERO_BASED;

int MrTable::bind_window(Mr* mw, const Pd* pd, const MwBind& b, uint32_t qpn) {
  std::unique_lock lock(mu_);
  if (!mw->is_window || (b.new_rkey >> 8) != (mw->ibmr.lkey >> 8)) return EINVAL;
  if (mw->pd != pd) return EINVAL;
  if (b.access & ~kWindowAccess) return EINVAL;
  if (b.length == 0) {  // IBA: a zero-length bind unbinds the window
    unbind_locked(mw);
    mw->ibmr.lkey = mw->ibmr.rkey = b.new_rkey;
    return 0;
  }
  const Mr* parent = nullptr;
  if (check_locked(b.mr_lkey, pd, b.addr, b.length, IBV_ACCESS_MW_BIND, false, &parent) != KeyCheck::kOk ||
      parent->is_window)
    return EINVAL;
  // Remote write and atomic through a window need local write on the MR.
  if ((b.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(parent->access & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  unbind_locked(mw);
  Mr* p = const_cast<Mr*>(parent);
  mw->parent = p;
  ++p->windows;
  mw->host = p->host_at(b.addr, false);
  mw->iova = (b.access & IBV_ACCESS_ZERO_BASED) ? 0 : b.addr;
  mw->length = b.length;
  mw->access = b.access & ~unsigned(IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
  mw->bound = true;
  mw->bound_qpn = mw->ibmw.type == IBV_MW_TYPE_2 ? qpn : 0;
  mw->ibmr.lkey = mw->ibmr.rkey = b.new_rkey;
  return 0;
}

int MrTable::invalidate(uint32_t rkey, const Pd* pd) {
  std::unique_lock lock(mu_);
  uint32_t index = rkey >> 8;
  if (index == 0 || index >= slots_.size()) return EINVAL;
  Mr* mw = slots_[index];
  if (!mw || !mw->is_window || mw->ibmr.lkey != rkey || !mw->bound || mw->pd != pd || mw->ibmw.type != IBV_MW_TYPE_2)
    return EINVAL;
  unbind_locked(mw);
  return 0;
}

int MrTable::remove(Mr* mr) {
  {
    std::unique_lock lock(mu_);
    uint32_t index = mr->ibmr.lkey >> 8;
    if (index >= slots_.size() || slots_[index] != mr) return EINVAL;
    if (mr->windows > 0) return EBUSY;  // windows are bound to it
    if (mr->is_window) unbind_locked(mr);
    if (observer_ && !mr->is_window) observer_->mr_removing(*mr);
    slots_[index] = nullptr;
    variants_[index] = uint8_t(mr->ibmr.lkey);  // a window's bind may have changed it
    --(mr->is_window ? windows_ : mrs_);
    free_.push_back(index);
  }
  mr->pd->users.fetch_sub(1);
  if (mr->dm) mr->dm->mrs.fetch_sub(1);
  delete mr;
  return 0;
}

namespace {

// The arguments of a rereg, checked before anything changes.
int validate_rereg(const Mr& mr, const MrChange& c) {
  constexpr int kFlags = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
  if (!c.flags || (c.flags & ~kFlags) || mr.is_window || mr.dm) return EINVAL;
  if ((c.flags & IBV_REREG_MR_CHANGE_PD) && (!c.pd || c.pd->ibpd.context != mr.pd->ibpd.context)) return EINVAL;
  const unsigned access = (c.flags & IBV_REREG_MR_CHANGE_ACCESS) ? c.access : mr.access;
  if (int e = validate_mr_access(access)) return e;
  const bool implicit = !mr.host && mr.length == SIZE_MAX;
  if (implicit && (c.flags & (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS))) return EINVAL;
  if (!(c.flags & IBV_REREG_MR_CHANGE_TRANSLATION)) return 0;
  if (!c.addr || !c.length || c.length > kMaxMrSize) return EINVAL;
  return validate_mr_range(c.addr, c.length, access);
}

}  // namespace

int MrTable::rereg(Mr* mr, const MrChange& c) {
  std::unique_lock lock(mu_);
  uint32_t index = mr->ibmr.lkey >> 8;
  if (index >= slots_.size() || slots_[index] != mr) return EINVAL;
  if (int e = validate_rereg(*mr, c)) return e;
  if (mr->windows > 0) return EBUSY;
  if (observer_) observer_->mr_removing(*mr);  // republished below with its new record
  if (c.flags & IBV_REREG_MR_CHANGE_PD) {
    c.pd->users.fetch_add(1);
    mr->pd->users.fetch_sub(1);
    mr->pd = c.pd;
    mr->ibmr.pd = &c.pd->ibpd;
  }
  if (c.flags & IBV_REREG_MR_CHANGE_ACCESS) mr->access = c.access;
  if (c.flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    mr->host = static_cast<uint8_t*>(c.addr);
    mr->iova = reinterpret_cast<uint64_t>(c.addr);
    mr->length = c.length;
    mr->ibmr.addr = c.addr;
    mr->ibmr.length = c.length;
  }
  if (observer_) observer_->mr_added(*mr);
  return 0;
}

KeyCheck MrTable::check_locked(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, unsigned need, bool remote,
                               const Mr** out, uint32_t qpn) const {
  uint32_t index = key >> 8;
  if (index == 0 || index >= slots_.size()) return KeyCheck::kBadKey;
  const Mr* mr = slots_[index];
  if (!mr || mr->ibmr.lkey != key) return KeyCheck::kBadKey;
  if (mr->is_window && (!mr->bound || !remote)) return KeyCheck::kBadKey;  // windows: bound, remote keys only
  if (mr->is_window && mr->bound_qpn != 0 && mr->bound_qpn != qpn) return KeyCheck::kBadKey;  // type 2: its QP only
  RegionGrant grant{mr->ibmr.lkey, mr->pd->id, remote ? mr->iova : mr->local_base(), mr->length, mr->access};
  KeyCheck c = check_grant(grant, key, pd ? pd->id : grant.pd, va, len, need);  // no PD: any
  if (c == KeyCheck::kOk) *out = mr;
  return c;
}

KeyCheck MrTable::check(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, unsigned need, bool remote,
                        uint32_t qpn) const {
  std::shared_lock lock(mu_);
  const Mr* mr = nullptr;
  return check_locked(key, pd, va, len, need, remote, &mr, qpn);
}

bool MrTable::scatter(const Pd* pd, const Sge* sge, uint16_t num_sge, uint32_t offset, const uint8_t* data,
                      uint32_t len) const {
  std::shared_lock lock(mu_);
  uint32_t skip = offset;
  for (uint16_t i = 0; i < num_sge && len > 0; ++i) {
    if (skip >= sge[i].length) {
      skip -= sge[i].length;
      continue;
    }
    uint32_t n = std::min(sge[i].length - skip, len);
    const Mr* mr = nullptr;
    if (check_locked(sge[i].lkey, pd, sge[i].addr + skip, n, IBV_ACCESS_LOCAL_WRITE, false, &mr) != KeyCheck::kOk)
      return false;
    uint8_t* dst = mr->host_at(sge[i].addr + skip, false);
    if (!copy_to_mr(*mr, dst, data, n)) return false;
    data += n;
    len -= n;
    if (len == 0 && !is_on_demand(*mr)) prefetch_for_write(dst + n, sge[i].length - skip - n);  // within the SGE
    skip = 0;
  }
  return len == 0;
}

}  // namespace uroce::core
