/* An out-of-tree program built against an installed uroce (tests/install/run_install_test.sh).
 *
 * Written against rdma-core's public <infiniband/verbs.h> only: opens uroce0, allocates a PD,
 * registers two MRs, creates a CQ and two RC QPs connected to each other through the port's
 * own GID and LID (loopback), does one RDMA WRITE from one buffer to the other, waits for its
 * completion (bounded) and checks the bytes. Exits 0 on success, 1 with a one-line reason
 * otherwise. Linked with -luroce, or with -libverbs and run under `uroce run`. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

enum { kSize = 4096, kPollTimeoutMs = 10000 };

struct Resources {
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  struct ibv_qp* qp[2];
  struct ibv_mr* src_mr;
  struct ibv_mr* dst_mr;
};

static char g_src[kSize];
static char g_dst[kSize];

static int fail(const char* what, int err) {
  fprintf(stderr, "consumer: %s: %s\n", what, strerror(err));
  return 1;
}

static struct ibv_context* open_uroce0(void) {
  int num = 0;
  struct ibv_device** list = ibv_get_device_list(&num);
  if (!list) return NULL;
  struct ibv_device* dev = NULL;
  for (int i = 0; i < num && !dev; ++i)
    if (strcmp(ibv_get_device_name(list[i]), "uroce0") == 0) dev = list[i];
  struct ibv_context* ctx = dev ? ibv_open_device(dev) : NULL;
  int err = dev ? errno : ENODEV;
  ibv_free_device_list(list);
  errno = err;
  return ctx;
}

static struct ibv_qp* create_rc_qp(struct Resources* r) {
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = r->cq;
  ia.recv_cq = r->cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 4;
  ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  return ibv_create_qp(r->pd, &ia);
}

/* RESET -> INIT -> RTR -> RTS, connected to QP `dest_qpn` of this same port. */
static int connect_qp(struct ibv_qp* qp, uint32_t dest_qpn, const union ibv_gid* gid,
                      const struct ibv_port_attr* port) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc) return rc;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = port->active_mtu;
  a.dest_qp_num = dest_qpn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = *gid;
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.dlid = port->lid;
  a.ah_attr.port_num = 1;
  rc = ibv_modify_qp(qp, &a,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc) return rc;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  return ibv_modify_qp(
      qp, &a,
      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* One completion within kPollTimeoutMs: 0 and *wc filled, or ETIMEDOUT / EIO. */
static int poll_one(struct ibv_cq* cq, struct ibv_wc* wc) {
  double deadline = now_ms() + kPollTimeoutMs;
  for (;;) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n < 0) return EIO;
    if (n > 0) return 0;
    if (now_ms() > deadline) return ETIMEDOUT;
    struct timespec pause = {0, 50000};
    nanosleep(&pause, NULL);
  }
}

static int write_once(struct Resources* r) {
  for (int i = 0; i < kSize; ++i) g_src[i] = (char)(i * 7 + 1);
  struct ibv_sge sge = {(uintptr_t)g_src, kSize, r->src_mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 42;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = (uintptr_t)g_dst;
  wr.wr.rdma.rkey = r->dst_mr->rkey;
  int rc = ibv_post_send(r->qp[0], &wr, &bad);
  if (rc) return fail("ibv_post_send", rc);
  struct ibv_wc wc;
  rc = poll_one(r->cq, &wc);
  if (rc) return fail("ibv_poll_cq", rc);
  if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 42) {
    fprintf(stderr, "consumer: completion %s (wr_id %llu)\n", ibv_wc_status_str(wc.status),
            (unsigned long long)wc.wr_id);
    return 1;
  }
  if (memcmp(g_src, g_dst, kSize) != 0) {
    fprintf(stderr, "consumer: RDMA WRITE completed but the destination differs\n");
    return 1;
  }
  return 0;
}

static int run(struct Resources* r) {
  r->ctx = open_uroce0();
  if (!r->ctx) return fail("open uroce0", errno);
  struct ibv_port_attr port;
  union ibv_gid gid;
  int rc = ibv_query_port(r->ctx, 1, &port);
  if (rc) return fail("ibv_query_port", rc);
  rc = ibv_query_gid(r->ctx, 1, 0, &gid);
  if (rc) return fail("ibv_query_gid", rc);
  r->pd = ibv_alloc_pd(r->ctx);
  if (!r->pd) return fail("ibv_alloc_pd", errno);
  r->src_mr = ibv_reg_mr(r->pd, g_src, kSize, IBV_ACCESS_LOCAL_WRITE);
  r->dst_mr = ibv_reg_mr(r->pd, g_dst, kSize, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!r->src_mr || !r->dst_mr) return fail("ibv_reg_mr", errno);
  r->cq = ibv_create_cq(r->ctx, 8, NULL, NULL, 0);
  if (!r->cq) return fail("ibv_create_cq", errno);
  for (int i = 0; i < 2; ++i) {
    r->qp[i] = create_rc_qp(r);
    if (!r->qp[i]) return fail("ibv_create_qp", errno);
  }
  for (int i = 0; i < 2; ++i) {
    rc = connect_qp(r->qp[i], r->qp[1 - i]->qp_num, &gid, &port);
    if (rc) return fail("ibv_modify_qp", rc);
  }
  rc = write_once(r);
  if (rc == 0) printf("consumer: RDMA WRITE of %d bytes through uroce0 (LID %u) ok\n", kSize, port.lid);
  return rc;
}

static void release(struct Resources* r) {
  for (int i = 0; i < 2; ++i)
    if (r->qp[i]) ibv_destroy_qp(r->qp[i]);
  if (r->cq) ibv_destroy_cq(r->cq);
  if (r->dst_mr) ibv_dereg_mr(r->dst_mr);
  if (r->src_mr) ibv_dereg_mr(r->src_mr);
  if (r->pd) ibv_dealloc_pd(r->pd);
  if (r->ctx) ibv_close_device(r->ctx);
}

int main(void) {
  struct Resources r;
  memset(&r, 0, sizeof r);
  int rc = run(&r);
  release(&r);
  return rc;
}
