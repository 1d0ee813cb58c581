// Protection domains and memory regions.
#include <infiniband/verbs.h>

#include "core/mr.h"
#include "engine/engine_context.h"
#include "verbs/export.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

using uroce::core::Mr;
using uroce::core::Pd;
using uroce::engine::EngineContext;
using uroce::verbs::abi_guard;

UROCE_API ibv_pd* ibv_alloc_pd(ibv_context* context) {
  return abi_guard<ibv_pd*>(nullptr, [&]() -> ibv_pd* {
    if (!context) {
      errno = EINVAL;
      return nullptr;
    }
    auto* pd = new Pd;
    pd->ctx = EngineContext::from(context);
    pd->ibpd.context = context;
    pd->ibpd.handle = 0;
    return &pd->ibpd;
  });
}

UROCE_API int ibv_dealloc_pd(ibv_pd* ibpd) {
  if (!ibpd) return EINVAL;
  Pd* pd = Pd::from(ibpd);
  if (pd->users.load() != 0) return EBUSY;  // MRs/QPs still use it (kernel: EBUSY)
  delete pd;
  return 0;
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
  if (!ibmr) return EINVAL;
  return EngineContext::from(ibmr->context)->mrs.remove(Mr::from(ibmr));
}
