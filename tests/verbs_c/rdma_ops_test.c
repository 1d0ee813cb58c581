/*
 * rdma_ops_test: RC data-path and error semantics through the public libibverbs C API.
 *
 * Written against rdma-core's <infiniband/verbs.h> only, linked with -libverbs and run as
 *   uroce run rdma_ops_test [CASE...]      (no CASE: run every case; --list: print names)
 * so the same program also runs on real RDMA hardware / rxe.
 *
 * One process opens the first device twice: two device contexts, each with its own PD and
 * (under uroce) its own UDP port, i.e. its own LID. Every case builds a fresh pair of RC QPs,
 * QP A on context 0 and QP B on context 1, connected with the ordinary
 * RESET->INIT->RTR->RTS sequence (RoCE: is_global=1, dgid = GID 0 of the peer context,
 * dlid = the peer context's port LID).
 *
 * Data checks: every byte of every buffer involved is compared with a shadow copy of what it
 * must contain; bytes outside the target ranges (guards between and around the regions,
 * which lie inside the registered MRs where possible) must be untouched. Patterns are
 * pseudo-random with fixed seeds.
 *
 * Each case prints what it checked ("ok" / "FAIL" lines), the program ends with
 * "rdma_ops_test: N passed, M failed" and exits non-zero if any case failed.
 */
#define _POSIX_C_SOURCE 200809L

#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------------------ */
/* Reporting                                                                            */

static int g_case_failures; /* failed checks in the current case */

static void ok(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("  ok    ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
}

static void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("  FAIL  ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
  g_case_failures++;
}

/* Records a check: prints "ok ..." or "FAIL ..." with the same description. */
#define CHECK(cond, ...) \
  do {                   \
    if (cond)            \
      ok(__VA_ARGS__);   \
    else                 \
      fail(__VA_ARGS__); \
  } while (0)

static const char* wc_status(enum ibv_wc_status s) { return ibv_wc_status_str(s); }

static const char* wc_opcode_name(int op) {
  switch (op) {
    case IBV_WC_SEND:
      return "IBV_WC_SEND";
    case IBV_WC_RDMA_WRITE:
      return "IBV_WC_RDMA_WRITE";
    case IBV_WC_RDMA_READ:
      return "IBV_WC_RDMA_READ";
    case IBV_WC_COMP_SWAP:
      return "IBV_WC_COMP_SWAP";
    case IBV_WC_FETCH_ADD:
      return "IBV_WC_FETCH_ADD";
    case IBV_WC_BIND_MW:
      return "IBV_WC_BIND_MW";
    case IBV_WC_LOCAL_INV:
      return "IBV_WC_LOCAL_INV";
    case IBV_WC_RECV:
      return "IBV_WC_RECV";
    case IBV_WC_RECV_RDMA_WITH_IMM:
      return "IBV_WC_RECV_RDMA_WITH_IMM";
    default:
      return "(other)";
  }
}

static const char* qp_state_name(enum ibv_qp_state s) {
  switch (s) {
    case IBV_QPS_RESET:
      return "RESET";
    case IBV_QPS_INIT:
      return "INIT";
    case IBV_QPS_RTR:
      return "RTR";
    case IBV_QPS_RTS:
      return "RTS";
    case IBV_QPS_SQD:
      return "SQD";
    case IBV_QPS_SQE:
      return "SQE";
    case IBV_QPS_ERR:
      return "ERR";
    default:
      return "(unknown)";
  }
}

static const char* err_name(int e) {
  switch (e) {
    case 0:
      return "0";
    case EINVAL:
      return "EINVAL";
    case ENOMEM:
      return "ENOMEM";
    case EOPNOTSUPP:
      return "EOPNOTSUPP";
    case EPERM:
      return "EPERM";
    case EACCES:
      return "EACCES";
    case EBUSY:
      return "EBUSY";
    case EAGAIN:
      return "EAGAIN";
    case ENOSPC:
      return "ENOSPC";
    default:
      return strerror(e);
  }
}

/* ------------------------------------------------------------------------------------ */
/* Time, random                                                                         */

#ifndef POLL_TIMEOUT_MS
#define POLL_TIMEOUT_MS 10000 /* every expected completion must arrive within 10 s */
#endif

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static uint64_t rng_next(uint64_t* s) { /* splitmix64 */
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void fill_random(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t s = seed;
  size_t i = 0;
  while (i < n) {
    uint64_t v = rng_next(&s);
    for (int k = 0; k < 8 && i < n; k++, i++) p[i] = (uint8_t)(v >> (8 * k));
  }
}

/* ------------------------------------------------------------------------------------ */
/* Devices                                                                              */

static struct ibv_context* g_ctx[2];
static struct ibv_pd* g_pd[2];
static uint16_t g_lid[2];
static union ibv_gid g_gid[2];
static struct ibv_device_attr g_dev_attr;

static void gid_str(const union ibv_gid* g, char* out, size_t n) {
  if (!inet_ntop(AF_INET6, g->raw, out, (socklen_t)n)) snprintf(out, n, "?");
}

static int open_devices(void) {
  int num = 0;
  struct ibv_device** list = ibv_get_device_list(&num);
  if (!list || num < 1) {
    printf("setup: no RDMA device (ibv_get_device_list: %d devices, errno %d)\n", num, errno);
    if (list) ibv_free_device_list(list);
    return -1;
  }
  printf("setup: device %s, opened twice (two contexts)\n", ibv_get_device_name(list[0]));
  for (int i = 0; i < 2; i++) {
    g_ctx[i] = ibv_open_device(list[0]);
    if (!g_ctx[i]) {
      printf("setup: ibv_open_device #%d failed: %s\n", i, strerror(errno));
      ibv_free_device_list(list);
      return -1;
    }
  }
  ibv_free_device_list(list);
  if (ibv_query_device(g_ctx[0], &g_dev_attr)) {
    printf("setup: ibv_query_device failed\n");
    return -1;
  }
  for (int i = 0; i < 2; i++) {
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof pa);
    int rc = ibv_query_port(g_ctx[i], 1, &pa);
    if (rc) {
      printf("setup: ibv_query_port(ctx%d) = %d\n", i, rc);
      return -1;
    }
    rc = ibv_query_gid(g_ctx[i], 1, 0, &g_gid[i]);
    if (rc) {
      printf("setup: ibv_query_gid(ctx%d, 1, 0) = %d\n", i, rc);
      return -1;
    }
    g_lid[i] = pa.lid;
    g_pd[i] = ibv_alloc_pd(g_ctx[i]);
    if (!g_pd[i]) {
      printf("setup: ibv_alloc_pd(ctx%d) failed: %s\n", i, strerror(errno));
      return -1;
    }
    char gs[INET6_ADDRSTRLEN];
    gid_str(&g_gid[i], gs, sizeof gs);
    printf("setup: ctx%d port 1: state %d, active_mtu %d, max_mtu %d, lid %u, gid[0] %s\n", i, (int)pa.state,
           128 << pa.active_mtu, 128 << pa.max_mtu, (unsigned)pa.lid, gs);
  }
  if (g_lid[0] == g_lid[1]) printf("setup: note: both contexts report LID %u\n", (unsigned)g_lid[0]);
  return 0;
}

static void close_devices(void) {
  for (int i = 0; i < 2; i++) {
    if (g_pd[i]) ibv_dealloc_pd(g_pd[i]);
    if (g_ctx[i]) ibv_close_device(g_ctx[i]);
  }
}

/* ------------------------------------------------------------------------------------ */
/* QP pairs                                                                             */

#define A 0
#define B 1

/* PSNs: A's requests start just below the 24-bit wrap, so multi-packet messages wrap. */
static const uint32_t g_sq_psn[2] = {0xFFFF80, 0x000ABC};

struct pair {
  struct ibv_cq *scq[2], *rcq[2];
  struct ibv_qp* qp[2];
  struct ibv_qp_cap cap[2]; /* as granted by ibv_create_qp */
};

static const struct ibv_qp_cap k_default_cap = {
    .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 4, .max_recv_sge = 4, .max_inline_data = 0};

static void pair_destroy(struct pair* p) {
  for (int i = 0; i < 2; i++) {
    if (p->qp[i] && ibv_destroy_qp(p->qp[i])) fail("ibv_destroy_qp(QP %c)", 'A' + i);
    if (p->scq[i] && ibv_destroy_cq(p->scq[i])) fail("ibv_destroy_cq(send CQ %c)", 'A' + i);
    if (p->rcq[i] && ibv_destroy_cq(p->rcq[i])) fail("ibv_destroy_cq(recv CQ %c)", 'A' + i);
  }
  memset(p, 0, sizeof *p);
}

/* Creates CQs and QPs (state RESET). cap_a: capabilities requested for QP A (NULL: default). */
static int pair_create(struct pair* p, const struct ibv_qp_cap* cap_a) {
  memset(p, 0, sizeof *p);
  for (int i = 0; i < 2; i++) {
    p->scq[i] = ibv_create_cq(g_ctx[i], 1024, NULL, NULL, 0);
    p->rcq[i] = ibv_create_cq(g_ctx[i], 1024, NULL, NULL, 0);
    if (!p->scq[i] || !p->rcq[i]) {
      fail("ibv_create_cq on ctx%d: %s", i, strerror(errno));
      pair_destroy(p);
      return -1;
    }
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = p->scq[i];
    ia.recv_cq = p->rcq[i];
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = 0;
    ia.cap = (i == A && cap_a) ? *cap_a : k_default_cap;
    p->qp[i] = ibv_create_qp(g_pd[i], &ia);
    if (!p->qp[i]) {
      fail("ibv_create_qp(QP %c) failed: %s", 'A' + i, strerror(errno));
      pair_destroy(p);
      return -1;
    }
    p->cap[i] = ia.cap;
  }
  return 0;
}

#define INIT_MASK (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
#define RTR_MASK                                                                                              \
  (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | \
   IBV_QP_MIN_RNR_TIMER)
#define RTS_MASK \
  (IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)

static void init_attr(struct ibv_qp_attr* a) {
  memset(a, 0, sizeof *a);
  a->qp_state = IBV_QPS_INIT;
  a->pkey_index = 0;
  a->port_num = 1;
  a->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
}

/* RTR attributes for a QP on context `self` talking to QP `peer_qpn` on context `peer`. */
static void rtr_attr(struct ibv_qp_attr* a, int peer, uint32_t peer_qpn, enum ibv_mtu mtu) {
  memset(a, 0, sizeof *a);
  a->qp_state = IBV_QPS_RTR;
  a->path_mtu = mtu;
  a->dest_qp_num = peer_qpn;
  a->rq_psn = g_sq_psn[peer];
  a->max_dest_rd_atomic = 1;
  a->min_rnr_timer = 12;
  a->ah_attr.is_global = 1;
  a->ah_attr.grh.dgid = g_gid[peer];
  a->ah_attr.grh.sgid_index = 0;
  a->ah_attr.grh.hop_limit = 64;
  a->ah_attr.grh.flow_label = 0;
  a->ah_attr.grh.traffic_class = 0;
  a->ah_attr.dlid = g_lid[peer];
  a->ah_attr.sl = 0;
  a->ah_attr.src_path_bits = 0;
  a->ah_attr.port_num = 1;
}

static void rts_attr(struct ibv_qp_attr* a, int self) {
  memset(a, 0, sizeof *a);
  a->qp_state = IBV_QPS_RTS;
  a->timeout = 14;
  a->retry_cnt = 7;
  a->rnr_retry = 7;
  a->sq_psn = g_sq_psn[self];
  a->max_rd_atomic = 1;
}

static int qp_init(struct pair* p, int i) {
  struct ibv_qp_attr a;
  init_attr(&a);
  int rc = ibv_modify_qp(p->qp[i], &a, INIT_MASK);
  if (rc) fail("ibv_modify_qp(QP %c, RESET->INIT) = %s", 'A' + i, err_name(rc));
  return rc;
}

static int qp_rtr(struct pair* p, int i, enum ibv_mtu mtu) {
  struct ibv_qp_attr a;
  rtr_attr(&a, 1 - i, p->qp[1 - i]->qp_num, mtu);
  int rc = ibv_modify_qp(p->qp[i], &a, RTR_MASK);
  if (rc) fail("ibv_modify_qp(QP %c, INIT->RTR) = %s", 'A' + i, err_name(rc));
  return rc;
}

static int qp_rts(struct pair* p, int i) {
  struct ibv_qp_attr a;
  rts_attr(&a, i);
  int rc = ibv_modify_qp(p->qp[i], &a, RTS_MASK);
  if (rc) fail("ibv_modify_qp(QP %c, RTR->RTS) = %s", 'A' + i, err_name(rc));
  return rc;
}

static int pair_connect(struct pair* p, enum ibv_mtu mtu) {
  for (int i = 0; i < 2; i++)
    if (qp_init(p, i)) return -1;
  for (int i = 0; i < 2; i++)
    if (qp_rtr(p, i, mtu)) return -1;
  for (int i = 0; i < 2; i++)
    if (qp_rts(p, i)) return -1;
  return 0;
}

/* Fresh connected pair with default capabilities. */
static int pair_setup(struct pair* p, enum ibv_mtu mtu) {
  if (pair_create(p, NULL)) return -1;
  if (pair_connect(p, mtu)) {
    pair_destroy(p);
    return -1;
  }
  ok("QP A 0x%06x (ctx0, lid %u) <-> QP B 0x%06x (ctx1, lid %u) connected, path_mtu %d", p->qp[A]->qp_num,
     (unsigned)g_lid[A], p->qp[B]->qp_num, (unsigned)g_lid[B], 128 << mtu);
  return 0;
}

static enum ibv_qp_state qp_state(struct ibv_qp* qp) {
  struct ibv_qp_attr a;
  struct ibv_qp_init_attr ia;
  memset(&a, 0, sizeof a);
  if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia)) return (enum ibv_qp_state) - 1;
  return a.qp_state;
}

static void check_qp_state(struct ibv_qp* qp, const char* name, enum ibv_qp_state want) {
  enum ibv_qp_state s = qp_state(qp);
  CHECK(s == want, "%s state is %s (expected %s)", name, qp_state_name(s), qp_state_name(want));
}

/* ------------------------------------------------------------------------------------ */
/* Completions                                                                          */

/* Polls one completion; 1 = got it, 0 = timeout, -1 = ibv_poll_cq error. */
static int poll_one(struct ibv_cq* cq, struct ibv_wc* wc, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  for (;;) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n != 0) return n < 0 ? -1 : 1;
    if (now_ms() > deadline) return 0;
    sleep_us(20);
  }
}

#define ANY -1

/* Expects the next completion on cq: status, wr_id, qp_num always; opcode and byte_len
 * unless ANY (they are undefined for error completions). Returns 1 if it matched. */
static int expect_wc(struct ibv_cq* cq, const char* what, enum ibv_wc_status status, uint64_t wr_id, uint32_t qp_num,
                     int opcode, long long byte_len, struct ibv_wc* out) {
  struct ibv_wc wc;
  memset(&wc, 0, sizeof wc);
  int rc = poll_one(cq, &wc, POLL_TIMEOUT_MS);
  if (rc == 0) {
    fail("%s: no completion within %d ms (expected %s, wr_id 0x%" PRIx64 ")", what, POLL_TIMEOUT_MS, wc_status(status),
         wr_id);
    return 0;
  }
  if (rc < 0) {
    fail("%s: ibv_poll_cq returned an error", what);
    return 0;
  }
  if (out) *out = wc;
  int good = 1;
  if (wc.status != status) {
    fail("%s: status %s (%d), expected %s (%d) [wr_id 0x%" PRIx64 ", vendor_err 0x%x]", what, wc_status(wc.status),
         (int)wc.status, wc_status(status), (int)status, wc.wr_id, wc.vendor_err);
    good = 0;
  }
  if (wc.wr_id != wr_id) {
    fail("%s: wr_id 0x%" PRIx64 ", expected 0x%" PRIx64, what, wc.wr_id, wr_id);
    good = 0;
  }
  if (wc.qp_num != qp_num) {
    fail("%s: qp_num 0x%x, expected 0x%x", what, wc.qp_num, qp_num);
    good = 0;
  }
  if (opcode != ANY && (int)wc.opcode != opcode) {
    fail("%s: opcode %s (%d), expected %s (%d)", what, wc_opcode_name(wc.opcode), (int)wc.opcode,
         wc_opcode_name(opcode), opcode);
    good = 0;
  }
  if (byte_len != ANY && (long long)wc.byte_len != byte_len) {
    fail("%s: byte_len %u, expected %lld", what, wc.byte_len, byte_len);
    good = 0;
  }
  if (good)
    ok("%s: %s, wr_id 0x%" PRIx64 "%s%s%s", what, wc_status(status), wr_id, opcode != ANY ? ", opcode " : "",
       opcode != ANY ? wc_opcode_name(opcode) : "", byte_len != ANY ? ", byte_len as expected" : "");
  return good;
}

/* No completion may appear on cq within wait_ms. */
static void expect_cq_empty(struct ibv_cq* cq, const char* what, int wait_ms) {
  struct ibv_wc wc;
  int rc = poll_one(cq, &wc, wait_ms);
  if (rc == 0)
    ok("%s: no completion (as expected)", what);
  else if (rc < 0)
    fail("%s: ibv_poll_cq returned an error", what);
  else
    fail("%s: unexpected completion: status %s, opcode %s, wr_id 0x%" PRIx64 ", byte_len %u", what,
         wc_status(wc.status), wc_opcode_name(wc.opcode), wc.wr_id, wc.byte_len);
}

/* ------------------------------------------------------------------------------------ */
/* Buffers with shadow copies                                                           */

#define GUARD 61 /* guard bytes around and between regions (odd: unaligned addresses) */
#define MAX_RANGES 4

struct mbuf {
  uint8_t* p;      /* the memory the device sees */
  uint8_t* expect; /* what it must contain */
  size_t size;
  size_t nrange; /* ranges expected to change (for reporting) */
  size_t roff[MAX_RANGES], rlen[MAX_RANGES];
};

static int mbuf_init(struct mbuf* b, size_t size, uint64_t seed) {
  memset(b, 0, sizeof *b);
  b->p = malloc(size);
  b->expect = malloc(size);
  if (!b->p || !b->expect) {
    free(b->p);
    free(b->expect);
    fail("malloc(%zu) failed", size);
    return -1;
  }
  b->size = size;
  fill_random(b->p, size, seed);
  memcpy(b->expect, b->p, size);
  return 0;
}

static void mbuf_free(struct mbuf* b) {
  free(b->p);
  free(b->expect);
  memset(b, 0, sizeof *b);
}

/* Declares that [off, off+len) must end up holding src. */
static void mbuf_expect(struct mbuf* b, size_t off, const uint8_t* src, size_t len) {
  memcpy(b->expect + off, src, len);
  if (b->nrange < MAX_RANGES) {
    b->roff[b->nrange] = off;
    b->rlen[b->nrange] = len;
    b->nrange++;
  }
}

static int in_ranges(const struct mbuf* b, size_t off) {
  for (size_t i = 0; i < b->nrange; i++)
    if (off >= b->roff[i] && off < b->roff[i] + b->rlen[i]) return 1;
  return 0;
}

/* Compares the buffer with its shadow; reports data bytes and untouched bytes separately. */
static int mbuf_verify(const struct mbuf* b, const char* what) {
  size_t data_total = 0, data_bad = 0, other_bad = 0;
  size_t first_data = (size_t)-1, first_other = (size_t)-1;
  for (size_t i = 0; i < b->nrange; i++) data_total += b->rlen[i];
  for (size_t off = 0; off < b->size; off++) {
    if (b->p[off] == b->expect[off]) continue;
    if (in_ranges(b, off)) {
      if (!data_bad++) first_data = off;
    } else {
      if (!other_bad++) first_other = off;
    }
  }
  size_t other_total = b->size - data_total;
  if (data_bad)
    fail("%s: %zu of %zu data bytes wrong (first at offset %zu: 0x%02x, expected 0x%02x)", what, data_bad, data_total,
         first_data, b->p[first_data], b->expect[first_data]);
  if (other_bad)
    fail(
        "%s: %zu of %zu bytes outside the target ranges modified (first at offset %zu: 0x%02x, "
        "was 0x%02x)",
        what, other_bad, other_total, first_other, b->p[first_other], b->expect[first_other]);
  if (!data_bad && !other_bad) {
    if (data_total)
      ok("%s: all %zu data bytes correct, %zu bytes around them untouched", what, data_total, other_total);
    else
      ok("%s: all %zu bytes untouched", what, b->size);
  }
  return !data_bad && !other_bad;
}

/* Up to three regions of an mbuf, each with its own MR, separated by GUARD bytes. */
struct sgl {
  int n;
  size_t off[3], len[3];
  struct ibv_mr* mr[3];
  struct ibv_sge sge[3];
};

/* Lays out n regions with guards: returns the buffer size needed. */
static size_t sgl_layout(struct sgl* s, int n, const size_t* len) {
  memset(s, 0, sizeof *s);
  s->n = n;
  size_t pos = GUARD;
  for (int i = 0; i < n; i++) {
    s->off[i] = pos;
    s->len[i] = len[i];
    pos += len[i] + GUARD;
  }
  return pos;
}

static int sgl_register(struct sgl* s, struct ibv_pd* pd, struct mbuf* b, int access, const char* what) {
  for (int i = 0; i < s->n; i++) {
    s->mr[i] = ibv_reg_mr(pd, b->p + s->off[i], s->len[i], access);
    if (!s->mr[i]) {
      fail("%s: ibv_reg_mr(region %d, %zu bytes, access 0x%x) failed: %s", what, i, s->len[i], access, strerror(errno));
      return -1;
    }
    s->sge[i].addr = (uintptr_t)(b->p + s->off[i]);
    s->sge[i].length = (uint32_t)s->len[i];
    s->sge[i].lkey = s->mr[i]->lkey;
  }
  return 0;
}

static void sgl_deregister(struct sgl* s) {
  for (int i = 0; i < s->n; i++)
    if (s->mr[i]) {
      if (ibv_dereg_mr(s->mr[i])) fail("ibv_dereg_mr failed");
      s->mr[i] = NULL;
    }
}

/* Concatenates the regions' current contents (a gather) into out. */
static void sgl_gather(const struct sgl* s, const struct mbuf* b, uint8_t* out) {
  for (int i = 0; i < s->n; i++) {
    memcpy(out, b->p + s->off[i], s->len[i]);
    out += s->len[i];
  }
}

/* Declares that msg (len bytes) is scattered over the regions in order. */
static void sgl_expect_scatter(const struct sgl* s, struct mbuf* b, const uint8_t* msg, size_t len) {
  for (int i = 0; i < s->n && len; i++) {
    size_t k = len < s->len[i] ? len : s->len[i];
    mbuf_expect(b, s->off[i], msg, k);
    msg += k;
    len -= k;
  }
}

static void describe_sgl(const struct sgl* s, char* out, size_t n) {
  int w = snprintf(out, n, "%d SGE%s [", s->n, s->n == 1 ? "" : "s");
  for (int i = 0; i < s->n && w > 0 && (size_t)w < n; i++)
    w += snprintf(out + w, n - (size_t)w, "%s%zu", i ? " + " : "", s->len[i]);
  if (w > 0 && (size_t)w < n) snprintf(out + w, n - (size_t)w, "]");
}

/* Gather split of a message over three unequal regions (one region for tiny messages: a
 * 1-byte message cannot be split into three non-empty SGEs, and a zero-length SGE has
 * provider-specific meaning, e.g. 2 GiB on mlx5). */
static int split_gather(size_t L, size_t* len) {
  if (L < 16) {
    len[0] = L;
    return 1;
  }
  len[0] = L / 4 + 1;
  len[1] = L / 2 - 3;
  len[2] = L - len[0] - len[1];
  return 3;
}

/* A different three-way split (boundaries do not line up with the gather side); extra
 * bytes of room at the end of the last region. */
static int split_scatter(size_t L, size_t* len, size_t extra, int allow_single) {
  if (L < 16) {
    if (allow_single && !extra) {
      len[0] = L;
      return 1;
    }
    len[0] = L;
    len[1] = 5;
    len[2] = 9 + extra;
    return 3;
  }
  len[0] = L / 3 + 7;
  len[1] = L / 5 + 1;
  len[2] = L - len[0] - len[1] + extra;
  return 3;
}

static struct ibv_mr* reg_mr_or_fail(struct ibv_pd* pd, void* addr, size_t len, int access, const char* what) {
  struct ibv_mr* mr = ibv_reg_mr(pd, addr, len, access);
  if (!mr) fail("%s: ibv_reg_mr(%zu bytes, access 0x%x) failed: %s", what, len, access, strerror(errno));
  return mr;
}

static void dereg(struct ibv_mr** mr) {
  if (*mr) {
    if (ibv_dereg_mr(*mr)) fail("ibv_dereg_mr failed");
    *mr = NULL;
  }
}

static int post_send_checked(struct ibv_qp* qp, struct ibv_send_wr* wr, const char* what) {
  struct ibv_send_wr* bad = NULL;
  int rc = ibv_post_send(qp, wr, &bad);
  if (rc) fail("%s: ibv_post_send = %s", what, err_name(rc));
  return rc;
}

static int post_recv_checked(struct ibv_qp* qp, struct ibv_recv_wr* wr, const char* what) {
  struct ibv_recv_wr* bad = NULL;
  int rc = ibv_post_recv(qp, wr, &bad);
  if (rc) fail("%s: ibv_post_recv = %s", what, err_name(rc));
  return rc;
}

/* ------------------------------------------------------------------------------------ */
/* Positive transfers                                                                   */

enum op { OP_WRITE, OP_WRITE_IMM, OP_READ, OP_SEND };
static const char* const k_op_name[] = {"write", "write_imm", "read", "send"};

struct xfer {
  enum op op;
  size_t len;
  enum ibv_mtu mtu;
};

#define IMM_VALUE 0x8badf00du

/*
 * WRITE / WRITE_WITH_IMM: A gathers from three regions (three MRs, no access flags = local
 *   read only) into B's buffer at offset GUARD; B's MR covers the whole buffer, guards
 *   included. WRITE_WITH_IMM consumes a receive on B whose buffer must stay untouched; a
 *   plain WRITE must not consume B's posted receive.
 * READ: A reads B's buffer at offset GUARD (MR: REMOTE_READ only) into three local regions.
 * SEND: A gathers from three regions; B receives into three regions whose total is 100 bytes
 *   larger than the message.
 */
static void case_transfer(const void* arg) {
  const struct xfer* x = arg;
  const size_t L = x->len;
  const uint64_t seed = 0x5EED0000ull + (uint64_t)x->op * 0x100 + L * 7 + (uint64_t)x->mtu;
  struct pair p;
  struct mbuf local, remote, rbuf; /* local: A's regions; remote: B's memory; rbuf: B's recv */
  struct sgl lsgl, rsgl;           /* A's gather/scatter list, B's receive scatter list */
  struct ibv_mr *remote_mr = NULL, *rbuf_mr = NULL;
  size_t lens[3];
  char desc[128];
  uint8_t* msg = NULL;

  memset(&local, 0, sizeof local);
  memset(&remote, 0, sizeof remote);
  memset(&rbuf, 0, sizeof rbuf);
  memset(&lsgl, 0, sizeof lsgl);
  memset(&rsgl, 0, sizeof rsgl);

  if (pair_setup(&p, x->mtu)) return;
  msg = malloc(L + 1);
  if (!msg) {
    fail("malloc");
    goto out;
  }

  /* A's side. */
  int n;
  if (x->op == OP_READ)
    n = split_scatter(L, lens, 0, 1);
  else
    n = split_gather(L, lens);
  if (mbuf_init(&local, sgl_layout(&lsgl, n, lens), seed + 1)) goto out;
  if (sgl_register(&lsgl, g_pd[A], &local, x->op == OP_READ ? IBV_ACCESS_LOCAL_WRITE : 0, "A regions")) goto out;
  describe_sgl(&lsgl, desc, sizeof desc);

  /* B's side. */
  if (x->op == OP_SEND) {
    size_t rl[3];
    int rn = split_scatter(L, rl, 100, 0);
    if (mbuf_init(&rbuf, sgl_layout(&rsgl, rn, rl), seed + 2)) goto out;
    if (sgl_register(&rsgl, g_pd[B], &rbuf, IBV_ACCESS_LOCAL_WRITE, "B receive regions")) goto out;
  } else {
    if (mbuf_init(&remote, L + 2 * GUARD, seed + 3)) goto out;
    int access = x->op == OP_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    remote_mr = reg_mr_or_fail(g_pd[B], remote.p, remote.size, access, "B buffer");
    if (!remote_mr) goto out;
    /* A receive on B: consumed by WRITE_WITH_IMM (buffer untouched), not by WRITE. */
    if (mbuf_init(&rbuf, 64, seed + 4)) goto out;
    rbuf_mr = reg_mr_or_fail(g_pd[B], rbuf.p, rbuf.size, IBV_ACCESS_LOCAL_WRITE, "B recv buffer");
    if (!rbuf_mr) goto out;
  }

  /* B posts its receive first. */
  const uint64_t recv_id = 0xB0000000ull + L, send_id = 0xA0000000ull + L;
  if (x->op != OP_READ) {
    struct ibv_sge one = {(uintptr_t)rbuf.p, (uint32_t)rbuf.size, rbuf_mr ? rbuf_mr->lkey : 0};
    struct ibv_recv_wr rwr;
    memset(&rwr, 0, sizeof rwr);
    rwr.wr_id = recv_id;
    if (x->op == OP_SEND) {
      rwr.sg_list = rsgl.sge;
      rwr.num_sge = rsgl.n;
    } else {
      rwr.sg_list = &one;
      rwr.num_sge = 1;
    }
    if (post_recv_checked(p.qp[B], &rwr, "B receive")) goto out;
  }

  /* A posts the operation. */
  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = send_id;
  wr.sg_list = lsgl.sge;
  wr.num_sge = lsgl.n;
  wr.send_flags = IBV_SEND_SIGNALED;
  switch (x->op) {
    case OP_WRITE:
      wr.opcode = IBV_WR_RDMA_WRITE;
      break;
    case OP_WRITE_IMM:
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr.imm_data = htonl(IMM_VALUE);
      break;
    case OP_READ:
      wr.opcode = IBV_WR_RDMA_READ;
      break;
    case OP_SEND:
      wr.opcode = IBV_WR_SEND;
      break;
  }
  if (x->op != OP_SEND) {
    wr.wr.rdma.remote_addr = (uintptr_t)(remote.p + GUARD);
    wr.wr.rdma.rkey = remote_mr->rkey;
  }
  printf("  ..    %s of %zu bytes, A %s %s\n", k_op_name[x->op], L, x->op == OP_READ ? "scatters into" : "gathers from",
         desc);

  /* The expected contents, computed before the transfer. */
  if (x->op == OP_READ) {
    sgl_expect_scatter(&lsgl, &local, remote.p + GUARD, L);
  } else {
    sgl_gather(&lsgl, &local, msg);
    if (x->op == OP_SEND)
      sgl_expect_scatter(&rsgl, &rbuf, msg, L);
    else
      mbuf_expect(&remote, GUARD, msg, L);
  }

  if (post_send_checked(p.qp[A], &wr, "A post")) goto out;

  static const int k_wc_op[] = {IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_SEND};
  expect_wc(p.scq[A], "A send completion", IBV_WC_SUCCESS, send_id, p.qp[A]->qp_num, k_wc_op[x->op],
            x->op == OP_READ ? (long long)L : ANY, NULL);

  if (x->op == OP_SEND || x->op == OP_WRITE_IMM) {
    struct ibv_wc wc;
    int opc = x->op == OP_SEND ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM;
    if (expect_wc(p.rcq[B], "B receive completion", IBV_WC_SUCCESS, recv_id, p.qp[B]->qp_num, opc, (long long)L, &wc)) {
      if (x->op == OP_WRITE_IMM) {
        CHECK(wc.wc_flags & IBV_WC_WITH_IMM, "B receive completion has IBV_WC_WITH_IMM");
        CHECK(wc.imm_data == htonl(IMM_VALUE), "B imm_data 0x%08x (network order), expected 0x%08x", ntohl(wc.imm_data),
              IMM_VALUE);
      } else {
        CHECK(!(wc.wc_flags & IBV_WC_WITH_IMM), "B receive completion has no IBV_WC_WITH_IMM");
      }
    }
  } else if (x->op == OP_WRITE) {
    expect_cq_empty(p.rcq[B], "B receive CQ after a plain WRITE", 100);
  }
  expect_cq_empty(p.scq[A], "A send CQ (no extra completion)", 0);

  /* Every byte. */
  if (x->op == OP_READ) {
    mbuf_verify(&local, "A scatter regions (destination)");
    mbuf_verify(&remote, "B buffer (source, unchanged)");
  } else {
    mbuf_verify(&local, "A gather regions (source, unchanged)");
    if (x->op == OP_SEND)
      mbuf_verify(&rbuf, "B receive regions (destination)");
    else {
      mbuf_verify(&remote, "B buffer (destination)");
      mbuf_verify(&rbuf, "B receive buffer (not written)");
    }
  }

out:
  pair_destroy(&p);
  sgl_deregister(&lsgl);
  sgl_deregister(&rsgl);
  dereg(&remote_mr);
  dereg(&rbuf_mr);
  mbuf_free(&local);
  mbuf_free(&remote);
  mbuf_free(&rbuf);
  free(msg);
}

/* ------------------------------------------------------------------------------------ */
/* Remote and local access errors                                                       */

enum rkey_fault { RF_BAD_RKEY, RF_PAST_END, RF_NO_ACCESS, RF_BAD_LKEY };

struct access_case {
  enum ibv_wr_opcode opcode; /* IBV_WR_RDMA_WRITE or IBV_WR_RDMA_READ */
  enum rkey_fault fault;
  enum ibv_wc_status expect;
};

#define ERR_MR_LEN 4096
#define ERR_XFER 16

/*
 * One RDMA WRITE or READ of 16 bytes that must fail. B's memory: a 4096-byte MR in the middle
 * of a larger buffer (so bytes just past the MR are real memory that can be checked). Nothing
 * may be written anywhere, on either side.
 */
static void case_access_error(const void* arg) {
  const struct access_case* c = arg;
  const int is_write = c->opcode == IBV_WR_RDMA_WRITE;
  struct pair p;
  struct mbuf lb, rb;
  struct ibv_mr *lmr = NULL, *rmr = NULL;
  memset(&lb, 0, sizeof lb);
  memset(&rb, 0, sizeof rb);

  if (pair_setup(&p, IBV_MTU_1024)) return;
  if (mbuf_init(&lb, ERR_XFER + 2 * GUARD, 0xE001) || mbuf_init(&rb, ERR_MR_LEN + 2 * GUARD, 0xE002)) goto out;
  lmr = reg_mr_or_fail(g_pd[A], lb.p, lb.size, IBV_ACCESS_LOCAL_WRITE, "A buffer");
  int raccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (c->fault == RF_NO_ACCESS)
    raccess = is_write ? (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ)
                       : (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  rmr = reg_mr_or_fail(g_pd[B], rb.p + GUARD, ERR_MR_LEN, raccess, "B MR");
  if (!lmr || !rmr) goto out;

  struct ibv_sge sge = {(uintptr_t)(lb.p + GUARD), ERR_XFER, lmr->lkey};
  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 0xE1;
  wr.opcode = c->opcode;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = (uintptr_t)(rb.p + GUARD + 128);
  wr.wr.rdma.rkey = rmr->rkey;
  switch (c->fault) {
    case RF_BAD_RKEY:
      wr.wr.rdma.rkey = rmr->rkey ^ 0x00A5A500u;
      printf("  ..    %s with R_Key 0x%x (the MR's is 0x%x)\n", is_write ? "WRITE" : "READ", wr.wr.rdma.rkey,
             rmr->rkey);
      break;
    case RF_PAST_END:
      wr.wr.rdma.remote_addr = (uintptr_t)(rb.p + GUARD + ERR_MR_LEN - ERR_XFER + 1);
      printf("  ..    %s of %d bytes ending one byte past the end of a %d-byte MR\n", is_write ? "WRITE" : "READ",
             ERR_XFER, ERR_MR_LEN);
      break;
    case RF_NO_ACCESS:
      printf("  ..    %s to an MR registered without %s\n", is_write ? "WRITE" : "READ",
             is_write ? "IBV_ACCESS_REMOTE_WRITE" : "IBV_ACCESS_REMOTE_READ");
      break;
    case RF_BAD_LKEY:
      sge.lkey = lmr->lkey ^ 0x00A5A500u;
      printf("  ..    %s with a local SGE L_Key 0x%x (the MR's is 0x%x)\n", is_write ? "WRITE" : "READ", sge.lkey,
             lmr->lkey);
      break;
  }
  if (post_send_checked(p.qp[A], &wr, "A post")) goto out;
  expect_wc(p.scq[A], "A send completion", c->expect, 0xE1, p.qp[A]->qp_num, ANY, ANY, NULL);
  check_qp_state(p.qp[A], "QP A (requester) after the error", IBV_QPS_ERR);
  if (c->fault == RF_BAD_LKEY) /* a local error: B saw no error (at most a valid READ) */
    check_qp_state(p.qp[B], "QP B (responder) after A's local protection error", IBV_QPS_RTS);
  else /* the responder NAKs (remote access error) and goes to ERR */
    check_qp_state(p.qp[B], "QP B (responder) after NAKing the access", IBV_QPS_ERR);
  expect_cq_empty(p.rcq[B], "B receive CQ", 50);
  mbuf_verify(&lb, "A buffer");
  mbuf_verify(&rb, "B buffer (MR and the bytes around it)");

out:
  pair_destroy(&p);
  dereg(&lmr);
  dereg(&rmr);
  mbuf_free(&lb);
  mbuf_free(&rb);
}

static const struct access_case k_write_bad_rkey = {IBV_WR_RDMA_WRITE, RF_BAD_RKEY, IBV_WC_REM_ACCESS_ERR};
static const struct access_case k_read_bad_rkey = {IBV_WR_RDMA_READ, RF_BAD_RKEY, IBV_WC_REM_ACCESS_ERR};
static const struct access_case k_write_past_end = {IBV_WR_RDMA_WRITE, RF_PAST_END, IBV_WC_REM_ACCESS_ERR};
static const struct access_case k_read_past_end = {IBV_WR_RDMA_READ, RF_PAST_END, IBV_WC_REM_ACCESS_ERR};
static const struct access_case k_write_no_access = {IBV_WR_RDMA_WRITE, RF_NO_ACCESS, IBV_WC_REM_ACCESS_ERR};
static const struct access_case k_read_no_access = {IBV_WR_RDMA_READ, RF_NO_ACCESS, IBV_WC_REM_ACCESS_ERR};
static const struct access_case k_write_bad_lkey = {IBV_WR_RDMA_WRITE, RF_BAD_LKEY, IBV_WC_LOC_PROT_ERR};
static const struct access_case k_read_bad_lkey = {IBV_WR_RDMA_READ, RF_BAD_LKEY, IBV_WC_LOC_PROT_ERR};

/* ------------------------------------------------------------------------------------ */
/* Receive too small; flush after an error                                              */

/*
 * B posts a 64-byte receive (three SGEs) and a second one; A sends 100 bytes, then 10 bytes.
 * B: LOC_LEN_ERR for the first receive, WR_FLUSH_ERR for the second.
 * A: REM_INV_REQ_ERR (NAK invalid request) for the first send, WR_FLUSH_ERR for the second.
 * Only the bytes covered by the first receive's SGEs may have been written on B.
 */
static void case_send_recv_too_small(const void* arg) {
  (void)arg;
  struct pair p;
  struct mbuf sb, rb;
  struct sgl rsgl;
  struct ibv_mr* smr = NULL;
  memset(&sb, 0, sizeof sb);
  memset(&rb, 0, sizeof rb);
  memset(&rsgl, 0, sizeof rsgl);

  if (pair_setup(&p, IBV_MTU_1024)) return;
  const size_t rl[4] = {20, 30, 14, 256}; /* receive 1: 20+30+14 = 64 bytes; receive 2: 256 */
  if (mbuf_init(&rb, sgl_layout(&rsgl, 3, rl), 0xF001) || mbuf_init(&sb, 256, 0xF002)) goto out;
  if (sgl_register(&rsgl, g_pd[B], &rb, IBV_ACCESS_LOCAL_WRITE, "B receive regions")) goto out;
  uint8_t* r2 = malloc(rl[3]);
  if (!r2) goto out;
  struct ibv_mr* r2mr = reg_mr_or_fail(g_pd[B], r2, rl[3], IBV_ACCESS_LOCAL_WRITE, "B receive 2");
  smr = reg_mr_or_fail(g_pd[A], sb.p, sb.size, 0, "A send buffer");
  if (!r2mr || !smr) {
    dereg(&r2mr);
    free(r2);
    goto out;
  }
  /* Receive 1's regions may hold anything (IBA: contents undefined after a length error),
   * but nothing around them may change. */
  for (int i = 0; i < 3; i++) {
    mbuf_expect(&rb, rsgl.off[i], rb.p + rsgl.off[i], rsgl.len[i]);
  }

  struct ibv_sge r2sge = {(uintptr_t)r2, (uint32_t)rl[3], r2mr->lkey};
  struct ibv_recv_wr rwr[2];
  memset(rwr, 0, sizeof rwr);
  rwr[0].wr_id = 0xB1;
  rwr[0].sg_list = rsgl.sge;
  rwr[0].num_sge = 3;
  rwr[0].next = &rwr[1];
  rwr[1].wr_id = 0xB2;
  rwr[1].sg_list = &r2sge;
  rwr[1].num_sge = 1;
  if (post_recv_checked(p.qp[B], rwr, "B receives")) goto out2;

  struct ibv_sge s1 = {(uintptr_t)sb.p, 100, smr->lkey}, s2 = {(uintptr_t)(sb.p + 128), 10, smr->lkey};
  struct ibv_send_wr swr[2];
  memset(swr, 0, sizeof swr);
  swr[0].wr_id = 0xA1;
  swr[0].opcode = IBV_WR_SEND;
  swr[0].sg_list = &s1;
  swr[0].num_sge = 1;
  swr[0].send_flags = IBV_SEND_SIGNALED;
  swr[0].next = &swr[1];
  swr[1] = swr[0];
  swr[1].wr_id = 0xA2;
  swr[1].sg_list = &s2;
  swr[1].next = NULL;
  printf("  ..    SEND 100 bytes into a 64-byte receive (3 SGEs), then SEND 10 bytes\n");
  if (post_send_checked(p.qp[A], swr, "A sends")) goto out2;

  expect_wc(p.rcq[B], "B receive 1 (too small)", IBV_WC_LOC_LEN_ERR, 0xB1, p.qp[B]->qp_num, ANY, ANY, NULL);
  expect_wc(p.scq[A], "A send 1 (NAK invalid request)", IBV_WC_REM_INV_REQ_ERR, 0xA1, p.qp[A]->qp_num, ANY, ANY, NULL);
  expect_wc(p.scq[A], "A send 2 (flushed)", IBV_WC_WR_FLUSH_ERR, 0xA2, p.qp[A]->qp_num, ANY, ANY, NULL);
  expect_wc(p.rcq[B], "B receive 2 (flushed)", IBV_WC_WR_FLUSH_ERR, 0xB2, p.qp[B]->qp_num, ANY, ANY, NULL);
  check_qp_state(p.qp[A], "QP A", IBV_QPS_ERR);
  check_qp_state(p.qp[B], "QP B", IBV_QPS_ERR);
  /* Data in receive 1's SGEs is undefined: compare only outside them. */
  for (int i = 0; i < 3; i++) memcpy(rb.expect + rsgl.off[i], rb.p + rsgl.off[i], rsgl.len[i]);
  mbuf_verify(&rb, "B receive 1 buffer outside its SGEs");
  mbuf_verify(&sb, "A send buffer (unchanged)");

out2:
  pair_destroy(&p); /* before deregistering the receive buffers */
  dereg(&r2mr);
  free(r2);
out:
  pair_destroy(&p);
  sgl_deregister(&rsgl);
  dereg(&smr);
  mbuf_free(&sb);
  mbuf_free(&rb);
}

/*
 * A posts [WRITE with a bad R_Key, good WRITE, SEND] (all signaled) with two receives posted
 * on A: the first fails with REM_ACCESS_ERR, every other outstanding WR of A - both send WRs
 * and both receives - completes with WR_FLUSH_ERR, in order. WRs posted to A while it is in
 * ERR are accepted and flushed too. The good WRITE must not reach B's memory.
 */
static void case_flush_after_error(const void* arg) {
  (void)arg;
  struct pair p;
  struct mbuf lb, rb;
  struct ibv_mr *lmr = NULL, *rmr = NULL;
  memset(&lb, 0, sizeof lb);
  memset(&rb, 0, sizeof rb);

  if (pair_setup(&p, IBV_MTU_1024)) return;
  if (mbuf_init(&lb, 4096, 0xF101) || mbuf_init(&rb, 4096, 0xF102)) goto out;
  lmr = reg_mr_or_fail(g_pd[A], lb.p, lb.size, IBV_ACCESS_LOCAL_WRITE, "A buffer");
  rmr = reg_mr_or_fail(g_pd[B], rb.p, rb.size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, "B buffer");
  if (!lmr || !rmr) goto out;

  /* Two receives on A (into the second half of A's buffer), one on B. */
  struct ibv_sge ar[2] = {{(uintptr_t)(lb.p + 2048), 512, lmr->lkey}, {(uintptr_t)(lb.p + 2560), 512, lmr->lkey}};
  struct ibv_recv_wr arw[2];
  memset(arw, 0, sizeof arw);
  arw[0].wr_id = 0xAA1;
  arw[0].sg_list = &ar[0];
  arw[0].num_sge = 1;
  arw[0].next = &arw[1];
  arw[1].wr_id = 0xAA2;
  arw[1].sg_list = &ar[1];
  arw[1].num_sge = 1;
  if (post_recv_checked(p.qp[A], arw, "A receives")) goto out;
  struct ibv_sge br = {(uintptr_t)(rb.p + 3072), 512, rmr->lkey};
  struct ibv_recv_wr brw;
  memset(&brw, 0, sizeof brw);
  brw.wr_id = 0xBB1;
  brw.sg_list = &br;
  brw.num_sge = 1;
  if (post_recv_checked(p.qp[B], &brw, "B receive")) goto out;

  struct ibv_sge s[3] = {{(uintptr_t)lb.p, 64, lmr->lkey},
                         {(uintptr_t)(lb.p + 64), 64, lmr->lkey},
                         {(uintptr_t)(lb.p + 128), 64, lmr->lkey}};
  struct ibv_send_wr w[3];
  memset(w, 0, sizeof w);
  for (int i = 0; i < 3; i++) {
    w[i].wr_id = 0xA01 + (uint64_t)i;
    w[i].sg_list = &s[i];
    w[i].num_sge = 1;
    w[i].send_flags = IBV_SEND_SIGNALED;
    w[i].next = i < 2 ? &w[i + 1] : NULL;
  }
  w[0].opcode = IBV_WR_RDMA_WRITE;
  w[0].wr.rdma.remote_addr = (uintptr_t)rb.p;
  w[0].wr.rdma.rkey = rmr->rkey ^ 0x00A5A500u;
  w[1].opcode = IBV_WR_RDMA_WRITE;
  w[1].wr.rdma.remote_addr = (uintptr_t)(rb.p + 1024);
  w[1].wr.rdma.rkey = rmr->rkey;
  w[2].opcode = IBV_WR_SEND;
  printf("  ..    A posts [WRITE bad R_Key, WRITE, SEND]; 2 receives posted on A\n");
  if (post_send_checked(p.qp[A], w, "A sends")) goto out;

  expect_wc(p.scq[A], "A WR 1 (bad R_Key)", IBV_WC_REM_ACCESS_ERR, 0xA01, p.qp[A]->qp_num, ANY, ANY, NULL);
  expect_wc(p.scq[A], "A WR 2 (flushed)", IBV_WC_WR_FLUSH_ERR, 0xA02, p.qp[A]->qp_num, ANY, ANY, NULL);
  expect_wc(p.scq[A], "A WR 3 (flushed)", IBV_WC_WR_FLUSH_ERR, 0xA03, p.qp[A]->qp_num, ANY, ANY, NULL);
  expect_wc(p.rcq[A], "A receive 1 (flushed)", IBV_WC_WR_FLUSH_ERR, 0xAA1, p.qp[A]->qp_num, ANY, ANY, NULL);
  expect_wc(p.rcq[A], "A receive 2 (flushed)", IBV_WC_WR_FLUSH_ERR, 0xAA2, p.qp[A]->qp_num, ANY, ANY, NULL);
  check_qp_state(p.qp[A], "QP A", IBV_QPS_ERR);

  /* Posting to a QP in ERR: accepted, completed with WR_FLUSH_ERR. */
  struct ibv_send_wr late = w[1];
  late.wr_id = 0xA04;
  late.next = NULL;
  struct ibv_send_wr* bad = NULL;
  int rc = ibv_post_send(p.qp[A], &late, &bad);
  CHECK(rc == 0, "ibv_post_send on QP A in ERR returns %s (expected 0)", err_name(rc));
  if (rc == 0)
    expect_wc(p.scq[A], "A WR 4 posted in ERR (flushed)", IBV_WC_WR_FLUSH_ERR, 0xA04, p.qp[A]->qp_num, ANY, ANY, NULL);
  struct ibv_recv_wr late_r = arw[0];
  late_r.wr_id = 0xAA3;
  late_r.next = NULL;
  struct ibv_recv_wr* bad_r = NULL;
  rc = ibv_post_recv(p.qp[A], &late_r, &bad_r);
  CHECK(rc == 0, "ibv_post_recv on QP A in ERR returns %s (expected 0)", err_name(rc));
  if (rc == 0)
    expect_wc(p.rcq[A], "A receive 3 posted in ERR (flushed)", IBV_WC_WR_FLUSH_ERR, 0xAA3, p.qp[A]->qp_num, ANY, ANY,
              NULL);
  expect_cq_empty(p.scq[A], "A send CQ (nothing else)", 50);
  /* B (the responder) moved to ERR when it NAKed the bad R_Key: its receive is flushed,
   * so the SEND was never executed. */
  expect_wc(p.rcq[B], "B receive (flushed: responder in ERR, SEND not executed)", IBV_WC_WR_FLUSH_ERR, 0xBB1,
            p.qp[B]->qp_num, ANY, ANY, NULL);
  check_qp_state(p.qp[B], "QP B (responder) after NAKing the bad R_Key", IBV_QPS_ERR);
  mbuf_verify(&rb, "B buffer (neither WRITE executed)");
  mbuf_verify(&lb, "A buffer (receives flushed, nothing written)");

out:
  pair_destroy(&p);
  dereg(&lmr);
  dereg(&rmr);
  mbuf_free(&lb);
  mbuf_free(&rb);
}

/* ------------------------------------------------------------------------------------ */
/* Immediate errors of ibv_post_send / ibv_modify_qp / ibv_reg_mr                       */

/* ibv_post_send on a QP in RESET, INIT and RTR: EINVAL, *bad_wr = the WR, no completion. */
static void case_post_send_bad_state(const void* arg) {
  (void)arg;
  struct pair p;
  struct mbuf lb, rb;
  struct ibv_mr *lmr = NULL, *rmr = NULL;
  memset(&lb, 0, sizeof lb);
  memset(&rb, 0, sizeof rb);
  if (pair_create(&p, NULL)) return;
  if (mbuf_init(&lb, 256, 0xF201) || mbuf_init(&rb, 256, 0xF202)) goto out;
  lmr = reg_mr_or_fail(g_pd[A], lb.p, lb.size, IBV_ACCESS_LOCAL_WRITE, "A buffer");
  rmr = reg_mr_or_fail(g_pd[B], rb.p, rb.size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, "B buffer");
  if (!lmr || !rmr) goto out;

  struct ibv_sge sge = {(uintptr_t)lb.p, 32, lmr->lkey};
  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 0x5001;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = (uintptr_t)(rb.p + 64);
  wr.wr.rdma.rkey = rmr->rkey;

  for (int step = 0; step < 3; step++) {
    enum ibv_qp_state st = step == 0 ? IBV_QPS_RESET : step == 1 ? IBV_QPS_INIT : IBV_QPS_RTR;
    if (step == 1 && (qp_init(&p, A) || qp_init(&p, B))) goto out;
    if (step == 2 && (qp_rtr(&p, A, IBV_MTU_1024) || qp_rtr(&p, B, IBV_MTU_1024) || qp_rts(&p, B))) goto out;
    check_qp_state(p.qp[A], "QP A", st);
    struct ibv_send_wr* bad = (struct ibv_send_wr*)(uintptr_t)0x1; /* must be overwritten */
    int rc = ibv_post_send(p.qp[A], &wr, &bad);
    CHECK(rc == EINVAL, "ibv_post_send on a QP in %s returns %s (expected EINVAL)", qp_state_name(st), err_name(rc));
    CHECK(bad == &wr, "  ... and sets *bad_wr to the WR (%s)", bad == &wr ? "yes" : "no");
  }
  expect_cq_empty(p.scq[A], "A send CQ (rejected WRs produce no completion)", 50);

  /* Sanity: the same WR goes through once A is in RTS. */
  if (qp_rts(&p, A)) goto out;
  if (post_send_checked(p.qp[A], &wr, "A post in RTS")) goto out;
  expect_wc(p.scq[A], "A WRITE in RTS", IBV_WC_SUCCESS, 0x5001, p.qp[A]->qp_num, IBV_WC_RDMA_WRITE, ANY, NULL);
  mbuf_expect(&rb, 64, lb.p, 32);
  mbuf_verify(&rb, "B buffer");

out:
  pair_destroy(&p);
  dereg(&lmr);
  dereg(&rmr);
  mbuf_free(&lb);
  mbuf_free(&rb);
}

/* [WR with max_send_sge SGEs, WR with max_send_sge+1 SGEs]: EINVAL, *bad_wr = the second WR;
 * the first is posted and completes. */
static void case_post_send_too_many_sge(const void* arg) {
  (void)arg;
  struct pair p;
  struct mbuf lb, rb;
  struct ibv_mr *lmr = NULL, *rmr = NULL;
  struct ibv_sge* sges = NULL;
  memset(&lb, 0, sizeof lb);
  memset(&rb, 0, sizeof rb);
  if (pair_setup(&p, IBV_MTU_1024)) return;
  const uint32_t max = p.cap[A].max_send_sge;
  printf("  ..    QP A: requested max_send_sge %u, granted %u\n", k_default_cap.max_send_sge, max);
  CHECK(max >= k_default_cap.max_send_sge, "granted max_send_sge %u >= requested %u", max, k_default_cap.max_send_sge);
  if (mbuf_init(&lb, 2 * (max + 1) + 64, 0xF301) || mbuf_init(&rb, 4 * (max + 1) + 64, 0xF302)) goto out;
  lmr = reg_mr_or_fail(g_pd[A], lb.p, lb.size, IBV_ACCESS_LOCAL_WRITE, "A buffer");
  rmr = reg_mr_or_fail(g_pd[B], rb.p, rb.size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, "B buffer");
  sges = calloc(max + 1, sizeof *sges);
  if (!lmr || !rmr || !sges) goto out;
  for (uint32_t i = 0; i <= max; i++) { /* 1-byte SGEs at every other byte */
    sges[i].addr = (uintptr_t)(lb.p + 2 * i);
    sges[i].length = 1;
    sges[i].lkey = lmr->lkey;
  }
  struct ibv_send_wr w[2];
  memset(w, 0, sizeof w);
  w[0].wr_id = 0x6001;
  w[0].opcode = IBV_WR_RDMA_WRITE;
  w[0].sg_list = sges;
  w[0].num_sge = (int)max;
  w[0].send_flags = IBV_SEND_SIGNALED;
  w[0].wr.rdma.remote_addr = (uintptr_t)rb.p;
  w[0].wr.rdma.rkey = rmr->rkey;
  w[0].next = &w[1];
  w[1] = w[0];
  w[1].wr_id = 0x6002;
  w[1].num_sge = (int)max + 1;
  w[1].wr.rdma.remote_addr = (uintptr_t)(rb.p + 2 * (max + 1));
  w[1].next = NULL;
  struct ibv_send_wr* bad = NULL;
  int rc = ibv_post_send(p.qp[A], w, &bad);
  CHECK(rc == EINVAL, "ibv_post_send [%u SGEs, %u SGEs] returns %s (expected EINVAL)", max, max + 1, err_name(rc));
  CHECK(bad == &w[1], "  ... and sets *bad_wr to the second WR (%s)",
        bad == &w[1]   ? "yes"
        : bad == &w[0] ? "no: the first"
                       : "no");
  expect_wc(p.scq[A], "A first WR (max_send_sge SGEs) was posted and completes", IBV_WC_SUCCESS, 0x6001,
            p.qp[A]->qp_num, IBV_WC_RDMA_WRITE, ANY, NULL);
  expect_cq_empty(p.scq[A], "A send CQ (no completion for the rejected WR)", 50);
  for (uint32_t i = 0; i < max; i++) mbuf_expect(&rb, i, lb.p + 2 * i, 1);
  rb.nrange = 1; /* mbuf_expect records up to MAX_RANGES: describe the range as a whole */
  rb.roff[0] = 0;
  rb.rlen[0] = max;
  mbuf_verify(&rb, "B buffer (first WR's data; nothing of the rejected WR)");

out:
  pair_destroy(&p);
  dereg(&lmr);
  dereg(&rmr);
  mbuf_free(&lb);
  mbuf_free(&rb);
  free(sges);
}

/*
 * QP A created with max_send_wr 8 and connected to QP B that is left in INIT (B silently
 * drops A's packets, so no WR can complete meanwhile). A chain of granted+2 WRITEs:
 * ENOMEM, *bad_wr = the first WR beyond the queue. Then B is brought to RTS: A's
 * retransmissions get through and the posted WRs complete successfully.
 */
static void case_post_send_queue_full(const void* arg) {
  (void)arg;
  struct pair p;
  struct mbuf lb, rb;
  struct ibv_mr *lmr = NULL, *rmr = NULL;
  struct ibv_send_wr* w = NULL;
  struct ibv_sge* sges = NULL;
  memset(&lb, 0, sizeof lb);
  memset(&rb, 0, sizeof rb);
  struct ibv_qp_cap cap = k_default_cap;
  cap.max_send_wr = 8;
  if (pair_create(&p, &cap)) return;
  const uint32_t depth = p.cap[A].max_send_wr;
  printf("  ..    QP A: requested max_send_wr 8, granted %u\n", depth);
  CHECK(depth >= 8, "granted max_send_wr %u >= requested 8", depth);
  const uint32_t n = depth + 2;
  if (mbuf_init(&lb, 8 * n, 0xF401) || mbuf_init(&rb, 8 * n, 0xF402)) goto out;
  lmr = reg_mr_or_fail(g_pd[A], lb.p, lb.size, IBV_ACCESS_LOCAL_WRITE, "A buffer");
  rmr = reg_mr_or_fail(g_pd[B], rb.p, rb.size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, "B buffer");
  w = calloc(n, sizeof *w);
  sges = calloc(n, sizeof *sges);
  if (!lmr || !rmr || !w || !sges) goto out;
  if (qp_init(&p, A) || qp_init(&p, B) || qp_rtr(&p, A, IBV_MTU_1024) || qp_rts(&p, A)) goto out;
  check_qp_state(p.qp[B], "QP B (left in INIT: drops A's packets)", IBV_QPS_INIT);
  for (uint32_t i = 0; i < n; i++) {
    sges[i].addr = (uintptr_t)(lb.p + 8 * i);
    sges[i].length = 8;
    sges[i].lkey = lmr->lkey;
    w[i].wr_id = 0x7000 + i;
    w[i].opcode = IBV_WR_RDMA_WRITE;
    w[i].sg_list = &sges[i];
    w[i].num_sge = 1;
    w[i].send_flags = IBV_SEND_SIGNALED;
    w[i].wr.rdma.remote_addr = (uintptr_t)(rb.p + 8 * i);
    w[i].wr.rdma.rkey = rmr->rkey;
    w[i].next = i + 1 < n ? &w[i + 1] : NULL;
  }
  struct ibv_send_wr* bad = NULL;
  int rc = ibv_post_send(p.qp[A], w, &bad);
  CHECK(rc == ENOMEM,
        "ibv_post_send of %u WRs into a %u-deep send queue returns %s (expected "
        "ENOMEM)",
        n, depth, err_name(rc));
  long idx = bad ? (long)(bad - w) : -1;
  CHECK(bad == &w[depth], "  ... and sets *bad_wr to WR #%u, the first not posted (got %s #%ld)", depth,
        bad ? "WR" : "NULL", idx);

  /* B is in INIT: it must drop A's packets (nothing executed, nothing acknowledged). */
  sleep_us(20000);
  expect_cq_empty(p.scq[A], "A send CQ while B is in INIT (20 ms)", 0);
  mbuf_verify(&rb, "B buffer while B is in INIT (nothing executed)");

  /* Let the posted WRs complete: bring B up; A retransmits after its ACK timeout. */
  if (qp_rtr(&p, B, IBV_MTU_1024) || qp_rts(&p, B)) goto out;
  const double t_up = now_ms();
  uint32_t posted = (rc == ENOMEM && bad >= w && bad < w + n) ? (uint32_t)(bad - w) : 0;
  int all_ok = 1;
  for (uint32_t i = 0; i < posted; i++) {
    struct ibv_wc wc;
    int r = poll_one(p.scq[A], &wc, POLL_TIMEOUT_MS);
    if (r != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != 0x7000 + i) {
      if (r == 1)
        fail("posted WR %u: completion status %s wr_id 0x%" PRIx64 " (expected success, 0x%x)", i, wc_status(wc.status),
             wc.wr_id, 0x7000 + i);
      else
        fail("posted WR %u: no completion within %d ms", i, POLL_TIMEOUT_MS);
      all_ok = 0;
      break;
    }
  }
  if (posted && all_ok)
    ok("all %u posted WRs completed successfully %.1f ms after B reached RTS (retransmission)", posted,
       now_ms() - t_up);
  expect_cq_empty(p.scq[A], "A send CQ (nothing for the WRs not posted)", 50);
  if (all_ok && posted) {
    for (uint32_t i = 0; i < posted; i++) memcpy(rb.expect + 8 * i, lb.p + 8 * i, 8);
    rb.nrange = 1;
    rb.roff[0] = 0;
    rb.rlen[0] = 8 * posted;
    mbuf_verify(&rb, "B buffer (posted WRs' data only)");
  }

out:
  pair_destroy(&p);
  dereg(&lmr);
  dereg(&rmr);
  mbuf_free(&lb);
  mbuf_free(&rb);
  free(w);
  free(sges);
}

static void expect_modify_einval(struct ibv_qp* qp, struct ibv_qp_attr* a, int mask, enum ibv_qp_state before,
                                 const char* what) {
  errno = 0;
  int rc = ibv_modify_qp(qp, a, mask);
  CHECK(rc == EINVAL, "ibv_modify_qp %s returns %s (expected EINVAL)", what, err_name(rc));
  /* As a kernel provider's failed command leaves it (qperf prints it). */
  CHECK(errno == EINVAL, "  ... and errno is %s (expected EINVAL)", err_name(errno));
  enum ibv_qp_state s = qp_state(qp);
  CHECK(s == before, "  ... and the QP stays in %s (is %s)", qp_state_name(before), qp_state_name(s));
}

/* Illegal transitions: RESET->RTR, RESET->RTS, INIT->RTS. */
static void case_modify_qp_bad_transition(const void* arg) {
  (void)arg;
  struct pair p;
  if (pair_create(&p, NULL)) return;
  struct ibv_qp_attr a;
  rtr_attr(&a, B, p.qp[B]->qp_num, IBV_MTU_1024);
  expect_modify_einval(p.qp[A], &a, RTR_MASK, IBV_QPS_RESET, "RESET->RTR (all RTR attributes)");
  rts_attr(&a, A);
  expect_modify_einval(p.qp[A], &a, RTS_MASK, IBV_QPS_RESET, "RESET->RTS (all RTS attributes)");
  if (qp_init(&p, A)) goto out;
  rts_attr(&a, A);
  expect_modify_einval(p.qp[A], &a, RTS_MASK, IBV_QPS_INIT, "INIT->RTS (all RTS attributes)");
  /* A RoCE port has no LID routing: an address without a GRH (qperf's UC and UD tests). */
  rtr_attr(&a, B, p.qp[B]->qp_num, IBV_MTU_1024);
  a.ah_attr.is_global = 0;
  expect_modify_einval(p.qp[A], &a, RTR_MASK, IBV_QPS_INIT, "INIT->RTR without a GRH");
  /* The legal sequence still works afterwards. */
  if (qp_init(&p, B) || qp_rtr(&p, A, IBV_MTU_1024) || qp_rtr(&p, B, IBV_MTU_1024) || qp_rts(&p, A) || qp_rts(&p, B))
    goto out;
  check_qp_state(p.qp[A], "QP A after the legal sequence", IBV_QPS_RTS);
out:
  pair_destroy(&p);
}

/* Each legal transition with one required attribute missing. */
static void case_modify_qp_missing_attr(const void* arg) {
  (void)arg;
  struct pair p;
  if (pair_create(&p, NULL)) return;
  struct ibv_qp_attr a;
  static const struct {
    int mask;
    const char* name;
  } init_req[] = {{IBV_QP_PKEY_INDEX, "IBV_QP_PKEY_INDEX"},
                  {IBV_QP_PORT, "IBV_QP_PORT"},
                  {IBV_QP_ACCESS_FLAGS, "IBV_QP_ACCESS_FLAGS"}},
    rtr_req[] = {{IBV_QP_AV, "IBV_QP_AV"},
                 {IBV_QP_PATH_MTU, "IBV_QP_PATH_MTU"},
                 {IBV_QP_DEST_QPN, "IBV_QP_DEST_QPN"},
                 {IBV_QP_RQ_PSN, "IBV_QP_RQ_PSN"},
                 {IBV_QP_MAX_DEST_RD_ATOMIC, "IBV_QP_MAX_DEST_RD_ATOMIC"},
                 {IBV_QP_MIN_RNR_TIMER, "IBV_QP_MIN_RNR_TIMER"}},
    rts_req[] = {{IBV_QP_TIMEOUT, "IBV_QP_TIMEOUT"},
                 {IBV_QP_RETRY_CNT, "IBV_QP_RETRY_CNT"},
                 {IBV_QP_RNR_RETRY, "IBV_QP_RNR_RETRY"},
                 {IBV_QP_SQ_PSN, "IBV_QP_SQ_PSN"},
                 {IBV_QP_MAX_QP_RD_ATOMIC, "IBV_QP_MAX_QP_RD_ATOMIC"}};
  char what[96];
  for (size_t i = 0; i < sizeof init_req / sizeof init_req[0]; i++) {
    init_attr(&a);
    snprintf(what, sizeof what, "RESET->INIT without %s", init_req[i].name);
    expect_modify_einval(p.qp[A], &a, INIT_MASK & ~init_req[i].mask, IBV_QPS_RESET, what);
  }
  if (qp_init(&p, A) || qp_init(&p, B)) goto out;
  for (size_t i = 0; i < sizeof rtr_req / sizeof rtr_req[0]; i++) {
    rtr_attr(&a, B, p.qp[B]->qp_num, IBV_MTU_1024);
    snprintf(what, sizeof what, "INIT->RTR without %s", rtr_req[i].name);
    expect_modify_einval(p.qp[A], &a, RTR_MASK & ~rtr_req[i].mask, IBV_QPS_INIT, what);
  }
  if (qp_rtr(&p, A, IBV_MTU_1024) || qp_rtr(&p, B, IBV_MTU_1024)) goto out;
  for (size_t i = 0; i < sizeof rts_req / sizeof rts_req[0]; i++) {
    rts_attr(&a, A);
    snprintf(what, sizeof what, "RTR->RTS without %s", rts_req[i].name);
    expect_modify_einval(p.qp[A], &a, RTS_MASK & ~rts_req[i].mask, IBV_QPS_RTR, what);
  }
  if (qp_rts(&p, A) || qp_rts(&p, B)) goto out;
  check_qp_state(p.qp[A], "QP A after the complete attribute sets", IBV_QPS_RTS);
out:
  pair_destroy(&p);
}

/* ibv_reg_mr: remote write or remote atomic access requires local write (EINVAL). */
static void case_reg_mr_access(const void* arg) {
  (void)arg;
  static uint8_t buf[4096];
  static const struct {
    int access;
    const char* name;
  } bad[] = {{IBV_ACCESS_REMOTE_WRITE, "REMOTE_WRITE"},
             {IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, "REMOTE_WRITE|REMOTE_READ"},
             {IBV_ACCESS_REMOTE_ATOMIC, "REMOTE_ATOMIC"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    errno = 0;
    struct ibv_mr* mr = ibv_reg_mr(g_pd[A], buf, sizeof buf, bad[i].access);
    int e = errno;
    CHECK(mr == NULL && e == EINVAL,
          "ibv_reg_mr(%s without LOCAL_WRITE) returns %s with errno %s (expected NULL, EINVAL)", bad[i].name,
          mr ? "an MR" : "NULL", err_name(e));
    if (mr) ibv_dereg_mr(mr);
  }
  struct ibv_mr* mr = ibv_reg_mr(g_pd[A], buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  CHECK(mr != NULL, "ibv_reg_mr(LOCAL_WRITE|REMOTE_WRITE) succeeds%s%s", mr ? "" : ": ", mr ? "" : strerror(errno));
  if (mr) ibv_dereg_mr(mr);
}

/* ------------------------------------------------------------------------------------ */
/* Case table and main                                                                  */

struct testcase {
  char name[48];
  void (*fn)(const void* arg);
  const void* arg;
};

#define MAX_CASES 64
static struct testcase g_cases[MAX_CASES];
static int g_ncases;
static struct xfer g_xfers[32];

static void add_case(const char* name, void (*fn)(const void*), const void* arg) {
  if (g_ncases >= MAX_CASES) abort();
  snprintf(g_cases[g_ncases].name, sizeof g_cases[g_ncases].name, "%s", name);
  g_cases[g_ncases].fn = fn;
  g_cases[g_ncases].arg = arg;
  g_ncases++;
}

static void build_cases(void) {
  static const enum ibv_mtu mtus[] = {IBV_MTU_1024, IBV_MTU_4096};
  static const size_t sizes[] = {1, 4097, 1u << 20};
  static const char* const size_names[] = {"1", "4097", "1m"};
  int nx = 0;
  for (int op = OP_WRITE; op <= OP_SEND; op++)
    for (int s = 0; s < 3; s++)
      for (int m = 0; m < 2; m++) {
        struct xfer* x = &g_xfers[nx++];
        x->op = (enum op)op;
        x->len = sizes[s];
        x->mtu = mtus[m];
        char name[48];
        snprintf(name, sizeof name, "%s_%s_mtu%d", k_op_name[op], size_names[s], 128 << mtus[m]);
        add_case(name, case_transfer, x);
      }
  add_case("write_bad_rkey", case_access_error, &k_write_bad_rkey);
  add_case("read_bad_rkey", case_access_error, &k_read_bad_rkey);
  add_case("write_past_mr_end", case_access_error, &k_write_past_end);
  add_case("read_past_mr_end", case_access_error, &k_read_past_end);
  add_case("write_no_remote_write", case_access_error, &k_write_no_access);
  add_case("read_no_remote_read", case_access_error, &k_read_no_access);
  add_case("write_bad_lkey", case_access_error, &k_write_bad_lkey);
  add_case("read_bad_lkey", case_access_error, &k_read_bad_lkey);
  add_case("send_recv_too_small", case_send_recv_too_small, NULL);
  add_case("flush_after_error", case_flush_after_error, NULL);
  add_case("post_send_bad_state", case_post_send_bad_state, NULL);
  add_case("post_send_too_many_sge", case_post_send_too_many_sge, NULL);
  add_case("post_send_queue_full", case_post_send_queue_full, NULL);
  add_case("modify_qp_bad_transition", case_modify_qp_bad_transition, NULL);
  add_case("modify_qp_missing_attr", case_modify_qp_missing_attr, NULL);
  add_case("reg_mr_access", case_reg_mr_access, NULL);
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  build_cases();
  if (argc > 1 && strcmp(argv[1], "--list") == 0) {
    for (int i = 0; i < g_ncases; i++) printf("%s\n", g_cases[i].name);
    return 0;
  }
  int selected[MAX_CASES], nsel = 0;
  if (argc == 1) {
    for (int i = 0; i < g_ncases; i++) selected[nsel++] = i;
  } else {
    for (int a = 1; a < argc; a++) {
      int found = -1;
      for (int i = 0; i < g_ncases; i++)
        if (strcmp(argv[a], g_cases[i].name) == 0) found = i;
      if (found < 0) {
        fprintf(stderr, "rdma_ops_test: unknown case '%s' (--list prints the cases)\n", argv[a]);
        return 2;
      }
      if (nsel < MAX_CASES) selected[nsel++] = found;
    }
  }
  if (open_devices()) {
    close_devices();
    printf("rdma_ops_test: setup failed\n");
    return 1;
  }
  int passed = 0, failed = 0;
  for (int k = 0; k < nsel; k++) {
    const struct testcase* t = &g_cases[selected[k]];
    printf("[ RUN  ] %s\n", t->name);
    g_case_failures = 0;
    double t0 = now_ms();
    t->fn(t->arg);
    double dt = now_ms() - t0;
    if (g_case_failures) {
      printf("[ FAIL ] %s (%d failed check%s, %.0f ms)\n", t->name, g_case_failures, g_case_failures == 1 ? "" : "s",
             dt);
      failed++;
    } else {
      printf("[  OK  ] %s (%.0f ms)\n", t->name, dt);
      passed++;
    }
  }
  close_devices();
  printf("rdma_ops_test: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
