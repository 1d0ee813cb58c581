/* Shared receive queue and asynchronous events through the public verbs API:
 *
 *   - one SRQ on B shared by two RC QPs (the SRQ and its buffers in a PD of their own:
 *     receive buffers are checked against the SRQ's PD, not the QP's), fed by senders A1 and A2: every message lands
 *     in an SRQ WQE, the completion names the QP it arrived on, data verified;
 *   - srq_limit armed at 4 with 6 WQEs posted: after 3 messages the async fd becomes
 *     readable and ibv_get_async_event returns IBV_EVENT_SRQ_LIMIT_REACHED for this SRQ,
 *     once (the limit disarms itself); ibv_query_srq then reports srq_limit 0;
 *   - bad input: ibv_post_recv on a QP attached to an SRQ -> EINVAL, ibv_destroy_srq
 *     while QPs use it -> EBUSY, max_wr over the device limit -> EINVAL, srq_limit over
 *     max_wr -> EINVAL; resizing (IBV_SRQ_MAX_WR) below the posted WQEs -> EINVAL, while
 *     growing keeps them in order (ibv_query_srq reports the new max_wr).
 *
 * Usage: srq_test. Exit 0 when every check passes. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "verbs_pair.h"

#define MSG 512
#define SLOTS 8

static uint8_t g_src[2][MSG];
static uint8_t g_dst[SLOTS][MSG];

static void post_srq(struct ibv_srq* srq, struct ibv_mr* mr, int slot) {
  struct ibv_sge sge = {(uintptr_t)g_dst[slot], MSG, mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1}, *bad;
  CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0, "ibv_post_srq_recv(slot %d)", slot);
}

static void send_from(struct vp_side* a, struct ibv_mr* mr, int which) {
  struct ibv_sge sge = {(uintptr_t)g_src[which], MSG, mr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "post_send from A%d", which + 1);
  struct ibv_wc wc;
  CHECK(vp_poll(a->cq, &wc, 5000) == 1 && wc.status == IBV_WC_SUCCESS, "A%d's SEND did not complete", which + 1);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct vp_params p;
  vp_default_params(&p);
  struct vp_side a[2];
  if (vp_open(&a[0], &p, 0x100) || vp_open(&a[1], &p, 0x200)) return 1;

  /* B: one context, one SRQ, two RC QPs on it. */
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  struct ibv_context* ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
  ibv_free_device_list(list);
  if (!ctx) return 1;
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  struct ibv_cq* cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
  struct ibv_device_attr da;
  CHECK(ibv_query_device(ctx, &da) == 0 && da.max_srq > 0 && da.max_srq_wr > 0, "device reports no SRQ support");
  struct ibv_srq_init_attr sa = {.attr = {.max_wr = (uint32_t)da.max_srq_wr + 1, .max_sge = 1}};
  errno = 0;
  CHECK(ibv_create_srq(pd, &sa) == NULL && errno == EINVAL, "max_wr over max_srq_wr: errno %d", errno);
  sa.attr.max_wr = 16;
  sa.attr.srq_limit = 17;
  errno = 0;
  CHECK(ibv_create_srq(pd, &sa) == NULL && errno == EINVAL, "srq_limit over max_wr: errno %d", errno);
  sa.attr.srq_limit = 0;
  struct ibv_pd* srq_pd = ibv_alloc_pd(ctx);
  struct ibv_srq* srq = srq_pd ? ibv_create_srq(srq_pd, &sa) : NULL;
  CHECK(srq != NULL, "ibv_create_srq: %s", strerror(errno));
  if (!srq) return 1;
  struct ibv_mr* dmr = ibv_reg_mr(srq_pd, g_dst, sizeof g_dst, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_port_attr pa;
  struct vp_conn bconn[2];
  struct ibv_qp* bqp[2];
  if (!dmr || ibv_query_port(ctx, 1, &pa)) return 1;
  for (int i = 0; i < 2; i++) {
    struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC};
    ia.cap.max_send_wr = 4;
    ia.cap.max_send_sge = 1;
    bqp[i] = ibv_create_qp(pd, &ia);
    if (!bqp[i]) return 1;
    struct ibv_qp_attr at = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_LOCAL_WRITE};
    if (ibv_modify_qp(bqp[i], &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return 1;
    bconn[i].qpn = bqp[i]->qp_num;
    bconn[i].psn = 0x40 + (uint32_t)i;
    bconn[i].lid = pa.lid;
    if (ibv_query_gid(ctx, 1, 0, &bconn[i].gid)) return 1;
    /* vp_connect needs a vp_side: borrow one for B's QP. */
    struct vp_side bs = {.ctx = ctx, .pd = pd, .cq = cq, .qp = bqp[i], .self = bconn[i]};
    if (vp_connect(&bs, &p, &a[i].self) || vp_connect(&a[i], &p, &bconn[i])) return 1;
  }
  struct ibv_mr* smr[2];
  for (int i = 0; i < 2; i++) {
    for (int k = 0; k < MSG; k++) g_src[i][k] = (uint8_t)(k * (i + 3));
    smr[i] = ibv_reg_mr(a[i].pd, g_src[i], MSG, IBV_ACCESS_LOCAL_WRITE);
    if (!smr[i]) return 1;
  }

  /* Bad input on an SRQ in use. */
  struct ibv_sge sge = {(uintptr_t)g_dst[0], MSG, dmr->lkey};
  struct ibv_recv_wr rwr = {.sg_list = &sge, .num_sge = 1}, *bad;
  CHECK(ibv_post_recv(bqp[0], &rwr, &bad) == EINVAL, "ibv_post_recv on an SRQ QP");
  CHECK(ibv_destroy_srq(srq) == EBUSY, "ibv_destroy_srq while QPs use it");
  struct ibv_srq_attr mod = {.max_wr = 32};

  /* Six WQEs, limit armed at 4: the third message crosses it. */
  for (int s = 0; s < 6; s++) post_srq(srq, dmr, s);
  mod.max_wr = 3;
  CHECK(ibv_modify_srq(srq, &mod, IBV_SRQ_MAX_WR) == EINVAL, "shrinking the SRQ below 6 posted WQEs");
  mod.max_wr = 32;
  CHECK(ibv_modify_srq(srq, &mod, IBV_SRQ_MAX_WR) == 0, "growing the SRQ to 32 WRs");
  struct ibv_srq_attr grown;
  CHECK(ibv_query_srq(srq, &grown) == 0 && grown.max_wr == 32, "max_wr after growing: %u", grown.max_wr);
  mod.srq_limit = 4;
  CHECK(ibv_modify_srq(srq, &mod, IBV_SRQ_LIMIT) == 0, "arming srq_limit");
  struct pollfd pfd = {ctx->async_fd, POLLIN, 0};
  struct ibv_async_event first;
  CHECK(poll(&pfd, 1, 1000) == 1 && ibv_get_async_event(ctx, &first) == 0 && first.event_type == IBV_EVENT_PORT_ACTIVE,
        "the context's first event is not PORT_ACTIVE");
  for (int m = 0; m < 4; m++) {
    int from = m % 2;
    send_from(&a[from], smr[from], from);
    struct ibv_wc wc;
    CHECK(vp_poll(cq, &wc, 5000) == 1, "message %d not received", m);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.byte_len == MSG, "message %d: %s", m,
          ibv_wc_status_str(wc.status));
    CHECK(wc.wr_id == (uint64_t)m, "message %d landed in SRQ slot %llu", m, (unsigned long long)wc.wr_id);
    CHECK(wc.qp_num == bqp[from]->qp_num, "message %d: qp_num 0x%x, expected 0x%x", m, wc.qp_num, bqp[from]->qp_num);
    CHECK(!memcmp(g_dst[m], g_src[from], MSG), "message %d: data differs", m);
    int ready = poll(&pfd, 1, m == 2 ? 2000 : 0);
    if (m < 2) CHECK(ready == 0, "async event before the limit was crossed (message %d)", m);
    if (m == 2) {
      CHECK(ready == 1, "no async event after the SRQ dropped below its limit");
      struct ibv_async_event ev;
      CHECK(ready == 1 && ibv_get_async_event(ctx, &ev) == 0, "ibv_get_async_event");
      CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == srq, "event %s",
            ibv_event_type_str(ev.event_type));
      ibv_ack_async_event(&ev);
      printf("srq: IBV_EVENT_SRQ_LIMIT_REACHED after message %d\n", m + 1);
    }
    if (m == 3) CHECK(ready == 0, "the limit event fired twice");
  }
  struct ibv_srq_attr q;
  CHECK(ibv_query_srq(srq, &q) == 0 && q.srq_limit == 0 && q.max_wr >= 16, "query after the event: limit %u",
        q.srq_limit);
  printf("srq: 4 messages from 2 QPs through one SRQ, data and qp_num verified\n");

  for (int i = 0; i < 2; i++) {
    ibv_destroy_qp(bqp[i]);
    ibv_dereg_mr(smr[i]);
    vp_close(&a[i]);
  }
  CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq after its QPs");
  ibv_dereg_mr(dmr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_dealloc_pd(srq_pd);
  ibv_close_device(ctx);
  printf("srq_test: %s\n", g_failures ? "FAILED" : "passed");
  return g_failures ? 1 : 0;
}
