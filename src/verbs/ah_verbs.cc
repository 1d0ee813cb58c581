// Address handles (UD destinations).
#include <infiniband/verbs.h>

#include <memory>

#include "core/ah.h"
#include "core/pd.h"
#include "engine/engine_context.h"
#include "verbs/export.h"

using uroce::core::Ah;
using uroce::core::Pd;
using uroce::engine::EngineContext;
using uroce::verbs::abi_guard;
using uroce::verbs::abi_guard_errno;

UROCE_API ibv_ah* ibv_create_ah(ibv_pd* ibpd, ibv_ah_attr* attr) {
  return abi_guard<ibv_ah*>(nullptr, [&]() -> ibv_ah* {
    if (!ibpd || !attr) {
      errno = EINVAL;
      return nullptr;
    }
    EngineContext* ctx = EngineContext::from(ibpd->context);
    auto ah = std::make_unique<Ah>();
    if (int e = uroce::core::resolve_ah(*ctx, *attr, ah.get())) {
      errno = e;
      return nullptr;
    }
    uroce::core::Reservation slot(ctx, uroce::core::Resource::kAh);  // max_ah
    if (slot.error()) {
      errno = slot.error();
      return nullptr;
    }
    ah->ibah.context = ibpd->context;
    ah->ibah.pd = ibpd;
    Pd::from(ibpd)->users.fetch_add(1);
    slot.keep();
    return &ah.release()->ibah;
  });
}

UROCE_API int ibv_destroy_ah(ibv_ah* ibah) {
  return abi_guard_errno([&] {
    if (!ibah) return EINVAL;
    Pd::from(ibah->pd)->users.fetch_sub(1);
    EngineContext::from(ibah->context)->release(uroce::core::Resource::kAh);
    delete Ah::from(ibah);
    return 0;
  });
}

UROCE_API int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh,
                                  ibv_ah_attr* ah_attr) {
  if (!context || !wc || !ah_attr) {
    errno = EINVAL;
    return -1;
  }
  return abi_guard<int>(-1, [&] {
    int e = uroce::core::ah_attr_from_wc(*EngineContext::from(context), port_num, *wc, grh, ah_attr);
    if (e) errno = e;
    return e ? -1 : 0;
  });
}

UROCE_API ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  if (!pd) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_ah_attr attr;
  if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr)) return nullptr;
  return ibv_create_ah(pd, &attr);
}
