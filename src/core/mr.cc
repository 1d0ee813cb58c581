#include "core/mr.h"

#include <cerrno>

#include "core/limits.h"

namespace uroce::core {

int validate_mr_access(unsigned access) {
  if (access & ~kSupportedAccess) return EINVAL;
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  return 0;
}

Result<Mr*> MrTable::add(Pd* pd, void* addr, uint64_t length, uint64_t iova, unsigned access) {
  if (int e = validate_mr_access(access)) return Result<Mr*>::error(e);
  if (length > kMaxMrSize) return Result<Mr*>::error(EINVAL);
  if (!addr && length) return Result<Mr*>::error(EINVAL);
  auto* mr = new (std::nothrow) Mr;
  if (!mr) return Result<Mr*>::error(ENOMEM);
  std::unique_lock lock(mu_);
  uint32_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    if (slots_.size() >= kMaxMr) {
      delete mr;
      return Result<Mr*>::error(ENOMEM);
    }
    index = uint32_t(slots_.size());
    slots_.push_back(nullptr);
  }
  // key = slot << 8 | generation, so a stale key of a reused slot fails.
  uint32_t key = index << 8 | ++generation_;
  mr->pd = pd;
  mr->host = static_cast<uint8_t*>(addr);
  mr->iova = iova;
  mr->length = length;
  mr->access = access;
  mr->ibmr.context = pd->ibpd.context;
  mr->ibmr.pd = &pd->ibpd;
  mr->ibmr.addr = addr;
  mr->ibmr.length = length;
  mr->ibmr.handle = index;
  mr->ibmr.lkey = key;
  mr->ibmr.rkey = key;
  slots_[index] = mr;
  pd->users.fetch_add(1);
  return mr;
}

int MrTable::remove(Mr* mr) {
  {
    std::unique_lock lock(mu_);
    uint32_t index = mr->ibmr.lkey >> 8;
    if (index >= slots_.size() || slots_[index] != mr) return EINVAL;
    slots_[index] = nullptr;
    free_.push_back(index);
  }
  mr->pd->users.fetch_sub(1);
  delete mr;
  return 0;
}

KeyCheck MrTable::check_locked(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, unsigned need, bool remote,
                               const Mr** out) const {
  uint32_t index = key >> 8;
  if (index == 0 || index >= slots_.size()) return KeyCheck::kBadKey;
  const Mr* mr = slots_[index];
  if (!mr || mr->ibmr.lkey != key) return KeyCheck::kBadKey;
  if (pd && mr->pd != pd) return KeyCheck::kPdMismatch;
  uint64_t base = remote ? mr->iova : reinterpret_cast<uint64_t>(mr->host);
  if (va < base || len > mr->length || va - base > mr->length - len) return KeyCheck::kOutOfBounds;
  if ((mr->access & need) != need) return KeyCheck::kNoPermission;
  *out = mr;
  return KeyCheck::kOk;
}

KeyCheck MrTable::check(uint32_t key, const Pd* pd, uint64_t va, uint64_t len, unsigned need, bool remote) const {
  std::shared_lock lock(mu_);
  const Mr* mr = nullptr;
  return check_locked(key, pd, va, len, need, remote, &mr);
}

}  // namespace uroce::core
