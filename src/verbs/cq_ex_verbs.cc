// Extended completion queues: ibv_create_cq_ex (verbs_context::create_cq_ex)
// and the polling API verbs.h reaches through struct ibv_cq_ex's function
// pointers (ibv_start_poll / ibv_next_poll / ibv_end_poll, ibv_wc_read_*).
//
// An extended CQ is an ordinary core::Cq (same ring, same arming and
// completion channel, ibv_poll_cq works on it too) whose function pointers
// are filled and which samples the completion clocks when asked to.
#include <infiniband/verbs.h>

#include <cstring>

#include "core/cq.h"
#include "core/pd.h"
#include "engine/engine_context.h"
#include "verbs/export.h"
#include "verbs/ops.h"

using uroce::core::Cq;
using uroce::engine::EngineContext;

namespace {

constexpr uint64_t kSupportedWcFlags = uint64_t(IBV_WC_STANDARD_FLAGS) | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                                       IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
// IBV_CQ_INIT_ATTR_MASK_PD names a parent domain (a plain PD is EINVAL, as
// mlx5); a CQ belongs to no PD, so it changes nothing else.
constexpr uint32_t kSupportedCompMask = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
// Neither flag changes anything: the CQ lock is cheap when uncontended, and an
// overrun never raises a CQ error (the completion is dropped and counted).
constexpr uint32_t kSupportedCreateFlags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;

Cq* cq_of(ibv_cq_ex* c) noexcept { return Cq::from(ibv_cq_ex_to_cq(c)); }
const ibv_wc& current_wc(ibv_cq_ex* c) noexcept { return cq_of(c)->current.wc; }

// Pops the next completion into the cursor and publishes wr_id and status,
// which ibv_cq_ex exposes as fields rather than readers.
int advance(ibv_cq_ex* ibcq) noexcept {
  Cq* cq = cq_of(ibcq);
  if (!cq->pop(&cq->current)) return ENOENT;
  ibcq->wr_id = cq->current.wc.wr_id;
  ibcq->status = cq->current.wc.status;
  return 0;
}

int start_poll(ibv_cq_ex* ibcq, ibv_poll_cq_attr* attr) noexcept {
  if (attr && attr->comp_mask) return EINVAL;
  Cq* cq = cq_of(ibcq);
  // The common busy-poll case: no lock taken; this thread receives what has
  // arrived itself (as poll_cq).
  if (cq->empty() && (!EngineContext::from(ibcq->context)->poll_receive() || cq->empty())) return ENOENT;
  cq->poll_batch_mu.lock();
  int err = advance(ibcq);
  // verbs: after ENOENT from start_poll the caller must not call end_poll.
  if (err) cq->poll_batch_mu.unlock();
  return err;
}

int next_poll(ibv_cq_ex* ibcq) noexcept { return advance(ibcq); }

void end_poll(ibv_cq_ex* ibcq) noexcept { cq_of(ibcq)->poll_batch_mu.unlock(); }

ibv_wc_opcode read_opcode(ibv_cq_ex* c) noexcept { return current_wc(c).opcode; }
uint32_t read_vendor_err(ibv_cq_ex* c) noexcept { return current_wc(c).vendor_err; }
uint32_t read_byte_len(ibv_cq_ex* c) noexcept { return current_wc(c).byte_len; }
// Also ibv_wc_read_invalidated_rkey: ibv_wc keeps both in one union.
__be32 read_imm_data(ibv_cq_ex* c) noexcept { return current_wc(c).imm_data; }
uint32_t read_qp_num(ibv_cq_ex* c) noexcept { return current_wc(c).qp_num; }
uint32_t read_src_qp(ibv_cq_ex* c) noexcept { return current_wc(c).src_qp; }
unsigned int read_wc_flags(ibv_cq_ex* c) noexcept { return current_wc(c).wc_flags; }
uint32_t read_slid(ibv_cq_ex* c) noexcept { return current_wc(c).slid; }
uint8_t read_sl(ibv_cq_ex* c) noexcept { return current_wc(c).sl; }
uint8_t read_dlid_path_bits(ibv_cq_ex* c) noexcept { return current_wc(c).dlid_path_bits; }
uint64_t read_completion_ts(ibv_cq_ex* c) noexcept { return cq_of(c)->current.timestamp_ns; }
uint64_t read_completion_wallclock_ns(ibv_cq_ex* c) noexcept { return cq_of(c)->current.wallclock_ns; }
// No VLAN stripping, flow steering or tag matching: these have nothing to report.
uint16_t read_cvlan(ibv_cq_ex*) noexcept { return 0; }
uint32_t read_flow_tag(ibv_cq_ex*) noexcept { return 0; }
void read_tm_info(ibv_cq_ex*, ibv_wc_tm_info* tm_info) noexcept { std::memset(tm_info, 0, sizeof *tm_info); }

void install_poll_ops(ibv_cq_ex& c) {
  c.start_poll = start_poll;
  c.next_poll = next_poll;
  c.end_poll = end_poll;
  c.read_opcode = read_opcode;
  c.read_vendor_err = read_vendor_err;
  c.read_byte_len = read_byte_len;
  c.read_imm_data = read_imm_data;
  c.read_qp_num = read_qp_num;
  c.read_src_qp = read_src_qp;
  c.read_wc_flags = read_wc_flags;
  c.read_slid = read_slid;
  c.read_sl = read_sl;
  c.read_dlid_path_bits = read_dlid_path_bits;
  c.read_completion_ts = read_completion_ts;
  c.read_cvlan = read_cvlan;
  c.read_flow_tag = read_flow_tag;
  c.read_tm_info = read_tm_info;
  c.read_completion_wallclock_ns = read_completion_wallclock_ns;
}

}  // namespace

namespace uroce::verbs {

// Errors as mlx5 reports them: unknown comp_mask bits or create flags EINVAL,
// unsupported wc_flags EOPNOTSUPP; the rest is ibv_create_cq's validation.
ibv_cq_ex* create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  return abi_guard<ibv_cq_ex*>(nullptr, [&]() -> ibv_cq_ex* {
    if (!context || !attr || (attr->comp_mask & ~kSupportedCompMask) ||
        ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (attr->flags & ~kSupportedCreateFlags))) {
      errno = EINVAL;
      return nullptr;
    }
    if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) &&
        (!attr->parent_domain || attr->parent_domain->context != context ||
         !core::Pd::own(attr->parent_domain)->base)) {
      errno = EINVAL;
      return nullptr;
    }
    if (attr->wc_flags & ~kSupportedWcFlags) {
      errno = EOPNOTSUPP;
      return nullptr;
    }
    if (attr->cqe > uint32_t(INT32_MAX) || attr->comp_vector > uint32_t(INT32_MAX)) {
      errno = EINVAL;
      return nullptr;
    }
    ibv_cq* ibcq = ibv_create_cq(context, int(attr->cqe), attr->cq_context, attr->channel, int(attr->comp_vector));
    if (!ibcq) return nullptr;
    Cq* cq = Cq::from(ibcq);
    // No QP uses the CQ yet, so nothing pushes concurrently with this setup.
    cq->record_timestamps((attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) != 0,
                          (attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK) != 0);
    install_poll_ops(cq->ibcq);
    return &cq->ibcq;
  });
}

}  // namespace uroce::verbs
