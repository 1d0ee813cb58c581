// Device memory (ibv_alloc_dm, ibv_reg_dm_mr, ibv_memcpy_to/from_dm): on a
// NIC, memory on the device that MRs can be registered on; in uroce, a
// buffer the library owns (docs/architecture.md, "Device memory"). MRs on it
// are zero-based: their addresses, local and remote, are offsets into the
// MR. Freeing it while MRs use it is EBUSY, as the kernel's uverbs object.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "core/container_of.h"

namespace uroce::core {

struct Dm {
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  ibv_dm ibdm{};                         // ABI object; memcpy_to_dm / memcpy_from_dm point at uroce's copies
  std::unique_ptr<uint8_t[], Free> mem;  // page-aligned (aligned_alloc), zeroed
  size_t length = 0;
  std::atomic<int> mrs{0};  // MRs registered on it

  static Dm* from(ibv_dm* d) { return UROCE_CONTAINER_OF(d, Dm, ibdm); }
};

}  // namespace uroce::core
