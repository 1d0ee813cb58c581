/* XRC (eXtended Reliable Connected transport, IBA annex A14) through the public verbs API.
 * An INI QP (IBV_QPT_XRC_SEND: PD and send CQ, no receive side) sends to a TGT QP
 * (IBV_QPT_XRC_RECV: only an XRC domain, no PD, no CQ); every request names an XRC SRQ
 * (wr.qp_type.xrc.remote_srqn) of the TGT QP's domain, and that SRQ's PD and CQ are the
 * ones the message uses: receive buffers and RDMA targets are checked against the SRQ's PD,
 * the receive completion goes to the SRQ's CQ. Setups connect an INI QP to a TGT QP of the
 * same context, exactly as ibv_xsrq_pingpong does (INI and TGT attribute masks, GRH AV
 * with dlid = the port's LID).
 *
 *   domain         ibv_open_xrcd: fd -1 gives process-private domains; with the fd of a
 *                  file, opens of the same inode (another fd, another name: a hard link)
 *                  share a domain (an SRQ of one open receives through a TGT QP of the
 *                  other); oflags without O_CREAT on a file with no domain -> EAGAIN;
 *                  O_CREAT|O_EXCL when one exists -> EINVAL (the kernel's errnos, from
 *                  ib_uverbs_open_xrcd, which real hardware returns: not ENOENT/EEXIST as
 *                  open(2) would say); ibv_close_xrcd while an XRC SRQ or a TGT QP uses the
 *                  handle -> EBUSY; once every open is closed the domain is gone (EAGAIN
 *                  again).
 *   srq            ibv_create_srq_ex(IBV_SRQT_XRC): missing XRCD or CQ mask bit -> EINVAL;
 *                  ibv_get_srq_num: non-zero 24-bit numbers, distinct per SRQ.
 *   send           SEND and SEND_WITH_IMM of 1 B, 4097 B and 64 KiB (MTU 1024): the receive
 *                  completes on the SRQ's CQ with qp_num = the TGT QP, src_qp = the INI QP,
 *                  IBV_WC_RECV, byte_len and data right.
 *   rdma           RDMA WRITE (4097 B, 64 KiB), WRITE_WITH_IMM (consumes an SRQ WQE), READ,
 *                  FETCH_AND_ADD and CMP_AND_SWP on memory registered in the SRQ's PD.
 *   rdma_wrong_pd  an RDMA WRITE whose R_Key belongs to another PD than the named SRQ's ->
 *                  IBV_WC_REM_ACCESS_ERR, memory untouched.
 *   bad_srqn       remote_srqn naming no SRQ (a destroyed one's number; a live SRQ of another
 *                  domain), for a SEND and for an RDMA WRITE -> IBV_WC_REM_INV_REQ_ERR.
 *   rnr            no receive posted on the SRQ, rnr_retry 1 -> IBV_WC_RNR_RETRY_EXC_ERR.
 *   two_srqs       one TGT QP, SRQ A and SRQ B (each with its own CQ): messages alternately
 *                  naming A and B land on the right one.
 *   cross_process  parent and a fork()ed child open the same domain file; the child's XRC
 *                  SRQ receives what the parent's INI QP sends through the parent's own TGT
 *                  QP (completion qp_num = the parent's TGT QP), data intact.
 *   domain_crash   the only process that had a file's domain open is SIGKILLed (it never
 *                  closes it): the domain is gone as after a close — oflags 0 -> EAGAIN,
 *                  then O_CREAT|O_EXCL succeeds.
 *   bad            ibv_post_send / ibv_post_recv on a TGT QP and ibv_post_recv on an INI QP
 *                  -> EINVAL with *bad_wr set; ibv_open_xrcd without the FD or OFLAGS mask
 *                  bit -> EINVAL; a TGT QP without IBV_QP_INIT_ATTR_XRCD and an INI QP
 *                  without a PD -> EINVAL.
 *
 * Usage: xrc_test CASE. Exit 0 when every check passes. */
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "verbs_pair.h"

#define BIG (64 * 1024)
#define BUF (2 * BIG + 4096)
#define INI_PSN 0x111
#define TGT_PSN 0x222

/* ---------- setup helpers ---------- */

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
    return NULL;
  }
  struct ibv_port_attr pa;
  if (ibv_query_port(ctx, 1, &pa) || ibv_query_gid(ctx, 1, 0, &port->gid)) {
    printf("ibv_query_port/ibv_query_gid failed\n");
    ibv_close_device(ctx);
    return NULL;
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
  return ibv_open_xrcd(ctx, &a);
}

/* An XRC SRQ; `drop` removes comp_mask bits (the pointers stay valid). */
static struct ibv_srq* create_xsrq(struct ibv_context* ctx, struct ibv_xrcd* xrcd, struct ibv_pd* pd, struct ibv_cq* cq,
                                   uint32_t drop) {
  struct ibv_srq_init_attr_ex a;
  memset(&a, 0, sizeof a);
  a.attr.max_wr = 64;
  a.attr.max_sge = 1;
  a.comp_mask = (IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD) & ~drop;
  a.srq_type = IBV_SRQT_XRC;
  a.xrcd = xrcd;
  a.cq = cq;
  a.pd = pd;
  return ibv_create_srq_ex(ctx, &a);
}

static uint32_t srq_num(struct ibv_srq* srq) {
  uint32_t n = 0;
  int rc = ibv_get_srq_num(srq, &n);
  CHECK(rc == 0, "ibv_get_srq_num: %s", strerror(rc));
  return n;
}

static struct ibv_qp* create_tgt(struct ibv_context* ctx, struct ibv_xrcd* xrcd) {
  struct ibv_qp_init_attr_ex a;
  memset(&a, 0, sizeof a);
  a.qp_type = IBV_QPT_XRC_RECV;
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
  a.cap.max_send_wr = 64;
  a.cap.max_send_sge = 1;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.pd = pd;
  struct ibv_qp* qp = ibv_create_qp_ex(ctx, &a);
  if (!qp) printf("ibv_create_qp_ex(IBV_QPT_XRC_SEND): %s\n", strerror(errno));
  return qp;
}

static void fill_av(struct ibv_ah_attr* av, const struct port* peer) {
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
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = access;
  int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc) printf("RESET->INIT (qp 0x%x): %s\n", qp->qp_num, strerror(rc));
  return rc;
}

/* TGT QP: INIT, RTR towards the INI QP `ini_qpn` at `peer`, RTS (xsrq_pingpong's masks). */
static int connect_tgt(struct ibv_qp* tgt, const struct vp_params* p, const struct port* peer, uint32_t ini_qpn) {
  if (to_init(tgt, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)) return -1;
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = p->mtu;
  a.dest_qp_num = ini_qpn;
  a.rq_psn = INI_PSN;
  a.max_dest_rd_atomic = p->rd_atomic;
  a.min_rnr_timer = p->min_rnr_timer;
  fill_av(&a.ah_attr, peer);
  int rc = ibv_modify_qp(tgt, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc) {
    printf("TGT INIT->RTR: %s\n", strerror(rc));
    return -1;
  }
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = p->timeout;
  a.sq_psn = TGT_PSN;
  rc = ibv_modify_qp(tgt, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN);
  if (rc) printf("TGT RTR->RTS: %s\n", strerror(rc));
  return rc ? -1 : 0;
}

/* INI QP: INIT, RTR towards the TGT QP `tgt_qpn` at `peer`, RTS. */
static int connect_ini(struct ibv_qp* ini, const struct vp_params* p, const struct port* peer, uint32_t tgt_qpn) {
  if (to_init(ini, 0)) return -1;
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = p->mtu;
  a.dest_qp_num = tgt_qpn;
  a.rq_psn = TGT_PSN;
  fill_av(&a.ah_attr, peer);
  int rc = ibv_modify_qp(ini, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN);
  if (rc) {
    printf("INI INIT->RTR: %s\n", strerror(rc));
    return -1;
  }
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = p->timeout;
  a.retry_cnt = p->retry_cnt;
  a.rnr_retry = p->rnr_retry;
  a.sq_psn = INI_PSN;
  a.max_rd_atomic = p->rd_atomic;
  rc = ibv_modify_qp(
      ini, &a,
      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc) printf("INI RTR->RTS: %s\n", strerror(rc));
  return rc ? -1 : 0;
}

/* One context with everything a single-process XRC exchange needs. */
struct xenv {
  struct ibv_context* ctx;
  struct port port;
  struct ibv_pd* ini_pd; /* the INI QP's PD: local buffers of SENDs, READs, atomics */
  struct ibv_pd* srq_pd; /* the XRC SRQ's PD: its receive buffers and the RDMA target */
  struct ibv_cq* send_cq;
  struct ibv_cq* recv_cq; /* the SRQ's CQ */
  struct ibv_xrcd* xrcd;
  struct ibv_srq* srq;
  uint32_t srqn;
  struct ibv_qp* tgt;
  struct ibv_qp* ini;
  uint8_t *sbuf, *rbuf;
  struct ibv_mr *smr, *rmr;
};

static const int kRemote =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

/* New TGT and INI QPs (destroying the old ones), connected to each other. */
static void xenv_new_qps(struct xenv* e, const struct vp_params* p) {
  if (e->ini) ibv_destroy_qp(e->ini);
  if (e->tgt) ibv_destroy_qp(e->tgt);
  e->tgt = create_tgt(e->ctx, e->xrcd);
  e->ini = create_ini(e->ctx, e->ini_pd, e->send_cq);
  if (!e->tgt || !e->ini || connect_tgt(e->tgt, p, &e->port, e->ini->qp_num) ||
      connect_ini(e->ini, p, &e->port, e->tgt->qp_num))
    exit(1);
}

static void xenv_open(struct xenv* e, const struct vp_params* p) {
  memset(e, 0, sizeof *e);
  e->ctx = open_ctx(&e->port);
  if (!e->ctx) exit(1);
  e->ini_pd = ibv_alloc_pd(e->ctx);
  e->srq_pd = ibv_alloc_pd(e->ctx);
  e->send_cq = ibv_create_cq(e->ctx, 128, NULL, NULL, 0);
  e->recv_cq = ibv_create_cq(e->ctx, 128, NULL, NULL, 0);
  if (!e->ini_pd || !e->srq_pd || !e->send_cq || !e->recv_cq) {
    printf("ibv_alloc_pd/ibv_create_cq: %s\n", strerror(errno));
    exit(1);
  }
  e->xrcd = open_xrcd(e->ctx, -1, O_CREAT);
  if (!e->xrcd) {
    printf("ibv_open_xrcd(fd -1, O_CREAT): %s\n", strerror(errno));
    exit(1);
  }
  e->srq = create_xsrq(e->ctx, e->xrcd, e->srq_pd, e->recv_cq, 0);
  if (!e->srq) {
    printf("ibv_create_srq_ex(IBV_SRQT_XRC): %s\n", strerror(errno));
    exit(1);
  }
  e->srqn = srq_num(e->srq);
  e->sbuf = aligned_alloc(4096, BUF);
  e->rbuf = aligned_alloc(4096, BUF);
  if (!e->sbuf || !e->rbuf) exit(1);
  memset(e->sbuf, 0, BUF);
  memset(e->rbuf, 0, BUF);
  e->smr = ibv_reg_mr(e->ini_pd, e->sbuf, BUF, IBV_ACCESS_LOCAL_WRITE);
  e->rmr = ibv_reg_mr(e->srq_pd, e->rbuf, BUF, kRemote);
  if (!e->smr || !e->rmr) {
    printf("ibv_reg_mr: %s\n", strerror(errno));
    exit(1);
  }
  xenv_new_qps(e, p);
}

static void xenv_close(struct xenv* e) {
  if (e->ini) CHECK(ibv_destroy_qp(e->ini) == 0, "ibv_destroy_qp(INI)");
  if (e->tgt) CHECK(ibv_destroy_qp(e->tgt) == 0, "ibv_destroy_qp(TGT)");
  CHECK(ibv_destroy_srq(e->srq) == 0, "ibv_destroy_srq(XRC SRQ)");
  CHECK(ibv_close_xrcd(e->xrcd) == 0, "ibv_close_xrcd after its SRQ and TGT QP are gone");
  ibv_dereg_mr(e->smr);
  ibv_dereg_mr(e->rmr);
  ibv_destroy_cq(e->send_cq);
  ibv_destroy_cq(e->recv_cq);
  ibv_dealloc_pd(e->ini_pd);
  ibv_dealloc_pd(e->srq_pd);
  ibv_close_device(e->ctx);
  free(e->sbuf);
  free(e->rbuf);
}

/* ---------- data path helpers ---------- */

static void pattern(uint8_t* p, size_t len, uint32_t seed) {
  uint64_t st = seed;
  for (size_t i = 0; i < len; i++) p[i] = (uint8_t)vp_rand(&st);
}

static void post_srq_recv(struct ibv_srq* srq, void* buf, uint32_t len, uint32_t lkey, uint64_t wr_id) {
  struct ibv_sge sge = {(uintptr_t)buf, len, lkey};
  struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
  int rc = ibv_post_srq_recv(srq, &wr, &bad);
  CHECK(rc == 0, "ibv_post_srq_recv: %s", strerror(rc));
}

/* A signaled XRC work request on the INI QP; returns ibv_post_send's result. */
static int post_x(struct ibv_qp* ini, uint32_t srqn, enum ibv_wr_opcode op, void* buf, uint32_t len, uint32_t lkey,
                  uint64_t raddr, uint32_t rkey, uint64_t add_or_cmp, uint64_t swap, uint32_t imm) {
  struct ibv_sge sge = {(uintptr_t)buf, len, lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 0x5e5e;
  wr.sg_list = &sge;
  wr.num_sge = len ? 1 : 0;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htobe32(imm);
  wr.qp_type.xrc.remote_srqn = srqn;
  if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
    wr.wr.atomic.remote_addr = raddr;
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = add_or_cmp;
    wr.wr.atomic.swap = swap;
  } else {
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
  }
  int rc = ibv_post_send(ini, &wr, &bad);
  CHECK(rc == 0, "ibv_post_send(opcode %d, srqn 0x%x): %s", (int)op, srqn, strerror(rc));
  return rc;
}

/* The status of the next completion on `cq` (IBV_WC_GENERAL_ERR + a failed check if none
 * within `ms`). */
static enum ibv_wc_status next_status(struct ibv_cq* cq, struct ibv_wc* wc, int ms, const char* what) {
  int n = vp_poll(cq, wc, ms);
  if (n != 1) {
    CHECK(0, "%s: no completion within %d ms", what, ms);
    memset(wc, 0, sizeof *wc);
    wc->status = IBV_WC_GENERAL_ERR;
  }
  return wc->status;
}

/* Posts one signaled XRC WR and expects its completion to succeed. */
static void do_x(struct xenv* e, enum ibv_wr_opcode op, uint32_t len, uint64_t raddr, uint64_t add_or_cmp,
                 uint64_t swap, const char* what) {
  if (post_x(e->ini, e->srqn, op, e->sbuf, len, e->smr->lkey, raddr, e->rmr->rkey, add_or_cmp, swap, 0)) return;
  struct ibv_wc wc;
  enum ibv_wc_status st = next_status(e->send_cq, &wc, 5000, what);
  CHECK(st == IBV_WC_SUCCESS, "%s: %s", what, ibv_wc_status_str(st));
  CHECK(wc.qp_num == e->ini->qp_num, "%s: send completion qp_num 0x%x, INI is 0x%x", what, wc.qp_num, e->ini->qp_num);
}

static int cq_empty(struct ibv_cq* cq) {
  struct ibv_wc wc;
  return ibv_poll_cq(cq, 1, &wc) == 0;
}

/* ---------- cases ---------- */

static int make_temp(char* path) {
  strcpy(path, "/tmp/uroce_xrc_test_XXXXXX");
  int fd = mkstemp(path);
  if (fd < 0) {
    printf("mkstemp: %s\n", strerror(errno));
    exit(1);
  }
  return fd;
}

static void case_domain(void) {
  struct vp_params p;
  vp_default_params(&p);
  struct port port;
  struct ibv_context* ctx = open_ctx(&port);
  if (!ctx) exit(1);

  /* fd -1: a new private domain each time. */
  struct ibv_xrcd* priv1 = open_xrcd(ctx, -1, O_CREAT);
  CHECK(priv1 != NULL, "ibv_open_xrcd(fd -1, O_CREAT): %s", strerror(errno));
  struct ibv_xrcd* priv2 = open_xrcd(ctx, -1, O_CREAT);
  CHECK(priv2 != NULL && priv2 != priv1, "a second private domain: %s", strerror(errno));

  char path[64], path2[80];
  int fd1 = make_temp(path);
  snprintf(path2, sizeof path2, "%s.link", path);
  errno = 0;
  struct ibv_xrcd* none = open_xrcd(ctx, fd1, 0);
  CHECK(none == NULL && errno == EAGAIN, "oflags 0 on a file with no domain: %p, errno %d (%s)", (void*)none, errno,
        strerror(errno));
  struct ibv_xrcd* xa = open_xrcd(ctx, fd1, O_CREAT);
  CHECK(xa != NULL, "ibv_open_xrcd(file, O_CREAT): %s", strerror(errno));
  errno = 0;
  none = open_xrcd(ctx, fd1, O_CREAT | O_EXCL);
  CHECK(none == NULL && errno == EINVAL, "O_CREAT|O_EXCL when the domain exists: %p, errno %d (%s)", (void*)none, errno,
        strerror(errno));
  /* The same inode under another name and through another open file description. */
  int fd2 = -1;
  struct ibv_xrcd* xb = NULL;
  if (link(path, path2) == 0) fd2 = open(path2, O_RDONLY);
  CHECK(fd2 >= 0, "hard link / open of %s: %s", path2, strerror(errno));
  if (fd2 >= 0) {
    xb = open_xrcd(ctx, fd2, 0);
    CHECK(xb != NULL, "ibv_open_xrcd(hard link of the file, oflags 0): %s", strerror(errno));
  }
  if (!priv1 || !priv2 || !xa || !xb) exit(1);

  /* Shared: an SRQ opened through xa receives what arrives at a TGT QP opened through xb. */
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  struct ibv_cq* scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
  struct ibv_cq* rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
  uint8_t* sbuf = calloc(1, 4096);
  uint8_t* rbuf = calloc(1, 4096);
  struct ibv_mr* smr = pd && sbuf ? ibv_reg_mr(pd, sbuf, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
  struct ibv_mr* rmr = pd && rbuf ? ibv_reg_mr(pd, rbuf, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
  if (!scq || !rcq || !smr || !rmr) exit(1);
  struct ibv_srq* srq = create_xsrq(ctx, xa, pd, rcq, 0);
  CHECK(srq != NULL, "ibv_create_srq_ex in the file's domain: %s", strerror(errno));
  struct ibv_qp* tgt = create_tgt(ctx, xb);
  struct ibv_qp* ini = create_ini(ctx, pd, scq);
  if (!srq || !tgt || !ini || connect_tgt(tgt, &p, &port, ini->qp_num) || connect_ini(ini, &p, &port, tgt->qp_num))
    exit(1);
  uint32_t srqn = srq_num(srq);
  post_srq_recv(srq, rbuf, 4096, rmr->lkey, 7);
  pattern(sbuf, 1000, 77);
  struct ibv_wc wc;
  if (post_x(ini, srqn, IBV_WR_SEND, sbuf, 1000, smr->lkey, 0, 0, 0, 0, 0) == 0) {
    enum ibv_wc_status st = next_status(scq, &wc, 5000, "SEND across two opens of one file");
    CHECK(st == IBV_WC_SUCCESS, "SEND across two opens of one file: %s", ibv_wc_status_str(st));
    st = next_status(rcq, &wc, 5000, "receive across two opens of one file");
    CHECK(st == IBV_WC_SUCCESS && wc.wr_id == 7 && wc.byte_len == 1000 && wc.qp_num == tgt->qp_num &&
              !memcmp(sbuf, rbuf, 1000),
          "receive across two opens of one file: %s, wr_id %" PRIu64 ", byte_len %u, qp_num 0x%x",
          ibv_wc_status_str(st), wc.wr_id, wc.byte_len, wc.qp_num);
    printf("domain: SRQ 0x%x opened through fd %d received 1000 B through TGT QP 0x%x of fd %d (hard link)\n", srqn,
           fd1, tgt->qp_num, fd2);
  }

  /* Busy: each handle is in use by the object created through it. */
  int rc = ibv_close_xrcd(xa);
  CHECK(rc == EBUSY, "ibv_close_xrcd while an XRC SRQ uses it: %d (%s)", rc, strerror(rc));
  rc = ibv_close_xrcd(xb);
  CHECK(rc == EBUSY, "ibv_close_xrcd while a TGT QP uses it: %d (%s)", rc, strerror(rc));
  CHECK(ibv_destroy_qp(ini) == 0, "ibv_destroy_qp(INI)");
  CHECK(ibv_destroy_qp(tgt) == 0, "ibv_destroy_qp(TGT)");
  rc = ibv_close_xrcd(xa);
  CHECK(rc == EBUSY, "ibv_close_xrcd while an XRC SRQ uses it (TGT QP gone): %d (%s)", rc, strerror(rc));
  CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq(XRC SRQ)");
  CHECK(ibv_close_xrcd(xa) == 0, "ibv_close_xrcd(file, first open) once unused");
  errno = 0;
  none = open_xrcd(ctx, fd1, O_CREAT | O_EXCL);
  CHECK(none == NULL && errno == EINVAL, "O_CREAT|O_EXCL while the second open is alive: errno %d", errno);
  CHECK(ibv_close_xrcd(xb) == 0, "ibv_close_xrcd(file, second open)");
  /* The last close ends the domain. */
  errno = 0;
  none = open_xrcd(ctx, fd1, 0);
  CHECK(none == NULL && errno == EAGAIN, "oflags 0 after every open was closed: %p, errno %d (%s)", (void*)none, errno,
        strerror(errno));
  if (none) ibv_close_xrcd(none);
  CHECK(ibv_close_xrcd(priv1) == 0 && ibv_close_xrcd(priv2) == 0, "ibv_close_xrcd(private domains)");
  printf(
      "domain: private x2, file: EAGAIN without O_CREAT, EINVAL with O_EXCL, shared through a hard link, "
      "EBUSY while used, EAGAIN after the last close\n");

  ibv_dereg_mr(smr);
  ibv_dereg_mr(rmr);
  ibv_destroy_cq(scq);
  ibv_destroy_cq(rcq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  close(fd1);
  if (fd2 >= 0) close(fd2);
  unlink(path2);
  unlink(path);
  free(sbuf);
  free(rbuf);
}

static void case_srq(void) {
  struct port port;
  struct ibv_context* ctx = open_ctx(&port);
  if (!ctx) exit(1);
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  struct ibv_cq* cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
  struct ibv_xrcd* xrcd = open_xrcd(ctx, -1, O_CREAT);
  CHECK(xrcd != NULL, "ibv_open_xrcd: %s", strerror(errno));
  if (!pd || !cq || !xrcd) exit(1);
  errno = 0;
  struct ibv_srq* s = create_xsrq(ctx, xrcd, pd, cq, IBV_SRQ_INIT_ATTR_XRCD);
  CHECK(s == NULL && errno == EINVAL, "XRC SRQ without IBV_SRQ_INIT_ATTR_XRCD: %p, errno %d (%s)", (void*)s, errno,
        strerror(errno));
  errno = 0;
  s = create_xsrq(ctx, xrcd, pd, cq, IBV_SRQ_INIT_ATTR_CQ);
  CHECK(s == NULL && errno == EINVAL, "XRC SRQ without IBV_SRQ_INIT_ATTR_CQ: %p, errno %d (%s)", (void*)s, errno,
        strerror(errno));
  struct ibv_srq* s1 = create_xsrq(ctx, xrcd, pd, cq, 0);
  struct ibv_srq* s2 = create_xsrq(ctx, xrcd, pd, cq, 0);
  CHECK(s1 && s2, "ibv_create_srq_ex(IBV_SRQT_XRC): %s", strerror(errno));
  if (!s1 || !s2) exit(1);
  uint32_t n1 = srq_num(s1), n2 = srq_num(s2);
  CHECK(n1 != 0 && n1 <= 0xffffff && n2 != 0 && n2 <= 0xffffff && n1 != n2, "SRQ numbers 0x%x and 0x%x", n1, n2);
  struct ibv_srq_attr q;
  CHECK(ibv_query_srq(s1, &q) == 0 && q.max_wr >= 64, "ibv_query_srq(XRC SRQ): max_wr %u", q.max_wr);
  uint8_t buf[64];
  struct ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  if (!mr) exit(1);
  post_srq_recv(s1, buf, sizeof buf, mr->lkey, 1);
  printf("srq: missing XRCD/CQ -> EINVAL; SRQ numbers 0x%x, 0x%x; max_wr %u\n", n1, n2, q.max_wr);
  CHECK(ibv_destroy_srq(s1) == 0 && ibv_destroy_srq(s2) == 0, "ibv_destroy_srq");
  CHECK(ibv_close_xrcd(xrcd) == 0, "ibv_close_xrcd");
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

static void case_send(void) {
  struct vp_params p;
  vp_default_params(&p);
  struct xenv e;
  xenv_open(&e, &p);
  static const uint32_t sizes[] = {1, 4097, BIG};
  int n = 0;
  for (int imm = 0; imm < 2; imm++) {
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++, n++) {
      uint32_t len = sizes[i];
      char what[64];
      snprintf(what, sizeof what, "%s %u B", imm ? "SEND_WITH_IMM" : "SEND", len);
      pattern(e.sbuf, len, (uint32_t)(100 + n));
      memset(e.rbuf, 0xee, BIG + 16);
      post_srq_recv(e.srq, e.rbuf, BIG + 16, e.rmr->lkey, (uint64_t)(1000 + n));
      do_x(&e, imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND, len, 0, 0, 0, what);
      struct ibv_wc wc;
      enum ibv_wc_status st = next_status(e.recv_cq, &wc, 5000, what);
      CHECK(st == IBV_WC_SUCCESS, "%s: receive %s", what, ibv_wc_status_str(st));
      if (st != IBV_WC_SUCCESS) continue;
      CHECK(wc.opcode == IBV_WC_RECV, "%s: opcode %d", what, (int)wc.opcode);
      CHECK(wc.wr_id == (uint64_t)(1000 + n), "%s: wr_id %" PRIu64, what, wc.wr_id);
      CHECK(wc.byte_len == len, "%s: byte_len %u", what, wc.byte_len);
      CHECK(wc.qp_num == e.tgt->qp_num, "%s: qp_num 0x%x, TGT QP is 0x%x", what, wc.qp_num, e.tgt->qp_num);
      CHECK(wc.src_qp == e.ini->qp_num, "%s: src_qp 0x%x, INI QP is 0x%x", what, wc.src_qp, e.ini->qp_num);
      if (imm)
        CHECK((wc.wc_flags & IBV_WC_WITH_IMM) && be32toh(wc.imm_data) == 0,
              "%s: wc_flags 0x%x imm 0x%x (imm 0 was sent)", what, wc.wc_flags, be32toh(wc.imm_data));
      else
        CHECK(!(wc.wc_flags & IBV_WC_WITH_IMM), "%s: IBV_WC_WITH_IMM set", what);
      CHECK(!memcmp(e.sbuf, e.rbuf, len), "%s: data differs", what);
      CHECK(e.rbuf[len] == 0xee, "%s: byte after the message overwritten", what);
      printf("send: %-20s -> SRQ 0x%x: qp_num 0x%x (TGT), src_qp 0x%x (INI), byte_len %u, data ok\n", what, e.srqn,
             wc.qp_num, wc.src_qp, wc.byte_len);
    }
  }
  /* An immediate value that is not 0. */
  post_srq_recv(e.srq, e.rbuf, 64, e.rmr->lkey, 77);
  if (post_x(e.ini, e.srqn, IBV_WR_SEND_WITH_IMM, e.sbuf, 8, e.smr->lkey, 0, 0, 0, 0, 0xa1b2c3d4) == 0) {
    struct ibv_wc wc;
    CHECK(next_status(e.send_cq, &wc, 5000, "SEND_WITH_IMM 0xa1b2c3d4") == IBV_WC_SUCCESS, "SEND_WITH_IMM send");
    CHECK(next_status(e.recv_cq, &wc, 5000, "receive of imm 0xa1b2c3d4") == IBV_WC_SUCCESS &&
              (wc.wc_flags & IBV_WC_WITH_IMM) && be32toh(wc.imm_data) == 0xa1b2c3d4,
          "imm 0xa1b2c3d4: wc_flags 0x%x imm 0x%x", wc.wc_flags, be32toh(wc.imm_data));
  }
  CHECK(cq_empty(e.recv_cq) && cq_empty(e.send_cq), "extra completions");
  xenv_close(&e);
}

static void case_rdma(void) {
  struct vp_params p;
  vp_default_params(&p);
  struct xenv e;
  xenv_open(&e, &p);
  uint64_t rbase = (uintptr_t)e.rbuf;

  /* WRITE 4097 B at offset 100 and 64 KiB at offset BIG. */
  memset(e.rbuf, 0xee, BUF);
  pattern(e.sbuf, 4097, 1);
  do_x(&e, IBV_WR_RDMA_WRITE, 4097, rbase + 100, 0, 0, "RDMA WRITE 4097 B");
  CHECK(!memcmp(e.rbuf + 100, e.sbuf, 4097) && e.rbuf[99] == 0xee && e.rbuf[100 + 4097] == 0xee,
        "RDMA WRITE 4097 B: target memory wrong");
  pattern(e.sbuf, BIG, 2);
  do_x(&e, IBV_WR_RDMA_WRITE, BIG, rbase + BIG, 0, 0, "RDMA WRITE 64 KiB");
  CHECK(!memcmp(e.rbuf + BIG, e.sbuf, BIG) && e.rbuf[BIG - 1] == 0xee && e.rbuf[2 * BIG] == 0xee,
        "RDMA WRITE 64 KiB: target memory wrong");
  printf("rdma: WRITE 4097 B and 64 KiB through XRC into the SRQ's PD: data ok\n");

  /* WRITE_WITH_IMM: the data lands in the MR, the immediate consumes an SRQ WQE. */
  post_srq_recv(e.srq, e.rbuf + 2 * BIG, 64, e.rmr->lkey, 55);
  pattern(e.sbuf, 3000, 3);
  if (post_x(e.ini, e.srqn, IBV_WR_RDMA_WRITE_WITH_IMM, e.sbuf, 3000, e.smr->lkey, rbase + 8192, e.rmr->rkey, 0, 0,
             0x600dcafe) == 0) {
    struct ibv_wc wc;
    CHECK(next_status(e.send_cq, &wc, 5000, "WRITE_WITH_IMM") == IBV_WC_SUCCESS, "WRITE_WITH_IMM: %s",
          ibv_wc_status_str(wc.status));
    enum ibv_wc_status st = next_status(e.recv_cq, &wc, 5000, "WRITE_WITH_IMM receive");
    CHECK(st == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && wc.wr_id == 55 &&
              (wc.wc_flags & IBV_WC_WITH_IMM) && be32toh(wc.imm_data) == 0x600dcafe && wc.qp_num == e.tgt->qp_num,
          "WRITE_WITH_IMM receive: %s opcode %d wr_id %" PRIu64 " imm 0x%x qp_num 0x%x", ibv_wc_status_str(st),
          (int)wc.opcode, wc.wr_id, be32toh(wc.imm_data), wc.qp_num);
    CHECK(!memcmp(e.rbuf + 8192, e.sbuf, 3000), "WRITE_WITH_IMM: target memory wrong");
    printf("rdma: WRITE_WITH_IMM 3000 B: data ok, IBV_WC_RECV_RDMA_WITH_IMM on the SRQ's CQ, qp_num 0x%x\n", wc.qp_num);
  }

  /* READ back 4097 B. */
  pattern(e.rbuf + 20000, 4097, 4);
  memset(e.sbuf, 0, 8192);
  do_x(&e, IBV_WR_RDMA_READ, 4097, rbase + 20000, 0, 0, "RDMA READ 4097 B");
  CHECK(!memcmp(e.sbuf, e.rbuf + 20000, 4097) && e.sbuf[4097] == 0, "RDMA READ 4097 B: data wrong");
  pattern(e.rbuf, BIG, 5);
  do_x(&e, IBV_WR_RDMA_READ, BIG, rbase, 0, 0, "RDMA READ 64 KiB");
  CHECK(!memcmp(e.sbuf, e.rbuf, BIG), "RDMA READ 64 KiB: data wrong");
  printf("rdma: READ 4097 B and 64 KiB through XRC: data ok\n");

  /* Atomics on an 8-aligned word of the SRQ's PD. */
  uint64_t* word = (uint64_t*)(e.rbuf + 2 * BIG + 512);
  uint64_t* local = (uint64_t*)e.sbuf;
  *word = 1000;
  do_x(&e, IBV_WR_ATOMIC_FETCH_AND_ADD, 8, (uintptr_t)word, 5, 0, "FETCH_AND_ADD 5");
  CHECK(*local == 1000 && *word == 1005, "FETCH_AND_ADD 5: fetched %" PRIu64 ", memory %" PRIu64, *local, *word);
  do_x(&e, IBV_WR_ATOMIC_FETCH_AND_ADD, 8, (uintptr_t)word, 7, 0, "FETCH_AND_ADD 7");
  CHECK(*local == 1005 && *word == 1012, "FETCH_AND_ADD 7: fetched %" PRIu64 ", memory %" PRIu64, *local, *word);
  do_x(&e, IBV_WR_ATOMIC_CMP_AND_SWP, 8, (uintptr_t)word, 1012, 42, "CMP_AND_SWP 1012->42");
  CHECK(*local == 1012 && *word == 42, "CMP_AND_SWP: fetched %" PRIu64 ", memory %" PRIu64, *local, *word);
  printf("rdma: FETCH_AND_ADD 1000+5+7 = %" PRIu64 " before CMP_AND_SWP -> %" PRIu64 "\n", *local, *word);
  CHECK(cq_empty(e.recv_cq) && cq_empty(e.send_cq), "extra completions");
  xenv_close(&e);
}

static void case_rdma_wrong_pd(void) {
  struct vp_params p;
  vp_default_params(&p);
  p.retry_cnt = 1;
  struct xenv e;
  xenv_open(&e, &p);
  /* Memory registered with remote write in the INI's PD, not the SRQ's. */
  uint8_t* other = calloc(1, 4096);
  struct ibv_mr* omr = other ? ibv_reg_mr(e.ini_pd, other, 4096, kRemote) : NULL;
  if (!omr) exit(1);
  memset(other, 0xee, 4096);
  pattern(e.sbuf, 256, 9);
  struct ibv_wc wc;
  if (post_x(e.ini, e.srqn, IBV_WR_RDMA_WRITE, e.sbuf, 256, e.smr->lkey, (uintptr_t)other, omr->rkey, 0, 0, 0) == 0) {
    enum ibv_wc_status st = next_status(e.send_cq, &wc, 10000, "WRITE with another PD's R_Key");
    CHECK(st == IBV_WC_REM_ACCESS_ERR, "WRITE with an R_Key of another PD than the SRQ's: %s (expected %s)",
          ibv_wc_status_str(st), ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));
    int untouched = 1;
    for (int i = 0; i < 4096; i++) untouched &= other[i] == 0xee;
    CHECK(untouched, "memory of the other PD was written");
    printf("rdma_wrong_pd: WRITE with an R_Key of the INI's PD, naming SRQ 0x%x -> %s, memory untouched\n", e.srqn,
           ibv_wc_status_str(st));
  }
  ibv_dereg_mr(omr);
  free(other);
  xenv_close(&e);
}

static void case_bad_srqn(void) {
  struct vp_params p;
  vp_default_params(&p);
  p.retry_cnt = 1;
  struct xenv e;
  xenv_open(&e, &p);
  /* A live SRQ of another domain. */
  struct ibv_xrcd* other_x = open_xrcd(e.ctx, -1, O_CREAT);
  struct ibv_srq* other = other_x ? create_xsrq(e.ctx, other_x, e.srq_pd, e.recv_cq, 0) : NULL;
  if (!other) exit(1);
  uint32_t other_n = srq_num(other);
  post_srq_recv(other, e.rbuf, 4096, e.rmr->lkey, 1);
  /* A number that names no SRQ: that of an SRQ just destroyed (created last: numbers may be
   * reused by later SRQs). */
  struct ibv_srq* gone = create_xsrq(e.ctx, e.xrcd, e.srq_pd, e.recv_cq, 0);
  if (!gone) exit(1);
  uint32_t gone_n = srq_num(gone);
  CHECK(ibv_destroy_srq(gone) == 0, "ibv_destroy_srq");
  CHECK(gone_n != other_n && gone_n != e.srqn, "a destroyed SRQ's number 0x%x is still in use", gone_n);

  struct {
    const char* what;
    uint32_t srqn;
    enum ibv_wr_opcode op;
  } tries[] = {
      {"SEND naming a destroyed SRQ", gone_n, IBV_WR_SEND},
      {"RDMA WRITE naming a destroyed SRQ", gone_n, IBV_WR_RDMA_WRITE},
      {"SEND naming an SRQ of another domain", other_n, IBV_WR_SEND},
      {"RDMA WRITE naming an SRQ of another domain", other_n, IBV_WR_RDMA_WRITE},
  };
  for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
    if (i) xenv_new_qps(&e, &p); /* the error moved the previous pair to ERR */
    memset(e.rbuf + 8192, 0xee, 64);
    struct ibv_wc wc;
    if (post_x(e.ini, tries[i].srqn, tries[i].op, e.sbuf, 64, e.smr->lkey, (uintptr_t)e.rbuf + 8192, e.rmr->rkey, 0, 0,
               0))
      continue;
    enum ibv_wc_status st = next_status(e.send_cq, &wc, 10000, tries[i].what);
    CHECK(st == IBV_WC_REM_INV_REQ_ERR, "%s (0x%x): %s (expected %s)", tries[i].what, tries[i].srqn,
          ibv_wc_status_str(st), ibv_wc_status_str(IBV_WC_REM_INV_REQ_ERR));
    CHECK(e.rbuf[8192] == 0xee, "%s: the WRITE was executed", tries[i].what);
    printf("bad_srqn: %s (0x%x) -> %s\n", tries[i].what, tries[i].srqn, ibv_wc_status_str(st));
  }
  CHECK(cq_empty(e.recv_cq), "a message reached the other domain's SRQ");
  CHECK(ibv_destroy_srq(other) == 0 && ibv_close_xrcd(other_x) == 0, "destroying the other domain");
  xenv_close(&e);
}

static void case_rnr(void) {
  struct vp_params p;
  vp_default_params(&p);
  p.rnr_retry = 1;
  p.min_rnr_timer = 1; /* 0.01 ms */
  struct xenv e;
  xenv_open(&e, &p);
  pattern(e.sbuf, 64, 1);
  double t0 = vp_now_ms();
  if (post_x(e.ini, e.srqn, IBV_WR_SEND, e.sbuf, 64, e.smr->lkey, 0, 0, 0, 0, 0) == 0) {
    struct ibv_wc wc;
    enum ibv_wc_status st = next_status(e.send_cq, &wc, 10000, "SEND to an empty SRQ");
    CHECK(st == IBV_WC_RNR_RETRY_EXC_ERR, "SEND to an empty XRC SRQ with rnr_retry 1: %s (expected %s)",
          ibv_wc_status_str(st), ibv_wc_status_str(IBV_WC_RNR_RETRY_EXC_ERR));
    printf("rnr: SEND to an empty XRC SRQ, rnr_retry 1 -> %s after %.1f ms\n", ibv_wc_status_str(st), vp_now_ms() - t0);
  }
  CHECK(cq_empty(e.recv_cq), "a receive completion on an SRQ with no WQE");
  xenv_close(&e);
}

static void case_two_srqs(void) {
  struct vp_params p;
  vp_default_params(&p);
  struct xenv e;
  xenv_open(&e, &p);
  struct ibv_cq* bcq = ibv_create_cq(e.ctx, 16, NULL, NULL, 0);
  struct ibv_srq* b = bcq ? create_xsrq(e.ctx, e.xrcd, e.srq_pd, bcq, 0) : NULL;
  if (!b) exit(1);
  uint32_t bn = srq_num(b);
  CHECK(bn != e.srqn, "two SRQs with number 0x%x", bn);
  enum { kMsgs = 8, kSlot = 4096 };
  for (int i = 0; i < kMsgs / 2; i++) {
    post_srq_recv(e.srq, e.rbuf + (2 * i) * kSlot, kSlot, e.rmr->lkey, (uint64_t)(2 * i));
    post_srq_recv(b, e.rbuf + (2 * i + 1) * kSlot, kSlot, e.rmr->lkey, (uint64_t)(2 * i + 1));
  }
  int ok = 0;
  for (int m = 0; m < kMsgs; m++) {
    int to_b = m & 1;
    uint32_t len = 100 + 37 * (uint32_t)m;
    pattern(e.sbuf, len, (uint32_t)(500 + m));
    char what[48];
    snprintf(what, sizeof what, "message %d to SRQ %c", m, to_b ? 'B' : 'A');
    if (post_x(e.ini, to_b ? bn : e.srqn, IBV_WR_SEND, e.sbuf, len, e.smr->lkey, 0, 0, 0, 0, 0)) continue;
    struct ibv_wc wc;
    CHECK(next_status(e.send_cq, &wc, 5000, what) == IBV_WC_SUCCESS, "%s: send %s", what, ibv_wc_status_str(wc.status));
    struct ibv_cq* want = to_b ? bcq : e.recv_cq;
    struct ibv_cq* not_want = to_b ? e.recv_cq : bcq;
    enum ibv_wc_status st = next_status(want, &wc, 5000, what);
    int good = st == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)m && wc.byte_len == len && wc.qp_num == e.tgt->qp_num &&
               !memcmp(e.rbuf + m * kSlot, e.sbuf, len);
    CHECK(good, "%s: %s wr_id %" PRIu64 " byte_len %u qp_num 0x%x", what, ibv_wc_status_str(st), wc.wr_id, wc.byte_len,
          wc.qp_num);
    CHECK(cq_empty(not_want), "%s: a completion on the other SRQ's CQ", what);
    ok += good;
  }
  printf("two_srqs: %d/%d messages alternating SRQ A 0x%x / B 0x%x behind TGT QP 0x%x landed right\n", ok, kMsgs,
         e.srqn, bn, e.tgt->qp_num);
  CHECK(ibv_destroy_srq(b) == 0, "ibv_destroy_srq(B)");
  ibv_destroy_cq(bcq);
  xenv_close(&e);
}

/* ---------- cross_process ---------- */

#define XP_MSGS 6
static const uint32_t kXpSizes[XP_MSGS] = {1, 4097, BIG, 512, 2048, BIG};

static pid_t g_child = -1;
static int g_is_child;
static char g_xp_path[64];

/* The parent's exit path, whatever it is: kill and reap the child, remove the file. */
static void xp_atexit(void) {
  if (g_is_child) return;
  if (g_child > 0) {
    kill(g_child, SIGKILL);
    waitpid(g_child, NULL, 0);
    g_child = -1;
  }
  if (g_xp_path[0]) unlink(g_xp_path);
}

/* The child: its own context, the shared domain, an XRC SRQ; receives XP_MSGS messages. */
static int xp_child(int to_parent, int from_parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  alarm(45);
  uint32_t srqn = 0;
  struct port port;
  struct ibv_context* ctx = open_ctx(&port);
  int fd = open(g_xp_path, O_RDONLY);
  struct ibv_xrcd* xrcd = ctx && fd >= 0 ? open_xrcd(ctx, fd, O_CREAT) : NULL;
  struct ibv_pd* pd = xrcd ? ibv_alloc_pd(ctx) : NULL;
  struct ibv_cq* cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
  struct ibv_srq* srq = cq ? create_xsrq(ctx, xrcd, pd, cq, 0) : NULL;
  size_t blen = (size_t)XP_MSGS * BIG;
  uint8_t* buf = srq ? malloc(blen) : NULL;
  struct ibv_mr* mr = buf ? ibv_reg_mr(pd, buf, blen, IBV_ACCESS_LOCAL_WRITE) : NULL;
  if (!mr) {
    printf("[child] setup failed: %s\n", strerror(errno));
    vp_write_full(to_parent, &srqn, sizeof srqn);
    return 1;
  }
  memset(buf, 0xee, blen);
  for (int i = 0; i < XP_MSGS; i++) post_srq_recv(srq, buf + (size_t)i * BIG, BIG, mr->lkey, (uint64_t)i);
  srqn = srq_num(srq);
  if (vp_write_full(to_parent, &srqn, sizeof srqn)) return 1;
  uint32_t tgt_qpn = 0;
  if (vp_read_full(from_parent, &tgt_qpn, sizeof tgt_qpn, 20000)) {
    printf("[child] no TGT QP number from the parent\n");
    return 1;
  }
  int ok = 0;
  uint8_t* want = malloc(BIG);
  if (!want) return 1;
  for (int i = 0; i < XP_MSGS; i++) {
    struct ibv_wc wc;
    char what[48];
    snprintf(what, sizeof what, "[child] message %d (%u B)", i, kXpSizes[i]);
    enum ibv_wc_status st = next_status(cq, &wc, 10000, what);
    if (st != IBV_WC_SUCCESS) {
      CHECK(0, "%s: %s", what, ibv_wc_status_str(st));
      break;
    }
    pattern(want, kXpSizes[i], (uint32_t)(900 + i));
    int good = wc.opcode == IBV_WC_RECV && wc.wr_id == (uint64_t)i && wc.byte_len == kXpSizes[i] &&
               wc.qp_num == tgt_qpn && !memcmp(buf + (size_t)i * BIG, want, kXpSizes[i]);
    CHECK(good, "%s: opcode %d wr_id %" PRIu64 " byte_len %u qp_num 0x%x (parent's TGT QP 0x%x), data %s", what,
          (int)wc.opcode, wc.wr_id, wc.byte_len, wc.qp_num, tgt_qpn,
          memcmp(buf + (size_t)i * BIG, want, kXpSizes[i]) ? "differs" : "ok");
    ok += good;
  }
  CHECK(cq_empty(cq), "[child] extra completions");
  printf("[child] %d/%d messages received on SRQ 0x%x through the parent's TGT QP 0x%x, data ok\n", ok, XP_MSGS, srqn,
         tgt_qpn);
  CHECK(ibv_destroy_srq(srq) == 0, "[child] ibv_destroy_srq");
  CHECK(ibv_close_xrcd(xrcd) == 0, "[child] ibv_close_xrcd");
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  close(fd);
  free(buf);
  free(want);
  return g_failures ? 1 : 0;
}

static void case_cross_process(void) {
  int fd = make_temp(g_xp_path);
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
    g_is_child = 1; /* the parent's exit handler is not the child's */
    close(to_parent[0]);
    close(to_child[1]);
    close(fd);
    int rc = xp_child(to_parent[1], to_child[0]);
    fflush(stdout);
    _exit(rc);
  }
  g_child = pid;
  signal(SIGPIPE, SIG_IGN); /* a dead child makes writes fail, not kill the parent */
  close(to_parent[1]);
  close(to_child[0]);

  struct vp_params p;
  vp_default_params(&p);
  struct port port;
  struct ibv_context* ctx = open_ctx(&port);
  struct ibv_xrcd* xrcd = ctx ? open_xrcd(ctx, fd, O_CREAT) : NULL;
  CHECK(xrcd != NULL, "ibv_open_xrcd(shared file, O_CREAT): %s", strerror(errno));
  struct ibv_pd* pd = xrcd ? ibv_alloc_pd(ctx) : NULL;
  struct ibv_cq* cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
  uint8_t* sbuf = cq ? malloc(BIG) : NULL;
  struct ibv_mr* smr = sbuf ? ibv_reg_mr(pd, sbuf, BIG, IBV_ACCESS_LOCAL_WRITE) : NULL;
  struct ibv_qp* tgt = smr ? create_tgt(ctx, xrcd) : NULL;
  struct ibv_qp* ini = tgt ? create_ini(ctx, pd, cq) : NULL;
  if (!ini || connect_tgt(tgt, &p, &port, ini->qp_num) || connect_ini(ini, &p, &port, tgt->qp_num)) exit(1);

  uint32_t srqn = 0;
  if (vp_read_full(to_parent[0], &srqn, sizeof srqn, 20000) || srqn == 0) {
    CHECK(0, "no SRQ number from the child");
  } else {
    uint32_t tgt_qpn = tgt->qp_num;
    CHECK(vp_write_full(to_child[1], &tgt_qpn, sizeof tgt_qpn) == 0, "writing to the child");
    int sent = 0;
    for (int i = 0; i < XP_MSGS; i++) {
      pattern(sbuf, kXpSizes[i], (uint32_t)(900 + i));
      if (post_x(ini, srqn, IBV_WR_SEND, sbuf, kXpSizes[i], smr->lkey, 0, 0, 0, 0, 0)) break;
      struct ibv_wc wc;
      enum ibv_wc_status st = next_status(cq, &wc, 10000, "SEND to the child's SRQ");
      CHECK(st == IBV_WC_SUCCESS, "SEND %d (%u B) to the child's SRQ 0x%x: %s", i, kXpSizes[i], srqn,
            ibv_wc_status_str(st));
      if (st != IBV_WC_SUCCESS) break;
      sent++;
    }
    printf("cross_process: parent sent %d/%d messages through INI 0x%x -> its TGT 0x%x naming the child's SRQ 0x%x\n",
           sent, XP_MSGS, ini->qp_num, tgt->qp_num, srqn);
  }
  /* The child's verdict, within 30 s. */
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
  CHECK(ibv_destroy_qp(ini) == 0 && ibv_destroy_qp(tgt) == 0, "ibv_destroy_qp");
  CHECK(ibv_close_xrcd(xrcd) == 0, "ibv_close_xrcd");
  ibv_dereg_mr(smr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  close(fd);
  free(sbuf);
}

static void case_domain_crash(void) {
  char path[64];
  int fd = make_temp(path);
  snprintf(g_xp_path, sizeof g_xp_path, "%s", path); /* xp_atexit removes it */
  atexit(xp_atexit);
  int ready[2];
  if (pipe(ready)) exit(1);
  g_child = fork();
  if (g_child < 0) exit(1);
  if (g_child == 0) {
    /* The child: opens the domain, says so, then waits to be killed. */
    g_is_child = 1;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(30);
    struct port port;
    struct ibv_context* ctx = open_ctx(&port);
    struct ibv_xrcd* x = ctx ? open_xrcd(ctx, fd, O_CREAT) : NULL;
    char c = x ? 'y' : 'n';
    if (write(ready[1], &c, 1) != 1) _exit(1);
    for (;;) pause();
  }
  char c = 0;
  CHECK(vp_read_full(ready[0], &c, 1, 10000) == 0 && c == 'y', "the child could not open the domain");
  kill(g_child, SIGKILL);
  waitpid(g_child, NULL, 0);
  g_child = -1;

  struct port port;
  struct ibv_context* ctx = open_ctx(&port);
  if (!ctx) exit(1);
  errno = 0;
  struct ibv_xrcd* x = open_xrcd(ctx, fd, 0);
  CHECK(x == NULL && errno == EAGAIN, "oflags 0 after the only opener died: %p, errno %d (%s)", (void*)x, errno,
        strerror(errno));
  if (x) ibv_close_xrcd(x);
  x = open_xrcd(ctx, fd, O_CREAT | O_EXCL);
  CHECK(x != NULL, "O_CREAT|O_EXCL after the only opener died: %s", strerror(errno));
  printf("domain_crash: the SIGKILLed opener's domain is gone (EAGAIN without O_CREAT, O_EXCL creates it)\n");
  if (x) CHECK(ibv_close_xrcd(x) == 0, "ibv_close_xrcd");
  ibv_close_device(ctx);
  close(fd);
}

/* The ibv_wr_* builders on a TGT QP (created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
 * no operations, and moved to RTS) are refused as ibv_post_send is: EINVAL, no
 * completion. Both go through one post path (engine/post_send.h). */
static void bad_wr_api_on_tgt(struct xenv* e, const struct vp_params* p, struct ibv_send_wr* swr) {
  struct ibv_qp_init_attr_ex a;
  memset(&a, 0, sizeof a);
  a.qp_type = IBV_QPT_XRC_RECV;
  a.comp_mask = IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  a.xrcd = e->xrcd;
  struct ibv_qp* tgt = ibv_create_qp_ex(e->ctx, &a);
  CHECK(tgt != NULL, "TGT QP with send_ops_flags 0: %s", strerror(errno));
  if (!tgt) return;
  CHECK(connect_tgt(tgt, p, &e->port, e->ini->qp_num) == 0, "second TGT QP to RTS");
  struct ibv_send_wr* sbad = NULL;
  int post_rc = ibv_post_send(tgt, swr, &sbad);
  struct ibv_qp_ex* qpx = ibv_qp_to_qp_ex(tgt);
  CHECK(qpx != NULL, "ibv_qp_to_qp_ex on a TGT QP created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS");
  if (qpx) {
    ibv_wr_start(qpx);
    qpx->wr_id = 1;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(qpx);
    ibv_wr_set_xrc_srqn(qpx, e->srqn);
    ibv_wr_set_sge(qpx, e->smr->lkey, (uintptr_t)e->sbuf, 64);
    int wr_rc = ibv_wr_complete(qpx);
    CHECK(post_rc == EINVAL && wr_rc == post_rc, "TGT QP in RTS: ibv_post_send %d (%s), ibv_wr_complete %d (%s)",
          post_rc, strerror(post_rc), wr_rc, strerror(wr_rc));
  }
  CHECK(cq_empty(e->send_cq) && cq_empty(e->recv_cq), "a rejected WR on a TGT QP produced a completion");
  CHECK(ibv_destroy_qp(tgt) == 0, "ibv_destroy_qp(second TGT)");
}

static void case_bad(void) {
  struct vp_params p;
  vp_default_params(&p);
  struct xenv e;
  xenv_open(&e, &p);
  struct ibv_sge sge = {(uintptr_t)e.sbuf, 64, e.smr->lkey};
  struct ibv_send_wr swr, *sbad = NULL;
  memset(&swr, 0, sizeof swr);
  swr.sg_list = &sge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  swr.qp_type.xrc.remote_srqn = e.srqn;
  int rc = ibv_post_send(e.tgt, &swr, &sbad);
  CHECK(rc == EINVAL && sbad == &swr, "ibv_post_send on a TGT QP: %d (%s), bad_wr %s", rc, strerror(rc),
        sbad == &swr ? "set" : "not set");
  struct ibv_recv_wr rwr = {.sg_list = &sge, .num_sge = 1}, *rbad = NULL;
  rc = ibv_post_recv(e.tgt, &rwr, &rbad);
  CHECK(rc == EINVAL && rbad == &rwr, "ibv_post_recv on a TGT QP: %d (%s), bad_wr %s", rc, strerror(rc),
        rbad == &rwr ? "set" : "not set");
  rbad = NULL;
  rc = ibv_post_recv(e.ini, &rwr, &rbad);
  CHECK(rc == EINVAL && rbad == &rwr, "ibv_post_recv on an INI QP: %d (%s), bad_wr %s", rc, strerror(rc),
        rbad == &rwr ? "set" : "not set");
  CHECK(cq_empty(e.send_cq) && cq_empty(e.recv_cq), "a rejected WR produced a completion");
  bad_wr_api_on_tgt(&e, &p, &swr);

  struct ibv_xrcd_init_attr xa;
  memset(&xa, 0, sizeof xa);
  xa.fd = -1;
  xa.oflags = O_CREAT;
  const uint32_t masks[] = {0, IBV_XRCD_INIT_ATTR_FD, IBV_XRCD_INIT_ATTR_OFLAGS};
  for (size_t i = 0; i < 3; i++) {
    xa.comp_mask = masks[i];
    errno = 0;
    struct ibv_xrcd* x = ibv_open_xrcd(e.ctx, &xa);
    CHECK(x == NULL && errno == EINVAL, "ibv_open_xrcd with comp_mask 0x%x: %p, errno %d (%s)", masks[i], (void*)x,
          errno, strerror(errno));
    if (x) ibv_close_xrcd(x);
  }

  struct ibv_qp_init_attr_ex qa;
  memset(&qa, 0, sizeof qa);
  qa.qp_type = IBV_QPT_XRC_RECV;
  qa.xrcd = e.xrcd;
  errno = 0;
  struct ibv_qp* q = ibv_create_qp_ex(e.ctx, &qa);
  CHECK(q == NULL && errno == EINVAL, "TGT QP without IBV_QP_INIT_ATTR_XRCD: %p, errno %d (%s)", (void*)q, errno,
        strerror(errno));
  if (q) ibv_destroy_qp(q);
  memset(&qa, 0, sizeof qa);
  qa.qp_type = IBV_QPT_XRC_SEND;
  qa.send_cq = e.send_cq;
  qa.cap.max_send_wr = 4;
  qa.cap.max_send_sge = 1;
  errno = 0;
  q = ibv_create_qp_ex(e.ctx, &qa);
  CHECK(q == NULL && errno == EINVAL, "INI QP without a PD: %p, errno %d (%s)", (void*)q, errno, strerror(errno));
  if (q) ibv_destroy_qp(q);
  printf(
      "bad: post_send/post_recv on TGT and post_recv on INI -> EINVAL; open_xrcd without FD/OFLAGS -> EINVAL; "
      "TGT without XRCD, INI without PD -> EINVAL\n");
  xenv_close(&e);
}

int main(int argc, char** argv) {
  static const struct vp_case cases[] = {
      {"domain", case_domain},
      {"srq", case_srq},
      {"send", case_send},
      {"rdma", case_rdma},
      {"rdma_wrong_pd", case_rdma_wrong_pd},
      {"bad_srqn", case_bad_srqn},
      {"rnr", case_rnr},
      {"two_srqs", case_two_srqs},
      {"cross_process", case_cross_process},
      {"domain_crash", case_domain_crash},
      {"bad", case_bad},
  };
  return vp_run_case(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
