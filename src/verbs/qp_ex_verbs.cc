// Extended queue pairs: ibv_create_qp_ex (verbs_context::create_qp_ex),
// ibv_qp_to_qp_ex and the work-request builders verbs.h reaches through
// struct ibv_qp_ex's function pointers (ibv_wr_start … ibv_wr_complete).
//
// The builders only record: each one appends an ibv_send_wr (and copies of its
// SGEs and inline data) to the batch of the calling thread, and
// ibv_wr_complete posts the whole batch through the same validation and queue
// as ibv_post_send, all or nothing (ibv_wr_post(3): "the entire posting will
// be aborted"). Because the builders report nothing, the first error they
// detect is kept and returned by ibv_wr_complete.
//
// Batches are per thread, not per QP: a batch lives from ibv_wr_start to
// ibv_wr_complete/abort on one thread (the man page's critical region, which
// providers guard with a lock taken and released by that thread), so keeping
// it in thread-local storage needs no lock on the builder path and no state
// in the QP that ibv_destroy_qp would have to release.
#include <infiniband/verbs.h>

#include <climits>
#include <cstring>
#include <memory>
#include <vector>

#include "core/wr_opcode.h"
#include "engine/engine_context.h"
#include "engine/post_send.h"
#include "verbs/export.h"
#include "verbs/ops.h"

using uroce::engine::EngineContext;
using uroce::engine::EngineQp;

namespace {

// What each QP type can post: the opcode table's rows for it (core/wr_opcode.h,
// as ibv_post_send checks); asking for more at creation fails with
// EOPNOTSUPP, as rdma-core providers do. Invalidation and window binds come
// with type 2 memory windows, so they also need the device to report those.
constexpr uint64_t kMwSendOps = IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV;

uint64_t supported_send_ops(ibv_context* context, ibv_qp_type type) {
  uint64_t ops = 0;
  for (size_t op = 0; op < uroce::core::kWrOpcodeInfo.size(); ++op)
    if (uroce::core::wr_allowed(type, ibv_wr_opcode(op))) ops |= uroce::core::kWrOpcodeInfo[op].send_op;
  ibv_device_attr dev;
  EngineContext::from(context)->query_device(&dev);
  if (!(dev.device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B))) ops &= ~kMwSendOps;
  return ops;
}

constexpr uint64_t kSupportedQpCompMask =
    IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

// One work request being built. Its SGEs and inline bytes live in the batch's
// arrays, which may grow while later WRs are added, so they are referred to
// by index and turned into pointers only by wr_complete.
struct PendingWr {
  ibv_send_wr wr{};
  size_t first_sge = 0;
  size_t inline_offset = 0;  // into Batch::inline_data when wr.send_flags has IBV_SEND_INLINE
};

struct Batch {
  ibv_qp_ex* qp = nullptr;  // nullptr: free for reuse
  int error = 0;            // first error a builder detected
  std::vector<PendingWr> wrs;
  std::vector<ibv_sge> sges;
  std::vector<uint8_t> inline_data;

  void reset(ibv_qp_ex* q) {
    qp = q;
    error = 0;
    wrs.clear();  // keeps the capacity: steady-state batches do not allocate
    sges.clear();
    inline_data.clear();
  }
  void fail(int e) {
    if (!error) error = e;
  }
};

// The open batches of this thread: almost always one, a few if the
// application interleaves critical regions of several QPs.
thread_local std::vector<std::unique_ptr<Batch>> t_batches;

Batch* find_batch(ibv_qp_ex* qp) {
  for (auto& b : t_batches)
    if (b->qp == qp) return b.get();
  return nullptr;
}

// The batch's WR that setters apply to, or nullptr (recorded as EINVAL) when
// no builder has been called since ibv_wr_start.
PendingWr* last_wr(Batch* b) {
  if (b->wrs.empty()) {
    b->fail(EINVAL);
    return nullptr;
  }
  return &b->wrs.back();
}

// Runs a builder or setter body. They return void into C, so an allocation
// failure is recorded for wr_complete instead of thrown. Calls outside
// ibv_wr_start … ibv_wr_complete have nowhere to report and are ignored.
template <class F>
void with_batch(ibv_qp_ex* qp, F&& f) noexcept {
  Batch* b = find_batch(qp);
  if (!b) return;
  try {
    f(b);
  } catch (...) {
    b->fail(ENOMEM);
  }
}

// Starts a new WR with the application's wr_id and wr_flags (ibv_wr_post(3):
// read by the builder, not by the setters). IBV_SEND_INLINE is not a flag of
// this API: only the inline setters make a WR inline.
PendingWr& new_wr(Batch* b, ibv_qp_ex* qp, ibv_wr_opcode opcode) {
  PendingWr& p = b->wrs.emplace_back();
  p.wr.wr_id = qp->wr_id;
  p.wr.opcode = opcode;
  p.wr.send_flags = qp->wr_flags & ~unsigned(IBV_SEND_INLINE);
  return p;
}

void wr_start(ibv_qp_ex* qp) noexcept {
  try {
    Batch* b = find_batch(qp);
    if (!b) {
      for (auto& free_batch : t_batches)
        if (!free_batch->qp) {
          b = free_batch.get();
          break;
        }
      if (!b) b = t_batches.emplace_back(std::make_unique<Batch>()).get();
    }
    b->reset(qp);
  } catch (...) {
    // No batch: the builders are ignored and wr_complete reports ENOMEM.
  }
}

// Posts the chain starting at `first` through the path ibv_post_send takes
// (engine/post_send.h), all or nothing.
int post_all_or_nothing(ibv_qp* ibqp, ibv_send_wr* first) {
  auto* qp = static_cast<EngineQp*>(uroce::core::Qp::from(ibqp));
  ibv_send_wr* bad = nullptr;
  return uroce::engine::post_send(*qp, first, &bad, uroce::engine::PostMode::kAllOrNothing);
}

int wr_complete(ibv_qp_ex* qp) noexcept {
  Batch* b = find_batch(qp);
  if (!b) return ENOMEM;  // wr_start could not allocate a batch (or was not called)
  int err = b->error;
  if (!err && !b->wrs.empty()) {
    for (size_t i = 0; i < b->wrs.size(); ++i) {
      PendingWr& p = b->wrs[i];
      p.wr.next = i + 1 < b->wrs.size() ? &b->wrs[i + 1].wr : nullptr;
      p.wr.sg_list = p.wr.num_sge ? &b->sges[p.first_sge] : nullptr;
      if (p.wr.num_sge && (p.wr.send_flags & IBV_SEND_INLINE))
        p.wr.sg_list->addr = reinterpret_cast<uintptr_t>(b->inline_data.data() + p.inline_offset);
    }
    err = uroce::verbs::abi_guard_errno([&] { return post_all_or_nothing(&qp->qp_base, &b->wrs[0].wr); });
  }
  b->reset(nullptr);
  return err;
}

void wr_abort(ibv_qp_ex* qp) noexcept {
  if (Batch* b = find_batch(qp)) b->reset(nullptr);
}

// ---- builders: one per operation ----

void wr_send(ibv_qp_ex* qp) noexcept {
  with_batch(qp, [&](Batch* b) { new_wr(b, qp, IBV_WR_SEND); });
}

void wr_send_imm(ibv_qp_ex* qp, __be32 imm_data) noexcept {
  with_batch(qp, [&](Batch* b) { new_wr(b, qp, IBV_WR_SEND_WITH_IMM).wr.imm_data = imm_data; });
}

// SEND_WITH_INV, LOCAL_INV and BIND_MW go to the post path like any other WR,
// which decides whether the QP supports them.
void wr_send_inv(ibv_qp_ex* qp, uint32_t invalidate_rkey) noexcept {
  with_batch(qp, [&](Batch* b) { new_wr(b, qp, IBV_WR_SEND_WITH_INV).wr.invalidate_rkey = invalidate_rkey; });
}

void wr_local_inv(ibv_qp_ex* qp, uint32_t invalidate_rkey) noexcept {
  with_batch(qp, [&](Batch* b) { new_wr(b, qp, IBV_WR_LOCAL_INV).wr.invalidate_rkey = invalidate_rkey; });
}

void wr_bind_mw(ibv_qp_ex* qp, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* bind_info) noexcept {
  with_batch(qp, [&](Batch* b) {
    PendingWr& p = new_wr(b, qp, IBV_WR_BIND_MW);
    p.wr.bind_mw.mw = mw;
    p.wr.bind_mw.rkey = rkey;
    if (bind_info)
      p.wr.bind_mw.bind_info = *bind_info;
    else
      b->fail(EINVAL);
  });
}

void wr_rdma_write(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr) noexcept {
  with_batch(qp, [&](Batch* b) {
    PendingWr& p = new_wr(b, qp, IBV_WR_RDMA_WRITE);
    p.wr.wr.rdma.rkey = rkey;
    p.wr.wr.rdma.remote_addr = remote_addr;
  });
}

void wr_rdma_write_imm(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, __be32 imm_data) noexcept {
  with_batch(qp, [&](Batch* b) {
    PendingWr& p = new_wr(b, qp, IBV_WR_RDMA_WRITE_WITH_IMM);
    p.wr.wr.rdma.rkey = rkey;
    p.wr.wr.rdma.remote_addr = remote_addr;
    p.wr.imm_data = imm_data;
  });
}

void wr_rdma_read(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr) noexcept {
  with_batch(qp, [&](Batch* b) {
    PendingWr& p = new_wr(b, qp, IBV_WR_RDMA_READ);
    p.wr.wr.rdma.rkey = rkey;
    p.wr.wr.rdma.remote_addr = remote_addr;
  });
}

void wr_atomic_cmp_swp(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, uint64_t compare, uint64_t swap) noexcept {
  with_batch(qp, [&](Batch* b) {
    PendingWr& p = new_wr(b, qp, IBV_WR_ATOMIC_CMP_AND_SWP);
    p.wr.wr.atomic.rkey = rkey;
    p.wr.wr.atomic.remote_addr = remote_addr;
    p.wr.wr.atomic.compare_add = compare;
    p.wr.wr.atomic.swap = swap;
  });
}

void wr_atomic_fetch_add(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, uint64_t add) noexcept {
  with_batch(qp, [&](Batch* b) {
    PendingWr& p = new_wr(b, qp, IBV_WR_ATOMIC_FETCH_AND_ADD);
    p.wr.wr.atomic.rkey = rkey;
    p.wr.wr.atomic.remote_addr = remote_addr;
    p.wr.wr.atomic.compare_add = add;
  });
}

// TSO (raw packet QPs) and ATOMIC_WRITE have no uroce implementation; their
// arguments point to application memory that would have to be copied now.
void wr_send_tso(ibv_qp_ex* qp, void*, uint16_t, uint16_t) noexcept {
  with_batch(qp, [&](Batch* b) {
    new_wr(b, qp, IBV_WR_TSO);
    b->fail(EOPNOTSUPP);
  });
}

void wr_atomic_write(ibv_qp_ex* qp, uint32_t, uint64_t, const void*) noexcept {
  with_batch(qp, [&](Batch* b) {
    new_wr(b, qp, IBV_WR_ATOMIC_WRITE);
    b->fail(EOPNOTSUPP);
  });
}

// ---- setters: apply to the last WR ----

void wr_set_ud_addr(ibv_qp_ex* qp, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) noexcept {
  with_batch(qp, [&](Batch* b) {
    if (PendingWr* p = last_wr(b)) {
      p->wr.wr.ud.ah = ah;
      p->wr.wr.ud.remote_qpn = remote_qpn;
      p->wr.wr.ud.remote_qkey = remote_qkey;
    }
  });
}

void wr_set_xrc_srqn(ibv_qp_ex* qp, uint32_t remote_srqn) noexcept {
  with_batch(qp, [&](Batch* b) {
    if (PendingWr* p = last_wr(b)) p->wr.qp_type.xrc.remote_srqn = remote_srqn;
  });
}

void set_sges(Batch* b, size_t num_sge, const ibv_sge* sg_list) {
  PendingWr* p = last_wr(b);
  if (!p) return;
  if (num_sge > INT_MAX || (num_sge && !sg_list)) return b->fail(EINVAL);
  p->first_sge = b->sges.size();
  b->sges.insert(b->sges.end(), sg_list, sg_list + num_sge);
  p->wr.num_sge = int(num_sge);
  p->wr.send_flags &= ~unsigned(IBV_SEND_INLINE);
}

void wr_set_sge(ibv_qp_ex* qp, uint32_t lkey, uint64_t addr, uint32_t length) noexcept {
  with_batch(qp, [&](Batch* b) {
    ibv_sge sge{addr, length, lkey};
    set_sges(b, 1, &sge);
  });
}

void wr_set_sge_list(ibv_qp_ex* qp, size_t num_sge, const ibv_sge* sg_list) noexcept {
  with_batch(qp, [&](Batch* b) { set_sges(b, num_sge, sg_list); });
}

// Inline data is copied now (the application may reuse its buffers at once)
// and handed to the post path as one inline SGE; the length limit
// (max_inline_data) is the post path's check.
void set_inline(Batch* b, size_t num_buf, const ibv_data_buf* bufs) {
  PendingWr* p = last_wr(b);
  if (!p) return;
  if (!uroce::core::wr_has(p->wr.opcode, uroce::core::kWrInline))
    return b->fail(EINVAL);  // ibv_wr_post(3): inline is valid only for SEND and RDMA_WRITE
  if (num_buf && !bufs) return b->fail(EINVAL);
  size_t total = 0;
  for (size_t i = 0; i < num_buf; ++i) {
    if (bufs[i].length && !bufs[i].addr) return b->fail(EINVAL);
    total += bufs[i].length;
  }
  if (total > UINT32_MAX) return b->fail(EINVAL);
  p->inline_offset = b->inline_data.size();
  for (size_t i = 0; i < num_buf; ++i) {
    auto* data = static_cast<const uint8_t*>(bufs[i].addr);
    b->inline_data.insert(b->inline_data.end(), data, data + bufs[i].length);
  }
  p->first_sge = b->sges.size();
  if (total) b->sges.push_back(ibv_sge{0, uint32_t(total), 0});  // addr filled in by wr_complete
  p->wr.num_sge = total ? 1 : 0;
  p->wr.send_flags |= IBV_SEND_INLINE;
}

void wr_set_inline_data(ibv_qp_ex* qp, void* addr, size_t length) noexcept {
  with_batch(qp, [&](Batch* b) {
    ibv_data_buf buf{addr, length};
    set_inline(b, 1, &buf);
  });
}

void wr_set_inline_data_list(ibv_qp_ex* qp, size_t num_buf, const ibv_data_buf* buf_list) noexcept {
  with_batch(qp, [&](Batch* b) { set_inline(b, num_buf, buf_list); });
}

void install_wr_ops(ibv_qp_ex& q) {
  q.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  q.wr_atomic_fetch_add = wr_atomic_fetch_add;
  q.wr_bind_mw = wr_bind_mw;
  q.wr_local_inv = wr_local_inv;
  q.wr_rdma_read = wr_rdma_read;
  q.wr_rdma_write = wr_rdma_write;
  q.wr_rdma_write_imm = wr_rdma_write_imm;
  q.wr_send = wr_send;
  q.wr_send_imm = wr_send_imm;
  q.wr_send_inv = wr_send_inv;
  q.wr_send_tso = wr_send_tso;
  q.wr_set_ud_addr = wr_set_ud_addr;
  q.wr_set_xrc_srqn = wr_set_xrc_srqn;
  q.wr_set_inline_data = wr_set_inline_data;
  q.wr_set_inline_data_list = wr_set_inline_data_list;
  q.wr_set_sge = wr_set_sge;
  q.wr_set_sge_list = wr_set_sge_list;
  q.wr_start = wr_start;
  q.wr_complete = wr_complete;
  q.wr_abort = wr_abort;
  q.wr_atomic_write = wr_atomic_write;
}

}  // namespace

// rdma-core returns the extended QP only for QPs created with the ibv_wr_*
// API enabled (IBV_QP_INIT_ATTR_SEND_OPS_FLAGS); its builders are set then.
UROCE_API ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  if (!qp) return nullptr;
  ibv_qp_ex* qpx = &uroce::core::Qp::from(qp)->ibqp;
  return qpx->wr_start ? qpx : nullptr;
}

namespace uroce::verbs {

// The QP itself is made by ibv_create_qp (the same validation, caps rounding
// and registration); this adds the extended attributes. Unsupported comp_mask
// bits, create flags or send operations: EOPNOTSUPP, as rdma-core providers.
ibv_qp* create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  return abi_guard<ibv_qp*>(nullptr, [&]() -> ibv_qp* {
    if (!context || !attr) {
      errno = EINVAL;
      return nullptr;
    }
    if ((attr->comp_mask & ~kSupportedQpCompMask) ||
        ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags) ||
        ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
         (attr->send_ops_flags & ~supported_send_ops(context, attr->qp_type)))) {
      errno = EOPNOTSUPP;
      return nullptr;
    }
    if (attr->qp_type == IBV_QPT_XRC_SEND || attr->qp_type == IBV_QPT_XRC_RECV) {
      ibv_qp* qp = create_xrc_qp(context, attr);
      if (qp && (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) install_wr_ops(core::Qp::from(qp)->ibqp);
      return qp;
    }
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd || attr->pd->context != context) {
      errno = EINVAL;
      return nullptr;
    }
    ibv_qp_init_attr init{};
    init.qp_context = attr->qp_context;
    init.send_cq = attr->send_cq;
    init.recv_cq = attr->recv_cq;
    init.srq = attr->srq;
    init.cap = attr->cap;
    init.qp_type = attr->qp_type;
    init.sq_sig_all = attr->sq_sig_all;
    ibv_qp* qp = ibv_create_qp(attr->pd, &init);
    if (!qp) return nullptr;
    attr->cap = init.cap;  // in/out, as for ibv_create_qp
    if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) install_wr_ops(core::Qp::from(qp)->ibqp);
    return qp;
  });
}

}  // namespace uroce::verbs
