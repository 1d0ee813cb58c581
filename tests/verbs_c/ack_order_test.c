/* ACK before completion, through the public verbs API. A responder must
 * send the ACK of a message before the message's receive completion becomes visible to
 * the application, as an RDMA NIC does (it ACKs on receipt, long before software can
 * react). Two processes (fork), each with one RC QP and one CQ for sends and receives:
 *
 *   reply_order   A sends message i; B answers it as soon as it polls the receive
 *                 completion. On A's CQ, the completion of A's SEND i must come before the
 *                 receive of B's reply i: a reply posted in reaction to a receive can
 *                 never overtake the ACK of that receive. ITERS iterations.
 *   recv_then_err B moves its QP to ERR right after polling the receive completion (the
 *                 "disconnect after the last message" pattern). A's SEND must complete
 *                 with IBV_WC_SUCCESS: the message was delivered, so it was ACKed before
 *                 B could react. ITERS fresh connections.
 *   recv_then_destroy  the same with ibv_destroy_qp instead of the move to ERR.
 *   recv_then_exit  B exits (exit(), every verbs object still open) right after polling
 *                 the receive completion: A's SEND must complete successfully and B end
 *                 with status 0. ITERS processes.
 *
 * Usage: ack_order_test CASE [ITERS]. Exit 0 when every check passes; the summary line
 * says how many iterations violated the order. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "verbs_pair.h"

#define MSG_LEN 64
#define POLL_MS 10000 /* bound of every wait: far beyond any legitimate delay */

enum { kWrSend = 1, kWrRecv = 2 };

/* One process's side: the verbs objects and a registered message buffer. */
struct side {
  struct vp_side vp;
  struct ibv_mr* mr;
  uint8_t buf[2 * MSG_LEN]; /* [0, MSG_LEN): send; [MSG_LEN, 2 * MSG_LEN): receive */
};

/* The pipes between A (parent) and B (child). */
struct link {
  int a_to_b, b_to_a;
};

static void params(struct vp_params* p) {
  vp_default_params(p);
  /* A missing ACK shows as RETRY_EXC_ERR after 1.07 s x (3 + 1) instead of never. Not
   * shorter: a loaded 2-core machine can stall a process for several hundred ms (measured:
   * 350 ms without a scheduled progress thread while builds ran), and a stalled receiver
   * must not pass for a lost ACK. */
  p->timeout = 18;
  p->retry_cnt = 3;
  p->sq_depth = 16;
  p->rq_depth = 16;
}

static int side_open(struct side* s, const struct vp_params* p, uint32_t psn) {
  if (vp_open(&s->vp, p, psn)) return -1;
  s->mr = ibv_reg_mr(s->vp.pd, s->buf, sizeof s->buf, IBV_ACCESS_LOCAL_WRITE);
  if (!s->mr) printf("ibv_reg_mr failed\n");
  return s->mr ? 0 : -1;
}

static void side_close(struct side* s) {
  if (s->mr) ibv_dereg_mr(s->mr);
  vp_close(&s->vp);
}

static int post_recv(struct side* s) {
  struct ibv_sge sge = {(uintptr_t)(s->buf + MSG_LEN), MSG_LEN, s->mr->lkey};
  struct ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = kWrRecv;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(s->vp.qp, &wr, &bad);
}

static int post_send(struct side* s, uint32_t seq) {
  memcpy(s->buf, &seq, sizeof seq);
  struct ibv_sge sge = {(uintptr_t)s->buf, MSG_LEN, s->mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = kWrSend;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  return ibv_post_send(s->vp.qp, &wr, &bad);
}

/* Busy-polls one completion (no sleep: B must react as fast as an application can), for at
 * most POLL_MS. 1: got one; 0: none; -1: poll error. */
static int poll_one(struct ibv_cq* cq, struct ibv_wc* wc) {
  double deadline = vp_now_ms() + POLL_MS;
  for (;;) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n) return n < 0 ? -1 : 1;
    if (vp_now_ms() > deadline) return 0;
  }
}

static uint32_t received_seq(const struct side* s) {
  uint32_t seq;
  memcpy(&seq, s->buf + MSG_LEN, sizeof seq);
  return seq;
}

/* After fork, each process closes the pipe ends that belong to the other: a peer that
 * dies then ends the survivor's read with EOF instead of leaving it blocked until the
 * test's timeout. */
static void close_other_ends(int fd1, int fd2) {
  close(fd1);
  close(fd2);
}

/* Exchanges connection facts over the pipes and moves the QP to RTS. */
static int connect_over(struct side* s, const struct vp_params* p, int wfd, int rfd) {
  struct vp_conn peer;
  if (write(wfd, &s->vp.self, sizeof s->vp.self) != sizeof s->vp.self) return -1;
  if (read(rfd, &peer, sizeof peer) != sizeof peer) return -1;
  return vp_connect(&s->vp, p, &peer);
}

/* ---- reply_order ---- */

/* B: answers every message as soon as its receive completion is polled. */
static int run_replier(struct side* b, uint32_t iters) {
  for (uint32_t i = 0; i < iters; i++) {
    struct ibv_wc wc;
    /* Skip our own send completions until the next receive. */
    do {
      if (poll_one(b->vp.cq, &wc) != 1) return -1;
      if (wc.status != IBV_WC_SUCCESS) {
        printf("B: completion %s for wr %llu\n", ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id);
        return -1;
      }
    } while (wc.wr_id != kWrRecv);
    uint32_t seq = received_seq(b);
    if (post_recv(b) || post_send(b, seq)) return -1;
  }
  struct ibv_wc wc; /* the last reply's completion */
  while (poll_one(b->vp.cq, &wc) == 1 && wc.wr_id != kWrSend) {
  }
  return 0;
}

/* A: iteration i posts SEND i and waits for both completions; counts the iterations
 * whose reply came first. */
static void check_reply_order(struct side* a, uint32_t iters) {
  uint32_t violations = 0, first_violation = 0;
  for (uint32_t i = 0; i < iters && !g_failures; i++) {
    CHECK(post_send(a, i) == 0, "post_send %u", i);
    int send_done = 0, reply_done = 0;
    while (!(send_done && reply_done) && !g_failures) {
      struct ibv_wc wc;
      if (poll_one(a->vp.cq, &wc) != 1) {
        CHECK(0, "iteration %u: no completion within %d ms (send %d, reply %d)", i, POLL_MS, send_done, reply_done);
        break;
      }
      CHECK(wc.status == IBV_WC_SUCCESS, "iteration %u: wr %llu completed %s", i, (unsigned long long)wc.wr_id,
            ibv_wc_status_str(wc.status));
      if (wc.wr_id == kWrSend) {
        send_done = 1;
      } else {
        CHECK(received_seq(a) == i, "iteration %u: reply %u", i, received_seq(a));
        if (!send_done && violations++ == 0) first_violation = i;
        reply_done = 1;
        CHECK(post_recv(a) == 0, "post_recv");
      }
    }
  }
  CHECK(violations == 0, "%u of %u replies were seen before the send they answer completed (first: %u)", violations,
        iters, first_violation);
  printf("reply_order: %u iterations, %u replies before their send's completion\n", iters, violations);
}

static void case_reply_order(uint32_t iters) {
  struct vp_params p;
  params(&p);
  struct link l;
  int ab[2], ba[2];
  if (pipe(ab) || pipe(ba)) exit(1);
  fflush(stdout);
  pid_t child = fork();
  if (child < 0) exit(1);
  if (child == 0) {
    alarm(300); /* never outlive a parent that failed */
    close_other_ends(ab[1], ba[0]);
    struct side b;
    memset(&b, 0, sizeof b);
    if (side_open(&b, &p, 0x700) || post_recv(&b) || connect_over(&b, &p, ba[1], ab[0])) _exit(1);
    _exit(run_replier(&b, iters) ? 1 : 0);
  }
  close_other_ends(ab[0], ba[1]);
  l.a_to_b = ab[1];
  l.b_to_a = ba[0];
  struct side a;
  memset(&a, 0, sizeof a);
  if (side_open(&a, &p, 0x100) || post_recv(&a) || connect_over(&a, &p, l.a_to_b, l.b_to_a)) {
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    exit(1);
  }
  check_reply_order(&a, iters);
  if (g_failures) kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(g_failures || (WIFEXITED(status) && WEXITSTATUS(status) == 0), "B failed (status 0x%x)", status);
  side_close(&a);
}

/* ---- recv_then_err / recv_then_destroy ---- */

/* B, once per iteration: a fresh QP, one receive; as soon as it completes, ERR (or
 * destroy). Then it waits for A's verdict before the next connection. */
static int run_disconnecter(const struct vp_params* p, uint32_t iters, int destroy, int wfd, int rfd) {
  for (uint32_t i = 0; i < iters; i++) {
    struct side b;
    memset(&b, 0, sizeof b);
    if (side_open(&b, p, (0x300 + i * 97) & 0xFFFFFF) || post_recv(&b) || connect_over(&b, p, wfd, rfd)) return -1;
    struct ibv_wc wc;
    if (poll_one(b.vp.cq, &wc) != 1 || wc.status != IBV_WC_SUCCESS || received_seq(&b) != i) return -1;
    if (destroy) {
      ibv_destroy_qp(b.vp.qp);
      b.vp.qp = NULL;
    } else {
      struct ibv_qp_attr a;
      memset(&a, 0, sizeof a);
      a.qp_state = IBV_QPS_ERR;
      if (ibv_modify_qp(b.vp.qp, &a, IBV_QP_STATE)) return -1;
    }
    char verdict;
    if (read(rfd, &verdict, 1) != 1) return -1; /* A's send completed (either way) */
    side_close(&b);
  }
  return 0;
}

static void case_recv_then_disconnect(uint32_t iters, int destroy) {
  struct vp_params p;
  params(&p);
  int ab[2], ba[2];
  if (pipe(ab) || pipe(ba)) exit(1);
  fflush(stdout);
  pid_t child = fork();
  if (child < 0) exit(1);
  if (child == 0) {
    alarm(600);
    close_other_ends(ab[1], ba[0]);
    _exit(run_disconnecter(&p, iters, destroy, ba[1], ab[0]) ? 1 : 0);
  }
  close_other_ends(ab[0], ba[1]);
  uint32_t failed = 0, first_failed = 0;
  enum ibv_wc_status first_status = IBV_WC_SUCCESS;
  for (uint32_t i = 0; i < iters && !g_failures; i++) {
    struct side a;
    memset(&a, 0, sizeof a);
    if (side_open(&a, &p, (0x900 + i * 31) & 0xFFFFFF) || connect_over(&a, &p, ab[1], ba[0])) {
      CHECK(0, "iteration %u: connection failed", i);
      break;
    }
    CHECK(post_send(&a, i) == 0, "post_send");
    struct ibv_wc wc;
    if (poll_one(a.vp.cq, &wc) != 1) {
      CHECK(0, "iteration %u: the send did not complete within %d ms", i, POLL_MS);
    } else if (wc.status != IBV_WC_SUCCESS && failed++ == 0) {
      first_failed = i;
      first_status = wc.status;
    }
    CHECK(write(ab[1], "v", 1) == 1, "pipe");
    side_close(&a);
  }
  CHECK(failed == 0, "%u of %u delivered sends did not complete successfully (first: iteration %u, %s)", failed, iters,
        first_failed, ibv_wc_status_str(first_status));
  if (g_failures) kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(g_failures || (WIFEXITED(status) && WEXITSTATUS(status) == 0), "B failed (status 0x%x)", status);
  printf("%s: %u connections, %u delivered sends failed\n", destroy ? "recv_then_destroy" : "recv_then_err", iters,
         failed);
}

/* ---- recv_then_exit ---- */

/* B, in a process of its own: one receive, and as soon as it completes, exit() with every
 * verbs object still open, as short tools and error paths do. The ACK that B's polling
 * turn left waiting for its next post goes at exit (engine_context.cc, send_acks_at_exit). */
static void run_exiter(const struct vp_params* p, uint32_t i, int wfd, int rfd) {
  struct side b;
  memset(&b, 0, sizeof b);
  if (side_open(&b, p, (0x500 + i * 13) & 0xFFFFFF) || post_recv(&b) || connect_over(&b, p, wfd, rfd)) _exit(1);
  struct ibv_wc wc;
  if (poll_one(b.vp.cq, &wc) != 1 || wc.status != IBV_WC_SUCCESS || received_seq(&b) != i) _exit(1);
  exit(0);
}

/* A, once per iteration: a fresh B; one SEND, which must complete successfully, and B must
 * end with exit status 0 (not a signal). */
static void case_recv_then_exit(uint32_t iters) {
  struct vp_params p;
  params(&p);
  uint32_t bad_exits = 0, failed = 0;
  for (uint32_t i = 0; i < iters && !g_failures; i++) {
    int ab[2], ba[2];
    if (pipe(ab) || pipe(ba)) exit(1);
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) exit(1);
    if (child == 0) {
      alarm(60);
      close_other_ends(ab[1], ba[0]);
      run_exiter(&p, i, ba[1], ab[0]);
    }
    close_other_ends(ab[0], ba[1]);
    struct side a;
    memset(&a, 0, sizeof a);
    if (side_open(&a, &p, (0xA00 + i * 31) & 0xFFFFFF) || connect_over(&a, &p, ab[1], ba[0])) {
      CHECK(0, "iteration %u: connection failed", i);
      kill(child, SIGKILL);
    } else {
      CHECK(post_send(&a, i) == 0, "post_send");
      struct ibv_wc wc;
      CHECK(poll_one(a.vp.cq, &wc) == 1, "iteration %u: the send did not complete within %d ms", i, POLL_MS);
      failed += wc.status != IBV_WC_SUCCESS;
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && bad_exits++ == 0)
      printf("iteration %u: B ended with status 0x%x\n", i, status);
    close(ab[1]);
    close(ba[0]);
    side_close(&a);
  }
  CHECK(bad_exits == 0, "%u of %u processes that exited with open verbs objects did not exit cleanly", bad_exits,
        iters);
  CHECK(failed == 0, "%u of %u sends to a process that exited after receiving them failed", failed, iters);
  printf("recv_then_exit: %u processes, %u unclean exits, %u failed sends\n", iters, bad_exits, failed);
}

int main(int argc, char** argv) {
  const char* c = argc > 1 ? argv[1] : "";
  uint32_t iters = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN); /* a dead peer: write fails with EPIPE and the check says so */
  if (!strcmp(c, "reply_order")) {
    case_reply_order(iters ? iters : 5000);
  } else if (!strcmp(c, "recv_then_err")) {
    case_recv_then_disconnect(iters ? iters : 300, 0);
  } else if (!strcmp(c, "recv_then_destroy")) {
    case_recv_then_disconnect(iters ? iters : 300, 1);
  } else if (!strcmp(c, "recv_then_exit")) {
    case_recv_then_exit(iters ? iters : 30);
  } else {
    fprintf(stderr, "usage: ack_order_test reply_order|recv_then_err|recv_then_destroy|recv_then_exit [ITERS]\n");
    return 2;
  }
  return g_failures ? 1 : 0;
}
