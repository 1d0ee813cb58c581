#include "verbs/ops.h"

namespace uroce::verbs {

void install_context_ops(verbs_context& vctx) {
  ibv_context_ops& ops = vctx.context.ops;
  ops.poll_cq = poll_cq;
  ops.req_notify_cq = req_notify_cq;
  ops.post_send = post_send;
  ops.post_recv = post_recv;
  ops.post_srq_recv = post_srq_recv;
  ops.alloc_mw = alloc_mw;
  ops.dealloc_mw = dealloc_mw;
  ops.bind_mw = bind_mw;
  vctx.query_port = query_port_ex;
  vctx.query_device_ex = query_device_ex;
  vctx.query_rt_values = query_rt_values;
  vctx.create_qp_ex = create_qp_ex;
  vctx.create_cq_ex = create_cq_ex;
  vctx.advise_mr = advise_mr;
  vctx.alloc_parent_domain = alloc_parent_domain;
  vctx.alloc_dm = alloc_dm;
  vctx.free_dm = free_dm;
  vctx.reg_dm_mr = reg_dm_mr;
  vctx.open_xrcd = open_xrcd;
  vctx.close_xrcd = close_xrcd;
  vctx.open_qp = open_qp;
  vctx.create_srq_ex = create_srq_ex;
  vctx.get_srq_num = get_srq_num;
}

}  // namespace uroce::verbs
