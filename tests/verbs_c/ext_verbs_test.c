/* Extended verbs through the public libibverbs C API:
 *
 *   send        ibv_wr_send / ibv_wr_send_imm with ibv_wr_set_sge, ibv_wr_set_sge_list,
 *               ibv_wr_set_inline_data and ibv_wr_set_inline_data_list, four WRs in one
 *               ibv_wr_start … ibv_wr_complete region; received bytes and every field of
 *               both sides' completions (read through ibv_cq_ex) checked.
 *   rdma        ibv_wr_rdma_write (SGE and inline list), ibv_wr_rdma_write_imm (SGE list),
 *               ibv_wr_rdma_read (scatter list); data and completions checked.
 *   atomic      ibv_wr_atomic_cmp_swp (matching and stale compare) and
 *               ibv_wr_atomic_fetch_add: returned originals and the remote value.
 *   abort       ibv_wr_abort and an empty region post nothing; the next region works.
 *   cq_ex       ibv_start_poll / ibv_next_poll / ibv_end_poll over several completions,
 *               timestamps (non-zero, non-decreasing, in the clock of
 *               ibv_query_rt_values_ex) and wall-clock times, ibv_poll_cq and completion
 *               events on an extended CQ, ENOENT / EINVAL from ibv_start_poll.
 *   bad_input   unsupported wc_flags / send_ops_flags / comp_mask → EOPNOTSUPP or EINVAL,
 *               TSO → EOPNOTSUPP, setters without a builder,
 *               inline data on a READ, too many SGEs, a QP not yet in RTS → EINVAL,
 *               ibv_qp_to_qp_ex of an ordinary QP → NULL.
 *   full_queue  ibv_wr_complete on a full send queue → ENOMEM with nothing posted.
 *   mw          ibv_wr_bind_mw, ibv_wr_local_inv, ibv_wr_send_inv: refused with EOPNOTSUPP
 *               without type 2 memory windows; with them, a window bound, written
 *               through, invalidated remotely and locally, and then refused.
 *   device_ex   ibv_query_device_ex (orig_attr, capability flags, ODP caps, clock, zero caps
 *               for what uroce lacks), ibv_query_rt_values_ex,
 *               ibv_query_gid_ex / ibv_query_gid_table, an ODP MR and ibv_advise_mr with
 *               its error cases.
 *
 * Usage: ext_verbs_test CASE. One process, two device contexts (two LIDs) connected by one
 * RC QP pair whose QPs and CQs are created with ibv_create_qp_ex / ibv_create_cq_ex.
 * Prints "FAIL ..." for each failed check; exit 0 when every check passes. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "verbs_pair.h"

#define BUF_SIZE (64 * 1024)
#define TIMEOUT_MS 5000
#define ACCESS_ALL \
  (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

static const uint64_t kWcFlagsAll = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
                                    IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |
                                    IBV_WC_EX_WITH_DLID_PATH_BITS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                                    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
static const uint64_t kRcOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
                               IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
                               IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

static const uint64_t kMwOps = IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV;

/* Type 2 memory windows, and with them IBV_WR_LOCAL_INV / BIND_MW / SEND_WITH_INV. */
static int device_has_mw2(struct ibv_context* ctx) {
  struct ibv_device_attr a;
  return ibv_query_device(ctx, &a) == 0 &&
         (a.device_cap_flags & (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B));
}

/* One side: a vp_side whose CQ and QP are extended, plus a registered buffer. */
struct ext_side {
  struct vp_side s;
  struct ibv_comp_channel* channel;
  struct ibv_cq_ex* cqx;
  struct ibv_qp_ex* qpx;
  struct ibv_mr* mr;
  uint8_t* buf;
  uint64_t last_ts; /* completion timestamp of the last completion read */
};

/* Everything ibv_cq_ex reports about one completion. */
struct exwc {
  uint64_t wr_id;
  enum ibv_wc_status status;
  enum ibv_wc_opcode opcode;
  uint32_t vendor_err, byte_len, imm, inv_rkey, qp_num, src_qp, slid;
  unsigned wc_flags;
  uint8_t sl, dlid_path_bits;
  uint64_t ts, wallclock;
};

static uint64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int ext_open(struct ext_side* e, const struct vp_params* p, uint32_t psn, int with_channel) {
  memset(e, 0, sizeof *e);
  int num = 0;
  struct ibv_device** list = ibv_get_device_list(&num);
  if (!list || num < 1) {
    printf("ext_open: no RDMA device\n");
    if (list) ibv_free_device_list(list);
    return -1;
  }
  e->s.ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  struct ibv_port_attr pa;
  if (!e->s.ctx || ibv_query_port(e->s.ctx, 1, &pa) || ibv_query_gid(e->s.ctx, 1, 0, &e->s.self.gid)) {
    printf("ext_open: open/query failed\n");
    return -1;
  }
  e->s.self.lid = pa.lid;
  e->s.self.psn = psn;
  e->s.pd = ibv_alloc_pd(e->s.ctx);
  if (with_channel) e->channel = ibv_create_comp_channel(e->s.ctx);
  struct ibv_cq_init_attr_ex ca;
  memset(&ca, 0, sizeof ca);
  ca.cqe = p->sq_depth + p->rq_depth;
  ca.channel = e->channel;
  ca.wc_flags = kWcFlagsAll;
  ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
  ca.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
  e->cqx = e->s.pd ? ibv_create_cq_ex(e->s.ctx, &ca) : NULL;
  if (!e->cqx) {
    printf("ext_open: ibv_create_cq_ex: %s\n", strerror(errno));
    return -1;
  }
  e->s.cq = ibv_cq_ex_to_cq(e->cqx);
  struct ibv_qp_init_attr_ex ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = e->s.cq;
  ia.recv_cq = e->s.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = p->sq_depth;
  ia.cap.max_recv_wr = p->rq_depth;
  ia.cap.max_send_sge = p->max_sge;
  ia.cap.max_recv_sge = p->max_sge;
  ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  ia.pd = e->s.pd;
  ia.send_ops_flags = kRcOps | (device_has_mw2(e->s.ctx) ? kMwOps : 0);
  e->s.qp = ibv_create_qp_ex(e->s.ctx, &ia);
  if (!e->s.qp) {
    printf("ext_open: ibv_create_qp_ex: %s\n", strerror(errno));
    return -1;
  }
  e->qpx = ibv_qp_to_qp_ex(e->s.qp);
  CHECK(e->qpx != NULL, "ibv_qp_to_qp_ex returned NULL for an extended QP");
  CHECK(ia.cap.max_send_wr >= p->sq_depth && ia.cap.max_inline_data > 0, "granted caps not reported (%u, %u)",
        ia.cap.max_send_wr, ia.cap.max_inline_data);
  e->s.self.qpn = e->s.qp->qp_num;
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = ACCESS_ALL;
  if (ibv_modify_qp(e->s.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return -1;
  e->buf = aligned_alloc(4096, BUF_SIZE);
  if (!e->buf) return -1;
  memset(e->buf, 0, BUF_SIZE);
  e->mr = ibv_reg_mr(e->s.pd, e->buf, BUF_SIZE, ACCESS_ALL | (device_has_mw2(e->s.ctx) ? IBV_ACCESS_MW_BIND : 0));
  return e->mr && e->qpx ? 0 : -1;
}

/* Two connected sides A (context 0) and B (context 1). */
static int pair_open(struct ext_side* a, struct ext_side* b, const struct vp_params* p, int with_channel) {
  if (ext_open(a, p, 0x1000, with_channel) || ext_open(b, p, 0x2000, with_channel)) return -1;
  if (vp_connect(&a->s, p, &b->s.self) || vp_connect(&b->s, p, &a->s.self)) return -1;
  return 0;
}

/* The CQ goes before its completion channel, the channel before the context. */
static void pair_close(struct ext_side* a, struct ext_side* b) {
  struct ext_side* sides[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    struct ext_side* e = sides[i];
    if (e->mr) ibv_dereg_mr(e->mr);
    free(e->buf);
    if (e->s.qp) ibv_destroy_qp(e->s.qp);
    if (e->s.cq) ibv_destroy_cq(e->s.cq);
    if (e->channel) ibv_destroy_comp_channel(e->channel);
    e->s.qp = NULL;
    e->s.cq = NULL;
    vp_close(&e->s); /* the PD and the context */
  }
}

static void read_current(struct ibv_cq_ex* cq, struct exwc* w) {
  w->wr_id = cq->wr_id;
  w->status = cq->status;
  w->opcode = ibv_wc_read_opcode(cq);
  w->vendor_err = ibv_wc_read_vendor_err(cq);
  w->byte_len = ibv_wc_read_byte_len(cq);
  w->imm = ntohl(ibv_wc_read_imm_data(cq));
  w->inv_rkey = ibv_wc_read_invalidated_rkey(cq);
  w->qp_num = ibv_wc_read_qp_num(cq);
  w->src_qp = ibv_wc_read_src_qp(cq);
  w->wc_flags = ibv_wc_read_wc_flags(cq);
  w->slid = ibv_wc_read_slid(cq);
  w->sl = ibv_wc_read_sl(cq);
  w->dlid_path_bits = ibv_wc_read_dlid_path_bits(cq);
  w->ts = ibv_wc_read_completion_ts(cq);
  w->wallclock = ibv_wc_read_completion_wallclock_ns(cq);
}

/* Reads n completions of one side, as many per ibv_start_poll … ibv_end_poll batch as are
 * there (ibv_next_poll) and no more than n, checking status, timestamp order and the wall clock on the way.
 * Returns how many were read before the timeout. */
static int poll_n(struct ext_side* e, struct exwc* out, int n, int timeout_ms) {
  double deadline = vp_now_ms() + timeout_ms;
  int got = 0;
  struct ibv_poll_cq_attr attr;
  memset(&attr, 0, sizeof attr);
  while (got < n && vp_now_ms() < deadline) {
    int rc = ibv_start_poll(e->cqx, &attr);
    if (rc == ENOENT) {
      vp_sleep_ms(0);
      continue;
    }
    if (rc) {
      CHECK(0, "ibv_start_poll = %d", rc);
      return got;
    }
    do {
      struct exwc w;
      read_current(e->cqx, &w);
      CHECK(w.ts != 0 && w.ts >= e->last_ts, "completion timestamp %llu after %llu", (unsigned long long)w.ts,
            (unsigned long long)e->last_ts);
      uint64_t now = realtime_ns();
      CHECK(w.wallclock != 0 && w.wallclock <= now && now - w.wallclock < 60ull * 1000000000ull,
            "wall-clock timestamp %llu, now %llu", (unsigned long long)w.wallclock, (unsigned long long)now);
      e->last_ts = w.ts;
      out[got++] = w;
    } while (got < n && ibv_next_poll(e->cqx) == 0);
    ibv_end_poll(e->cqx);
  }
  return got;
}

/* No completion arrives on either side within `ms`. */
static void expect_quiet(struct ext_side* a, struct ext_side* b, int ms) {
  struct exwc w;
  CHECK(poll_n(a, &w, 1, ms) == 0, "side A got an unexpected completion (wr_id %llu)", (unsigned long long)w.wr_id);
  CHECK(poll_n(b, &w, 1, ms) == 0, "side B got an unexpected completion (wr_id %llu)", (unsigned long long)w.wr_id);
}

static void post_recv(struct ext_side* e, uint64_t wr_id, size_t offset, uint32_t length) {
  struct ibv_sge sge = {(uintptr_t)(e->buf + offset), length, e->mr->lkey};
  struct ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  int rc = ibv_post_recv(e->s.qp, &wr, &bad);
  CHECK(rc == 0, "ibv_post_recv = %d", rc);
}

static void fill(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)vp_rand(&seed);
}

/* A send-side completion: status, opcode, wr_id, this QP, and byte_len when it has one. */
static void check_send_wc(const struct exwc* w, uint64_t wr_id, enum ibv_wc_opcode op, const struct ext_side* self) {
  CHECK(w->status == IBV_WC_SUCCESS, "wr_id %llu: status %s", (unsigned long long)wr_id, ibv_wc_status_str(w->status));
  CHECK(w->wr_id == wr_id, "send completion wr_id %llu, expected %llu", (unsigned long long)w->wr_id,
        (unsigned long long)wr_id);
  CHECK(w->opcode == op, "wr_id %llu: opcode %d, expected %d", (unsigned long long)wr_id, w->opcode, op);
  CHECK(w->qp_num == self->s.self.qpn, "wr_id %llu: qp_num 0x%x, expected 0x%x", (unsigned long long)wr_id, w->qp_num,
        self->s.self.qpn);
  CHECK(w->vendor_err == 0, "vendor_err %u", w->vendor_err);
}

/* A receive-side completion: opcode, byte_len, immediate data, QP numbers and the sender's LID. */
static void check_recv_wc(const struct exwc* w, uint64_t wr_id, enum ibv_wc_opcode op, uint32_t byte_len, int has_imm,
                          uint32_t imm, const struct ext_side* self, const struct ext_side* peer) {
  CHECK(w->status == IBV_WC_SUCCESS, "recv wr_id %llu: status %s", (unsigned long long)wr_id,
        ibv_wc_status_str(w->status));
  CHECK(w->wr_id == wr_id, "recv completion wr_id %llu, expected %llu", (unsigned long long)w->wr_id,
        (unsigned long long)wr_id);
  CHECK(w->opcode == op, "recv wr_id %llu: opcode %d, expected %d", (unsigned long long)wr_id, w->opcode, op);
  CHECK(w->byte_len == byte_len, "recv wr_id %llu: byte_len %u, expected %u", (unsigned long long)wr_id, w->byte_len,
        byte_len);
  CHECK(!!(w->wc_flags & IBV_WC_WITH_IMM) == !!has_imm, "recv wr_id %llu: wc_flags 0x%x", (unsigned long long)wr_id,
        w->wc_flags);
  if (has_imm) CHECK(w->imm == imm, "recv wr_id %llu: imm 0x%x, expected 0x%x", (unsigned long long)wr_id, w->imm, imm);
  CHECK(w->qp_num == self->s.self.qpn, "recv qp_num 0x%x, expected 0x%x", w->qp_num, self->s.self.qpn);
  CHECK(w->src_qp == peer->s.self.qpn, "recv src_qp 0x%x, expected 0x%x", w->src_qp, peer->s.self.qpn);
  CHECK(w->slid == peer->s.self.lid, "recv slid 0x%x, expected the sender's LID 0x%x", w->slid, peer->s.self.lid);
  CHECK(w->sl == 0 && w->dlid_path_bits == 0, "recv sl %u dlid_path_bits %u", w->sl, w->dlid_path_bits);
}

/* ---- cases ---- */

static void case_send(struct ext_side* a, struct ext_side* b) {
  fill(a->buf, BUF_SIZE, 1);
  for (int i = 0; i < 4; i++) post_recv(b, 100 + i, (size_t)i * 1024, 1024);

  struct ibv_qp_ex* q = a->qpx;
  char inl[] = "inline payload";
  char p1[] = "gather-", p2[] = "ed ", p3[] = "inline list";
  struct ibv_data_buf list[3] = {{p1, 7}, {p2, 3}, {p3, 11}};
  struct ibv_sge sges[3] = {{(uintptr_t)(a->buf + 2000), 10, a->mr->lkey},
                            {(uintptr_t)(a->buf + 3000), 20, a->mr->lkey},
                            {(uintptr_t)(a->buf + 4000), 30, a->mr->lkey}};
  ibv_wr_start(q);
  q->wr_flags = IBV_SEND_SIGNALED;
  q->wr_id = 1;
  ibv_wr_send(q);
  ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)a->buf, 100);
  q->wr_id = 2;
  ibv_wr_send_imm(q, htonl(0x11223344));
  ibv_wr_set_sge_list(q, 3, sges);
  q->wr_id = 3;
  ibv_wr_send(q);
  ibv_wr_set_inline_data(q, inl, sizeof inl);
  q->wr_id = 4;
  ibv_wr_send_imm(q, htonl(0xCAFEF00D));
  ibv_wr_set_inline_data_list(q, 3, list);
  /* Inline data is copied by the setter: changing the sources now must not matter, and
   * neither does reusing the SGE array. */
  memset(inl, 'X', sizeof inl - 1);
  memset(p3, 'Y', sizeof p3 - 1);
  memset(sges, 0, sizeof sges);
  int rc = ibv_wr_complete(q);
  CHECK(rc == 0, "ibv_wr_complete = %d", rc);

  struct exwc sw[4], rw[4];
  CHECK(poll_n(a, sw, 4, TIMEOUT_MS) == 4, "sender: 4 completions expected");
  CHECK(poll_n(b, rw, 4, TIMEOUT_MS) == 4, "receiver: 4 completions expected");
  for (int i = 0; i < 4; i++) check_send_wc(&sw[i], (uint64_t)i + 1, IBV_WC_SEND, a);
  check_recv_wc(&rw[0], 100, IBV_WC_RECV, 100, 0, 0, b, a);
  check_recv_wc(&rw[1], 101, IBV_WC_RECV, 60, 1, 0x11223344, b, a);
  check_recv_wc(&rw[2], 102, IBV_WC_RECV, sizeof inl, 0, 0, b, a);
  check_recv_wc(&rw[3], 103, IBV_WC_RECV, 21, 1, 0xCAFEF00D, b, a);

  CHECK(memcmp(b->buf, a->buf, 100) == 0, "SEND with one SGE: data differs");
  uint8_t expect[60];
  memcpy(expect, a->buf + 2000, 10);
  memcpy(expect + 10, a->buf + 3000, 20);
  memcpy(expect + 30, a->buf + 4000, 30);
  CHECK(memcmp(b->buf + 1024, expect, 60) == 0, "SEND_WITH_IMM with an SGE list: data differs");
  CHECK(memcmp(b->buf + 2048, "inline payload", sizeof inl) == 0, "inline SEND: data differs");
  CHECK(memcmp(b->buf + 3072, "gather-ed inline list", 21) == 0, "inline-list SEND: data differs");
}

static void case_rdma(struct ext_side* a, struct ext_side* b) {
  fill(a->buf, BUF_SIZE, 2);
  fill(b->buf + 32768, 4096, 3); /* what the READ fetches */
  post_recv(b, 200, 0, 0);       /* consumed by the WRITE_WITH_IMM */
  uint64_t rb = (uintptr_t)b->buf;
  uint32_t rkey = b->mr->rkey, lkey = a->mr->lkey;
  struct ibv_sge wlist[2] = {{(uintptr_t)(a->buf + 5000), 700, lkey}, {(uintptr_t)(a->buf + 6000), 900, lkey}};
  struct ibv_sge rlist[2] = {{(uintptr_t)(a->buf + 20000), 100, lkey}, {(uintptr_t)(a->buf + 21000), 156, lkey}};
  char i1[] = "inline", i2[] = " write";
  struct ibv_data_buf ilist[2] = {{i1, 6}, {i2, 6}};

  struct ibv_qp_ex* q = a->qpx;
  ibv_wr_start(q);
  q->wr_flags = IBV_SEND_SIGNALED;
  q->wr_id = 11;
  ibv_wr_rdma_write(q, rkey, rb + 1000);
  ibv_wr_set_sge(q, lkey, (uintptr_t)a->buf, 3000); /* three packets at MTU 1024 */
  q->wr_id = 12;
  ibv_wr_rdma_write_imm(q, rkey, rb + 8192, htonl(0xABCD0123));
  ibv_wr_set_sge_list(q, 2, wlist);
  q->wr_id = 13;
  ibv_wr_rdma_write(q, rkey, rb + 16384);
  ibv_wr_set_inline_data_list(q, 2, ilist);
  q->wr_id = 14;
  ibv_wr_rdma_read(q, rkey, rb + 32768);
  ibv_wr_set_sge_list(q, 2, rlist);
  int rc = ibv_wr_complete(q);
  CHECK(rc == 0, "ibv_wr_complete = %d", rc);

  struct exwc sw[4], rw[1];
  CHECK(poll_n(a, sw, 4, TIMEOUT_MS) == 4, "requester: 4 completions expected");
  CHECK(poll_n(b, rw, 1, TIMEOUT_MS) == 1, "responder: 1 completion (WRITE_WITH_IMM) expected");
  check_send_wc(&sw[0], 11, IBV_WC_RDMA_WRITE, a);
  check_send_wc(&sw[1], 12, IBV_WC_RDMA_WRITE, a);
  check_send_wc(&sw[2], 13, IBV_WC_RDMA_WRITE, a);
  check_send_wc(&sw[3], 14, IBV_WC_RDMA_READ, a);
  CHECK(sw[3].byte_len == 256, "READ byte_len %u, expected 256", sw[3].byte_len);
  check_recv_wc(&rw[0], 200, IBV_WC_RECV_RDMA_WITH_IMM, 1600, 1, 0xABCD0123, b, a);

  CHECK(memcmp(b->buf + 1000, a->buf, 3000) == 0, "RDMA WRITE: data differs");
  CHECK(memcmp(b->buf + 8192, a->buf + 5000, 700) == 0 && memcmp(b->buf + 8892, a->buf + 6000, 900) == 0,
        "RDMA WRITE_WITH_IMM with an SGE list: data differs");
  CHECK(memcmp(b->buf + 16384, "inline write", 12) == 0, "inline RDMA WRITE: data differs");
  CHECK(memcmp(a->buf + 20000, b->buf + 32768, 100) == 0 && memcmp(a->buf + 21000, b->buf + 32868, 156) == 0,
        "RDMA READ into an SGE list: data differs");
}

static void case_atomic(struct ext_side* a, struct ext_side* b) {
  uint64_t* counter = (uint64_t*)(b->buf + 64);
  uint64_t* results = (uint64_t*)a->buf;
  *counter = 100;
  memset(results, 0xEE, 32);
  uint64_t raddr = (uintptr_t)counter;
  struct ibv_qp_ex* q = a->qpx;
  ibv_wr_start(q);
  q->wr_flags = IBV_SEND_SIGNALED;
  q->wr_id = 21;
  ibv_wr_atomic_cmp_swp(q, b->mr->rkey, raddr, 100, 555);
  ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)&results[0], 8);
  q->wr_id = 22;
  ibv_wr_atomic_fetch_add(q, b->mr->rkey, raddr, 10);
  ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)&results[1], 8);
  q->wr_id = 23;
  ibv_wr_atomic_cmp_swp(q, b->mr->rkey, raddr, 100, 1); /* stale compare: no swap */
  ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)&results[2], 8);
  int rc = ibv_wr_complete(q);
  CHECK(rc == 0, "ibv_wr_complete = %d", rc);
  struct exwc sw[3];
  CHECK(poll_n(a, sw, 3, TIMEOUT_MS) == 3, "3 atomic completions expected");
  check_send_wc(&sw[0], 21, IBV_WC_COMP_SWAP, a);
  check_send_wc(&sw[1], 22, IBV_WC_FETCH_ADD, a);
  check_send_wc(&sw[2], 23, IBV_WC_COMP_SWAP, a);
  for (int i = 0; i < 3; i++) CHECK(sw[i].byte_len == 8, "atomic byte_len %u", sw[i].byte_len);
  CHECK(results[0] == 100 && results[1] == 555 && results[2] == 565, "originals %llu %llu %llu, expected 100 555 565",
        (unsigned long long)results[0], (unsigned long long)results[1], (unsigned long long)results[2]);
  CHECK(*counter == 565, "remote value %llu, expected 565", (unsigned long long)*counter);
  expect_quiet(a, b, 50);
}

static void case_abort(struct ext_side* a, struct ext_side* b) {
  post_recv(b, 300, 0, 1024);
  struct ibv_qp_ex* q = a->qpx;
  ibv_wr_start(q);
  q->wr_flags = IBV_SEND_SIGNALED;
  q->wr_id = 31;
  ibv_wr_send(q);
  ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)a->buf, 64);
  q->wr_id = 32;
  ibv_wr_rdma_write(q, b->mr->rkey, (uintptr_t)b->buf + 4096);
  ibv_wr_set_inline_data(q, "must not arrive", 15);
  ibv_wr_abort(q);
  ibv_wr_start(q); /* an empty region posts nothing and succeeds */
  CHECK(ibv_wr_complete(q) == 0, "empty ibv_wr_complete failed");
  expect_quiet(a, b, 200);
  CHECK(b->buf[4096] == 0, "aborted RDMA WRITE reached the peer");

  strcpy((char*)a->buf, "after abort");
  ibv_wr_start(q);
  q->wr_id = 33;
  ibv_wr_send(q);
  ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)a->buf, 12);
  CHECK(ibv_wr_complete(q) == 0, "ibv_wr_complete after abort failed");
  struct exwc sw, rw;
  CHECK(poll_n(a, &sw, 1, TIMEOUT_MS) == 1, "no send completion after abort");
  CHECK(poll_n(b, &rw, 1, TIMEOUT_MS) == 1, "no receive completion after abort");
  check_send_wc(&sw, 33, IBV_WC_SEND, a);
  check_recv_wc(&rw, 300, IBV_WC_RECV, 12, 0, 0, b, a);
  CHECK(strcmp((char*)b->buf, "after abort") == 0, "data after abort differs");
  expect_quiet(a, b, 50);
}

static void case_cq_ex(struct ext_side* a, struct ext_side* b) {
  struct ibv_poll_cq_attr attr;
  memset(&attr, 0, sizeof attr);
  CHECK(ibv_start_poll(a->cqx, &attr) == ENOENT, "ibv_start_poll on an empty CQ must return ENOENT");
  attr.comp_mask = 1;
  CHECK(ibv_start_poll(a->cqx, &attr) == EINVAL, "ibv_start_poll with comp_mask must return EINVAL");

  /* Completion events on an extended CQ. */
  CHECK(ibv_req_notify_cq(b->s.cq, 0) == 0, "ibv_req_notify_cq failed");
  struct ibv_values_ex before = {.comp_mask = IBV_VALUES_MASK_RAW_CLOCK};
  CHECK(ibv_query_rt_values_ex(a->s.ctx, &before) == 0 && (before.comp_mask & IBV_VALUES_MASK_RAW_CLOCK),
        "ibv_query_rt_values_ex failed");
  enum { kMsgs = 8 };
  for (int i = 0; i < kMsgs; i++) post_recv(b, 400 + i, (size_t)i * 64, 64);
  struct ibv_qp_ex* q = a->qpx;
  ibv_wr_start(q);
  q->wr_flags = IBV_SEND_SIGNALED;
  for (int i = 0; i < kMsgs; i++) {
    q->wr_id = 40 + i;
    ibv_wr_send_imm(q, htonl(0x100u + (uint32_t)i));
    ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)a->buf, (uint32_t)i * 8);
  }
  CHECK(ibv_wr_complete(q) == 0, "ibv_wr_complete failed");

  struct pollfd pfd = {b->channel->fd, POLLIN, 0};
  CHECK(poll(&pfd, 1, TIMEOUT_MS) == 1, "the completion channel's fd did not become readable");
  struct ibv_cq* ev_cq = NULL;
  void* ev_ctx = NULL;
  if (pfd.revents & POLLIN) {
    CHECK(ibv_get_cq_event(b->channel, &ev_cq, &ev_ctx) == 0 && ev_cq == b->s.cq,
          "no completion event for the extended CQ (or for another CQ)");
    ibv_ack_cq_events(b->s.cq, 1);
  }

  /* Sender: wait until all are there, then read them in one ibv_start_poll batch. */
  double deadline = vp_now_ms() + TIMEOUT_MS;
  struct exwc sw[kMsgs];
  int n = 0;
  while (n < kMsgs && vp_now_ms() < deadline) n += poll_n(a, &sw[n], kMsgs - n, 10);
  CHECK(n == kMsgs, "sender: %d of %d completions", n, kMsgs);
  for (int i = 0; i < n; i++) check_send_wc(&sw[i], 40u + (unsigned)i, IBV_WC_SEND, a);
  /* Receiver: the first half through the extended API, the rest through ibv_poll_cq. */
  struct exwc rw[kMsgs / 2];
  CHECK(poll_n(b, rw, kMsgs / 2, TIMEOUT_MS) == kMsgs / 2, "receiver: ex completions missing");
  for (int i = 0; i < kMsgs / 2; i++)
    check_recv_wc(&rw[i], 400u + (unsigned)i, IBV_WC_RECV, (uint32_t)i * 8, 1, 0x100u + (uint32_t)i, b, a);
  for (int i = kMsgs / 2; i < kMsgs; i++) {
    struct ibv_wc wc;
    CHECK(vp_poll(b->s.cq, &wc, TIMEOUT_MS) == 1, "ibv_poll_cq on an extended CQ: nothing");
    CHECK(wc.wr_id == 400u + (unsigned)i && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
              wc.byte_len == (uint32_t)i * 8 && ntohl(wc.imm_data) == 0x100u + (uint32_t)i &&
              wc.src_qp == a->s.self.qpn,
          "ibv_poll_cq on an extended CQ: wrong completion (wr_id %llu)", (unsigned long long)wc.wr_id);
  }
  struct ibv_values_ex after = {.comp_mask = IBV_VALUES_MASK_RAW_CLOCK};
  CHECK(ibv_query_rt_values_ex(a->s.ctx, &after) == 0, "ibv_query_rt_values_ex failed");
  uint64_t t0 = (uint64_t)before.raw_clock.tv_sec * 1000000000ull + (uint64_t)before.raw_clock.tv_nsec;
  uint64_t t1 = (uint64_t)after.raw_clock.tv_sec * 1000000000ull + (uint64_t)after.raw_clock.tv_nsec;
  CHECK(t0 <= sw[0].ts && sw[kMsgs - 1].ts <= t1 && t0 <= rw[0].ts && rw[kMsgs / 2 - 1].ts <= t1,
        "completion timestamps [%llu, %llu] outside the raw clock interval [%llu, %llu]", (unsigned long long)sw[0].ts,
        (unsigned long long)sw[kMsgs - 1].ts, (unsigned long long)t0, (unsigned long long)t1);
  expect_quiet(a, b, 50);
}

static void expect_cq_ex_error(struct ibv_context* ctx, struct ibv_cq_init_attr_ex* ca, int err, const char* what) {
  errno = 0;
  struct ibv_cq_ex* cq = ibv_create_cq_ex(ctx, ca);
  CHECK(!cq && errno == err, "ibv_create_cq_ex(%s): %s, expected %s", what, cq ? "created" : strerror(errno),
        strerror(err));
  if (cq) ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
}

static void expect_qp_ex_error(struct ext_side* e, enum ibv_qp_type type, uint64_t comp_mask, uint64_t send_ops,
                               int err, const char* what) {
  struct ibv_qp_init_attr_ex ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = e->s.cq;
  ia.recv_cq = e->s.cq;
  ia.qp_type = type;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ia.comp_mask = (uint32_t)comp_mask;
  ia.pd = e->s.pd;
  ia.send_ops_flags = send_ops;
  errno = 0;
  struct ibv_qp* qp = ibv_create_qp_ex(e->s.ctx, &ia);
  CHECK(!qp && errno == err, "ibv_create_qp_ex(%s): %s, expected %s", what, qp ? "created" : strerror(errno),
        strerror(err));
  if (qp) ibv_destroy_qp(qp);
}

/* Opens a WR region on A; expect_complete() closes it. */
static struct ibv_qp_ex* region(struct ext_side* a) {
  ibv_wr_start(a->qpx);
  a->qpx->wr_flags = IBV_SEND_SIGNALED;
  return a->qpx;
}

/* Closes the region: ibv_wr_complete must fail with `err` (and so post nothing). */
static void expect_complete(struct ibv_qp_ex* q, int err, const char* what) {
  int rc = ibv_wr_complete(q);
  CHECK(rc == err, "%s: ibv_wr_complete = %d (%s), expected %s", what, rc, strerror(rc), strerror(err));
}

static void case_bad_input(struct ext_side* a, struct ext_side* b) {
  struct ibv_context* ctx = a->s.ctx;
  struct ibv_cq_init_attr_ex ca;
  memset(&ca, 0, sizeof ca);
  ca.cqe = 4;
  ca.wc_flags = IBV_WC_EX_WITH_CVLAN;
  expect_cq_ex_error(ctx, &ca, EOPNOTSUPP, "IBV_WC_EX_WITH_CVLAN");
  ca.wc_flags = IBV_WC_EX_WITH_FLOW_TAG | IBV_WC_EX_WITH_BYTE_LEN;
  expect_cq_ex_error(ctx, &ca, EOPNOTSUPP, "IBV_WC_EX_WITH_FLOW_TAG");
  ca.wc_flags = IBV_WC_EX_WITH_TM_INFO;
  expect_cq_ex_error(ctx, &ca, EOPNOTSUPP, "IBV_WC_EX_WITH_TM_INFO");
  ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN;
  ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
  ca.flags = 1u << 7;
  expect_cq_ex_error(ctx, &ca, EINVAL, "unknown create flag");
  ca.comp_mask = 1u << 5;
  ca.flags = 0;
  expect_cq_ex_error(ctx, &ca, EINVAL, "unknown comp_mask bit");
  ca.comp_mask = 0;
  ca.cqe = 0;
  expect_cq_ex_error(ctx, &ca, EINVAL, "cqe 0");

  uint64_t base = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  expect_qp_ex_error(a, IBV_QPT_RC, base, IBV_QP_EX_WITH_TSO, EOPNOTSUPP, "RC + TSO");
  expect_qp_ex_error(a, IBV_QPT_RC, base, IBV_QP_EX_WITH_SEND | (1ull << 20), EOPNOTSUPP, "RC + unknown op");
  expect_qp_ex_error(a, IBV_QPT_UC, base, IBV_QP_EX_WITH_RDMA_READ, EOPNOTSUPP, "UC + RDMA_READ");
  expect_qp_ex_error(a, IBV_QPT_UC, base, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, EOPNOTSUPP, "UC + atomic");
  /* IBA 9.4: no SEND with Invalidate on UC (ibv_post_send refuses it), whatever the windows. */
  expect_qp_ex_error(a, IBV_QPT_UC, base, IBV_QP_EX_WITH_SEND_WITH_INV, EOPNOTSUPP, "UC + SEND_WITH_INV");
  expect_qp_ex_error(a, IBV_QPT_RC, base | IBV_QP_INIT_ATTR_MAX_TSO_HEADER, IBV_QP_EX_WITH_SEND, EOPNOTSUPP,
                     "MAX_TSO_HEADER");
  expect_qp_ex_error(a, IBV_QPT_RC, IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, IBV_QP_EX_WITH_SEND, EINVAL, "no PD");
  CHECK(ibv_qp_to_qp_ex(NULL) == NULL, "ibv_qp_to_qp_ex(NULL) != NULL");

  /* An ordinary QP has no ibv_wr_* API. */
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = ia.recv_cq = a->s.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  struct ibv_qp* plain = ibv_create_qp(a->s.pd, &ia);
  CHECK(plain && ibv_qp_to_qp_ex(plain) == NULL, "ibv_qp_to_qp_ex of an ibv_create_qp QP must be NULL");
  if (plain) ibv_destroy_qp(plain);

  /* UC with the ops UC has: created, and its builders work on it. */
  struct ibv_qp_init_attr_ex uc;
  memset(&uc, 0, sizeof uc);
  uc.send_cq = uc.recv_cq = a->s.cq;
  uc.qp_type = IBV_QPT_UC;
  uc.cap.max_send_wr = uc.cap.max_recv_wr = uc.cap.max_send_sge = uc.cap.max_recv_sge = 1;
  uc.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  uc.pd = a->s.pd;
  uc.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
  struct ibv_qp* ucqp = ibv_create_qp_ex(a->s.ctx, &uc);
  CHECK(ucqp && ibv_qp_to_qp_ex(ucqp), "UC QP with SEND/WRITE_WITH_IMM: %s", strerror(errno));
  if (ucqp) {
    /* Still in RESET: posting is refused (EINVAL), as for ibv_post_send. */
    struct ibv_qp_ex* ucx = ibv_qp_to_qp_ex(ucqp);
    ibv_wr_start(ucx);
    ibv_wr_send(ucx);
    ibv_wr_set_sge(ucx, a->mr->lkey, (uintptr_t)a->buf, 1);
    CHECK(ibv_wr_complete(ucx) == EINVAL, "ibv_wr_complete on a QP in RESET must return EINVAL");
    ibv_destroy_qp(ucqp);
  }

  /* Errors detected by the builders or the post path: the whole region is refused. */
  uint32_t lkey = a->mr->lkey;
  uintptr_t la = (uintptr_t)a->buf;
  struct ibv_qp_ex* q = region(a);
  ibv_wr_set_sge(q, lkey, la, 8);
  expect_complete(q, EINVAL, "setter without a builder");
  q = region(a);
  ibv_wr_send_tso(q, a->buf, 40, 1000);
  ibv_wr_set_sge(q, lkey, la, 8);
  expect_complete(q, EOPNOTSUPP, "ibv_wr_send_tso");
  q = region(a);
  ibv_wr_rdma_read(q, b->mr->rkey, (uintptr_t)b->buf);
  ibv_wr_set_inline_data(q, "x", 1);
  expect_complete(q, EINVAL, "inline data on a READ");
  struct ibv_sge many[5];
  for (int i = 0; i < 5; i++) many[i] = (struct ibv_sge){la + (uintptr_t)i * 8, 8, lkey};
  q = region(a);
  ibv_wr_send(q);
  ibv_wr_set_sge_list(q, 5, many);
  expect_complete(q, EINVAL, "5 SGEs with max_send_sge 4");
  char big[600];
  memset(big, 'b', sizeof big);
  q = region(a);
  ibv_wr_send(q);
  ibv_wr_set_inline_data(q, big, sizeof big);
  expect_complete(q, EINVAL, "inline data over max_inline_data");
  q = region(a);
  ibv_wr_atomic_fetch_add(q, b->mr->rkey, (uintptr_t)b->buf, 1);
  ibv_wr_set_sge(q, lkey, la, 4);
  expect_complete(q, EINVAL, "atomic of 4 bytes");
  /* A valid WR followed by an invalid one: neither is posted. */
  q = region(a);
  ibv_wr_send(q);
  ibv_wr_set_sge(q, lkey, la, 8);
  ibv_wr_send(q);
  ibv_wr_set_sge_list(q, 5, many);
  expect_complete(q, EINVAL, "valid + invalid WR");
  expect_quiet(a, b, 100);
}

/* A pair whose send queue holds 4 WRs: a region of 5 fails with ENOMEM and posts nothing. */
static void case_full_queue(struct ext_side* a, struct ext_side* b) {
  for (int i = 0; i < 8; i++) post_recv(b, 500 + i, (size_t)i * 64, 64);
  struct ibv_qp_ex* q = a->qpx;
  region(a);
  for (int i = 0; i < 5; i++) {
    q->wr_id = 50 + i;
    ibv_wr_send(q);
    ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)a->buf, 8);
  }
  expect_complete(q, ENOMEM, "5 WRs into a 4-deep send queue");
  expect_quiet(a, b, 200);
  ibv_wr_start(q);
  for (int i = 0; i < 4; i++) {
    q->wr_id = 60 + i;
    ibv_wr_send(q);
    ibv_wr_set_sge(q, a->mr->lkey, (uintptr_t)a->buf, 8);
  }
  CHECK(ibv_wr_complete(q) == 0, "4 WRs into a 4-deep send queue failed");
  struct exwc sw[4], rw[4];
  CHECK(poll_n(a, sw, 4, TIMEOUT_MS) == 4, "4 send completions expected");
  CHECK(poll_n(b, rw, 4, TIMEOUT_MS) == 4, "4 receive completions expected");
  for (int i = 0; i < 4; i++) {
    check_send_wc(&sw[i], 60u + (unsigned)i, IBV_WC_SEND, a);
    check_recv_wc(&rw[i], 500u + (unsigned)i, IBV_WC_RECV, 8, 0, 0, b, a);
  }
}

/* The memory-window builders. Without type 2 windows they are refused (at creation for
 * send_ops_flags, at ibv_wr_complete for the builders); with them: B binds a window over
 * part of its MR, A writes through it, invalidates it with SEND_WITH_INV, B binds it
 * again and invalidates it locally, and A's next write through it fails. */
static void case_mw(struct ext_side* a, struct ext_side* b) {
  uint32_t lkey = a->mr->lkey;
  uintptr_t la = (uintptr_t)a->buf;
  if (!device_has_mw2(a->s.ctx)) {
    uint64_t base = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    expect_qp_ex_error(a, IBV_QPT_RC, base, IBV_QP_EX_WITH_BIND_MW, EOPNOTSUPP, "RC + BIND_MW");
    expect_qp_ex_error(a, IBV_QPT_RC, base, IBV_QP_EX_WITH_LOCAL_INV, EOPNOTSUPP, "RC + LOCAL_INV");
    expect_qp_ex_error(a, IBV_QPT_RC, base, IBV_QP_EX_WITH_SEND_WITH_INV, EOPNOTSUPP, "RC + SEND_WITH_INV");
    struct ibv_mw_bind_info bind;
    memset(&bind, 0, sizeof bind);
    struct ibv_qp_ex* q = region(a);
    ibv_wr_local_inv(q, 0x1234);
    expect_complete(q, EOPNOTSUPP, "ibv_wr_local_inv");
    q = region(a);
    ibv_wr_bind_mw(q, NULL, 0x1234, &bind);
    expect_complete(q, EOPNOTSUPP, "ibv_wr_bind_mw");
    q = region(a);
    ibv_wr_send_inv(q, 0x1234);
    ibv_wr_set_sge(q, lkey, la, 8);
    expect_complete(q, EOPNOTSUPP, "ibv_wr_send_inv");
    expect_quiet(a, b, 100);
    return;
  }
  struct ibv_mw* mw = ibv_alloc_mw(b->s.pd, IBV_MW_TYPE_2);
  CHECK(mw != NULL, "ibv_alloc_mw(type 2): %s", strerror(errno));
  if (!mw) return;
  struct ibv_mw_bind_info bi = {b->mr, (uintptr_t)b->buf + 8192, 4096,
                                IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
  struct ibv_qp_ex* bq = b->qpx;
  struct ibv_qp_ex* q = a->qpx;
  struct exwc sw, rw;

  uint32_t key1 = ibv_inc_rkey(mw->rkey);
  ibv_wr_start(bq);
  bq->wr_id = 71;
  bq->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_bind_mw(bq, mw, key1, &bi);
  CHECK(ibv_wr_complete(bq) == 0, "ibv_wr_bind_mw: ibv_wr_complete failed");
  CHECK(poll_n(b, &rw, 1, TIMEOUT_MS) == 1, "no bind completion");
  check_send_wc(&rw, 71, IBV_WC_BIND_MW, b);

  ibv_wr_start(q);
  q->wr_id = 72;
  q->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(q, key1, (uintptr_t)b->buf + 8192 + 100);
  ibv_wr_set_inline_data(q, "through a window", 16);
  CHECK(ibv_wr_complete(q) == 0, "write through the window: ibv_wr_complete failed");
  CHECK(poll_n(a, &sw, 1, TIMEOUT_MS) == 1, "no completion for the write through the window");
  check_send_wc(&sw, 72, IBV_WC_RDMA_WRITE, a);
  CHECK(memcmp(b->buf + 8192 + 100, "through a window", 16) == 0, "write through the window: data differs");

  post_recv(b, 700, 0, 64);
  strcpy((char*)a->buf, "invalidate!");
  ibv_wr_start(q);
  q->wr_id = 73;
  ibv_wr_send_inv(q, key1);
  ibv_wr_set_sge(q, lkey, la, 12);
  CHECK(ibv_wr_complete(q) == 0, "ibv_wr_send_inv: ibv_wr_complete failed");
  CHECK(poll_n(a, &sw, 1, TIMEOUT_MS) == 1, "no SEND_WITH_INV completion");
  check_send_wc(&sw, 73, IBV_WC_SEND, a);
  CHECK(poll_n(b, &rw, 1, TIMEOUT_MS) == 1, "no receive completion for SEND_WITH_INV");
  CHECK(rw.status == IBV_WC_SUCCESS && rw.opcode == IBV_WC_RECV && (rw.wc_flags & IBV_WC_WITH_INV) &&
            rw.inv_rkey == key1 && rw.byte_len == 12,
        "SEND_WITH_INV receive: status %s opcode %d wc_flags 0x%x invalidated rkey 0x%x (expected 0x%x)",
        ibv_wc_status_str(rw.status), rw.opcode, rw.wc_flags, rw.inv_rkey, key1);

  uint32_t key2 = ibv_inc_rkey(key1);
  ibv_wr_start(bq);
  bq->wr_id = 74;
  bq->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_bind_mw(bq, mw, key2, &bi);
  bq->wr_id = 75;
  ibv_wr_local_inv(bq, key2);
  CHECK(ibv_wr_complete(bq) == 0, "bind + local invalidate: ibv_wr_complete failed");
  struct exwc bw[2];
  CHECK(poll_n(b, bw, 2, TIMEOUT_MS) == 2, "bind + local invalidate: completions missing");
  check_send_wc(&bw[0], 74, IBV_WC_BIND_MW, b);
  check_send_wc(&bw[1], 75, IBV_WC_LOCAL_INV, b);

  ibv_wr_start(q);
  q->wr_id = 76;
  ibv_wr_rdma_write(q, key2, (uintptr_t)b->buf + 8192);
  ibv_wr_set_inline_data(q, "too late", 8);
  CHECK(ibv_wr_complete(q) == 0, "write through the invalidated window: ibv_wr_complete failed");
  CHECK(poll_n(a, &sw, 1, TIMEOUT_MS) == 1, "no completion for the write through an invalidated window");
  CHECK(sw.wr_id == 76 && sw.status == IBV_WC_REM_ACCESS_ERR, "invalidated window: wr_id %llu status %s",
        (unsigned long long)sw.wr_id, ibv_wc_status_str(sw.status));
  CHECK(memcmp(b->buf + 8192, "too late", 8) != 0, "a write through an invalidated window reached memory");
  CHECK(ibv_dealloc_mw(mw) == 0, "ibv_dealloc_mw failed");
}

static void case_device_ex(struct ext_side* a, struct ext_side* b) {
  (void)b;
  struct ibv_context* ctx = a->s.ctx;
  struct ibv_device_attr orig;
  struct ibv_device_attr_ex ax;
  memset(&ax, 0xA5, sizeof ax);
  CHECK(ibv_query_device(ctx, &orig) == 0, "ibv_query_device failed");
  CHECK(ibv_query_device_ex(ctx, NULL, &ax) == 0, "ibv_query_device_ex failed");
  CHECK(memcmp(&orig, &ax.orig_attr, sizeof orig) == 0, "orig_attr differs from ibv_query_device");
  CHECK(ax.hca_core_clock == 1000000, "hca_core_clock %llu kHz, expected 1000000 (ns ticks)",
        (unsigned long long)ax.hca_core_clock);
  CHECK(ax.completion_timestamp_mask != 0, "completion_timestamp_mask is 0");
  CHECK(ax.odp_caps.general_caps & IBV_ODP_SUPPORT, "no IBV_ODP_SUPPORT");
  uint32_t rc_odp = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ;
  CHECK((ax.odp_caps.per_transport_caps.rc_odp_caps & rc_odp) == rc_odp, "rc_odp_caps 0x%x",
        ax.odp_caps.per_transport_caps.rc_odp_caps);
#if defined(__x86_64__)
  /* Atomics on ODP memory, as mlx5 (an unmapped page is a remote access error: the locked
     instruction survives the fault, core/guarded_access.h; x86-64 only). */
  CHECK(ax.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_ATOMIC, "rc_odp_caps lacks ATOMIC");
#else
  CHECK(!(ax.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_ATOMIC), "rc_odp_caps reports ATOMIC");
#endif
  CHECK((ax.device_cap_flags_ex & 0xFFFFFFFFull) == (uint64_t)(unsigned)orig.device_cap_flags,
        "device_cap_flags_ex does not extend device_cap_flags");
  /* The capability flags say what uroce does (ud_test: UD_AV_PORT_ENFORCE and the
   * qkey_viol_cntr; mw_test: type 2B windows; srq_test: resizing) and nothing else: one
   * port (no CHANGE_PHY_PORT), no automatic path migration, no P_Key counter, no fast
   * registration, IBV_QP_CUR_STATE only equal to the state, no checksum offload. */
  const unsigned want_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID |
                              IBV_DEVICE_UD_AV_PORT_ENFORCE | IBV_DEVICE_BAD_QKEY_CNTR | IBV_DEVICE_MEM_WINDOW |
                              IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_SRQ_RESIZE | IBV_DEVICE_XRC;
  CHECK((unsigned)orig.device_cap_flags == want_flags, "device_cap_flags 0x%x, expected 0x%x",
        (unsigned)orig.device_cap_flags, want_flags);
  CHECK(ax.device_cap_flags_ex == want_flags, "device_cap_flags_ex 0x%llx has bits above 31 or differs",
        (unsigned long long)ax.device_cap_flags_ex);
  CHECK(orig.max_res_rd_atom == orig.max_qp * orig.max_qp_rd_atom, "max_res_rd_atom %d, max_qp %d x max_qp_rd_atom %d",
        orig.max_res_rd_atom, orig.max_qp, orig.max_qp_rd_atom);
  CHECK(orig.atomic_cap == IBV_ATOMIC_HCA && orig.max_raw_ipv6_qp == 0 && orig.max_raw_ethy_qp == 0,
        "atomic_cap %d, raw QPs %d/%d", (int)orig.atomic_cap, orig.max_raw_ipv6_qp, orig.max_raw_ethy_qp);
  /* UC and UD receive through SRQs too (ud_test: a UD QP on an SRQ with an ODP MR). */
  uint32_t ud_odp = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
  CHECK(ax.odp_caps.per_transport_caps.ud_odp_caps == ud_odp, "ud_odp_caps 0x%x",
        ax.odp_caps.per_transport_caps.ud_odp_caps);
  CHECK(ax.odp_caps.per_transport_caps.uc_odp_caps == (ud_odp | IBV_ODP_SUPPORT_WRITE), "uc_odp_caps 0x%x",
        ax.odp_caps.per_transport_caps.uc_odp_caps);
  CHECK(ax.raw_packet_caps == 0 && ax.rss_caps.max_rwq_indirection_tables == 0 && ax.max_wq_type_rq == 0 &&
            ax.packet_pacing_caps.qp_rate_limit_max == 0 && ax.tm_caps.max_num_tags == 0 &&
            ax.pci_atomic_caps.fetch_add == 0 && ax.tso_caps.supported_qpts == 0,
        "raw packet / RSS / WQ / pacing / tag matching / PCI atomic / TSO caps reported");
  CHECK(ax.cq_mod_caps.max_cq_count == 0 && ax.tso_caps.max_tso == 0 && ax.comp_mask == 0,
        "unsupported features reported as present");
  /* Device memory and implicit ODP are offered (dm_test.c checks them). */
  CHECK(ax.max_dm_size == 256 * 1024, "max_dm_size %llu", (unsigned long long)ax.max_dm_size);
  CHECK(ax.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT, "no IBV_ODP_SUPPORT_IMPLICIT");
  uint32_t xrc_odp = rc_odp | IBV_ODP_SUPPORT_SRQ_RECV;  // what ibv_xsrq_pingpong -o asks for
  CHECK((ax.xrc_odp_caps & xrc_odp) == xrc_odp, "xrc_odp_caps 0x%x", ax.xrc_odp_caps);
  CHECK(ax.phys_port_cnt_ex == 1, "phys_port_cnt_ex %u", ax.phys_port_cnt_ex);
  struct ibv_query_device_ex_input in = {.comp_mask = 1};
  CHECK(ibv_query_device_ex(ctx, &in, &ax) == EINVAL, "ibv_query_device_ex with input comp_mask must be EINVAL");

  struct ibv_values_ex v1 = {.comp_mask = IBV_VALUES_MASK_RAW_CLOCK}, v2 = v1;
  CHECK(ibv_query_rt_values_ex(ctx, &v1) == 0 && ibv_query_rt_values_ex(ctx, &v2) == 0, "rt values failed");
  uint64_t r1 = (uint64_t)v1.raw_clock.tv_sec * 1000000000ull + (uint64_t)v1.raw_clock.tv_nsec;
  uint64_t r2 = (uint64_t)v2.raw_clock.tv_sec * 1000000000ull + (uint64_t)v2.raw_clock.tv_nsec;
  CHECK(v1.comp_mask == IBV_VALUES_MASK_RAW_CLOCK && r1 != 0 && r2 >= r1, "raw clock %llu then %llu",
        (unsigned long long)r1, (unsigned long long)r2);
  struct ibv_values_ex none = {.comp_mask = 0};
  CHECK(ibv_query_rt_values_ex(ctx, &none) == 0 && none.comp_mask == 0, "rt values with empty mask");

  /* GIDs: the extended queries agree with ibv_query_gid and say RoCE v2. */
  struct ibv_port_attr pa;
  CHECK(ibv_query_port(ctx, 1, &pa) == 0, "ibv_query_port failed");
  union ibv_gid gid0;
  CHECK(ibv_query_gid(ctx, 1, 0, &gid0) == 0, "ibv_query_gid failed");
  struct ibv_gid_entry ge;
  CHECK(ibv_query_gid_ex(ctx, 1, 0, &ge, 0) == 0, "ibv_query_gid_ex failed");
  CHECK(memcmp(&ge.gid, &gid0, sizeof gid0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2 && ge.port_num == 1 &&
            ge.gid_index == 0 && ge.ndev_ifindex != 0,
        "ibv_query_gid_ex: type %u port %u index %u ifindex %u", ge.gid_type, ge.port_num, ge.gid_index,
        ge.ndev_ifindex);
  CHECK(ibv_query_gid_ex(ctx, 2, 0, &ge, 0) == EINVAL, "ibv_query_gid_ex on port 2 must be EINVAL");
  CHECK(ibv_query_gid_ex(ctx, 1, (uint32_t)pa.gid_tbl_len, &ge, 0) == EINVAL,
        "ibv_query_gid_ex past the table must be EINVAL");
  struct ibv_gid_entry table[64];
  ssize_t n = ibv_query_gid_table(ctx, table, 64, 0);
  CHECK(n > 0 && n < pa.gid_tbl_len, "ibv_query_gid_table returned %zd, gid_tbl_len %d", n, pa.gid_tbl_len);
  for (ssize_t i = 0; i < n; i++) {
    union ibv_gid g;
    CHECK(ibv_query_gid(ctx, 1, (int)i, &g) == 0 && memcmp(&g, &table[i].gid, sizeof g) == 0 &&
              table[i].gid_type == IBV_GID_TYPE_ROCE_V2 && table[i].gid_index == (uint32_t)i,
          "gid table entry %zd", i);
  }
  /* The slots after the addresses are empty, as a NIC's: ENODATA from ibv_query_gid_ex, a
     zero GID from ibv_query_gid. */
  if (n > 0 && n < pa.gid_tbl_len) {
    union ibv_gid g, zero;
    memset(&g, 0xAB, sizeof g);
    memset(&zero, 0, sizeof zero);
    CHECK(ibv_query_gid_ex(ctx, 1, (uint32_t)n, &ge, 0) == ENODATA, "an empty GID slot must be ENODATA");
    CHECK(ibv_query_gid(ctx, 1, (int)n, &g) == 0 && memcmp(&g, &zero, sizeof g) == 0,
          "ibv_query_gid of an empty slot: a zero GID");
    CHECK(ibv_query_gid(ctx, 1, pa.gid_tbl_len, &g) != 0, "ibv_query_gid past the table must fail");
  }

  /* ODP MRs and ibv_advise_mr. */
  uint8_t* mem = aligned_alloc(4096, 8192);
  struct ibv_mr* odp = ibv_reg_mr(a->s.pd, mem, 8192, IBV_ACCESS_ON_DEMAND | ACCESS_ALL);
  struct ibv_mr* odp_ro = ibv_reg_mr(a->s.pd, mem, 8192, IBV_ACCESS_ON_DEMAND);
  CHECK(odp && odp_ro, "ibv_reg_mr with IBV_ACCESS_ON_DEMAND: %s", strerror(errno));
  if (odp && odp_ro) {
    struct ibv_sge sg[2] = {{(uintptr_t)mem, 4096, odp->lkey}, {(uintptr_t)mem + 4096, 4096, odp->lkey}};
    CHECK(ibv_advise_mr(a->s.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, sg, 2) == 0,
          "ibv_advise_mr(PREFETCH_WRITE) failed");
    CHECK(ibv_advise_mr(a->s.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, sg, 1) == 0, "ibv_advise_mr(PREFETCH) failed");
    CHECK(ibv_advise_mr(a->s.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, sg, 1) == 0,
          "ibv_advise_mr(PREFETCH_NO_FAULT) failed");
    CHECK(ibv_advise_mr(a->s.pd, (enum ibv_advise_mr_advice)99, 0, sg, 1) == EOPNOTSUPP, "unknown advice");
    CHECK(ibv_advise_mr(a->s.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 2, sg, 1) == EINVAL, "unknown flag");
    CHECK(ibv_advise_mr(a->s.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, sg, 0) == EINVAL, "no SGE");
    struct ibv_sge out = {(uintptr_t)mem + 4096, 8192, odp->lkey};
    CHECK(ibv_advise_mr(a->s.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &out, 1) == EFAULT, "range past the MR");
    struct ibv_sge badkey = {(uintptr_t)mem, 8, odp->lkey ^ 0xFFFF00u};
    CHECK(ibv_advise_mr(a->s.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &badkey, 1) == EFAULT, "invalid lkey");
    struct ibv_sge ro = {(uintptr_t)mem, 8, odp_ro->lkey};
    CHECK(ibv_advise_mr(a->s.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &ro, 1) == 0, "read prefetch of a read-only MR");
    CHECK(ibv_advise_mr(a->s.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, 0, &ro, 1) == EPERM,
          "write prefetch of a read-only MR must be EPERM");
    struct ibv_sge pinned = {(uintptr_t)a->buf, 8, a->mr->lkey};
    CHECK(ibv_advise_mr(a->s.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &pinned, 1) == EINVAL,
          "prefetch of a non-ODP MR must be EINVAL");
    struct ibv_pd* other = ibv_alloc_pd(ctx);
    CHECK(other && ibv_advise_mr(other, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, sg, 1) == EPERM,
          "another PD's MR must be EPERM");
    if (other) ibv_dealloc_pd(other);
  }
  if (odp) ibv_dereg_mr(odp);
  if (odp_ro) ibv_dereg_mr(odp_ro);
  free(mem);
}

struct testcase {
  const char* name;
  void (*fn)(struct ext_side*, struct ext_side*);
  uint32_t sq_depth;
  int with_channel;
};

static const struct testcase kCases[] = {
    {"send", case_send, 64, 0},
    {"rdma", case_rdma, 64, 0},
    {"atomic", case_atomic, 64, 0},
    {"abort", case_abort, 64, 0},
    {"cq_ex", case_cq_ex, 64, 1},
    {"bad_input", case_bad_input, 64, 0},
    {"full_queue", case_full_queue, 4, 0},
    {"mw", case_mw, 64, 0},
    {"device_ex", case_device_ex, 64, 0},
};

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const size_t ncases = sizeof kCases / sizeof kCases[0];
  if (argc != 2) {
    fprintf(stderr, "usage: ext_verbs_test CASE (--list prints them)\n");
    return 2;
  }
  if (strcmp(argv[1], "--list") == 0) {
    for (size_t i = 0; i < ncases; i++) printf("%s\n", kCases[i].name);
    return 0;
  }
  for (size_t i = 0; i < ncases; i++) {
    if (strcmp(argv[1], kCases[i].name) != 0) continue;
    struct vp_params p;
    vp_default_params(&p);
    p.sq_depth = kCases[i].sq_depth;
    p.rq_depth = 64;
    struct ext_side a, b;
    if (pair_open(&a, &b, &p, kCases[i].with_channel)) {
      printf("ext_verbs_test: setup failed\n");
      return 1;
    }
    kCases[i].fn(&a, &b);
    pair_close(&a, &b);
    printf("ext_verbs_test %s: %s\n", argv[1], g_failures ? "FAILED" : "passed");
    return g_failures ? 1 : 0;
  }
  fprintf(stderr, "ext_verbs_test: unknown case '%s'\n", argv[1]);
  return 2;
}
