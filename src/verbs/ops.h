// The per-context operation tables (ibv_context_ops / verbs_context) that
// verbs.h's inline data-path functions call through.
#pragma once

#include <infiniband/verbs.h>

namespace uroce::verbs {

void install_context_ops(verbs_context& vctx);

// Data path entry points (ops.c-style), defined in cq_verbs.cc / qp_verbs.cc.
int poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc);
int req_notify_cq(ibv_cq* cq, int solicited_only);
int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
int query_port_ex(ibv_context* context, uint8_t port_num, ibv_port_attr* port_attr, size_t port_attr_len);
int query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                    size_t attr_size);

}  // namespace uroce::verbs
