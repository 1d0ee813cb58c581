/* UD multicast through the public verbs API: ibv_attach_mcast/ibv_detach_mcast.
 *
 * Receive: three devices opened in one process (three engines, each its own sockets): two
 *          UD QPs attached to group 239.18.7.1 (GID ::ffff:239.18.7.1), a third UD QP
 *          sends to the group (AH with the group's GID, remote QPN 0xFFFFFF).
 * Expect:  both members receive every message, with a GRH whose destination GID is the
 *          group's; after one detaches, only the other receives; an RC QP, a unicast GID or
 *          a detach of a group not attached: EINVAL. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_pair.h"

enum { kQkey = 0x11111111, kMsg = 512, kSlot = kMsg + 40 };

struct ud_side {
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  struct ibv_qp* qp;
  struct ibv_mr* mr;
  uint8_t* buf;
};

static int ud_open(struct ud_side* s, struct ibv_device* dev) {
  s->ctx = ibv_open_device(dev);
  if (!s->ctx) return -1;
  s->pd = ibv_alloc_pd(s->ctx);
  s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
  s->buf = calloc(16, kSlot);
  s->mr = ibv_reg_mr(s->pd, s->buf, 16 * kSlot, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_qp_init_attr ia = {.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_UD,
                                .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
  s->qp = ibv_create_qp(s->pd, &ia);
  if (!s->pd || !s->cq || !s->mr || !s->qp) return -1;
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = kQkey};
  if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return -1;
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE)) return -1;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 1;
  if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) return -1;
  for (int i = 0; i < 8; ++i) {
    struct ibv_sge sge = {.addr = (uintptr_t)(s->buf + i * kSlot), .length = kSlot, .lkey = s->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad;
    if (ibv_post_recv(s->qp, &wr, &bad)) return -1;
  }
  return 0;
}

static void ud_close(struct ud_side* s) {
  if (s->qp) ibv_destroy_qp(s->qp);
  if (s->mr) ibv_dereg_mr(s->mr);
  if (s->cq) ibv_destroy_cq(s->cq);
  if (s->pd) ibv_dealloc_pd(s->pd);
  if (s->ctx) ibv_close_device(s->ctx);
  free(s->buf);
}

/* Sends message number `n` to the group from `s` through `ah`. */
static int send_to_group(struct ud_side* s, struct ibv_ah* ah, int n) {
  uint8_t* msg = s->buf + 15 * kSlot;
  for (int i = 0; i < kMsg; ++i) msg[i] = (uint8_t)(n * 31 + i);
  struct ibv_sge sge = {.addr = (uintptr_t)msg, .length = kMsg, .lkey = s->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 100, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                           .send_flags = IBV_SEND_SIGNALED}, *bad;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = 0xFFFFFF;
  wr.wr.ud.remote_qkey = kQkey;
  if (ibv_post_send(s->qp, &wr, &bad)) return -1;
  struct ibv_wc wc;
  return vp_poll(s->cq, &wc, 2000) == 1 && wc.status == IBV_WC_SUCCESS ? 0 : -1;
}

/* 1 when `s` received message `n` (GRH + payload checked), 0 when nothing came in `ms`. */
static int received(struct ud_side* s, int n, const union ibv_gid* group, int ms) {
  struct ibv_wc wc;
  if (vp_poll(s->cq, &wc, ms) != 1) return 0;
  CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == 40 + kMsg, "receive: status %d, %u bytes", wc.status,
        wc.byte_len);
  CHECK(wc.wc_flags & IBV_WC_GRH, "no GRH flag");
  uint8_t* slot = s->buf + wc.wr_id * kSlot;
  /* RoCEv2 over IPv4: the 40-byte GRH area holds the IPv4 header in its last 20 bytes. */
  uint32_t dst;
  memcpy(&dst, slot + 20 + 16, 4);
  CHECK(memcmp(&dst, &group->raw[12], 4) == 0, "the GRH's destination is not the group");
  for (int i = 0; i < kMsg; ++i)
    if (slot[40 + i] != (uint8_t)(n * 31 + i)) {
      CHECK(0, "payload byte %d of message %d", i, n);
      break;
    }
  struct ibv_sge sge = {.addr = (uintptr_t)slot, .length = kSlot, .lkey = s->mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = wc.wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
  CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0, "repost");
  return 1;
}

int main(void) {
  struct ibv_device** list = ibv_get_device_list(NULL);
  if (!list || !list[0]) {
    printf("no device\n");
    return 1;
  }
  struct ud_side m1 = {0}, m2 = {0}, tx = {0};
  if (ud_open(&m1, list[0]) || ud_open(&m2, list[0]) || ud_open(&tx, list[0])) {
    printf("setup failed: errno %d\n", errno);
    return 1;
  }
  struct ibv_device_attr dattr;
  CHECK(ibv_query_device(m1.ctx, &dattr) == 0 && dattr.max_mcast_grp > 0 && dattr.max_mcast_qp_attach > 0 &&
            dattr.max_total_mcast_qp_attach == dattr.max_mcast_grp * dattr.max_mcast_qp_attach,
        "multicast limits not reported");
  union ibv_gid group = {.raw = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 18, 7, 1}};
  union ibv_gid unicast = {.raw = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1}};
  CHECK(ibv_attach_mcast(m1.qp, &group, 0) == 0, "attach m1");
  CHECK(ibv_attach_mcast(m1.qp, &group, 0) == 0, "attach m1 again (no-op)");
  CHECK(ibv_attach_mcast(m2.qp, &group, 0) == 0, "attach m2");
  errno = 0;  /* an argument check: errno set too, as a kernel provider's failed command */
  CHECK(ibv_attach_mcast(m2.qp, &unicast, 0) == EINVAL && errno == EINVAL, "a unicast GID must be EINVAL (errno %d)",
        errno);
  CHECK(ibv_detach_mcast(tx.qp, &group, 0) == EINVAL, "detach of a QP not attached must be EINVAL");

  struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1, .grh = {.dgid = group, .sgid_index = 0, .hop_limit = 1}};
  struct ibv_ah* ah = ibv_create_ah(tx.pd, &aa);
  CHECK(ah, "create_ah for the group: errno %d", errno);
  if (ah) {
    for (int n = 0; n < 5; ++n) {
      CHECK(send_to_group(&tx, ah, n) == 0, "send %d", n);
      CHECK(received(&m1, n, &group, 3000) == 1, "member 1 missed message %d", n);
      CHECK(received(&m2, n, &group, 3000) == 1, "member 2 missed message %d", n);
    }
    CHECK(ibv_detach_mcast(m1.qp, &group, 0) == 0, "detach m1");
    CHECK(send_to_group(&tx, ah, 9) == 0, "send after detach");
    CHECK(received(&m2, 9, &group, 3000) == 1, "member 2 missed the message after member 1 left");
    CHECK(received(&m1, 9, &group, 300) == 0, "member 1 received after it detached");
    ibv_destroy_ah(ah);
  }

  /* Only UD QPs join groups. */
  struct ibv_qp_init_attr rc = {.send_cq = tx.cq, .recv_cq = tx.cq, .qp_type = IBV_QPT_RC,
                                .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
  struct ibv_qp* rc_qp = ibv_create_qp(tx.pd, &rc);
  if (rc_qp) {
    CHECK(ibv_attach_mcast(rc_qp, &group, 0) == EINVAL, "attach of an RC QP must be EINVAL");
    ibv_destroy_qp(rc_qp);
  }
  ud_close(&m1);
  ud_close(&m2); /* destroying an attached QP leaves the group */
  ud_close(&tx);
  ibv_free_device_list(list);
  printf("mcast: %s\n", g_failures ? "FAILED" : "PASSED");
  return g_failures ? 1 : 0;
}
