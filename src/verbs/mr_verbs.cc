// Protection domains and memory regions.
#include <infiniband/verbs.h>

#include <cstring>

#include "core/mr.h"
#include "engine/engine_context.h"
#include "verbs/export.h"
#include "verbs/import.h"
#include "verbs/ops.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

using uroce::core::KeyCheck;
using uroce::core::Mr;
using uroce::core::Pd;
using uroce::engine::EngineContext;
using uroce::verbs::abi_guard;
using uroce::verbs::abi_guard_errno;

UROCE_API ibv_pd* ibv_alloc_pd(ibv_context* context) {
  return abi_guard<ibv_pd*>(nullptr, [&]() -> ibv_pd* {
    if (!context) {
      errno = EINVAL;
      return nullptr;
    }
    EngineContext* ctx = EngineContext::from(context);
    uroce::core::Reservation slot(ctx, uroce::core::Resource::kPd);  // max_pd
    if (slot.error()) {
      errno = slot.error();
      return nullptr;
    }
    auto* pd = new Pd;
    pd->ctx = ctx;
    pd->ibpd.context = context;
    pd->ibpd.handle = pd->id;  // unique in the process: ibv_import_pd finds it
    uroce::verbs::track_pd(&pd->ibpd);
    slot.keep();
    return &pd->ibpd;
  });
}

UROCE_API int ibv_dealloc_pd(ibv_pd* ibpd) {
  return abi_guard_errno([&] {
    if (!ibpd) return EINVAL;
    Pd* pd = Pd::own(ibpd);
    if (pd->base) {  // a parent domain: what was created with it counts on its base
      pd->base->users.fetch_sub(1);
      delete pd;
      return 0;
    }
    if (pd->users.load() != 0) return EBUSY;  // MRs/QPs still use it (kernel: EBUSY)
    uroce::verbs::untrack_pd(ibpd);
    pd->ctx->release(uroce::core::Resource::kPd);
    delete pd;
    return 0;
  });
}

UROCE_API ibv_mr* ibv_reg_mr_iova2(ibv_pd* ibpd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  return abi_guard<ibv_mr*>(nullptr, [&]() -> ibv_mr* {
    if (!ibpd) {
      errno = EINVAL;
      return nullptr;
    }
    Pd* pd = Pd::from(ibpd);
    // IBV_ACCESS_OPTIONAL_RANGE bits may be ignored by a provider (verbs.h).
    access &= ~unsigned(IBV_ACCESS_OPTIONAL_RANGE);
    auto r = EngineContext::from(ibpd->context)->mrs.add(pd, addr, length, iova, access);
    if (!r.ok()) {
      errno = r.err();
      return nullptr;
    }
    (*r)->ibmr.pd = ibpd;  // as libibverbs: the PD (or parent domain) it was registered with
    return &(*r)->ibmr;
  });
}

UROCE_API ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr), unsigned(access));
}

UROCE_API ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, unsigned(access));
}

UROCE_API int ibv_dereg_mr(ibv_mr* ibmr) {
  return abi_guard_errno([&] {
    if (!ibmr) return EINVAL;
    return EngineContext::from(ibmr->context)->mrs.remove(Mr::from(ibmr));
  });
}

// ibv_rereg_mr: libibverbs' own argument checks fail with
// IBV_REREG_MR_ERR_INPUT (errno EINVAL); what the kernel refuses in rdma-core
// (core::MrTable::rereg) fails with IBV_REREG_MR_ERR_CMD and its errno. The
// keys stay the same (the kernel's rxe keeps them too).
UROCE_API int ibv_rereg_mr(ibv_mr* ibmr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  constexpr int kFlags = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
  if (!ibmr || (flags & ~kFlags) || ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!addr || !length)) ||
      (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS))) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  return abi_guard(int(IBV_REREG_MR_ERR_CMD), [&] {
    // pd, addr and length are read only when their flag is set (callers leave
    // them uninitialized otherwise: pyverbs does).
    Pd* new_pd = (flags & IBV_REREG_MR_CHANGE_PD) && pd ? Pd::from(pd) : nullptr;
    uroce::core::MrChange change{flags, new_pd, addr, length, unsigned(access)};
    if (int e = EngineContext::from(ibmr->context)->mrs.rereg(Mr::from(ibmr), change)) {
      errno = e;
      return int(IBV_REREG_MR_ERR_CMD);
    }
    if (flags & IBV_REREG_MR_CHANGE_PD) ibmr->pd = pd;  // as libibverbs: the PD (or parent domain) passed
    return 0;
  });
}

namespace uroce::verbs {

// ibv_alloc_parent_domain (verbs_context::alloc_parent_domain): a PD that
// stands for attr->pd (core::Pd::base). Errors as mlx5's: unknown comp_mask
// bits, no PD, a PD of another context or a parent domain as the base:
// EINVAL. Thread domains do not exist in uroce (ibv_alloc_td is EOPNOTSUPP),
// so a non-null td is EINVAL. The allocators are accepted and never called:
// a provider calls them for the queue buffers it shares with its hardware;
// uroce's queues are its own memory, with no such buffers to hand out.
ibv_pd* alloc_parent_domain(ibv_context* context, ibv_parent_domain_init_attr* attr) {
  return abi_guard<ibv_pd*>(nullptr, [&]() -> ibv_pd* {
    constexpr uint32_t kCompMask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    if (!context || !attr || !attr->pd || attr->td || (attr->comp_mask & ~kCompMask) || attr->pd->context != context ||
        Pd::own(attr->pd)->base) {
      errno = EINVAL;
      return nullptr;
    }
    Pd* base = Pd::own(attr->pd);
    auto* pd = new Pd;
    pd->ctx = base->ctx;
    pd->base = base;
    pd->ibpd.context = context;
    pd->ibpd.handle = base->ibpd.handle;
    base->users.fetch_add(1);  // the base outlives its parent domains (EBUSY)
    return &pd->ibpd;
  });
}

// ibv_advise_mr: uroce never pins or maps anything ahead of an access, so a
// prefetch has nothing to do; the arguments are still checked with the
// errors ibv_advise_mr(3) lists, so a program that works here also works on
// hardware.
int advise_mr(ibv_pd* ibpd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sges) {
  return abi_guard_errno([&] {
    // The application may pass any number: it is read as one (loading an enum
    // object that holds no enumerator is undefined: UBSan's enum check).
    uint32_t raw;
    static_assert(sizeof raw == sizeof advice);
    std::memcpy(&raw, &advice, sizeof raw);
    if (raw != IBV_ADVISE_MR_ADVICE_PREFETCH && raw != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
        raw != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
      return EOPNOTSUPP;
    const bool write = raw == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE;
    if (!ibpd || (flags & ~uint32_t(IBV_ADVISE_MR_FLAG_FLUSH)) || !sg_list || num_sges == 0) return EINVAL;
    const auto& mrs = EngineContext::from(ibpd->context)->mrs;
    Pd* pd = Pd::from(ibpd);
    for (uint32_t i = 0; i < num_sges; ++i) {
      const ibv_sge& s = sg_list[i];
      // Invalid lkey or range outside the MR: EFAULT; another PD's MR: EPERM.
      if (mrs.check(s.lkey, nullptr, s.addr, s.length, 0, false) != KeyCheck::kOk) return EFAULT;
      if (mrs.check(s.lkey, pd, s.addr, s.length, 0, false) != KeyCheck::kOk) return EPERM;
      // Prefetching applies to on-demand MRs only (ibv_advise_mr(3)).
      if (mrs.check(s.lkey, pd, s.addr, s.length, IBV_ACCESS_ON_DEMAND, false) != KeyCheck::kOk) return EINVAL;
      if (write && mrs.check(s.lkey, pd, s.addr, s.length, IBV_ACCESS_LOCAL_WRITE, false) != KeyCheck::kOk)
        return EPERM;  // write prefetch of a read-only MR
    }
    return 0;
  });
}

}  // namespace uroce::verbs
