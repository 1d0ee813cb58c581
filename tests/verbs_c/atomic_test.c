/* RC atomics through the public verbs API:
 *
 *   fetch_add_two_processes  two child processes, three RC QPs (three contexts) each,
 *                            issue FETCH_AND_ADD(+1) on one 64-bit counter of the parent
 *                            (registered once per parent context). Expect: the counter
 *                            ends at the number of operations, and the original values
 *                            returned are exactly 0 .. total-1, each once (nothing lost,
 *                            nothing executed twice), increasing on each QP.
 *   semantics                compare-and-swap with a matching and a stale compare value,
 *                            fetch-and-add wrapping at 2^64, a misaligned address
 *                            (IBV_WC_REM_INV_REQ_ERR) and an MR without REMOTE_ATOMIC
 *                            (IBV_WC_REM_ACCESS_ERR).
 *
 * Usage: atomic_test CASE [OPS_PER_QP]. Exit 0 when every check passes. Run it with
 * UROCE_FAULT set to see duplicates replayed instead of executed again. */
#define _POSIX_C_SOURCE 200809L
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "verbs_pair.h"

#define CHILDREN 2
#define QPS_PER_CHILD 3
#define DEPTH 8 /* outstanding atomics per QP */
#define ACCESS_ATOMIC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC)

static void post_atomic(struct ibv_qp* qp, enum ibv_wr_opcode op, uint64_t wr_id, uint64_t* result, uint32_t lkey,
                        uint64_t remote, uint32_t rkey, uint64_t compare_add, uint64_t swap) {
  struct ibv_sge sge = {(uintptr_t)result, 8, lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.atomic.remote_addr = remote;
  wr.wr.atomic.rkey = rkey;
  wr.wr.atomic.compare_add = compare_add;
  wr.wr.atomic.swap = swap;
  int rc = ibv_post_send(qp, &wr, &bad);
  CHECK(rc == 0, "ibv_post_send(atomic) = %d", rc);
}

/* What the parent tells a child about one of its QPs, and the counter. */
struct target {
  struct vp_conn conn;
  uint64_t addr;
  uint32_t rkey;
};

/* A child: QPS_PER_CHILD QPs, `ops` FETCH_AND_ADD(+1) each, DEPTH in flight per QP;
 * writes every returned original value to `out`. Exit status 0 when all succeeded. */
static void run_adder(int from_parent, int to_parent, int out, uint32_t ops) {
  alarm(120); /* never outlive a parent that failed to stop us */
  struct vp_params p;
  vp_default_params(&p);
  struct vp_side s[QPS_PER_CHILD];
  struct target t[QPS_PER_CHILD];
  uint64_t* results[QPS_PER_CHILD];
  struct ibv_mr* mr[QPS_PER_CHILD];
  for (int q = 0; q < QPS_PER_CHILD; q++) {
    if (vp_open(&s[q], &p, 0x1000u * (q + 1)) || read(from_parent, &t[q], sizeof t[q]) != sizeof t[q] ||
        write(to_parent, &s[q].self, sizeof s[q].self) != sizeof s[q].self || vp_connect(&s[q], &p, &t[q].conn))
      _exit(1);
    results[q] = calloc(ops, 8);
    mr[q] = results[q] ? ibv_reg_mr(s[q].pd, results[q], (size_t)ops * 8, IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (!mr[q]) _exit(1);
  }
  uint32_t posted[QPS_PER_CHILD] = {0}, done[QPS_PER_CHILD] = {0}, finished = 0;
  double deadline = vp_now_ms() + 60000;
  while (finished < QPS_PER_CHILD && vp_now_ms() < deadline) {
    for (int q = 0; q < QPS_PER_CHILD; q++) {
      while (posted[q] < ops && posted[q] - done[q] < DEPTH) {
        post_atomic(s[q].qp, IBV_WR_ATOMIC_FETCH_AND_ADD, posted[q], &results[q][posted[q]], mr[q]->lkey, t[q].addr,
                    t[q].rkey, 1, 0);
        posted[q]++;
      }
      struct ibv_wc wc[DEPTH];
      int n = ibv_poll_cq(s[q].cq, DEPTH, wc);
      for (int i = 0; i < n; i++) {
        CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].opcode == IBV_WC_FETCH_ADD && wc[i].wr_id == done[q],
              "child QP %d: wr_id %llu (expected %u) status %s", q, (unsigned long long)wc[i].wr_id, done[q],
              ibv_wc_status_str(wc[i].status));
        done[q]++;
        if (done[q] == ops) finished++;
      }
      if (g_failures) _exit(1);
    }
  }
  CHECK(finished == QPS_PER_CHILD, "child: only %u of %d QPs finished within 60 s", finished, QPS_PER_CHILD);
  for (int q = 0; q < QPS_PER_CHILD && !g_failures; q++) {
    for (uint32_t i = 1; i < ops; i++)
      CHECK(results[q][i] > results[q][i - 1], "child QP %d: op %u returned %llu after %llu", q, i,
            (unsigned long long)results[q][i], (unsigned long long)results[q][i - 1]);
    size_t len = (size_t)ops * 8;
    if (write(out, results[q], len) != (ssize_t)len) _exit(1);
  }
  for (int q = 0; q < QPS_PER_CHILD; q++) {
    ibv_dereg_mr(mr[q]);
    vp_close(&s[q]);
  }
  _exit(g_failures ? 1 : 0);
}

/* Reads exactly `len` bytes within `timeout_ms`. */
static int read_all(int fd, void* buf, size_t len, int timeout_ms) {
  double deadline = vp_now_ms() + timeout_ms;
  size_t got = 0;
  while (got < len) {
    int left = (int)(deadline - vp_now_ms());
    struct pollfd pfd = {fd, POLLIN, 0};
    if (left <= 0 || poll(&pfd, 1, left) != 1) return -1;
    ssize_t n = read(fd, (char*)buf + got, len - got);
    if (n <= 0) return -1;
    got += (size_t)n;
  }
  return 0;
}

static void case_fetch_add_two_processes(uint32_t ops) {
  const uint32_t total = CHILDREN * QPS_PER_CHILD * ops;
  static uint64_t counter[8] __attribute__((aligned(64)));
  struct vp_params p;
  vp_default_params(&p);
  struct vp_side s[CHILDREN][QPS_PER_CHILD];
  struct ibv_mr* mr[CHILDREN][QPS_PER_CHILD];
  pid_t pid[CHILDREN];
  int results_fd[CHILDREN], down_fd[CHILDREN], up_fd[CHILDREN];
  /* Fork before this process opens any device: a child must not inherit uroce's state. */
  for (int c = 0; c < CHILDREN; c++) {
    int down[2], up[2], res[2];
    if (pipe(down) || pipe(up) || pipe(res)) exit(1);
    pid[c] = fork();
    if (pid[c] < 0) exit(1);
    if (pid[c] == 0) run_adder(down[0], up[1], res[1], ops);
    close(res[1]);
    results_fd[c] = res[0];
    down_fd[c] = down[1];
    up_fd[c] = up[0];
  }
  for (int c = 0; c < CHILDREN; c++) {
    for (int q = 0; q < QPS_PER_CHILD; q++) {
      struct vp_conn child;
      int bad = vp_open(&s[c][q], &p, 0x7000u + (uint32_t)(c * QPS_PER_CHILD + q));
      mr[c][q] = bad ? NULL : ibv_reg_mr(s[c][q].pd, counter, sizeof counter, ACCESS_ATOMIC);
      struct target t = {s[c][q].self, (uintptr_t)&counter[0], mr[c][q] ? mr[c][q]->rkey : 0};
      if (!mr[c][q] || write(down_fd[c], &t, sizeof t) != sizeof t || read_all(up_fd[c], &child, sizeof child, 10000) ||
          vp_connect(&s[c][q], &p, &child)) {
        CHECK(0, "setting up QP %d of child %d", q, c);
        for (int k = 0; k < CHILDREN; k++) kill(pid[k], SIGKILL);
        exit(1);
      }
    }
  }
  /* Collect every returned value: each of 0 .. total-1 exactly once. */
  uint64_t* values = malloc((size_t)total * 8);
  uint8_t* seen = calloc(total, 1);
  if (!values || !seen) exit(1);
  for (int c = 0; c < CHILDREN; c++) {
    size_t len = (size_t)QPS_PER_CHILD * ops * 8;
    CHECK(read_all(results_fd[c], values + (size_t)c * QPS_PER_CHILD * ops, len, 90000) == 0,
          "child %d sent no results", c);
  }
  for (int c = 0; c < CHILDREN; c++) {
    int status = -1;
    for (int i = 0; i < 1000 && waitpid(pid[c], &status, WNOHANG) == 0; i++) vp_sleep_ms(10);
    if (status == -1) {
      kill(pid[c], SIGKILL);
      waitpid(pid[c], &status, 0);
    }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d failed (status 0x%x)", c, status);
  }
  uint32_t duplicates = 0, out_of_range = 0;
  for (uint32_t i = 0; i < total && !g_failures; i++) {
    if (values[i] >= total)
      out_of_range++;
    else if (seen[values[i]]++)
      duplicates++;
  }
  CHECK(counter[0] == total, "counter %llu after %u additions", (unsigned long long)counter[0], total);
  CHECK(!duplicates && !out_of_range, "%u original values returned twice, %u out of range", duplicates, out_of_range);
  printf("fetch_add_two_processes: %d processes x %d QPs x %u FETCH_AND_ADD: counter %llu, every original value once\n",
         CHILDREN, QPS_PER_CHILD, ops, (unsigned long long)counter[0]);
  free(values);
  free(seen);
  for (int c = 0; c < CHILDREN; c++)
    for (int q = 0; q < QPS_PER_CHILD; q++) {
      ibv_dereg_mr(mr[c][q]);
      vp_close(&s[c][q]);
    }
}

/* One atomic on the pair, waited for; returns its completion status. */
static enum ibv_wc_status atomic_once(struct vp_side* a, enum ibv_wr_opcode op, uint64_t* result, uint32_t lkey,
                                      uint64_t remote, uint32_t rkey, uint64_t compare_add, uint64_t swap) {
  post_atomic(a->qp, op, 7, result, lkey, remote, rkey, compare_add, swap);
  struct ibv_wc wc;
  if (vp_poll(a->cq, &wc, 10000) != 1) {
    CHECK(0, "no completion for the atomic");
    return IBV_WC_GENERAL_ERR;
  }
  return wc.status;
}

static void case_semantics(void) {
  struct vp_params p;
  vp_default_params(&p);
  struct vp_side s[2];
  if (vp_open(&s[0], &p, 0x10) || vp_open(&s[1], &p, 0x20) || vp_connect(&s[0], &p, &s[1].self) ||
      vp_connect(&s[1], &p, &s[0].self))
    exit(1);
  static uint64_t target[4] __attribute__((aligned(64)));
  static uint64_t result;
  struct ibv_mr* tmr = ibv_reg_mr(s[1].pd, target, sizeof target, ACCESS_ATOMIC);
  struct ibv_mr* plain = ibv_reg_mr(s[1].pd, target, sizeof target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  struct ibv_mr* rmr = ibv_reg_mr(s[0].pd, &result, sizeof result, IBV_ACCESS_LOCAL_WRITE);
  if (!tmr || !plain || !rmr) exit(1);
  uint64_t base = (uintptr_t)target;

  target[0] = 7;
  CHECK(atomic_once(&s[0], IBV_WR_ATOMIC_CMP_AND_SWP, &result, rmr->lkey, base, tmr->rkey, 7, 99) == IBV_WC_SUCCESS,
        "CAS (match) failed");
  CHECK(target[0] == 99 && result == 7, "CAS match: target %llu result %llu", (unsigned long long)target[0],
        (unsigned long long)result);
  CHECK(atomic_once(&s[0], IBV_WR_ATOMIC_CMP_AND_SWP, &result, rmr->lkey, base, tmr->rkey, 7, 1) == IBV_WC_SUCCESS,
        "CAS (stale) failed");
  CHECK(target[0] == 99 && result == 99, "CAS stale: target %llu result %llu", (unsigned long long)target[0],
        (unsigned long long)result);

  target[1] = UINT64_MAX;
  CHECK(
      atomic_once(&s[0], IBV_WR_ATOMIC_FETCH_AND_ADD, &result, rmr->lkey, base + 8, tmr->rkey, 2, 0) == IBV_WC_SUCCESS,
      "FAA failed");
  CHECK(target[1] == 1 && result == UINT64_MAX, "FAA wrap: target %llu result %llu", (unsigned long long)target[1],
        (unsigned long long)result);

  enum ibv_wc_status st =
      atomic_once(&s[0], IBV_WR_ATOMIC_FETCH_AND_ADD, &result, rmr->lkey, base + 4, tmr->rkey, 1, 0);
  CHECK(st == IBV_WC_REM_INV_REQ_ERR, "misaligned FAA: %s", ibv_wc_status_str(st));
  printf("semantics: CAS match/stale, FAA wrap at 2^64, misaligned -> %s\n", ibv_wc_status_str(st));

  /* A fresh pair: the error above moved QP A to ERR. */
  ibv_dereg_mr(rmr);
  vp_close(&s[0]);
  ibv_dereg_mr(tmr);
  ibv_dereg_mr(plain);
  vp_close(&s[1]);
  if (vp_open(&s[0], &p, 0x30) || vp_open(&s[1], &p, 0x40) || vp_connect(&s[0], &p, &s[1].self) ||
      vp_connect(&s[1], &p, &s[0].self))
    exit(1);
  plain = ibv_reg_mr(s[1].pd, target, sizeof target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  rmr = ibv_reg_mr(s[0].pd, &result, sizeof result, IBV_ACCESS_LOCAL_WRITE);
  if (!plain || !rmr) exit(1);
  target[2] = 5;
  st = atomic_once(&s[0], IBV_WR_ATOMIC_FETCH_AND_ADD, &result, rmr->lkey, base + 16, plain->rkey, 1, 0);
  CHECK(st == IBV_WC_REM_ACCESS_ERR && target[2] == 5, "FAA without REMOTE_ATOMIC: %s, target %llu",
        ibv_wc_status_str(st), (unsigned long long)target[2]);
  printf("semantics: MR without REMOTE_ATOMIC -> %s, memory untouched\n", ibv_wc_status_str(st));
  ibv_dereg_mr(rmr);
  ibv_dereg_mr(plain);
  vp_close(&s[0]);
  vp_close(&s[1]);
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* c = argc >= 2 ? argv[1] : "";
  uint32_t ops = argc >= 3 ? (uint32_t)strtoul(argv[2], NULL, 0) : 2000;
  if (!strcmp(c, "fetch_add_two_processes") && ops > 0)
    case_fetch_add_two_processes(ops);
  else if (!strcmp(c, "semantics"))
    case_semantics();
  else {
    fprintf(stderr, "usage: %s fetch_add_two_processes [OPS_PER_QP] | semantics\n", argv[0]);
    return 2;
  }
  printf("%s: %s\n", c, g_failures ? "FAILED" : "passed");
  return g_failures ? 1 : 0;
}
