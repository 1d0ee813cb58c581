// The per-context operation tables (ibv_context_ops / verbs_context) that
// verbs.h's inline data-path functions call through.
#pragma once

#include <infiniband/verbs.h>

namespace uroce::verbs {

void install_context_ops(verbs_context& vctx);

// These are ABI entry points too (verbs.h's inline functions call them), so no
// C++ exception may leave them (verbs/export.h; test abi.guarded). The control
// path ones run their bodies inside abi_guard / abi_guard_errno, as the
// UROCE_API exports do, or are noexcept when they cannot throw. The data path
// ones are noexcept, never wrapped: posting and polling allocate nothing per
// work request or completion (fixed rings; the transport's send and receive
// are noexcept too), only now and then (a thread's first TxBatch, growth of
// the engine's lists of QPs and of a completion channel's event queue), and a
// std::bad_alloc there ends the process, as it would on the progress thread.
// So are the ibv_qp_ex builders (qp_ex_verbs.cc: an allocation failure is kept
// for ibv_wr_complete), the ibv_cq_ex polling functions (cq_ex_verbs.cc) and
// the ibv_dm copies (dm_verbs.cc).

// Data path entry points (ops.c-style), defined in cq_verbs.cc / qp_verbs.cc / srq_verbs.cc / mw_verbs.cc.
int poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc) noexcept;
int req_notify_cq(ibv_cq* cq, int solicited_only) noexcept;
int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) noexcept;
int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) noexcept;
int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) noexcept;
int bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* mw_bind) noexcept;

// Control path (guarded, or noexcept where the body cannot throw).
ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type);
int dealloc_mw(ibv_mw* mw);
int query_port_ex(ibv_context* context, uint8_t port_num, ibv_port_attr* port_attr, size_t port_attr_len);
int query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                    size_t attr_size);

// Extended verbs (device_ex_verbs.cc, qp_ex_verbs.cc, cq_ex_verbs.cc, mr_verbs.cc).
int query_rt_values(ibv_context* context, ibv_values_ex* values) noexcept;
ibv_qp* create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr);
// XRC (xrc_verbs.cc): initiator and target QPs, domains, XRC SRQs.
// create_xrc_qp is no entry point: ibv_create_qp and create_qp_ex call it guarded.
ibv_qp* create_xrc_qp(ibv_context* context, ibv_qp_init_attr_ex* attr);
ibv_xrcd* open_xrcd(ibv_context* context, ibv_xrcd_init_attr* attr);
int close_xrcd(ibv_xrcd* xrcd) noexcept;
// ibv_open_qp: a handle on an existing XRC target QP of a domain.
ibv_qp* open_qp(ibv_context* context, ibv_qp_open_attr* attr);
ibv_srq* create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr);
int get_srq_num(ibv_srq* srq, uint32_t* srq_num) noexcept;
// Creates a basic SRQ for `*attr` and reports the granted attributes there
// (no entry point: ibv_create_srq and create_srq_ex call it guarded).
ibv_srq* create_srq(ibv_pd* ibpd, ibv_srq_attr* attr, void* srq_context);
ibv_cq_ex* create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr);
// Device memory (dm_verbs.cc).
ibv_pd* alloc_parent_domain(ibv_context* context, ibv_parent_domain_init_attr* attr);
ibv_dm* alloc_dm(ibv_context* context, ibv_alloc_dm_attr* attr);
int free_dm(ibv_dm* dm) noexcept;
ibv_mr* reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t dm_offset, size_t length, unsigned int access);
int advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sges);

}  // namespace uroce::verbs
