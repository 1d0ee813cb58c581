// Device memory: ibv_alloc_dm, ibv_free_dm, ibv_reg_dm_mr, ibv_memcpy_to_dm /
// ibv_memcpy_from_dm (verbs.h inlines that call through verbs_context and
// ibv_dm). uroce's device memory is a buffer it owns (core/dm.h); the errnos
// follow ibv_alloc_dm(3) and mlx5, the provider that offers it.
#include <infiniband/verbs.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/dm.h"
#include "core/limits.h"
#include "core/mr.h"
#include "engine/engine_context.h"
#include "verbs/export.h"
#include "verbs/import.h"
#include "verbs/ops.h"

namespace uroce::verbs {

namespace {

using core::Dm;

// Device memory is accessed in 4-byte words (mlx5: "DM access address and
// length must be aligned to 4 bytes"), so a copy outside the allocation is
// EFAULT and an unaligned offset or length EINVAL, in mlx5's order.
constexpr uint64_t kDmAccessAlign = 4;

int check_dm_copy(const Dm& dm, uint64_t dm_offset, size_t length) {
  if (dm_offset > dm.length || length > dm.length - dm_offset) return EFAULT;
  if ((dm_offset | length) & (kDmAccessAlign - 1)) return EINVAL;
  return 0;
}

int memcpy_to_dm(ibv_dm* ibdm, uint64_t dm_offset, const void* host_addr, size_t length) noexcept {
  Dm* dm = Dm::from(ibdm);
  if (int e = check_dm_copy(*dm, dm_offset, length)) return e;
  if (length) std::memcpy(dm->mem.get() + dm_offset, host_addr, length);
  return 0;
}

int memcpy_from_dm(void* host_addr, ibv_dm* ibdm, uint64_t dm_offset, size_t length) noexcept {
  Dm* dm = Dm::from(ibdm);
  if (int e = check_dm_copy(*dm, dm_offset, length)) return e;
  if (length) std::memcpy(host_addr, dm->mem.get() + dm_offset, length);
  return 0;
}

}  // namespace

ibv_dm* alloc_dm(ibv_context* context, ibv_alloc_dm_attr* attr) {
  return abi_guard<ibv_dm*>(nullptr, [&]() -> ibv_dm* {
    if (!context || !attr || attr->comp_mask || attr->log_align_req > 12) {
      errno = EINVAL;
      return nullptr;
    }
    auto* ctx = engine::EngineContext::from(context);
    if (attr->length == 0 || attr->length > core::kMaxDmSize || !ctx->take_dm_bytes(attr->length)) {
      errno = ENOMEM;  // more than the device's memory (max_dm_size) left
      return nullptr;
    }
    auto* dm = new (std::nothrow) Dm;
    size_t rounded = (attr->length + 4095) & ~size_t(4095);  // aligned_alloc: a multiple of the alignment
    auto* mem = dm ? static_cast<uint8_t*>(std::aligned_alloc(4096, rounded)) : nullptr;
    if (!mem) {
      delete dm;
      ctx->give_dm_bytes(attr->length);
      errno = ENOMEM;
      return nullptr;
    }
    std::memset(mem, 0, rounded);
    dm->mem.reset(mem);
    dm->length = attr->length;
    dm->ibdm.context = context;
    dm->ibdm.memcpy_to_dm = memcpy_to_dm;
    dm->ibdm.memcpy_from_dm = memcpy_from_dm;
    track_dm(&dm->ibdm);
    return &dm->ibdm;
  });
}

int free_dm(ibv_dm* ibdm) noexcept {
  if (!ibdm) return EINVAL;
  Dm* dm = Dm::from(ibdm);
  if (dm->mrs.load() != 0) return EBUSY;  // MRs are registered on it
  untrack_dm(ibdm);
  engine::EngineContext::from(ibdm->context)->give_dm_bytes(dm->length);
  delete dm;
  return 0;
}

ibv_mr* reg_dm_mr(ibv_pd* ibpd, ibv_dm* ibdm, uint64_t dm_offset, size_t length, unsigned int access) {
  return abi_guard<ibv_mr*>(nullptr, [&]() -> ibv_mr* {
    // DM MRs are zero-based (the kernel's mlx5_ib_reg_dm_mr requires it);
    // MW binding and on-demand paging do not apply to device memory.
    constexpr unsigned kAllowed = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                  IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ZERO_BASED;
    if (!ibpd || !ibdm || !(access & IBV_ACCESS_ZERO_BASED) || (access & ~kAllowed) || ibdm->context != ibpd->context) {
      errno = EINVAL;
      return nullptr;
    }
    Dm* dm = Dm::from(ibdm);
    // The range check of the kernel's UVERBS_METHOD_REG_DM_MR: a zero length
    // is allowed (an MR no access can reach, as mlx5 registers it).
    if (dm_offset > dm->length || length > dm->length - dm_offset) {
      errno = EINVAL;
      return nullptr;
    }
    auto r = engine::EngineContext::from(ibpd->context)
                 ->mrs.add(core::Pd::from(ibpd), dm->mem.get() + dm_offset, length, 0,
                           access & ~unsigned(IBV_ACCESS_ZERO_BASED), dm);
    if (!r.ok()) {
      errno = r.err();
      return nullptr;
    }
    (*r)->ibmr.addr = nullptr;  // zero-based: its addresses start at 0
    return &(*r)->ibmr;
  });
}

}  // namespace uroce::verbs
