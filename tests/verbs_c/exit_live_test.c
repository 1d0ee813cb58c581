/* Processes that exit with their verbs objects alive, as short tools and error paths do
 * (docs/architecture.md, "Decisions": a process may exit with its verbs objects alive).
 *
 * Each iteration forks a child that opens two contexts (two engines in one process), an
 * RC QP on each connected to the other and a UD QP on each, and then, by iteration:
 *
 *   i % 4 == 0  idle: connected, nothing sent;
 *   i % 4 == 1  RC in flight: 32 SENDs and 32 WRITEs of 4 KiB posted, none polled;
 *   i % 4 == 2  UD in flight: 16 SENDs posted to the other UD QP, none polled;
 *   i % 4 == 3  both, after one RC round trip completed.
 *
 * The child then ends with exit(kStatus + i % 4), every verbs object still open (exit()
 * runs what returning from main runs: the exit handlers, then the static destructors,
 * while the engines' threads still run). The parent checks that each child ended with
 * its own status, not a signal and not another code.
 *
 * Usage: exit_live_test [ITERS] (default 100). Exit 0 when every check passes. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "verbs_pair.h"

#define MSG 4096
#define RC_BURST 32
#define UD_BURST 16
#define QKEY 0x22220000u
#define STATUS 40 /* a child's status: STATUS + its case */

/* One context's objects: the RC side and a UD QP beside it, and a registered buffer. */
struct end {
  struct vp_side rc;
  struct ibv_cq* ud_cq;
  struct ibv_qp* ud;
  struct ibv_mr* mr;
  uint8_t* buf; /* [0, RC_BURST * MSG): receives and WRITE targets; then the send area */
};

static int ud_open(struct end* e) {
  e->ud_cq = ibv_create_cq(e->rc.ctx, 64, NULL, NULL, 0);
  struct ibv_qp_init_attr ia = {.send_cq = e->ud_cq, .recv_cq = e->ud_cq, .qp_type = IBV_QPT_UD};
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 2 * UD_BURST;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  e->ud = e->ud_cq ? ibv_create_qp(e->rc.pd, &ia) : NULL;
  if (!e->ud) return -1;
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
  if (ibv_modify_qp(e->ud, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) return -1;
  a.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(e->ud, &a, IBV_QP_STATE)) return -1;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0x321;
  return ibv_modify_qp(e->ud, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

static int end_open(struct end* e, const struct vp_params* p, uint32_t psn) {
  memset(e, 0, sizeof *e);
  if (vp_open(&e->rc, p, psn)) return -1;
  e->buf = calloc(2 * RC_BURST, MSG);
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  e->mr = e->buf ? ibv_reg_mr(e->rc.pd, e->buf, 2 * RC_BURST * MSG, access) : NULL;
  return e->mr ? ud_open(e) : -1;
}

static int post_recvs(struct ibv_qp* qp, struct end* e, int n, uint32_t len) {
  for (int i = 0; i < n; i++) {
    struct ibv_sge sge = {(uintptr_t)e->buf + (size_t)i * MSG, len, e->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad;
    if (ibv_post_recv(qp, &wr, &bad)) return -1;
  }
  return 0;
}

/* RC_BURST SENDs and RC_BURST WRITEs from `from` into `to`, none polled. */
static int rc_burst(struct end* from, struct end* to) {
  for (int i = 0; i < 2 * RC_BURST; i++) {
    struct ibv_sge sge = {(uintptr_t)from->buf + RC_BURST * MSG, MSG, from->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad;
    wr.opcode = i % 2 ? IBV_WR_RDMA_WRITE : IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)to->buf + (size_t)(i / 2) * MSG;
    wr.wr.rdma.rkey = to->mr->rkey;
    if (ibv_post_send(from->rc.qp, &wr, &bad)) return -1;
  }
  return 0;
}

/* UD_BURST SENDs from `from`'s UD QP to `to`'s, none polled. */
static int ud_burst(struct end* from, struct end* to) {
  struct ibv_ah_attr aa = {.dlid = to->rc.self.lid, .is_global = 1, .port_num = 1};
  aa.grh.dgid = to->rc.self.gid;
  aa.grh.hop_limit = 64;
  struct ibv_ah* ah = ibv_create_ah(from->rc.pd, &aa);
  if (!ah) return -1;
  for (int i = 0; i < UD_BURST; i++) {
    struct ibv_sge sge = {(uintptr_t)from->buf + RC_BURST * MSG, 512, from->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = to->ud->qp_num;
    wr.wr.ud.remote_qkey = QKEY;
    if (ibv_post_send(from->ud, &wr, &bad)) return -1;
  }
  return 0;
}

/* One SEND from a to b and its completion on both sides. */
static int round_trip(struct end* a, struct end* b) {
  struct ibv_sge sge = {(uintptr_t)a->buf + RC_BURST * MSG, 64, a->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND}, *bad;
  wr.send_flags = IBV_SEND_SIGNALED;
  struct ibv_wc wc;
  if (ibv_post_send(a->rc.qp, &wr, &bad) || vp_poll(a->rc.cq, &wc, 10000) != 1 || wc.status) return -1;
  return vp_poll(b->rc.cq, &wc, 10000) == 1 && wc.status == IBV_WC_SUCCESS ? 0 : -1;
}

/* The child: sets up, does case `c`'s traffic and exits with everything open. */
static void child(int c, uint32_t i) {
  struct vp_params p;
  vp_default_params(&p);
  struct end a, b;
  if (end_open(&a, &p, (0x100 + i) & 0xFFFFFF) || end_open(&b, &p, (0x900 + i) & 0xFFFFFF)) _exit(1);
  if (vp_connect(&a.rc, &p, &b.rc.self) || vp_connect(&b.rc, &p, &a.rc.self)) _exit(1);
  if (post_recvs(b.rc.qp, &b, RC_BURST, MSG) || post_recvs(b.ud, &b, UD_BURST, MSG)) _exit(1);
  if (c == 3 && round_trip(&a, &b)) _exit(2);
  if ((c == 1 || c == 3) && rc_burst(&a, &b)) _exit(3);
  if ((c == 2 || c == 3) && ud_burst(&a, &b)) _exit(4);
  exit(STATUS + c);
}

int main(int argc, char** argv) {
  uint32_t iters = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 100;
  uint32_t wrong[4] = {0}, signalled = 0;
  for (uint32_t i = 0; i < iters; i++) {
    int c = (int)(i % 4);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
      alarm(30);
      child(c, i);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return 1;
    if (WIFSIGNALED(status)) {
      signalled++;
      CHECK(0, "iteration %u (case %d): killed by signal %d", i, c, WTERMSIG(status));
    } else if (WEXITSTATUS(status) != STATUS + c) {
      wrong[c]++;
      CHECK(0, "iteration %u (case %d): exit status %d, expected %d", i, c, WEXITSTATUS(status), STATUS + c);
    }
  }
  printf("exit_live: %u runs, %u ended by a signal, %u/%u/%u/%u with another status (idle/rc/ud/both)\n", iters,
         signalled, wrong[0], wrong[1], wrong[2], wrong[3]);
  printf("exit_live: %s\n", g_failures ? "FAILED" : "passed");
  return g_failures ? 1 : 0;
}
