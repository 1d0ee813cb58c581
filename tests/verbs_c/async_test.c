/* Asynchronous events and CQ resizing through the public verbs API:
 *
 *   - a freshly opened context reports IBV_EVENT_PORT_ACTIVE for port 1 on its async_fd;
 *   - a responder-side fatal error (an RDMA WRITE with a bad R_Key) raises
 *     IBV_EVENT_QP_FATAL for the responder's QP;
 *   - a CQ that overflows raises IBV_EVENT_CQ_ERR for that CQ, once;
 *   - a QP on an SRQ moved to ERR raises IBV_EVENT_QP_LAST_WQE_REACHED;
 *   - ibv_resize_cq keeps queued completions in order; shrinking below them -> EINVAL.
 *
 * Usage: async_test. Exit 0 when every check passes. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "verbs_pair.h"

/* The next async event of `ctx` within `ms`; event_type -1 if none came. */
static struct ibv_async_event next_event(struct ibv_context* ctx, int ms) {
  struct ibv_async_event ev;
  memset(&ev, 0, sizeof ev);
  ev.event_type = (enum ibv_event_type) - 1;
  struct pollfd pfd = {ctx->async_fd, POLLIN, 0};
  if (poll(&pfd, 1, ms) == 1 && ibv_get_async_event(ctx, &ev) == 0) ibv_ack_async_event(&ev);
  return ev;
}

static void post_write(struct vp_side* a, struct ibv_mr* mr, uint64_t wr_id, uint32_t rkey, uint64_t addr) {
  struct ibv_sge sge = {(uintptr_t)mr->addr, 64, mr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "post WRITE %llu", (unsigned long long)wr_id);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  static uint8_t abuf[4096], bbuf[4096];
  struct vp_params p;
  vp_default_params(&p);
  struct vp_side a, b;
  if (vp_open(&a, &p, 1) || vp_open(&b, &p, 2) || vp_connect(&a, &p, &b.self) || vp_connect(&b, &p, &a.self)) return 1;
  struct ibv_async_event ev = next_event(a.ctx, 1000);
  CHECK(ev.event_type == IBV_EVENT_PORT_ACTIVE && ev.element.port_num == 1, "first event %d, not PORT_ACTIVE",
        (int)ev.event_type);
  next_event(b.ctx, 1000); /* B's PORT_ACTIVE */
  struct ibv_mr* amr = ibv_reg_mr(a.pd, abuf, sizeof abuf, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr* bmr = ibv_reg_mr(b.pd, bbuf, sizeof bbuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!amr || !bmr) return 1;

  /* ibv_resize_cq with completions queued. */
  for (uint64_t i = 0; i < 3; i++) post_write(&a, amr, i, bmr->rkey, (uintptr_t)bbuf);
  vp_sleep_ms(200);
  CHECK(ibv_resize_cq(a.cq, 2) == EINVAL, "shrinking below 3 queued completions is not EINVAL");
  CHECK(ibv_resize_cq(a.cq, 1024) == 0 && a.cq->cqe >= 1024, "growing the CQ");
  for (uint64_t i = 0; i < 3; i++) {
    struct ibv_wc wc;
    CHECK(vp_poll(a.cq, &wc, 2000) == 1 && wc.wr_id == i && wc.status == IBV_WC_SUCCESS,
          "completion %llu after the resize", (unsigned long long)i);
  }
  printf("async: ibv_resize_cq kept 3 queued completions in order; shrinking below them -> EINVAL\n");

  /* A bad R_Key: the responder's QP fails (class C error) and reports it. */
  post_write(&a, amr, 9, bmr->rkey ^ 0x100, (uintptr_t)bbuf);
  struct ibv_wc wc;
  CHECK(vp_poll(a.cq, &wc, 5000) == 1 && wc.status == IBV_WC_REM_ACCESS_ERR, "bad R_Key WRITE: %s",
        ibv_wc_status_str(wc.status));
  ev = next_event(b.ctx, 2000);
  CHECK(ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == b.qp, "responder event %s",
        ibv_event_type_str(ev.event_type));
  printf("async: responder QP_FATAL after a bad R_Key\n");
  ibv_dereg_mr(bmr);
  vp_close(&b);

  /* CQ overflow: a 1-entry CQ receiving two completions. */
  struct ibv_cq* small = ibv_create_cq(a.ctx, 1, NULL, NULL, 0);
  struct ibv_qp_init_attr ia = {.send_cq = small, .recv_cq = small, .qp_type = IBV_QPT_UD};
  ia.cap.max_send_wr = 4;
  ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  struct ibv_qp* ud = small ? ibv_create_qp(a.pd, &ia) : NULL;
  struct ibv_qp_attr at = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x22};
  if (!ud || ibv_modify_qp(ud, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return 1;
  at.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(ud, &at, IBV_QP_STATE)) return 1;
  at.qp_state = IBV_QPS_RTS;
  if (ibv_modify_qp(ud, &at, IBV_QP_STATE | IBV_QP_SQ_PSN)) return 1;
  struct ibv_ah_attr ah_attr = {.dlid = a.self.lid, .is_global = 1, .port_num = 1};
  ah_attr.grh.dgid = a.self.gid;
  struct ibv_ah* ah = ibv_create_ah(a.pd, &ah_attr);
  if (!ah) return 1;
  for (int i = 0; i < 3; i++) {
    struct ibv_sge sge = {(uintptr_t)abuf, 16, amr->lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = ud->qp_num;
    wr.wr.ud.remote_qkey = 0x22;
    CHECK(ibv_post_send(ud, &wr, &bad) == 0, "UD send %d", i);
  }
  ev = next_event(a.ctx, 2000);
  CHECK(ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == small, "overflow event %s",
        ibv_event_type_str(ev.event_type));
  ev = next_event(a.ctx, 200);
  CHECK(ev.event_type == (enum ibv_event_type) - 1, "a second event after one overflow: %s",
        ibv_event_type_str(ev.event_type));
  printf("async: CQ_ERR once when a 1-entry CQ overflowed\n");
  ibv_destroy_qp(ud);
  ibv_destroy_ah(ah);
  ibv_destroy_cq(small);

  /* A QP on an SRQ moved to ERR. */
  struct ibv_srq_init_attr sa = {.attr = {.max_wr = 4, .max_sge = 1}};
  struct ibv_srq* srq = ibv_create_srq(a.pd, &sa);
  struct ibv_cq* cq = ibv_create_cq(a.ctx, 8, NULL, NULL, 0);
  struct ibv_qp_init_attr ra = {.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC};
  ra.cap.max_send_wr = 1;
  ra.cap.max_send_sge = 1;
  struct ibv_qp* rq = srq && cq ? ibv_create_qp(a.pd, &ra) : NULL;
  if (!rq) return 1;
  struct ibv_qp_attr init = {.qp_state = IBV_QPS_INIT, .port_num = 1};
  CHECK(ibv_modify_qp(rq, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
        "modify to INIT");
  struct ibv_qp_attr err = {.qp_state = IBV_QPS_ERR}; /* RESET -> ERR is not a legal transition */
  CHECK(ibv_modify_qp(rq, &err, IBV_QP_STATE) == 0, "modify to ERR");
  ev = next_event(a.ctx, 2000);
  CHECK(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == rq, "SRQ QP to ERR: event %s",
        ibv_event_type_str(ev.event_type));
  printf("async: QP_LAST_WQE_REACHED for an SRQ QP moved to ERR\n");
  ibv_destroy_qp(rq);
  ibv_destroy_srq(srq);
  ibv_destroy_cq(cq);
  ibv_dereg_mr(amr);
  vp_close(&a);
  printf("async_test: %s\n", g_failures ? "FAILED" : "passed");
  return g_failures ? 1 : 0;
}
