/* Shared plumbing of uroce's C verbs tests; see verbs_pair.h. */
#define _POSIX_C_SOURCE 200809L
#include "verbs_pair.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int g_failures;

int vp_run_case(int argc, char** argv, const struct vp_case* cases, size_t count) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* c = argc == 2 ? argv[1] : "";
  for (size_t i = 0; i < count; i++) {
    if (strcmp(c, cases[i].name)) continue;
    cases[i].run();
    printf("%s: %s\n", c, g_failures ? "FAILED" : "passed");
    return g_failures ? 1 : 0;
  }
  fprintf(stderr, "usage: %s CASE, one of:", argv[0]);
  for (size_t i = 0; i < count; i++) fprintf(stderr, " %s", cases[i].name);
  fprintf(stderr, "\n");
  return 2;
}

void vp_default_params(struct vp_params* p) {
  memset(p, 0, sizeof *p);
  p->mtu = IBV_MTU_1024;
  p->timeout = 14;
  p->retry_cnt = 7;
  p->rnr_retry = 7;
  p->min_rnr_timer = 1; /* 0.01 ms */
  p->rd_atomic = 16;
  p->sq_depth = 256;
  p->rq_depth = 256;
  p->max_sge = 4;
}

int vp_open(struct vp_side* s, const struct vp_params* p, uint32_t psn) {
  memset(s, 0, sizeof *s);
  int num = 0;
  struct ibv_device** list = ibv_get_device_list(&num);
  if (!list || num < 1) {
    printf("vp_open: no RDMA device\n");
    if (list) ibv_free_device_list(list);
    return -1;
  }
  s->ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!s->ctx) {
    printf("vp_open: ibv_open_device: %s\n", strerror(errno));
    return -1;
  }
  struct ibv_port_attr pa;
  if (ibv_query_port(s->ctx, 1, &pa) || ibv_query_gid(s->ctx, 1, 0, &s->self.gid)) {
    printf("vp_open: ibv_query_port/gid failed\n");
    return -1;
  }
  s->self.lid = pa.lid;
  s->self.psn = psn;
  s->pd = ibv_alloc_pd(s->ctx);
  s->cq = s->pd ? ibv_create_cq(s->ctx, (int)(p->sq_depth + p->rq_depth), NULL, NULL, 0) : NULL;
  if (!s->cq) {
    printf("vp_open: ibv_alloc_pd/ibv_create_cq: %s\n", strerror(errno));
    return -1;
  }
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = s->cq;
  ia.recv_cq = s->cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = p->sq_depth;
  ia.cap.max_recv_wr = p->rq_depth;
  ia.cap.max_send_sge = p->max_sge;
  ia.cap.max_recv_sge = p->max_sge;
  s->qp = ibv_create_qp(s->pd, &ia);
  if (!s->qp) {
    printf("vp_open: ibv_create_qp: %s\n", strerror(errno));
    return -1;
  }
  s->self.qpn = s->qp->qp_num;
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  int rc = ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc) printf("vp_open: RESET->INIT: %s\n", strerror(rc));
  return rc ? -1 : 0;
}

int vp_connect(struct vp_side* s, const struct vp_params* p, const struct vp_conn* peer) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = p->mtu;
  a.dest_qp_num = peer->qpn;
  a.rq_psn = peer->psn;
  a.max_dest_rd_atomic = p->rd_atomic;
  a.min_rnr_timer = p->min_rnr_timer;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = peer->gid;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.dlid = peer->lid;
  a.ah_attr.port_num = 1;
  int rc = ibv_modify_qp(s->qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc) {
    printf("vp_connect: INIT->RTR: %s\n", strerror(rc));
    return -1;
  }
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = p->timeout;
  a.retry_cnt = p->retry_cnt;
  a.rnr_retry = p->rnr_retry;
  a.sq_psn = s->self.psn;
  a.max_rd_atomic = p->rd_atomic;
  rc = ibv_modify_qp(
      s->qp, &a,
      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc) printf("vp_connect: RTR->RTS: %s\n", strerror(rc));
  return rc ? -1 : 0;
}

void vp_close(struct vp_side* s) {
  if (s->qp) ibv_destroy_qp(s->qp);
  if (s->cq) ibv_destroy_cq(s->cq);
  if (s->pd) ibv_dealloc_pd(s->pd);
  if (s->ctx) ibv_close_device(s->ctx);
  memset(s, 0, sizeof *s);
}

double vp_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void vp_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

int vp_read_full(int fd, void* buf, size_t len, int ms) {
  double deadline = vp_now_ms() + ms;
  size_t got = 0;
  while (got < len) {
    int left = (int)(deadline - vp_now_ms());
    if (left <= 0) return -1;
    struct pollfd pfd = {fd, POLLIN, 0};
    int r = poll(&pfd, 1, left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    ssize_t n = read(fd, (uint8_t*)buf + got, len - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    got += (size_t)n;
  }
  return 0;
}

int vp_write_full(int fd, const void* buf, size_t len) { return write(fd, buf, len) == (ssize_t)len ? 0 : -1; }

int vp_poll(struct ibv_cq* cq, struct ibv_wc* wc, int timeout_ms) {
  double deadline = vp_now_ms() + timeout_ms;
  for (;;) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n != 0) return n < 0 ? -1 : 1;
    if (vp_now_ms() > deadline) return 0;
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
}

uint64_t vp_rand(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
