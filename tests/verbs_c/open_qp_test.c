/* ibv_open_qp: handles on an existing XRC target QP (IBV_QPT_XRC_RECV), as the kernel's
 * ib_open_qp / ib_close_qp give them. Every process or device context that opened the XRC
 * domain (ibv_open_xrcd with the same file) can open a handle on one of its target QPs by
 * number; each handle queries and modifies the same QP, gets its asynchronous events with
 * its own ibv_qp and qp_context, and ibv_destroy_qp of a handle drops only that handle's
 * reference: the QP lives while any handle (its creator's included) does.
 *
 *   same_process   context A creates the domain (a temporary file) and the target QP;
 *                  context B opens the same file's domain and the QP. Through B's handle:
 *                  query (RESET, qp_context B's) and modify (INIT, RTR towards A's INI QP,
 *                  RTS), seen by A's query; A's INI QP sends to the target naming B's XRC
 *                  SRQ (1 B .. 64 KiB), data and completions checked. An RDMA WRITE with a
 *                  bad R_Key gives IBV_EVENT_QP_FATAL on both handles (each with its own
 *                  ibv_qp); A resets and reconnects the QP. Destroying B's handle leaves A's
 *                  working; with a second handle of B, destroying A's handle (and closing
 *                  A's domain handle) leaves the QP working through B's; destroying that last
 *                  handle destroys the QP: ibv_open_qp of its number is EINVAL, the INI QP's
 *                  next SEND ends in IBV_WC_RETRY_EXC_ERR.
 *   cross_process  a fork()ed child opens the parent's domain file and target QP and
 *                  connects it (query RESET, INIT, RTR, RTS through its handle); the parent
 *                  sees those attributes through its own handle, sends through the QP to its
 *                  own XRC SRQ, destroys its handle and sends again (the QP lives for the
 *                  child's handle); a bad-R_Key WRITE gives the child IBV_EVENT_QP_FATAL on
 *                  its handle; the child destroys its handle, and the QP is gone for the
 *                  parent (ibv_open_qp EINVAL).
 *   bad            comp_mask without NUM, XRCD or TYPE -> EINVAL, with an unknown bit ->
 *                  EOPNOTSUPP; NULL xrcd, another context's xrcd, qp_type RC / UD /
 *                  XRC_SEND -> EINVAL; a number no target QP of the domain has (none at all,
 *                  an INI QP's, another domain's target's) -> EINVAL; ibv_post_send /
 *                  ibv_post_recv on a handle -> EINVAL; ibv_close_xrcd while a handle uses
 *                  it -> EBUSY; when the creator's context is closed (its own handle
 *                  destroyed, the QP kept for another context's), the QP goes with it:
 *                  query / modify of the remaining handle -> EIO, its destroy -> 0.
 *
 * Usage: open_qp_test CASE. Exit 0 when every check passes. */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "verbs_pair.h"

#define BIG (64 * 1024)
#define NMSG 4
#define INI_PSN 0x1234
#define TGT_PSN 0x5678
static const uint32_t kSizes[NMSG] = {1, 4097, BIG, 100};

/* ---------- setup ---------- */

struct port {
  uint16_t lid;
  union ibv_gid gid;
};

static struct ibv_context* open_ctx(struct port* port) {
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  struct ibv_context* ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
  if (list) ibv_free_device_list(list);
  if (!ctx) {
    printf("no RDMA device could be opened: %s\n", strerror(errno));
    exit(1);
  }
  struct ibv_port_attr pa;
  if (ibv_query_port(ctx, 1, &pa) || ibv_query_gid(ctx, 1, 0, &port->gid)) {
    printf("ibv_query_port/ibv_query_gid failed\n");
    exit(1);
  }
  port->lid = pa.lid;
  return ctx;
}

static struct ibv_xrcd* open_xrcd(struct ibv_context* ctx, int fd, int oflags) {
  struct ibv_xrcd_init_attr a;
  memset(&a, 0, sizeof a);
  a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  a.fd = fd;
  a.oflags = oflags;
  struct ibv_xrcd* x = ibv_open_xrcd(ctx, &a);
  if (!x) printf("ibv_open_xrcd(fd %d, oflags 0x%x): %s\n", fd, oflags, strerror(errno));
  return x;
}

static struct ibv_qp* create_tgt(struct ibv_context* ctx, struct ibv_xrcd* xrcd, void* qp_context) {
  struct ibv_qp_init_attr_ex a;
  memset(&a, 0, sizeof a);
  a.qp_type = IBV_QPT_XRC_RECV;
  a.qp_context = qp_context;
  a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
  a.xrcd = xrcd;
  struct ibv_qp* qp = ibv_create_qp_ex(ctx, &a);
  if (!qp) printf("ibv_create_qp_ex(IBV_QPT_XRC_RECV): %s\n", strerror(errno));
  return qp;
}

static struct ibv_qp* create_ini(struct ibv_context* ctx, struct ibv_pd* pd, struct ibv_cq* cq) {
  struct ibv_qp_init_attr_ex a;
  memset(&a, 0, sizeof a);
  a.qp_type = IBV_QPT_XRC_SEND;
  a.send_cq = cq;
  a.cap.max_send_wr = 32;
  a.cap.max_send_sge = 1;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.pd = pd;
  struct ibv_qp* qp = ibv_create_qp_ex(ctx, &a);
  if (!qp) printf("ibv_create_qp_ex(IBV_QPT_XRC_SEND): %s\n", strerror(errno));
  return qp;
}

static struct ibv_srq* create_xsrq(struct ibv_context* ctx, struct ibv_xrcd* xrcd, struct ibv_pd* pd,
                                   struct ibv_cq* cq) {
  struct ibv_srq_init_attr_ex a;
  memset(&a, 0, sizeof a);
  a.attr.max_wr = 64;
  a.attr.max_sge = 1;
  a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD;
  a.srq_type = IBV_SRQT_XRC;
  a.xrcd = xrcd;
  a.cq = cq;
  a.pd = pd;
  struct ibv_srq* s = ibv_create_srq_ex(ctx, &a);
  if (!s) printf("ibv_create_srq_ex(IBV_SRQT_XRC): %s\n", strerror(errno));
  return s;
}

/* ibv_open_qp with the given comp_mask / type; errno as it left it. */
static struct ibv_qp* open_qp_ex(struct ibv_context* ctx, struct ibv_xrcd* xrcd, uint32_t qpn, void* qp_context,
                                 uint32_t comp_mask, enum ibv_qp_type type) {
  struct ibv_qp_open_attr a;
  memset(&a, 0, sizeof a);
  a.comp_mask = comp_mask;
  a.qp_num = qpn;
  a.xrcd = xrcd;
  a.qp_context = qp_context;
  a.qp_type = type;
  errno = 0;
  return ibv_open_qp(ctx, &a);
}

static const uint32_t kAllMask =
    IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_CONTEXT | IBV_QP_OPEN_ATTR_TYPE;

static struct ibv_qp* open_qp(struct ibv_context* ctx, struct ibv_xrcd* xrcd, uint32_t qpn, void* qp_context) {
  struct ibv_qp* qp = open_qp_ex(ctx, xrcd, qpn, qp_context, kAllMask, IBV_QPT_XRC_RECV);
  if (!qp) printf("ibv_open_qp(0x%x): %s\n", qpn, strerror(errno));
  return qp;
}

static void fill_av(struct ibv_ah_attr* av, const struct port* peer) {
  memset(av, 0, sizeof *av);
  av->is_global = 1;
  av->grh.dgid = peer->gid;
  av->grh.sgid_index = 0;
  av->grh.hop_limit = 64;
  av->dlid = peer->lid;
  av->port_num = 1;
}

static int to_init(struct ibv_qp* qp, int access) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = access;
  int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc) printf("RESET->INIT (qp 0x%x): %s\n", qp->qp_num, strerror(rc));
  return rc;
}

static const int kTgtAccess = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

/* A target handle: INIT, RTR towards INI QP `ini_qpn` at `ini_port`, RTS. */
static int connect_tgt(struct ibv_qp* tgt, const struct port* ini_port, uint32_t ini_qpn) {
  if (to_init(tgt, kTgtAccess)) return -1;
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = ini_qpn;
  a.rq_psn = INI_PSN;
  a.max_dest_rd_atomic = 4;
  a.min_rnr_timer = 1;
  fill_av(&a.ah_attr, ini_port);
  int rc = ibv_modify_qp(tgt, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc) {
    printf("TGT INIT->RTR: %s\n", strerror(rc));
    return -1;
  }
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.sq_psn = TGT_PSN;
  rc = ibv_modify_qp(tgt, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN);
  if (rc) printf("TGT RTR->RTS: %s\n", strerror(rc));
  return rc ? -1 : 0;
}

/* An INI QP: INIT, RTR towards target QP `tgt_qpn` at `tgt_port`, RTS. A short retry
 * budget (timeout 12 ~ 17 ms, retry_cnt 2), so that a target that is gone is noticed. */
static int connect_ini(struct ibv_qp* ini, const struct port* tgt_port, uint32_t tgt_qpn) {
  if (to_init(ini, 0)) return -1;
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = tgt_qpn;
  a.rq_psn = TGT_PSN;
  fill_av(&a.ah_attr, tgt_port);
  int rc = ibv_modify_qp(ini, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN);
  if (rc) {
    printf("INI INIT->RTR: %s\n", strerror(rc));
    return -1;
  }
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 12;
  a.retry_cnt = 2;
  a.rnr_retry = 7;
  a.sq_psn = INI_PSN;
  a.max_rd_atomic = 4;
  rc = ibv_modify_qp(
      ini, &a,
      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc) printf("INI RTR->RTS: %s\n", strerror(rc));
  return rc ? -1 : 0;
}

static enum ibv_qp_state query_state(struct ibv_qp* qp, struct ibv_qp_attr* a, struct ibv_qp_init_attr* init) {
  memset(a, 0, sizeof *a);
  memset(init, 0, sizeof *init);
  int rc = ibv_query_qp(qp, a, IBV_QP_STATE, init);
  CHECK(rc == 0, "ibv_query_qp(qp 0x%x): %s", qp->qp_num, strerror(rc));
  return rc ? IBV_QPS_UNKNOWN : a->qp_state;
}

/* ---------- data path ---------- */

static void pattern(uint8_t* p, size_t len, uint32_t seed) {
  uint64_t st = seed;
  for (size_t i = 0; i < len; i++) p[i] = (uint8_t)vp_rand(&st);
}

/* A signaled XRC SEND (or, with rkey != 0, RDMA WRITE to raddr/rkey) naming SRQ `srqn`. */
static int post_x(struct ibv_qp* ini, uint32_t srqn, void* buf, uint32_t len, uint32_t lkey, uint64_t raddr,
                  uint32_t rkey) {
  struct ibv_sge sge = {(uintptr_t)buf, len, lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 0x77;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = rkey ? IBV_WR_RDMA_WRITE : IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.qp_type.xrc.remote_srqn = srqn;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  int rc = ibv_post_send(ini, &wr, &bad);
  CHECK(rc == 0, "ibv_post_send(srqn 0x%x): %s", srqn, strerror(rc));
  return rc;
}

static enum ibv_wc_status next_status(struct ibv_cq* cq, struct ibv_wc* wc, int ms) {
  if (vp_poll(cq, wc, ms) != 1) {
    memset(wc, 0, sizeof *wc);
    wc->status = IBV_WC_GENERAL_ERR;
  }
  return wc->status;
}

/* The receive side of the exchanges: an XRC SRQ with its PD, CQ and buffers. */
struct rx {
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  struct ibv_srq* srq;
  uint32_t srqn;
  uint8_t* buf;
  struct ibv_mr* mr;
};

static void rx_open(struct rx* r, struct ibv_context* ctx, struct ibv_xrcd* xrcd) {
  memset(r, 0, sizeof *r);
  r->pd = ibv_alloc_pd(ctx);
  r->cq = r->pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
  r->srq = r->cq ? create_xsrq(ctx, xrcd, r->pd, r->cq) : NULL;
  r->buf = r->srq ? malloc((size_t)NMSG * BIG) : NULL;
  r->mr =
      r->buf ? ibv_reg_mr(r->pd, r->buf, (size_t)NMSG * BIG, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) : NULL;
  if (!r->mr || ibv_get_srq_num(r->srq, &r->srqn)) {
    printf("receive side setup failed: %s\n", strerror(errno));
    exit(1);
  }
}

static void rx_close(struct rx* r) {
  CHECK(ibv_destroy_srq(r->srq) == 0, "ibv_destroy_srq");
  ibv_dereg_mr(r->mr);
  ibv_destroy_cq(r->cq);
  ibv_dealloc_pd(r->pd);
  free(r->buf);
}

/* The send side: an INI QP with its PD, CQ and buffer. */
struct tx {
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  struct ibv_qp* ini;
  uint8_t* buf;
  struct ibv_mr* mr;
};

static void tx_open(struct tx* t, struct ibv_context* ctx) {
  memset(t, 0, sizeof *t);
  t->pd = ibv_alloc_pd(ctx);
  t->cq = t->pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
  t->ini = t->cq ? create_ini(ctx, t->pd, t->cq) : NULL;
  t->buf = t->ini ? malloc(BIG) : NULL;
  t->mr = t->buf ? ibv_reg_mr(t->pd, t->buf, BIG, IBV_ACCESS_LOCAL_WRITE) : NULL;
  if (!t->mr) {
    printf("send side setup failed: %s\n", strerror(errno));
    exit(1);
  }
}

/* A new INI QP (after the old one went to ERR). */
static void tx_new_ini(struct tx* t, struct ibv_context* ctx) {
  CHECK(ibv_destroy_qp(t->ini) == 0, "ibv_destroy_qp(INI)");
  t->ini = create_ini(ctx, t->pd, t->cq);
  if (!t->ini) exit(1);
}

static void tx_close(struct tx* t) {
  CHECK(ibv_destroy_qp(t->ini) == 0, "ibv_destroy_qp(INI)");
  ibv_dereg_mr(t->mr);
  ibv_destroy_cq(t->cq);
  ibv_dealloc_pd(t->pd);
  free(t->buf);
}

/* NMSG SENDs from `t` through target QP `tgt_qpn` into `r`'s SRQ: every completion and
 * byte checked. Returns how many arrived intact. */
static int exchange(struct tx* t, struct rx* r, uint32_t tgt_qpn, uint32_t seed, const char* what) {
  int ok = 0;
  for (int i = 0; i < NMSG; i++) {
    uint8_t* slot = r->buf + (size_t)i * BIG;
    memset(slot, 0xee, BIG);
    struct ibv_sge sge = {(uintptr_t)slot, BIG, r->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
    CHECK(ibv_post_srq_recv(r->srq, &wr, &bad) == 0, "%s: ibv_post_srq_recv", what);
  }
  for (int i = 0; i < NMSG; i++) {
    pattern(t->buf, kSizes[i], seed + (uint32_t)i);
    if (post_x(t->ini, r->srqn, t->buf, kSizes[i], t->mr->lkey, 0, 0)) return ok;
    struct ibv_wc wc;
    enum ibv_wc_status st = next_status(t->cq, &wc, 5000);
    CHECK(st == IBV_WC_SUCCESS, "%s: SEND %d (%u B): %s", what, i, kSizes[i], ibv_wc_status_str(st));
    if (st != IBV_WC_SUCCESS) return ok;
    st = next_status(r->cq, &wc, 5000);
    uint8_t* want = malloc(BIG);
    if (!want) exit(1);
    pattern(want, kSizes[i], seed + (uint32_t)i);
    int good = st == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == (uint64_t)i &&
               wc.byte_len == kSizes[i] && wc.qp_num == tgt_qpn && !memcmp(r->buf + (size_t)i * BIG, want, kSizes[i]);
    CHECK(good, "%s: receive %d: status %s opcode %d wr_id %" PRIu64 " byte_len %u qp_num 0x%x (target 0x%x), data %s",
          what, i, ibv_wc_status_str(st), (int)wc.opcode, wc.wr_id, wc.byte_len, wc.qp_num, tgt_qpn,
          memcmp(r->buf + (size_t)i * BIG, want, kSizes[i]) ? "differs" : "ok");
    free(want);
    ok += good;
  }
  return ok;
}

/* An RDMA WRITE with an R_Key no MR has, naming `srqn`: the target's responder fails it
 * (class C: NAK remote access, the target QP to ERR, IBV_EVENT_QP_FATAL). */
static void write_bad_rkey(struct tx* t, uint32_t srqn, const char* what) {
  if (post_x(t->ini, srqn, t->buf, 8, t->mr->lkey, 0x1000, 0xdead00)) return;
  struct ibv_wc wc;
  enum ibv_wc_status st = next_status(t->cq, &wc, 5000);
  CHECK(st == IBV_WC_REM_ACCESS_ERR, "%s: WRITE with a bad R_Key: %s (want remote access error)", what,
        ibv_wc_status_str(st));
}

/* Waits up to `ms` for an asynchronous event `type` about `qp` on `ctx` (others are
 * acknowledged and skipped). 1 when it came. */
static int wait_qp_event(struct ibv_context* ctx, enum ibv_event_type type, struct ibv_qp* qp, int ms) {
  double deadline = vp_now_ms() + ms;
  for (;;) {
    int left = (int)(deadline - vp_now_ms());
    if (left <= 0) return 0;
    struct pollfd pfd = {ctx->async_fd, POLLIN, 0};
    int r = poll(&pfd, 1, left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    struct ibv_async_event ev;
    if (ibv_get_async_event(ctx, &ev)) return 0;
    int match = ev.event_type == type && ev.element.qp == qp;
    ibv_ack_async_event(&ev);
    if (match) return 1;
  }
}

static int make_temp(char* path) {
  strcpy(path, "/tmp/uroce_open_qp_XXXXXX");
  int fd = mkstemp(path);
  if (fd < 0) {
    printf("mkstemp: %s\n", strerror(errno));
    exit(1);
  }
  return fd;
}

/* ---------- same_process ---------- */

static void case_same_process(void) {
  char path[64];
  int fd = make_temp(path);
  int tag_a = 0, tag_b = 0; /* the handles' qp_context */
  struct port pa, pb;
  struct ibv_context* a = open_ctx(&pa);
  struct ibv_context* b = open_ctx(&pb);
  struct ibv_xrcd* xa = open_xrcd(a, fd, O_CREAT);
  struct ibv_xrcd* xb = xa ? open_xrcd(b, fd, 0) : NULL; /* the same inode: the same domain */
  struct ibv_qp* tgt = xb ? create_tgt(a, xa, &tag_a) : NULL;
  if (!tgt) exit(1);
  const uint32_t qpn = tgt->qp_num;
  struct tx t;
  struct rx r;
  tx_open(&t, a);
  rx_open(&r, b, xb); /* the SRQ is the opener's: requests are relayed from A to B */

  /* Open from B: a new handle on the same QP, B's context and qp_context. */
  struct ibv_qp* h1 = open_qp(b, xb, qpn, &tag_b);
  if (!h1) exit(1);
  CHECK(h1 != tgt && h1->qp_num == qpn && h1->context == b && h1->qp_context == &tag_b &&
            h1->qp_type == IBV_QPT_XRC_RECV && h1->pd == NULL && h1->send_cq == NULL && h1->srq == NULL,
        "the opened handle: %p qp_num 0x%x context %s qp_context %s type %d", (void*)h1, h1->qp_num,
        h1->context == b ? "B" : "other", h1->qp_context == &tag_b ? "B's" : "other", (int)h1->qp_type);
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qi;
  CHECK(query_state(h1, &qa, &qi) == IBV_QPS_RESET && qi.qp_context == &tag_b && qi.qp_type == IBV_QPT_XRC_RECV,
        "query through the handle: state %d, qp_context %s, type %d", (int)qa.qp_state,
        qi.qp_context == &tag_b ? "B's" : "other", (int)qi.qp_type);
  CHECK(h1->state == IBV_QPS_RESET, "the handle's state after the query: %d", (int)h1->state);

  /* Modify through B's handle; A's handle sees it. */
  if (connect_tgt(h1, &pa, t.ini->qp_num) || connect_ini(t.ini, &pa, qpn)) exit(1);
  CHECK(query_state(tgt, &qa, &qi) == IBV_QPS_RTS && qa.dest_qp_num == t.ini->qp_num && qa.rq_psn == INI_PSN &&
            qa.qp_access_flags == (unsigned)kTgtAccess && qa.min_rnr_timer == 1 && qi.qp_context == &tag_a,
        "A's query after B's modify: state %d dest_qp_num 0x%x rq_psn 0x%x access 0x%x rnr %u", (int)qa.qp_state,
        qa.dest_qp_num, qa.rq_psn, qa.qp_access_flags, qa.min_rnr_timer);
  int got = exchange(&t, &r, qpn, 100, "connected through B's handle");
  printf("same_process: target 0x%x (context A, port %u) connected through B's handle (port %u): %d/%d received\n", qpn,
         pa.lid, pb.lid, got, NMSG);

  /* A responder error reaches both handles, each as its own ibv_qp. */
  write_bad_rkey(&t, r.srqn, "same_process");
  CHECK(wait_qp_event(a, IBV_EVENT_QP_FATAL, tgt, 3000), "no IBV_EVENT_QP_FATAL for A's handle on context A");
  CHECK(wait_qp_event(b, IBV_EVENT_QP_FATAL, h1, 3000), "no IBV_EVENT_QP_FATAL for B's handle on context B");
  CHECK(query_state(h1, &qa, &qi) == IBV_QPS_ERR, "B's query after the error: state %d", (int)qa.qp_state);
  CHECK(query_state(tgt, &qa, &qi) == IBV_QPS_ERR, "A's query after the error: state %d", (int)qa.qp_state);
  /* A resets and reconnects it (and a new INI QP). */
  memset(&qa, 0, sizeof qa);
  qa.qp_state = IBV_QPS_RESET;
  CHECK(ibv_modify_qp(tgt, &qa, IBV_QP_STATE) == 0, "ERR->RESET through A's handle");
  tx_new_ini(&t, a);
  if (connect_tgt(tgt, &pa, t.ini->qp_num) || connect_ini(t.ini, &pa, qpn)) exit(1);
  CHECK(query_state(h1, &qa, &qi) == IBV_QPS_RTS && qa.dest_qp_num == t.ini->qp_num,
        "B's query after A's reconnect: state %d dest_qp_num 0x%x", (int)qa.qp_state, qa.dest_qp_num);
  got = exchange(&t, &r, qpn, 200, "reconnected through A's handle");

  /* Destroying B's handle leaves A's QP as it was. */
  CHECK(ibv_destroy_qp(h1) == 0, "ibv_destroy_qp(B's handle)");
  got += exchange(&t, &r, qpn, 300, "after B's handle was destroyed");

  /* Destroying A's (the creator's) handle while B holds one: the QP lives on. */
  struct ibv_qp* h2 = open_qp(b, xb, qpn, &tag_b);
  if (!h2) exit(1);
  CHECK(ibv_destroy_qp(tgt) == 0, "ibv_destroy_qp(A's handle) while B's is open");
  CHECK(ibv_close_xrcd(xa) == 0, "ibv_close_xrcd(A's domain handle) once A's QP handle is destroyed");
  got += exchange(&t, &r, qpn, 400, "after A's handle was destroyed");
  CHECK(query_state(h2, &qa, &qi) == IBV_QPS_RTS && qa.dest_qp_num == t.ini->qp_num,
        "B's query with A's handle gone: state %d", (int)qa.qp_state);
  memset(&qa, 0, sizeof qa);
  qa.min_rnr_timer = 7;
  CHECK(ibv_modify_qp(h2, &qa, IBV_QP_MIN_RNR_TIMER) == 0, "RTS->RTS (min_rnr_timer) through B's handle");
  CHECK(query_state(h2, &qa, &qi) == IBV_QPS_RTS && qa.min_rnr_timer == 7, "min_rnr_timer %u after the modify",
        qa.min_rnr_timer);
  got += exchange(&t, &r, qpn, 500, "after B's RTS->RTS");
  printf(
      "same_process: %d/%d messages in the later phases (after an error and reset, B's handle destroyed, "
      "A's handle destroyed)\n",
      got, 4 * NMSG);

  /* The last handle goes: so does the QP. */
  CHECK(ibv_destroy_qp(h2) == 0, "ibv_destroy_qp(B's last handle)");
  struct ibv_qp* none = open_qp_ex(b, xb, qpn, NULL, kAllMask, IBV_QPT_XRC_RECV);
  CHECK(none == NULL && errno == EINVAL, "ibv_open_qp of the destroyed QP: %p, errno %d", (void*)none, errno);
  if (post_x(t.ini, r.srqn, t.buf, 16, t.mr->lkey, 0, 0) == 0) {
    struct ibv_wc wc;
    enum ibv_wc_status st = next_status(t.cq, &wc, 5000);
    CHECK(st == IBV_WC_RETRY_EXC_ERR, "a SEND to the destroyed target: %s (want retry exceeded)",
          ibv_wc_status_str(st));
  }

  tx_close(&t);
  rx_close(&r);
  CHECK(ibv_close_xrcd(xb) == 0, "ibv_close_xrcd(B)");
  ibv_close_device(a);
  ibv_close_device(b);
  close(fd);
  unlink(path);
}

/* ---------- cross_process ---------- */

static pid_t g_child = -1;
static int g_is_child;
static char g_path[64];

static void xp_atexit(void) {
  if (g_is_child) return;
  if (g_child > 0) {
    kill(g_child, SIGKILL);
    waitpid(g_child, NULL, 0);
    g_child = -1;
  }
  if (g_path[0]) unlink(g_path);
}

/* What the parent tells the child, and the steps they signal each other. */
struct xp_hello {
  uint32_t tgt_qpn;
  uint32_t ini_qpn;
  struct port parent;
};
enum { kConnected = 1, kSent = 2, kQueried = 3, kFatalSent = 4, kGotFatal = 5, kDestroyed = 6, kFailed = 99 };

static int send_step(int fd, int step) {
  uint8_t s = (uint8_t)step;
  return vp_write_full(fd, &s, 1);
}

static int wait_step(int fd, int step, int ms, const char* who) {
  uint8_t s = 0;
  if (vp_read_full(fd, &s, 1, ms) || s != step) {
    CHECK(0, "%s: waited for step %d, got %d", who, step, s);
    return -1;
  }
  return 0;
}

/* The child: opens the parent's target QP, connects it, waits for the QP's fatal event,
 * destroys its handle. */
static int xp_child(int to_parent, int from_parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  alarm(45);
  struct xp_hello h;
  if (vp_read_full(from_parent, &h, sizeof h, 20000)) {
    printf("[child] nothing from the parent\n");
    return 1;
  }
  int tag = 0;
  struct port me;
  struct ibv_context* ctx = open_ctx(&me);
  int fd = open(g_path, O_RDONLY);
  struct ibv_xrcd* x = fd >= 0 ? open_xrcd(ctx, fd, 0) : NULL;
  struct ibv_qp* qp = x ? open_qp(ctx, x, h.tgt_qpn, &tag) : NULL;
  if (!qp) {
    send_step(to_parent, kFailed);
    return 1;
  }
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qi;
  CHECK(query_state(qp, &qa, &qi) == IBV_QPS_RESET && qi.qp_context == &tag,
        "[child] query of the parent's new target: state %d", (int)qa.qp_state);
  if (connect_tgt(qp, &h.parent, h.ini_qpn)) {
    send_step(to_parent, kFailed);
    return 1;
  }
  send_step(to_parent, kConnected);
  if (wait_step(from_parent, kSent, 20000, "[child]") == 0) {
    CHECK(query_state(qp, &qa, &qi) == IBV_QPS_RTS, "[child] query with the parent's handle destroyed: state %d",
          (int)qa.qp_state);
    send_step(to_parent, kQueried);
  }
  if (wait_step(from_parent, kFatalSent, 20000, "[child]") == 0) {
    int got = wait_qp_event(ctx, IBV_EVENT_QP_FATAL, qp, 3000);
    CHECK(got, "[child] no IBV_EVENT_QP_FATAL on the child's handle (the error happened in the parent)");
    CHECK(query_state(qp, &qa, &qi) == IBV_QPS_ERR, "[child] query after the error: state %d", (int)qa.qp_state);
    printf("[child] handle on the parent's target 0x%x: connected it, %s the fatal event, destroying it\n", h.tgt_qpn,
           got ? "got" : "did NOT get");
    send_step(to_parent, kGotFatal);
  }
  CHECK(ibv_close_xrcd(x) == EBUSY, "[child] ibv_close_xrcd while the handle uses it: not EBUSY");
  CHECK(ibv_destroy_qp(qp) == 0, "[child] ibv_destroy_qp(handle)");
  CHECK(ibv_close_xrcd(x) == 0, "[child] ibv_close_xrcd");
  send_step(to_parent, kDestroyed);
  ibv_close_device(ctx);
  close(fd);
  return g_failures ? 1 : 0;
}

static void case_cross_process(void) {
  int fd = make_temp(g_path);
  int to_parent[2], to_child[2];
  if (pipe(to_parent) || pipe(to_child)) exit(1);
  atexit(xp_atexit);
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    printf("fork: %s\n", strerror(errno));
    exit(1);
  }
  if (pid == 0) {
    g_is_child = 1;
    close(to_parent[0]);
    close(to_child[1]);
    close(fd);
    int rc = xp_child(to_parent[1], to_child[0]);
    fflush(stdout);
    _exit(rc);
  }
  g_child = pid;
  signal(SIGPIPE, SIG_IGN);
  close(to_parent[1]);
  close(to_child[0]);

  int tag = 0;
  struct port me;
  struct ibv_context* ctx = open_ctx(&me);
  struct ibv_xrcd* x = open_xrcd(ctx, fd, O_CREAT);
  struct ibv_qp* tgt = x ? create_tgt(ctx, x, &tag) : NULL;
  if (!tgt) exit(1);
  const uint32_t qpn = tgt->qp_num;
  struct tx t;
  struct rx r;
  tx_open(&t, ctx);
  rx_open(&r, ctx, x);
  struct xp_hello h = {qpn, t.ini->qp_num, me};
  CHECK(vp_write_full(to_child[1], &h, sizeof h) == 0, "writing to the child");
  if (wait_step(to_parent[0], kConnected, 20000, "parent") == 0) {
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qi;
    CHECK(query_state(tgt, &qa, &qi) == IBV_QPS_RTS && qa.dest_qp_num == t.ini->qp_num && qa.rq_psn == INI_PSN &&
              qa.qp_access_flags == (unsigned)kTgtAccess && qi.qp_context == &tag,
          "the parent's query after the child's modify: state %d dest_qp_num 0x%x rq_psn 0x%x access 0x%x",
          (int)qa.qp_state, qa.dest_qp_num, qa.rq_psn, qa.qp_access_flags);
    if (connect_ini(t.ini, &me, qpn)) exit(1);
    int got = exchange(&t, &r, qpn, 600, "connected by the child");
    CHECK(ibv_destroy_qp(tgt) == 0, "ibv_destroy_qp(the parent's handle) while the child's is open");
    got += exchange(&t, &r, qpn, 700, "the parent's handle destroyed");
    printf(
        "cross_process: target 0x%x connected by the child's handle: %d/%d messages, the second half after the "
        "parent's handle was destroyed\n",
        qpn, got, 2 * NMSG);
    send_step(to_child[1], kSent);
    wait_step(to_parent[0], kQueried, 20000, "parent");
    write_bad_rkey(&t, r.srqn, "cross_process");
    send_step(to_child[1], kFatalSent);
    wait_step(to_parent[0], kGotFatal, 20000, "parent");
    if (wait_step(to_parent[0], kDestroyed, 20000, "parent") == 0) {
      struct ibv_qp* none = open_qp_ex(ctx, x, qpn, NULL, kAllMask, IBV_QPT_XRC_RECV);
      CHECK(none == NULL && errno == EINVAL, "ibv_open_qp once the child destroyed the last handle: %p, errno %d",
            (void*)none, errno);
    }
  }
  int status = 0;
  pid_t w = 0;
  double deadline = vp_now_ms() + 30000;
  while ((w = waitpid(pid, &status, WNOHANG)) == 0 && vp_now_ms() < deadline) vp_sleep_ms(10);
  if (w == pid) {
    g_child = -1;
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status 0x%x)", status);
  } else {
    CHECK(0, "the child did not finish within 30 s");
    xp_atexit();
  }
  tx_close(&t);
  rx_close(&r);
  CHECK(ibv_close_xrcd(x) == 0, "ibv_close_xrcd");
  ibv_close_device(ctx);
  close(fd);
}

/* ---------- bad ---------- */

static void expect_open_fails(struct ibv_context* ctx, struct ibv_xrcd* x, uint32_t qpn, uint32_t mask,
                              enum ibv_qp_type type, int want, const char* what) {
  struct ibv_qp* qp = open_qp_ex(ctx, x, qpn, NULL, mask, type);
  CHECK(qp == NULL && errno == want, "ibv_open_qp with %s: %p, errno %d (%s), want %s", what, (void*)qp, errno,
        strerror(errno), strerror(want));
  if (qp) ibv_destroy_qp(qp);
}

static void case_bad(void) {
  char path[64];
  int fd = make_temp(path);
  struct port pa, pb;
  struct ibv_context* a = open_ctx(&pa);
  struct ibv_context* b = open_ctx(&pb);
  struct ibv_xrcd* xa = open_xrcd(a, fd, O_CREAT);
  struct ibv_xrcd* xb = xa ? open_xrcd(b, fd, 0) : NULL;
  struct ibv_xrcd* other = xb ? open_xrcd(b, -1, O_CREAT) : NULL; /* a private domain */
  struct ibv_qp* tgt = other ? create_tgt(a, xa, NULL) : NULL;
  struct ibv_qp* other_tgt = tgt ? create_tgt(b, other, NULL) : NULL;
  if (!other_tgt) exit(1);
  struct tx t;
  tx_open(&t, b);
  const uint32_t qpn = tgt->qp_num;

  const uint32_t need = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  expect_open_fails(b, xb, qpn, 0, IBV_QPT_XRC_RECV, EINVAL, "comp_mask 0");
  expect_open_fails(b, xb, qpn, need & ~IBV_QP_OPEN_ATTR_NUM, IBV_QPT_XRC_RECV, EINVAL, "no IBV_QP_OPEN_ATTR_NUM");
  expect_open_fails(b, xb, qpn, need & ~IBV_QP_OPEN_ATTR_XRCD, IBV_QPT_XRC_RECV, EINVAL, "no IBV_QP_OPEN_ATTR_XRCD");
  expect_open_fails(b, xb, qpn, need & ~IBV_QP_OPEN_ATTR_TYPE, IBV_QPT_XRC_RECV, EINVAL, "no IBV_QP_OPEN_ATTR_TYPE");
  expect_open_fails(b, xb, qpn, kAllMask | IBV_QP_OPEN_ATTR_RESERVED, IBV_QPT_XRC_RECV, EOPNOTSUPP,
                    "an unknown comp_mask bit");
  expect_open_fails(b, NULL, qpn, kAllMask, IBV_QPT_XRC_RECV, EINVAL, "a NULL xrcd");
  expect_open_fails(b, xa, qpn, kAllMask, IBV_QPT_XRC_RECV, EINVAL, "another context's xrcd");
  expect_open_fails(b, xb, qpn, kAllMask, IBV_QPT_RC, EINVAL, "qp_type RC");
  expect_open_fails(b, xb, qpn, kAllMask, IBV_QPT_UD, EINVAL, "qp_type UD");
  expect_open_fails(b, xb, qpn, kAllMask, IBV_QPT_XRC_SEND, EINVAL, "qp_type XRC_SEND");
  expect_open_fails(b, xb, 0xFFFFFF, kAllMask, IBV_QPT_XRC_RECV, EINVAL, "a QP number nothing has");
  expect_open_fails(b, xb, 0, kAllMask, IBV_QPT_XRC_RECV, EINVAL, "QP number 0");
  expect_open_fails(b, xb, t.ini->qp_num, kAllMask, IBV_QPT_XRC_RECV, EINVAL, "an INI QP's number");
  expect_open_fails(b, xb, other_tgt->qp_num, kAllMask, IBV_QPT_XRC_RECV, EINVAL, "another domain's target");

  struct ibv_qp* h = open_qp(b, xb, qpn, NULL);
  if (!h) exit(1);
  /* No queues on a handle, as on the target itself. */
  struct ibv_sge sge = {(uintptr_t)t.buf, 8, t.mr->lkey};
  struct ibv_send_wr swr, *sbad = NULL;
  memset(&swr, 0, sizeof swr);
  swr.sg_list = &sge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  int rc = ibv_post_send(h, &swr, &sbad);
  CHECK(rc == EINVAL && sbad == &swr, "ibv_post_send on an opened handle: %s", strerror(rc));
  struct ibv_recv_wr rwr = {.sg_list = &sge, .num_sge = 1}, *rbad = NULL;
  rc = ibv_post_recv(h, &rwr, &rbad);
  CHECK(rc == EINVAL && rbad == &rwr, "ibv_post_recv on an opened handle: %s", strerror(rc));
  CHECK(ibv_close_xrcd(xb) == EBUSY, "ibv_close_xrcd while an opened handle uses it: not EBUSY");
  struct ibv_qp_attr qa;
  memset(&qa, 0, sizeof qa);
  qa.qp_state = IBV_QPS_RTS;
  CHECK(ibv_modify_qp(h, &qa, IBV_QP_STATE) == EINVAL, "RESET->RTS through a handle: not EINVAL");

  /* The QP lives in its creator's context: closing that context ends the QP, whatever
   * handles remain (A's own handle is destroyed first, so A keeps the QP only for B's). */
  tx_close(&t);
  CHECK(ibv_destroy_qp(tgt) == 0, "ibv_destroy_qp(A's handle)");
  CHECK(ibv_close_xrcd(xa) == 0, "ibv_close_xrcd(A)");
  CHECK(ibv_close_device(a) == 0, "ibv_close_device(A) with the QP kept for B's handle");
  struct ibv_qp_init_attr qi;
  rc = ibv_query_qp(h, &qa, IBV_QP_STATE, &qi);
  CHECK(rc == EIO, "ibv_query_qp of a handle whose QP's context was closed: %d (%s), want EIO", rc, strerror(rc));
  memset(&qa, 0, sizeof qa);
  qa.qp_state = IBV_QPS_INIT;
  qa.port_num = 1;
  rc = ibv_modify_qp(h, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  CHECK(rc == EIO, "ibv_modify_qp of that handle: %d (%s), want EIO", rc, strerror(rc));
  CHECK(ibv_destroy_qp(h) == 0, "ibv_destroy_qp of that handle");
  expect_open_fails(b, xb, qpn, kAllMask, IBV_QPT_XRC_RECV, EINVAL, "the closed context's target");
  CHECK(ibv_close_xrcd(xb) == 0, "ibv_close_xrcd(B) after its handle is gone");
  CHECK(ibv_destroy_qp(other_tgt) == 0, "ibv_destroy_qp(another domain's target)");
  CHECK(ibv_close_xrcd(other) == 0, "ibv_close_xrcd(private)");
  ibv_close_device(b);
  close(fd);
  unlink(path);
  printf(
      "bad: comp_mask, xrcd, qp_type and QP numbers -> EINVAL/EOPNOTSUPP; no queues on a handle; EBUSY; "
      "EIO once the creator's context is closed\n");
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  static const struct {
    const char* name;
    void (*run)(void);
  } cases[] = {{"same_process", case_same_process}, {"cross_process", case_cross_process}, {"bad", case_bad}};
  if (argc == 2) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      if (strcmp(argv[1], cases[i].name)) continue;
      cases[i].run();
      printf("%s: %s\n", argv[1], g_failures ? "FAILED" : "PASSED");
      return g_failures ? 1 : 0;
    }
  }
  fprintf(stderr, "usage: open_qp_test same_process|cross_process|bad\n");
  return 2;
}
