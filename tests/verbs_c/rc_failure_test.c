/* RC failure semantics (IBA 9.7.5.2.8 RNR NAK, 9.7.6.1.3 local ACK timeout), through the
 * public verbs API:
 *
 *   rnr_late_receive    B posts its receive 200 ms after A's SEND; A (rnr_retry=7, i.e.
 *                       retry forever) keeps retrying on RNR NAKs and completes.
 *   rnr_retry_exceeded  A (rnr_retry=1) sends to B, which never posts a receive: A's SEND
 *                       completes IBV_WC_RNR_RETRY_EXC_ERR, the QP is in ERR, and the WRs
 *                       behind it are flushed.
 *   peer_death          B runs in a child process that is killed (SIGKILL) while A has
 *                       RDMA WRITEs in flight: A's oldest WR completes IBV_WC_RETRY_EXC_ERR
 *                       within timeout x (retry_cnt + 1) + margin, every other one
 *                       IBV_WC_WR_FLUSH_ERR, and nothing hangs.
 *   peer_death_busy_poll
 *                       the same with A polling its CQ back to back, as ibv_rc_pingpong
 *                       does: the local ACK timer must run while an application thread
 *                       takes the receive turn over and over.
 *
 * Usage: rc_failure_test CASE. Exit 0 when every check passes. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "verbs_pair.h"

#define MSG_LEN 4096

/* A (index 0) and B (index 1) in this process, connected to each other. */
static int open_pair(struct vp_side s[2], const struct vp_params p[2]) {
  if (vp_open(&s[0], &p[0], 0x100) || vp_open(&s[1], &p[1], 0xFFFFF0)) return -1;
  if (vp_connect(&s[0], &p[0], &s[1].self) || vp_connect(&s[1], &p[1], &s[0].self)) return -1;
  return 0;
}

static int post_send(struct ibv_qp* qp, struct ibv_mr* mr, uint64_t wr_id) {
  struct ibv_sge sge = {(uintptr_t)mr->addr, MSG_LEN, mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  return ibv_post_send(qp, &wr, &bad);
}

static enum ibv_qp_state qp_state(struct ibv_qp* qp) {
  struct ibv_qp_attr a;
  struct ibv_qp_init_attr ia;
  if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia)) return (enum ibv_qp_state) - 1;
  return a.qp_state;
}

/* Receive: A's SEND finds no receive WQE at B for 200 ms / Expect: no completion at A
 * meanwhile; after B posts one, A's SEND and B's receive complete with the data. */
static void case_rnr_late_receive(void) {
  struct vp_params p[2];
  vp_default_params(&p[0]);
  p[1] = p[0];
  p[0].rnr_retry = 7;      /* infinite */
  p[1].min_rnr_timer = 14; /* B asks for 1.28 ms between retries */
  struct vp_side s[2];
  if (open_pair(s, p)) exit(1);
  static uint8_t src[MSG_LEN], dst[MSG_LEN];
  for (int i = 0; i < MSG_LEN; i++) src[i] = (uint8_t)(i * 7 + 3);
  struct ibv_mr* smr = ibv_reg_mr(s[0].pd, src, MSG_LEN, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr* rmr = ibv_reg_mr(s[1].pd, dst, MSG_LEN, IBV_ACCESS_LOCAL_WRITE);
  CHECK(smr && rmr, "ibv_reg_mr failed");
  if (!smr || !rmr) exit(1);

  CHECK(post_send(s[0].qp, smr, 1) == 0, "post_send");
  struct ibv_wc wc;
  CHECK(vp_poll(s[0].cq, &wc, 200) == 0, "A completed (status %s) before B posted a receive",
        ibv_wc_status_str(wc.status));

  struct ibv_sge sge = {(uintptr_t)dst, MSG_LEN, rmr->lkey};
  struct ibv_recv_wr rwr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
  CHECK(ibv_post_recv(s[1].qp, &rwr, &bad) == 0, "post_recv");
  CHECK(vp_poll(s[0].cq, &wc, 10000) == 1, "A's SEND did not complete after the late receive");
  CHECK(wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND, "A: wr_id %llu status %s",
        (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
  CHECK(vp_poll(s[1].cq, &wc, 10000) == 1, "B's receive did not complete");
  CHECK(wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS && wc.byte_len == MSG_LEN, "B: wr_id %llu status %s len %u",
        (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.byte_len);
  CHECK(memcmp(src, dst, MSG_LEN) == 0, "received bytes differ");
  printf("rnr_late_receive: SEND completed after the late receive, %d bytes verified\n", MSG_LEN);
  ibv_dereg_mr(smr);
  ibv_dereg_mr(rmr);
  vp_close(&s[1]);
  vp_close(&s[0]);
}

/* Receive: RNR NAKs for every try of A's SEND (rnr_retry=1) / Expect:
 * IBV_WC_RNR_RETRY_EXC_ERR for it, QP A in ERR, the two WRs behind it flushed. */
static void case_rnr_retry_exceeded(void) {
  struct vp_params p[2];
  vp_default_params(&p[0]);
  p[1] = p[0];
  p[0].rnr_retry = 1;
  p[1].min_rnr_timer = 14;
  struct vp_side s[2];
  if (open_pair(s, p)) exit(1);
  static uint8_t src[MSG_LEN];
  struct ibv_mr* smr = ibv_reg_mr(s[0].pd, src, MSG_LEN, IBV_ACCESS_LOCAL_WRITE);
  if (!smr) exit(1);
  for (uint64_t id = 1; id <= 3; id++)
    CHECK(post_send(s[0].qp, smr, id) == 0, "post_send %llu", (unsigned long long)id);

  struct ibv_wc wc;
  CHECK(vp_poll(s[0].cq, &wc, 10000) == 1, "no completion for the SEND");
  CHECK(wc.wr_id == 1 && wc.status == IBV_WC_RNR_RETRY_EXC_ERR, "first completion: wr_id %llu status %s",
        (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
  for (uint64_t id = 2; id <= 3; id++) {
    CHECK(vp_poll(s[0].cq, &wc, 10000) == 1, "no completion for WR %llu", (unsigned long long)id);
    CHECK(wc.wr_id == id && wc.status == IBV_WC_WR_FLUSH_ERR, "WR %llu: wr_id %llu status %s", (unsigned long long)id,
          (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
  }
  CHECK(qp_state(s[0].qp) == IBV_QPS_ERR, "QP A is in state %d, not ERR", (int)qp_state(s[0].qp));
  CHECK(vp_poll(s[1].cq, &wc, 50) == 0, "B produced a completion without a receive");
  printf("rnr_retry_exceeded: RNR_RETRY_EXC_ERR, QP in ERR, 2 WRs flushed\n");
  ibv_dereg_mr(smr);
  vp_close(&s[1]);
  vp_close(&s[0]);
}

/* What the child (B) tells the parent (A) through a pipe. */
struct peer_info {
  struct vp_conn conn;
  uint64_t addr;
  uint32_t rkey;
};

#define DEATH_BUF (1u << 20)
#define DEATH_MSG (64u << 10)
#define DEATH_DEPTH 16

/* B: connect to A, expose a buffer for RDMA WRITE, then wait to be killed. */
static void run_doomed_peer(const struct vp_params* p, int to_parent, int from_parent) {
  alarm(60); /* never outlive a parent that failed to kill us */
  struct vp_side b;
  if (vp_open(&b, p, 0x500)) _exit(1);
  void* buf = malloc(DEATH_BUF);
  struct ibv_mr* mr = ibv_reg_mr(b.pd, buf, DEATH_BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!buf || !mr) _exit(1);
  struct peer_info me = {b.self, (uintptr_t)buf, mr->rkey};
  struct vp_conn a;
  if (write(to_parent, &me, sizeof me) != sizeof me || read(from_parent, &a, sizeof a) != sizeof a) _exit(1);
  if (vp_connect(&b, p, &a)) _exit(1);
  for (;;) pause();
}

/* One completion from `cq` within `timeout_ms`, polled back to back (no pause between
 * polls): 1, 0 on timeout, -1 on error. */
static int poll_busy(struct ibv_cq* cq, struct ibv_wc* wc, int timeout_ms) {
  double deadline = vp_now_ms() + timeout_ms;
  for (unsigned polls = 1;; polls++) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n != 0) return n < 0 ? -1 : 1;
    if (polls % 1024 == 0 && vp_now_ms() > deadline) return 0;
  }
}

/* Receive: silence from B after it is killed with WRITEs in flight / Expect: the oldest
 * WR fails with IBV_WC_RETRY_EXC_ERR within timeout x (retry_cnt + 1) + 1 s of the kill,
 * every later WR IBV_WC_WR_FLUSH_ERR, QP in ERR. `busy_poll`: A polls back to back. */
static void case_peer_death(int busy_poll) {
  struct vp_params p;
  vp_default_params(&p);
  p.timeout = 14; /* 4.096 us << 14 = 67 ms */
  p.retry_cnt = 3;
  const double timeout_ms = 4.096e-3 * (double)(1u << p.timeout);
  const double bound_ms = timeout_ms * (p.retry_cnt + 1) + 1000.0;

  int up[2], down[2];
  if (pipe(up) || pipe(down)) exit(1);
  pid_t child = fork();
  if (child < 0) exit(1);
  if (child == 0) run_doomed_peer(&p, up[1], down[0]);

  struct vp_side a;
  struct peer_info b;
  if (vp_open(&a, &p, 0x900) || read(up[0], &b, sizeof b) != sizeof b ||
      write(down[1], &a.self, sizeof a.self) != sizeof a.self || vp_connect(&a, &p, &b.conn)) {
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    exit(1);
  }
  uint8_t* src = calloc(1, DEATH_MSG);
  struct ibv_mr* mr = ibv_reg_mr(a.pd, src, DEATH_MSG, IBV_ACCESS_LOCAL_WRITE);
  if (!src || !mr) exit(1);

  /* Keep DEATH_DEPTH WRITEs in flight; kill B after 64 have completed, then post DEATH_DEPTH
   * more (same-host direct placement completes a WRITE as it is posted, so none may be in
   * flight at the kill: these are, since placement into a dead process is declined). */
  uint64_t posted = 0, succeeded = 0, flushed = 0, retry_exc = 0, other = 0, posted_at_kill = 0;
  double killed_at = 0, failed_at = 0;
  int alive = 1;
  while (posted < 100000) {
    while (posted - succeeded - flushed - retry_exc - other < DEATH_DEPTH && !retry_exc &&
           (alive || posted - posted_at_kill < DEATH_DEPTH)) {
      struct ibv_sge sge = {(uintptr_t)src, DEATH_MSG, mr->lkey};
      struct ibv_send_wr wr, *bad = NULL;
      memset(&wr, 0, sizeof wr);
      wr.wr_id = posted;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = b.addr + (posted % (DEATH_BUF / DEATH_MSG)) * DEATH_MSG;
      wr.wr.rdma.rkey = b.rkey;
      if (ibv_post_send(a.qp, &wr, &bad)) break;
      posted++;
    }
    if (alive && succeeded >= 64) {
      kill(child, SIGKILL);
      waitpid(child, NULL, 0);
      killed_at = vp_now_ms();
      alive = 0;
      posted_at_kill = posted;
      continue; /* post the WRITEs that meet the dead peer */
    }
    if (posted == succeeded + flushed + retry_exc + other && !alive) break;
    struct ibv_wc wc;
    int got = busy_poll ? poll_busy(a.cq, &wc, (int)bound_ms + 10000) : vp_poll(a.cq, &wc, (int)bound_ms + 10000);
    if (got != 1) {
      CHECK(0, "no completion within %.0f ms (posted %llu, completed %llu)", bound_ms + 10000,
            (unsigned long long)posted, (unsigned long long)(succeeded + flushed + retry_exc + other));
      break;
    }
    if (wc.status == IBV_WC_SUCCESS && !retry_exc) {
      succeeded++;
    } else if (wc.status == IBV_WC_RETRY_EXC_ERR && !retry_exc) {
      retry_exc++;
      failed_at = vp_now_ms();
      CHECK(wc.wr_id == succeeded, "RETRY_EXC_ERR for WR %llu, but the oldest outstanding is %llu",
            (unsigned long long)wc.wr_id, (unsigned long long)succeeded);
    } else if (wc.status == IBV_WC_WR_FLUSH_ERR && retry_exc) {
      flushed++;
    } else {
      other++;
      CHECK(0, "unexpected completion: wr_id %llu status %s (after %llu successes, %llu retry errors)",
            (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), (unsigned long long)succeeded,
            (unsigned long long)retry_exc);
    }
  }
  if (alive) {
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
  }
  CHECK(killed_at > 0, "the peer was never killed (%llu WRITEs succeeded)", (unsigned long long)succeeded);
  CHECK(retry_exc == 1, "%llu RETRY_EXC_ERR completions, expected 1", (unsigned long long)retry_exc);
  double took = failed_at - killed_at;
  CHECK(retry_exc == 0 || took <= bound_ms, "RETRY_EXC_ERR %.0f ms after the kill; bound %.0f ms", took, bound_ms);
  CHECK(flushed + 1 == posted - succeeded, "%llu flushed, %llu outstanding after the error",
        (unsigned long long)flushed, (unsigned long long)(posted - succeeded - 1));
  CHECK(qp_state(a.qp) == IBV_QPS_ERR, "QP A is in state %d, not ERR", (int)qp_state(a.qp));
  printf("%s: %llu WRITEs succeeded, RETRY_EXC_ERR %.0f ms after the kill (bound %.0f ms), %llu flushed\n",
         busy_poll ? "peer_death_busy_poll" : "peer_death", (unsigned long long)succeeded, took, bound_ms,
         (unsigned long long)flushed);
  ibv_dereg_mr(mr);
  free(src);
  vp_close(&a);
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* c = argc == 2 ? argv[1] : "";
  if (!strcmp(c, "rnr_late_receive"))
    case_rnr_late_receive();
  else if (!strcmp(c, "rnr_retry_exceeded"))
    case_rnr_retry_exceeded();
  else if (!strcmp(c, "peer_death"))
    case_peer_death(0);
  else if (!strcmp(c, "peer_death_busy_poll"))
    case_peer_death(1);
  else {
    fprintf(stderr, "usage: %s rnr_late_receive | rnr_retry_exceeded | peer_death | peer_death_busy_poll\n", argv[0]);
    return 2;
  }
  printf("%s: %s\n", c, g_failures ? "FAILED" : "passed");
  return g_failures ? 1 : 0;
}
