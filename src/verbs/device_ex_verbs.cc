// Extended device queries: ibv_query_device_ex (verbs_context::query_device_ex)
// and ibv_query_rt_values_ex (verbs_context::query_rt_values).
#include <infiniband/verbs.h>

#include <algorithm>
#include <cstring>

#include "core/completion_clock.h"
#include "core/mr_access.h"
#include "engine/engine_context.h"
#include "verbs/export.h"
#include "verbs/ops.h"

using uroce::engine::EngineContext;

namespace uroce::verbs {

// Everything beyond orig_attr that uroce has (ODP, completion timestamps,
// device memory), and zero for what it has not (TSO, RSS, WQs, raw packet QPs,
// packet pacing, tag matching, CQ moderation, PCI atomics, ODP atomics).
int query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                    size_t attr_size) {
  return abi_guard_errno([&] {
    if (!context || !attr) return EINVAL;
    if (input && input->comp_mask) return EINVAL;
    ibv_device_attr_ex a{};
    EngineContext::from(context)->query_device(&a.orig_attr);
    a.device_cap_flags_ex = unsigned(a.orig_attr.device_cap_flags);  // no flag above bit 31 applies
    // On-demand paging is what uroce always does: nothing is pinned, and every
    // access goes through the MR table at the time it happens. Implicit ODP
    // (one MR for the whole address space, ibv_reg_mr(pd, NULL, SIZE_MAX,
    // ON_DEMAND)) too: like any MR, it lets peers reach what its access flags
    // say — there, the whole address space — and every access to an unmapped
    // address fails cleanly (core/mr_access.h).
    a.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
    a.odp_caps.per_transport_caps.rc_odp_caps =
        IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
        (core::kOdpAtomics ? IBV_ODP_SUPPORT_ATOMIC : 0) | (a.orig_attr.max_srq > 0 ? IBV_ODP_SUPPORT_SRQ_RECV : 0);
    // UC and UD QPs take receives from an SRQ too (the responder's receive path is one).
    a.odp_caps.per_transport_caps.uc_odp_caps =
        IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV;
    a.odp_caps.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
    // XRC: as RC, receives through SRQs.
    a.xrc_odp_caps = a.odp_caps.per_transport_caps.rc_odp_caps | IBV_ODP_SUPPORT_SRQ_RECV;
    a.completion_timestamp_mask = core::kCompletionTimestampMask;
    a.hca_core_clock = core::kHcaCoreClockKhz;
    a.phys_port_cnt_ex = uint32_t(a.orig_attr.phys_port_cnt);
    a.max_dm_size = core::kMaxDmSize;
    std::memset(attr, 0, attr_size);
    std::memcpy(attr, &a, std::min(attr_size, sizeof a));
    return 0;
  });
}

// The raw clock goes in tv_nsec with tv_sec = 0, as mlx5 reports its cycle
// counter: consumers read either tv_nsec alone or tv_sec * 1e9 + tv_nsec,
// and both give the ticks of ibv_wc_read_completion_ts.
int query_rt_values(ibv_context* context, ibv_values_ex* values) noexcept {
  if (!context || !values) return EINVAL;
  uint32_t requested = values->comp_mask;
  values->comp_mask = 0;
  if (requested & IBV_VALUES_MASK_RAW_CLOCK) {
    values->raw_clock.tv_sec = 0;
    values->raw_clock.tv_nsec = long(core::completion_clock_ns());
    values->comp_mask |= IBV_VALUES_MASK_RAW_CLOCK;
  }
  return 0;
}

}  // namespace uroce::verbs
