/* Memory windows through the public verbs API (IBA 10.6.7): B owns memory and grants A
 * access through windows; A accesses it with RDMA WRITE/READ.
 *
 *   type1     ibv_bind_mw on B's QP (completion IBV_WC_BIND_MW, new key in mw->rkey);
 *             A writes inside the window (data verified), then past its end ->
 *             IBV_WC_REM_ACCESS_ERR, memory beyond the window untouched.
 *   type2     IBV_WR_BIND_MW with a read-only window: A reads through it; a WRITE through
 *             it -> IBV_WC_REM_ACCESS_ERR (the window grants read only); a READ arriving
 *             on another QP of B (same PD) -> IBV_WC_REM_ACCESS_ERR (a type 2 window is
 *             associated with the QP that bound it: IBV_DEVICE_MEM_WINDOW_TYPE_2B).
 *   local_inv IBV_WR_LOCAL_INV on B invalidates the window: A's READ -> REM_ACCESS_ERR.
 *   send_inv  A's IBV_WR_SEND_WITH_INV names the window: B's receive completion has
 *             IBV_WC_WITH_INV and invalidated_rkey; A's READ with that key then fails.
 *   bad       IBV_WR_BIND_MW with a type 1 window -> EINVAL; binding to an MR without
 *             IBV_ACCESS_MW_BIND -> IBV_WC_MW_BIND_ERR; ibv_dereg_mr of an MR with a bound
 *             window -> EBUSY; ibv_alloc_mw of an unknown type -> EINVAL.
 *   local_write_mr  windows granting REMOTE_WRITE (with LOCAL_WRITE in the bind's flags, as
 *             rdma-core's pyverbs tests pass them) bound, type 1 and type 2, onto an MR with
 *             LOCAL_WRITE | MW_BIND and no remote access: legal (IBA C10-75 asks local
 *             write of the MR only), A writes through both (data verified); the same bind
 *             onto an MR without LOCAL_WRITE -> IBV_WC_MW_BIND_ERR.
 *
 * Usage: mw_test CASE. Exit 0 when every check passes. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_pair.h"

#define BUF 4096
#define WIN_OFF 512
#define WIN_LEN 1024

struct setup {
  struct vp_side a, b;
  uint8_t *abuf, *bbuf;
  struct ibv_mr *amr, *bmr;
};

static void setup_open(struct setup* s, int b_access) {
  struct vp_params p;
  vp_default_params(&p);
  if (vp_open(&s->a, &p, 0x10) || vp_open(&s->b, &p, 0x20) || vp_connect(&s->a, &p, &s->b.self) ||
      vp_connect(&s->b, &p, &s->a.self))
    exit(1);
  s->abuf = calloc(1, BUF);
  s->bbuf = calloc(1, BUF);
  s->amr = ibv_reg_mr(s->a.pd, s->abuf, BUF, IBV_ACCESS_LOCAL_WRITE);
  s->bmr = ibv_reg_mr(s->b.pd, s->bbuf, BUF, b_access);
  if (!s->abuf || !s->bbuf || !s->amr || !s->bmr) exit(1);
}

static void setup_close(struct setup* s) {
  ibv_dereg_mr(s->amr);
  ibv_dereg_mr(s->bmr);
  vp_close(&s->a);
  vp_close(&s->b);
  free(s->abuf);
  free(s->bbuf);
}

static const int kFull = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND;

static enum ibv_wc_status wait_status(struct ibv_cq* cq, enum ibv_wc_opcode* op) {
  struct ibv_wc wc;
  if (vp_poll(cq, &wc, 5000) != 1) {
    CHECK(0, "no completion within 5 s");
    return IBV_WC_GENERAL_ERR;
  }
  if (op) *op = wc.opcode;
  return wc.status;
}

/* A's RDMA WRITE/READ of `len` bytes at B's address `addr` with `rkey`. */
static enum ibv_wc_status rdma(struct setup* s, enum ibv_wr_opcode op, uint64_t addr, uint32_t rkey, uint32_t len) {
  struct ibv_sge sge = {(uintptr_t)s->abuf, len, s->amr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  if (ibv_post_send(s->a.qp, &wr, &bad)) return IBV_WC_GENERAL_ERR;
  return wait_status(s->a.cq, NULL);
}

/* B binds a type 2 window with IBV_WR_BIND_MW; returns the new key. */
static uint32_t bind2(struct setup* s, struct ibv_mw* mw, struct ibv_mr* mr, int access, enum ibv_wc_status* st) {
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info.mr = mr;
  wr.bind_mw.bind_info.addr = (uintptr_t)s->bbuf + WIN_OFF;
  wr.bind_mw.bind_info.length = WIN_LEN;
  wr.bind_mw.bind_info.mw_access_flags = (unsigned)access;
  int rc = ibv_post_send(s->b.qp, &wr, &bad);
  CHECK(rc == 0, "post IBV_WR_BIND_MW: %d", rc);
  enum ibv_wc_opcode op = 0;
  *st = rc ? IBV_WC_GENERAL_ERR : wait_status(s->b.cq, &op);
  if (*st == IBV_WC_SUCCESS) CHECK(op == IBV_WC_BIND_MW, "bind completion opcode %d", op);
  return wr.bind_mw.rkey;
}

static void local_inv(struct setup* s, uint32_t rkey) {
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.opcode = IBV_WR_LOCAL_INV;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.invalidate_rkey = rkey;
  CHECK(ibv_post_send(s->b.qp, &wr, &bad) == 0, "post IBV_WR_LOCAL_INV");
  CHECK(wait_status(s->b.cq, NULL) == IBV_WC_SUCCESS, "IBV_WR_LOCAL_INV failed");
}

static void case_type1(void) {
  struct setup s;
  setup_open(&s, kFull);
  struct ibv_mw* mw = ibv_alloc_mw(s.b.pd, IBV_MW_TYPE_1);
  CHECK(mw != NULL, "ibv_alloc_mw(type 1): %s", strerror(errno));
  if (!mw) exit(1);
  uint32_t old = mw->rkey;
  struct ibv_mw_bind bind = {.wr_id = 77, .send_flags = IBV_SEND_SIGNALED};
  bind.bind_info.mr = s.bmr;
  bind.bind_info.addr = (uintptr_t)s.bbuf + WIN_OFF;
  bind.bind_info.length = WIN_LEN;
  bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  CHECK(ibv_bind_mw(s.b.qp, mw, &bind) == 0, "ibv_bind_mw");
  enum ibv_wc_opcode op = 0;
  CHECK(wait_status(s.b.cq, &op) == IBV_WC_SUCCESS && op == IBV_WC_BIND_MW, "bind completion");
  CHECK(mw->rkey != old && (mw->rkey >> 8) == (old >> 8), "rkey 0x%x after bind (was 0x%x)", mw->rkey, old);
  for (int i = 0; i < 64; i++) s.abuf[i] = (uint8_t)(i + 1);
  uint64_t base = (uintptr_t)s.bbuf + WIN_OFF;
  CHECK(rdma(&s, IBV_WR_RDMA_WRITE, base + 100, mw->rkey, 64) == IBV_WC_SUCCESS, "WRITE inside the window");
  CHECK(!memcmp(s.bbuf + WIN_OFF + 100, s.abuf, 64), "data written through the window differs");
  /* The MR is busy while the window is bound to it. */
  CHECK(ibv_dereg_mr(s.bmr) == EBUSY, "ibv_dereg_mr with a bound window is not EBUSY");
  enum ibv_wc_status st = rdma(&s, IBV_WR_RDMA_WRITE, base + WIN_LEN - 4, mw->rkey, 8);
  CHECK(st == IBV_WC_REM_ACCESS_ERR, "WRITE past the window: %s", ibv_wc_status_str(st));
  CHECK(s.bbuf[WIN_OFF + WIN_LEN] == 0 && s.bbuf[WIN_OFF + WIN_LEN - 4] == 0, "memory past the window touched");
  printf("type1: bound, WRITE inside verified, WRITE past the end -> %s\n", ibv_wc_status_str(st));
  CHECK(ibv_dealloc_mw(mw) == 0, "ibv_dealloc_mw");
  setup_close(&s);
}

/* A second QP on `base`'s context, PD and CQ, in INIT as vp_open leaves one. */
static int second_qp(const struct vp_side* base, const struct vp_params* p, uint32_t psn, struct vp_side* out) {
  *out = *base;
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = ia.recv_cq = base->cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = p->sq_depth;
  ia.cap.max_recv_wr = p->rq_depth;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = p->max_sge;
  out->qp = ibv_create_qp(base->pd, &ia);
  if (!out->qp) return -1;
  out->self.qpn = out->qp->qp_num;
  out->self.psn = psn;
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  return ibv_modify_qp(out->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ? -1 : 0;
}

/* A READ through `key` arriving on B's second QP B2 (A2 -> B2): the window was bound on
 * B's first QP. */
static enum ibv_wc_status read_via_other_qp(struct setup* s, uint64_t addr, uint32_t key) {
  struct vp_params p;
  vp_default_params(&p);
  struct vp_side a2, b2;
  if (second_qp(&s->a, &p, 0x30, &a2) || second_qp(&s->b, &p, 0x40, &b2) || vp_connect(&a2, &p, &b2.self) ||
      vp_connect(&b2, &p, &a2.self))
    exit(1);
  struct ibv_sge sge = {(uintptr_t)s->abuf, 32, s->amr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = key;
  enum ibv_wc_status st = ibv_post_send(a2.qp, &wr, &bad) ? IBV_WC_GENERAL_ERR : wait_status(s->a.cq, NULL);
  ibv_destroy_qp(a2.qp);
  ibv_destroy_qp(b2.qp);
  return st;
}

static void case_type2(void) {
  struct setup s;
  setup_open(&s, kFull);
  struct ibv_mw* mw = ibv_alloc_mw(s.b.pd, IBV_MW_TYPE_2);
  if (!mw) exit(1);
  enum ibv_wc_status st;
  uint32_t key = bind2(&s, mw, s.bmr, IBV_ACCESS_REMOTE_READ, &st);
  CHECK(st == IBV_WC_SUCCESS, "IBV_WR_BIND_MW: %s", ibv_wc_status_str(st));
  for (int i = 0; i < WIN_LEN; i++) s.bbuf[WIN_OFF + i] = (uint8_t)(i * 5);
  uint64_t base = (uintptr_t)s.bbuf + WIN_OFF;
  CHECK(rdma(&s, IBV_WR_RDMA_READ, base, key, WIN_LEN) == IBV_WC_SUCCESS, "READ through the window");
  CHECK(!memcmp(s.abuf, s.bbuf + WIN_OFF, WIN_LEN), "data read through the window differs");
  enum ibv_wc_status other = read_via_other_qp(&s, base, key);
  CHECK(other == IBV_WC_REM_ACCESS_ERR, "READ through the window on another QP of B: %s", ibv_wc_status_str(other));
  st = rdma(&s, IBV_WR_RDMA_WRITE, base, key, 16);
  CHECK(st == IBV_WC_REM_ACCESS_ERR, "WRITE through a read-only window: %s", ibv_wc_status_str(st));
  printf("type2: READ through the window verified, on another QP of B -> %s, WRITE -> %s\n", ibv_wc_status_str(other),
         ibv_wc_status_str(st));
  ibv_dealloc_mw(mw);
  setup_close(&s);
}

static void case_local_inv(void) {
  struct setup s;
  setup_open(&s, kFull);
  struct ibv_mw* mw = ibv_alloc_mw(s.b.pd, IBV_MW_TYPE_2);
  if (!mw) exit(1);
  enum ibv_wc_status st;
  uint32_t key = bind2(&s, mw, s.bmr, IBV_ACCESS_REMOTE_READ, &st);
  uint64_t base = (uintptr_t)s.bbuf + WIN_OFF;
  CHECK(rdma(&s, IBV_WR_RDMA_READ, base, key, 32) == IBV_WC_SUCCESS, "READ before invalidation");
  local_inv(&s, key);
  st = rdma(&s, IBV_WR_RDMA_READ, base, key, 32);
  CHECK(st == IBV_WC_REM_ACCESS_ERR, "READ after IBV_WR_LOCAL_INV: %s", ibv_wc_status_str(st));
  printf("local_inv: READ with the invalidated key -> %s\n", ibv_wc_status_str(st));
  ibv_dealloc_mw(mw);
  setup_close(&s);
}

static void case_send_inv(void) {
  struct setup s;
  setup_open(&s, kFull);
  struct ibv_mw* mw = ibv_alloc_mw(s.b.pd, IBV_MW_TYPE_2);
  if (!mw) exit(1);
  enum ibv_wc_status st;
  uint32_t key = bind2(&s, mw, s.bmr, IBV_ACCESS_REMOTE_READ, &st);
  struct ibv_sge rsge = {(uintptr_t)s.bbuf, 64, s.bmr->lkey};
  struct ibv_recv_wr rwr = {.wr_id = 5, .sg_list = &rsge, .num_sge = 1}, *rbad;
  CHECK(ibv_post_recv(s.b.qp, &rwr, &rbad) == 0, "post_recv");
  struct ibv_sge sge = {(uintptr_t)s.abuf, 16, s.amr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND_WITH_INV;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.invalidate_rkey = key;
  CHECK(ibv_post_send(s.a.qp, &wr, &bad) == 0, "post SEND_WITH_INV");
  CHECK(wait_status(s.a.cq, NULL) == IBV_WC_SUCCESS, "A's SEND_WITH_INV");
  struct ibv_wc wc;
  CHECK(vp_poll(s.b.cq, &wc, 5000) == 1 && wc.status == IBV_WC_SUCCESS, "B's receive");
  CHECK((wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == key, "wc_flags 0x%x invalidated_rkey 0x%x (key 0x%x)",
        wc.wc_flags, wc.invalidated_rkey, key);
  st = rdma(&s, IBV_WR_RDMA_READ, (uintptr_t)s.bbuf + WIN_OFF, key, 32);
  CHECK(st == IBV_WC_REM_ACCESS_ERR, "READ after SEND_WITH_INV: %s", ibv_wc_status_str(st));
  printf("send_inv: IBV_WC_WITH_INV with the key; READ with it afterwards -> %s\n", ibv_wc_status_str(st));
  ibv_dealloc_mw(mw);
  setup_close(&s);
}

static void case_bad(void) {
  struct setup s;
  setup_open(&s, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ); /* no MW_BIND */
  errno = 0;
  CHECK(ibv_alloc_mw(s.b.pd, (enum ibv_mw_type)7) == NULL && errno == EINVAL, "ibv_alloc_mw(type 7): errno %d", errno);
  struct ibv_mw* mw1 = ibv_alloc_mw(s.b.pd, IBV_MW_TYPE_1);
  struct ibv_mw* mw2 = ibv_alloc_mw(s.b.pd, IBV_MW_TYPE_2);
  if (!mw1 || !mw2) exit(1);
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.opcode = IBV_WR_BIND_MW;
  wr.bind_mw.mw = mw1;
  wr.bind_mw.rkey = ibv_inc_rkey(mw1->rkey);
  wr.bind_mw.bind_info.mr = s.bmr;
  wr.bind_mw.bind_info.length = 16;
  wr.bind_mw.bind_info.addr = (uintptr_t)s.bbuf;
  CHECK(ibv_post_send(s.b.qp, &wr, &bad) == EINVAL, "IBV_WR_BIND_MW with a type 1 window is not EINVAL");
  enum ibv_wc_status st;
  bind2(&s, mw2, s.bmr, IBV_ACCESS_REMOTE_READ, &st);
  CHECK(st == IBV_WC_MW_BIND_ERR, "bind to an MR without MW_BIND: %s", ibv_wc_status_str(st));
  printf("bad: type 1 via IBV_WR_BIND_MW -> EINVAL, MR without MW_BIND -> %s, bad type -> EINVAL\n",
         ibv_wc_status_str(st));
  ibv_dealloc_mw(mw1);
  ibv_dealloc_mw(mw2);
  setup_close(&s);
}

static void case_local_write_mr(void) {
  struct setup s;
  setup_open(&s, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND); /* no remote access */
  const int access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  struct ibv_mw* mw1 = ibv_alloc_mw(s.b.pd, IBV_MW_TYPE_1);
  struct ibv_mw* mw2 = ibv_alloc_mw(s.b.pd, IBV_MW_TYPE_2);
  if (!mw1 || !mw2) exit(1);
  struct ibv_mw_bind bind = {.wr_id = 1, .send_flags = IBV_SEND_SIGNALED};
  bind.bind_info.mr = s.bmr;
  bind.bind_info.addr = (uintptr_t)s.bbuf + WIN_OFF;
  bind.bind_info.length = WIN_LEN;
  bind.bind_info.mw_access_flags = access;
  CHECK(ibv_bind_mw(s.b.qp, mw1, &bind) == 0, "ibv_bind_mw");
  enum ibv_wc_status st = wait_status(s.b.cq, NULL);
  CHECK(st == IBV_WC_SUCCESS, "type 1 bind with REMOTE_WRITE | LOCAL_WRITE: %s", ibv_wc_status_str(st));
  uint32_t key2 = bind2(&s, mw2, s.bmr, access, &st);
  CHECK(st == IBV_WC_SUCCESS, "type 2 bind with REMOTE_WRITE | LOCAL_WRITE: %s", ibv_wc_status_str(st));
  uint64_t base = (uintptr_t)s.bbuf + WIN_OFF;
  uint32_t keys[2] = {mw1->rkey, key2};
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < 64; i++) s.abuf[i] = (uint8_t)(i + 7 * k + 1);
    st = rdma(&s, IBV_WR_RDMA_WRITE, base + 64 * k, keys[k], 64);
    CHECK(st == IBV_WC_SUCCESS, "WRITE through the type %d window: %s", k + 1, ibv_wc_status_str(st));
    CHECK(!memcmp(s.bbuf + WIN_OFF + 64 * k, s.abuf, 64), "data written through the type %d window differs", k + 1);
  }
  struct ibv_mr* ro = ibv_reg_mr(s.b.pd, s.bbuf, BUF, IBV_ACCESS_MW_BIND | IBV_ACCESS_REMOTE_READ);
  CHECK(ro != NULL, "ibv_reg_mr(MW_BIND | REMOTE_READ): %s", strerror(errno));
  struct ibv_mw* mw3 = ibv_alloc_mw(s.b.pd, IBV_MW_TYPE_2);
  if (!ro || !mw3) exit(1);
  bind2(&s, mw3, ro, IBV_ACCESS_REMOTE_WRITE, &st);
  CHECK(st == IBV_WC_MW_BIND_ERR, "REMOTE_WRITE window on an MR without LOCAL_WRITE: %s", ibv_wc_status_str(st));
  printf("local_write_mr: REMOTE_WRITE windows on a LOCAL_WRITE MR written through; without LOCAL_WRITE -> %s\n",
         ibv_wc_status_str(st));
  ibv_dealloc_mw(mw1);
  ibv_dealloc_mw(mw2);
  ibv_dealloc_mw(mw3);
  ibv_dereg_mr(ro);
  setup_close(&s);
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* c = argc == 2 ? argv[1] : "";
  if (!strcmp(c, "type1"))
    case_type1();
  else if (!strcmp(c, "type2"))
    case_type2();
  else if (!strcmp(c, "local_inv"))
    case_local_inv();
  else if (!strcmp(c, "send_inv"))
    case_send_inv();
  else if (!strcmp(c, "bad"))
    case_bad();
  else if (!strcmp(c, "local_write_mr"))
    case_local_write_mr();
  else {
    fprintf(stderr, "usage: %s type1 | type2 | local_inv | send_inv | bad | local_write_mr\n", argv[0]);
    return 2;
  }
  printf("%s: %s\n", c, g_failures ? "FAILED" : "passed");
  return g_failures ? 1 : 0;
}
