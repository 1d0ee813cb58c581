// The access checks of a remote request at its target, in one place for the
// two that apply them (C9-88 ff., as rxe's check_op_valid and check_rkey):
// the responder (engine/responder.cc), on its own QP and MR table
// (MrTable::check_locked), and same-host direct placement
// (host/direct_placement.cc), on the QP and MR entries the target
// published in its placement window. What the placement cannot prove with
// them goes as packets, and the responder then reports the IBA status.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "core/mr.h"

namespace uroce::core {

enum class RemoteOp : uint8_t { kWrite, kRead, kAtomic };

// The access flag `op` needs, of the target QP and of the region.
constexpr unsigned remote_access_for(RemoteOp op) {
  switch (op) {
    case RemoteOp::kWrite:
      return IBV_ACCESS_REMOTE_WRITE;
    case RemoteOp::kRead:
      return IBV_ACCESS_REMOTE_READ;
    case RemoteOp::kAtomic:
      return IBV_ACCESS_REMOTE_ATOMIC;
  }
  return 0;
}

// Whether a QP with access flags `qp_access` (ibv_qp_attr::qp_access_flags)
// and `max_dest_rd_atomic` responder resources accepts `op`: its flag, and
// for READs and atomics at least one resource (else the responder NAKs an
// invalid request, as rxe's check_op_valid).
constexpr bool qp_accepts(unsigned qp_access, unsigned max_dest_rd_atomic, RemoteOp op) {
  if (!(qp_access & remote_access_for(op))) return false;
  return op == RemoteOp::kWrite || max_dest_rd_atomic > 0;
}

// A region as a key check sees it: its current key, its PD's id (Pd::id),
// where its range starts under the check's key semantics (an iova for
// remote keys, a local address for local ones), its length and access.
struct RegionGrant {
  uint32_t key = 0;
  uint32_t pd = 0;
  uint64_t base = 0;
  uint64_t length = 0;
  unsigned access = 0;
};

// Checks an access to [va, va+len) under `key` by PD `pd` needing `need`
// against region `r`: the key, the PD, the bounds (without overflow), then
// the region's access flags, in that order (the first failure names it).
constexpr KeyCheck check_grant(const RegionGrant& r, uint32_t key, uint32_t pd, uint64_t va, uint64_t len,
                               unsigned need) {
  if (r.key != key) return KeyCheck::kBadKey;
  if (r.pd != pd) return KeyCheck::kPdMismatch;
  if (va < r.base || len > r.length || va - r.base > r.length - len) return KeyCheck::kOutOfBounds;
  if ((r.access & need) != need) return KeyCheck::kNoPermission;
  return KeyCheck::kOk;
}

}  // namespace uroce::core
