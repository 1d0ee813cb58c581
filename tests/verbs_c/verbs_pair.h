/* Shared plumbing of uroce's C verbs tests: one side of an RC connection (context, PD,
 * CQ, QP), the facts a peer needs to connect to it, and bounded completion polling.
 * Written against rdma-core's public <infiniband/verbs.h> only, so the tests also run
 * on real RDMA hardware or rxe. */
#ifndef UROCE_TESTS_VERBS_PAIR_H
#define UROCE_TESTS_VERBS_PAIR_H

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>

/* QP parameters of a test connection (both directions use the same). */
struct vp_params {
  enum ibv_mtu mtu;
  uint8_t timeout;       /* local ACK timeout exponent: 4.096 us << timeout */
  uint8_t retry_cnt;     /* 7: retry forever */
  uint8_t rnr_retry;     /* 7: retry forever */
  uint8_t min_rnr_timer; /* IBA RNR timer code the responder advertises */
  uint8_t rd_atomic;     /* max_rd_atomic and max_dest_rd_atomic */
  uint32_t sq_depth, rq_depth, max_sge;
};

/* Defaults: MTU 1024, timeout 14 (~67 ms), retry_cnt 7, rnr_retry 7, 16 READ credits. */
void vp_default_params(struct vp_params* p);

/* Everything a peer needs to move its QP to RTR (what rc_pingpong exchanges). */
struct vp_conn {
  uint32_t qpn;
  uint32_t psn;
  uint16_t lid;
  union ibv_gid gid;
};

struct vp_side {
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_cq* cq; /* send and receive completions */
  struct ibv_qp* qp;
  struct vp_conn self;
};

/* Opens the first device, allocates PD, CQ and an RC QP in INIT with remote READ/WRITE/ATOMIC
 * access; `psn` is this side's first send PSN. Returns 0, or -1 after printing why. */
int vp_open(struct vp_side* s, const struct vp_params* p, uint32_t psn);
/* RTR then RTS towards `peer`. Returns 0, or -1 after printing why. */
int vp_connect(struct vp_side* s, const struct vp_params* p, const struct vp_conn* peer);
/* Destroys whatever vp_open created. */
void vp_close(struct vp_side* s);

/* Polls one completion for at most `timeout_ms`: 1 got one, 0 timed out, -1 poll error. */
int vp_poll(struct ibv_cq* cq, struct ibv_wc* wc, int timeout_ms);
double vp_now_ms(void);
void vp_sleep_ms(int ms);

/* Reads exactly `len` bytes from `fd` within `ms`: 0, or -1 (timeout, EOF, error). */
int vp_read_full(int fd, void* buf, size_t len, int ms);
/* Writes `len` bytes to `fd` (a pipe or socket between test processes): 0, or -1. */
int vp_write_full(int fd, const void* buf, size_t len);

/* Failed checks so far; CHECK records one with where and why ("FAIL file:line: ...")
 * and goes on (the CM tests' REQUIRE, cm_test_util.h, ends the process instead). */
extern int g_failures;
#define CHECK(cond, ...)                          \
  do {                                            \
    if (!(cond)) {                                \
      printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      printf(__VA_ARGS__);                        \
      printf("\n");                               \
      g_failures++;                               \
    }                                             \
  } while (0)

/* A program of named cases (one ctest each): runs the case argv[1] names, prints
 * "NAME: passed" or "NAME: FAILED" and returns 0 / 1 by g_failures; a missing or unknown
 * name prints the usage with every case's name and returns 2. */
struct vp_case {
  const char* name;
  void (*run)(void);
};
int vp_run_case(int argc, char** argv, const struct vp_case* cases, size_t count);

/* splitmix64: reproducible pseudo-random numbers for sizes, layouts and contents. */
uint64_t vp_rand(uint64_t* state);

#endif
