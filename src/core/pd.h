// Protection domain.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/container_of.h"

namespace uroce::core {

class Context;

struct Pd {
  ibv_pd ibpd{};  // ABI object
  // Unique in the process (a PD's identity in the same-host placement
  // window, host/direct_placement.h, where pointers mean nothing).
  uint32_t id = next_id();
  Context* ctx = nullptr;
  std::atomic<int> users{0};  // MRs, QPs, AHs, SRQs using this PD
  // A parent domain (ibv_alloc_parent_domain) is an ibv_pd that stands for the
  // protection domain it was made from: whatever is created with it belongs
  // to `base` (the kernel's uverbs gives both one PD handle).
  Pd* base = nullptr;

  // The protection domain `p` stands for: itself, or a parent domain's base.
  static Pd* from(ibv_pd* p) {
    Pd* pd = own(p);
    return pd->base ? pd->base : pd;
  }
  // The record of `p` itself (a parent domain's own, to free it).
  static Pd* own(ibv_pd* p) { return UROCE_CONTAINER_OF(p, Pd, ibpd); }
  static uint32_t next_id() {
    static std::atomic<uint32_t> last{0};
    return last.fetch_add(1, std::memory_order_relaxed) + 1;
  }
};

}  // namespace uroce::core
