// Protection domain.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>

#include "core/container_of.h"

namespace uroce::core {

class Context;

struct Pd {
  ibv_pd ibpd{};  // ABI object
  Context* ctx = nullptr;
  std::atomic<int> users{0};  // MRs, QPs, AHs, SRQs using this PD

  static Pd* from(ibv_pd* p) { return UROCE_CONTAINER_OF(p, Pd, ibpd); }
};

}  // namespace uroce::core
