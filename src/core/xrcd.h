// XRC domain (ibv_open_xrcd, IBA Vol. 1 Annex A14 "XRC domain"): groups XRC SRQs and XRC
// target QPs; a target QP may deliver into any XRC SRQ of its domain. Processes
// that open the domain with the same file (same inode) share one domain.
//
// The verbs-visible part only; the state shared between the processes of a
// domain lives in the engine (engine/xrc_domain.h).
#pragma once

#include <infiniband/verbs.h>

#include <atomic>

#include "core/container_of.h"

namespace uroce::core {

class Context;

struct Xrcd {
  ibv_xrcd ibxrcd{};  // ABI object
  Context* ctx = nullptr;
  std::atomic<int> users{0};  // XRC SRQs and target QPs (close -> EBUSY while > 0)

  static Xrcd* from(ibv_xrcd* x) { return UROCE_CONTAINER_OF(x, Xrcd, ibxrcd); }
};

}  // namespace uroce::core
