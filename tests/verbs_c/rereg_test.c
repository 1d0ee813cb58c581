/* Memory-region re-registration, parent domains and QP reset, through the public verbs
 * API (the generic features rdma-core's pyverbs tests exercise). A writes into B's memory.
 *
 *   rereg_access   ibv_rereg_mr(IBV_REREG_MR_CHANGE_ACCESS): B's local-only MR gains
 *                  REMOTE_WRITE, A's WRITE lands (data verified, keys unchanged); it loses
 *                  it again (a garbage PD argument ignored without CHANGE_PD), A's WRITE
 *                  -> IBV_WC_REM_ACCESS_ERR.
 *   rereg_pd       IBV_REREG_MR_CHANGE_PD to a second PD and back: A's WRITE lands; the
 *                  second PD is EBUSY while the MR is on it; moved to it again, A's WRITE
 *                  -> IBV_WC_REM_ACCESS_ERR (the MR is not in the QP's PD).
 *   rereg_addr     IBV_REREG_MR_CHANGE_TRANSLATION to another buffer: mr->addr/length are
 *                  the new ones, the keys the same, A's WRITE to the new address lands there.
 *   rereg_errors   unknown flag, TRANSLATION without address, access without CHANGE_ACCESS:
 *                  IBV_REREG_MR_ERR_INPUT + EINVAL; no flag, REMOTE_WRITE without
 *                  LOCAL_WRITE: IBV_REREG_MR_ERR_CMD + EINVAL; a PROT_NONE range:
 *                  IBV_REREG_MR_ERR_CMD + EFAULT; a failed rereg changes nothing.
 *   parent_domain  ibv_alloc_parent_domain (with allocators): an MR and a QP created with it
 *                  (mr->pd and qp->pd are the parent domain), an MR of the base PD used with
 *                  that QP, SEND/RECV and WRITE with data verified; ibv_create_cq_ex with
 *                  IBV_CQ_INIT_ATTR_MASK_PD takes it (a plain PD: EINVAL); a parent domain of
 *                  a parent domain: EINVAL; the base PD is EBUSY while it exists.
 *   reset_cq       B's posted receives are flushed when its QP moves to ERR; moving it to
 *                  RESET removes those completions from its CQ (as mlx5), so that a QP
 *                  restarted from RESET polls nothing of its previous life.
 *
 * Usage: rereg_test CASE. Exit 0 when every check passes. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "verbs_pair.h"

#define BUF 4096

struct setup {
  struct vp_params p;
  struct vp_side a, b;
  uint8_t *abuf, *bbuf;
  struct ibv_mr *amr, *bmr;
};

static void setup_open(struct setup* s, int b_access) {
  vp_default_params(&s->p);
  if (vp_open(&s->a, &s->p, 0x10) || vp_open(&s->b, &s->p, 0x20) || vp_connect(&s->a, &s->p, &s->b.self) ||
      vp_connect(&s->b, &s->p, &s->a.self))
    exit(1);
  s->abuf = calloc(1, BUF);
  s->bbuf = calloc(1, BUF);
  s->amr = ibv_reg_mr(s->a.pd, s->abuf, BUF, IBV_ACCESS_LOCAL_WRITE);
  s->bmr = ibv_reg_mr(s->b.pd, s->bbuf, BUF, b_access);
  if (!s->abuf || !s->bbuf || !s->amr || !s->bmr) exit(1);
}

static void setup_close(struct setup* s) {
  ibv_dereg_mr(s->amr);
  if (s->bmr) ibv_dereg_mr(s->bmr);
  vp_close(&s->a);
  vp_close(&s->b);
  free(s->abuf);
  free(s->bbuf);
}

static enum ibv_wc_status wait_status(struct ibv_cq* cq) {
  struct ibv_wc wc;
  if (vp_poll(cq, &wc, 5000) != 1) {
    CHECK(0, "no completion within 5 s");
    return IBV_WC_GENERAL_ERR;
  }
  return wc.status;
}

/* A's RDMA WRITE of `len` bytes (pattern `seed`) to B's `addr` with `rkey`. */
static enum ibv_wc_status write_to_b(struct setup* s, uint64_t addr, uint32_t rkey, uint32_t len, int seed) {
  for (uint32_t i = 0; i < len; i++) s->abuf[i] = (uint8_t)(i * 3 + (unsigned)seed);
  struct ibv_sge sge = {(uintptr_t)s->abuf, len, s->amr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  if (ibv_post_send(s->a.qp, &wr, &bad)) return IBV_WC_GENERAL_ERR;
  return wait_status(s->a.cq);
}

static void case_rereg_access(void) {
  struct setup s;
  setup_open(&s, IBV_ACCESS_LOCAL_WRITE);
  uint32_t lkey = s.bmr->lkey, rkey = s.bmr->rkey;
  int rc =
      ibv_rereg_mr(s.bmr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  CHECK(rc == 0, "rereg to REMOTE_WRITE: %d errno %d", rc, errno);
  CHECK(s.bmr->lkey == lkey && s.bmr->rkey == rkey, "keys changed");
  enum ibv_wc_status st = write_to_b(&s, (uintptr_t)s.bbuf, s.bmr->rkey, 256, 1);
  CHECK(st == IBV_WC_SUCCESS, "WRITE after gaining REMOTE_WRITE: %s", ibv_wc_status_str(st));
  CHECK(!memcmp(s.bbuf, s.abuf, 256), "written data differs");
  /* The PD argument is read only with IBV_REREG_MR_CHANGE_PD (pyverbs leaves garbage there). */
  struct ibv_pd* garbage = (struct ibv_pd*)(uintptr_t)0x6d37e7;
  rc = ibv_rereg_mr(s.bmr, IBV_REREG_MR_CHANGE_ACCESS, garbage, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
  CHECK(rc == 0, "rereg to LOCAL_WRITE: %d errno %d", rc, errno);
  CHECK(s.bmr->pd == s.b.pd, "mr->pd changed without IBV_REREG_MR_CHANGE_PD");
  st = write_to_b(&s, (uintptr_t)s.bbuf, s.bmr->rkey, 256, 2);
  CHECK(st == IBV_WC_REM_ACCESS_ERR, "WRITE after losing REMOTE_WRITE: %s", ibv_wc_status_str(st));
  printf("rereg_access: WRITE allowed, then refused (%s)\n", ibv_wc_status_str(st));
  setup_close(&s);
}

static void case_rereg_pd(void) {
  struct setup s;
  setup_open(&s, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct ibv_pd* pd2 = ibv_alloc_pd(s.b.ctx);
  if (!pd2) exit(1);
  CHECK(ibv_rereg_mr(s.bmr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0) == 0, "rereg to PD2: errno %d", errno);
  CHECK(s.bmr->pd == pd2, "mr->pd is not PD2");
  CHECK(ibv_dealloc_pd(pd2) == EBUSY, "PD2 with an MR is not EBUSY");
  CHECK(ibv_rereg_mr(s.bmr, IBV_REREG_MR_CHANGE_PD, s.b.pd, NULL, 0, 0) == 0, "rereg back: errno %d", errno);
  enum ibv_wc_status st = write_to_b(&s, (uintptr_t)s.bbuf, s.bmr->rkey, 128, 3);
  CHECK(st == IBV_WC_SUCCESS && !memcmp(s.bbuf, s.abuf, 128), "WRITE in the QP's PD: %s", ibv_wc_status_str(st));
  CHECK(ibv_rereg_mr(s.bmr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0) == 0, "rereg to PD2 again");
  st = write_to_b(&s, (uintptr_t)s.bbuf, s.bmr->rkey, 128, 4);
  CHECK(st == IBV_WC_REM_ACCESS_ERR, "WRITE to an MR of another PD: %s", ibv_wc_status_str(st));
  printf("rereg_pd: moved and back, WRITE lands; in another PD -> %s\n", ibv_wc_status_str(st));
  ibv_dereg_mr(s.bmr);
  s.bmr = NULL;
  CHECK(ibv_dealloc_pd(pd2) == 0, "dealloc PD2");
  setup_close(&s);
}

static void case_rereg_addr(void) {
  struct setup s;
  setup_open(&s, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  uint8_t* other = calloc(1, 2 * BUF);
  if (!other) exit(1);
  uint32_t rkey = s.bmr->rkey;
  int rc = ibv_rereg_mr(s.bmr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, other + 64, BUF, 0);
  CHECK(rc == 0, "rereg TRANSLATION: %d errno %d", rc, errno);
  CHECK(s.bmr->addr == other + 64 && s.bmr->length == BUF && s.bmr->rkey == rkey, "mr addr %p length %zu rkey 0x%x",
        s.bmr->addr, s.bmr->length, s.bmr->rkey);
  enum ibv_wc_status st = write_to_b(&s, (uintptr_t)other + 64 + 1000, rkey, 512, 5);
  CHECK(st == IBV_WC_SUCCESS, "WRITE to the new range: %s", ibv_wc_status_str(st));
  CHECK(!memcmp(other + 64 + 1000, s.abuf, 512), "data not in the new buffer");
  uint8_t zero[512] = {0};
  CHECK(!memcmp(s.bbuf + 1000, zero, sizeof zero), "old buffer written");
  printf("rereg_addr: WRITE landed in the new range\n");
  setup_close(&s);
  free(other);
}

static void case_rereg_errors(void) {
  struct setup s;
  setup_open(&s, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr* mr = s.bmr;
  errno = 0;
  CHECK(ibv_rereg_mr(mr, 1 << 7, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL, "unknown flag");
  errno = 0;
  CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, BUF, 0) == IBV_REREG_MR_ERR_INPUT &&
            errno == EINVAL,
        "TRANSLATION without an address");
  errno = 0;
  CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, s.b.pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE) == IBV_REREG_MR_ERR_INPUT &&
            errno == EINVAL,
        "access without CHANGE_ACCESS");
  errno = 0;
  CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_CMD && errno == EINVAL, "no flag: errno %d", errno);
  errno = 0;
  CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE) == IBV_REREG_MR_ERR_CMD &&
            errno == EINVAL,
        "REMOTE_WRITE without LOCAL_WRITE: errno %d", errno);
  /* A range without access (PROT_NONE, which the kernel cannot pin either). Not an unmapped
   * one: another thread (uroce's, or the sanitizer's allocator) may map a page there between
   * munmap and the check, as TSan's did in CI. */
  void* none = mmap(NULL, BUF, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (none == MAP_FAILED) exit(1);
  errno = 0;
  CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS, NULL, none, BUF,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == IBV_REREG_MR_ERR_CMD &&
            errno == EFAULT,
        "PROT_NONE range: errno %d", errno);
  munmap(none, BUF);
  CHECK(mr->addr == s.bbuf && mr->length == BUF, "a failed rereg changed the MR");
  enum ibv_wc_status st = write_to_b(&s, (uintptr_t)s.bbuf, mr->rkey, 64, 6);
  CHECK(st == IBV_WC_REM_ACCESS_ERR, "a failed rereg granted REMOTE_WRITE: %s", ibv_wc_status_str(st));
  printf("rereg_errors: passed\n");
  setup_close(&s);
}

static void* never_called_alloc(struct ibv_pd* pd, void* ctx, size_t size, size_t align, uint64_t type) {
  (void)pd, (void)ctx, (void)size, (void)align, (void)type;
  return IBV_ALLOCATOR_USE_DEFAULT;
}

static void never_called_free(struct ibv_pd* pd, void* ctx, void* ptr, uint64_t type) {
  (void)pd, (void)ctx, (void)ptr, (void)type;
}

/* Replaces side `s`'s QP by one created with `pd` and moves it to INIT as vp_open does. */
static void requeue_qp(struct vp_side* s, const struct vp_params* p, struct ibv_pd* pd) {
  ibv_destroy_qp(s->qp);
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = ia.recv_cq = s->cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = p->sq_depth;
  ia.cap.max_recv_wr = p->rq_depth;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = p->max_sge;
  s->qp = ibv_create_qp(pd, &ia);
  if (!s->qp) {
    printf("create_qp with a parent domain: %s\n", strerror(errno));
    exit(1);
  }
  s->self.qpn = s->qp->qp_num;
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) exit(1);
}

static void case_parent_domain(void) {
  struct setup s;
  vp_default_params(&s.p);
  if (vp_open(&s.a, &s.p, 0x10) || vp_open(&s.b, &s.p, 0x20)) exit(1);
  struct ibv_parent_domain_init_attr pa;
  memset(&pa, 0, sizeof pa);
  pa.pd = s.b.pd;
  pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  pa.alloc = never_called_alloc;
  pa.free = never_called_free;
  struct ibv_pd* parent = ibv_alloc_parent_domain(s.b.ctx, &pa);
  CHECK(parent != NULL, "ibv_alloc_parent_domain: %s", strerror(errno));
  if (!parent) exit(1);
  pa.pd = parent;
  errno = 0;
  CHECK(!ibv_alloc_parent_domain(s.b.ctx, &pa) && errno == EINVAL, "parent domain of a parent domain: errno %d", errno);
  CHECK(ibv_dealloc_pd(s.b.pd) == EBUSY, "base PD with a parent domain is not EBUSY");

  struct ibv_cq_init_attr_ex ca;
  memset(&ca, 0, sizeof ca);
  ca.cqe = 16;
  ca.wc_flags = IBV_WC_STANDARD_FLAGS;
  ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  ca.parent_domain = parent;
  struct ibv_cq_ex* cq = ibv_create_cq_ex(s.b.ctx, &ca);
  CHECK(cq != NULL, "ibv_create_cq_ex with a parent domain: %s", strerror(errno));
  if (cq) ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
  ca.parent_domain = s.b.pd;
  errno = 0;
  CHECK(!ibv_create_cq_ex(s.b.ctx, &ca) && errno == EINVAL, "create_cq_ex with a plain PD: errno %d", errno);

  requeue_qp(&s.b, &s.p, parent);
  CHECK(s.b.qp->pd == parent, "qp->pd is not the parent domain");
  if (vp_connect(&s.a, &s.p, &s.b.self) || vp_connect(&s.b, &s.p, &s.a.self)) exit(1);
  s.abuf = calloc(1, BUF);
  s.bbuf = calloc(1, BUF);
  s.amr = ibv_reg_mr(s.a.pd, s.abuf, BUF, IBV_ACCESS_LOCAL_WRITE);
  s.bmr = ibv_reg_mr(parent, s.bbuf, BUF, IBV_ACCESS_LOCAL_WRITE);
  uint8_t* wbuf = calloc(1, BUF);
  struct ibv_mr* wmr = ibv_reg_mr(s.b.pd, wbuf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!s.abuf || !s.bbuf || !s.amr || !s.bmr || !wbuf || !wmr) exit(1);
  CHECK(s.bmr->pd == parent, "mr->pd is not the parent domain");

  struct ibv_sge rsge = {(uintptr_t)s.bbuf, 300, s.bmr->lkey};
  struct ibv_recv_wr rwr = {.wr_id = 9, .sg_list = &rsge, .num_sge = 1}, *rbad;
  CHECK(ibv_post_recv(s.b.qp, &rwr, &rbad) == 0, "post_recv");
  for (int i = 0; i < 300; i++) s.abuf[i] = (uint8_t)(i ^ 0x5a);
  struct ibv_sge ssge = {(uintptr_t)s.abuf, 300, s.amr->lkey};
  struct ibv_send_wr swr, *sbad;
  memset(&swr, 0, sizeof swr);
  swr.sg_list = &ssge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  CHECK(ibv_post_send(s.a.qp, &swr, &sbad) == 0, "post SEND");
  enum ibv_wc_status st = wait_status(s.a.cq);
  CHECK(st == IBV_WC_SUCCESS, "SEND: %s", ibv_wc_status_str(st));
  st = wait_status(s.b.cq);
  CHECK(st == IBV_WC_SUCCESS && !memcmp(s.bbuf, s.abuf, 300), "receive into the parent domain's MR: %s",
        ibv_wc_status_str(st));
  st = write_to_b(&s, (uintptr_t)wbuf + 8, wmr->rkey, 200, 7);
  CHECK(st == IBV_WC_SUCCESS && !memcmp(wbuf + 8, s.abuf, 200), "WRITE to the base PD's MR: %s", ibv_wc_status_str(st));
  printf("parent_domain: SEND/RECV and WRITE through a QP of a parent domain\n");
  ibv_dereg_mr(wmr);
  free(wbuf);
  ibv_dereg_mr(s.bmr);
  s.bmr = NULL;
  ibv_destroy_qp(s.b.qp);
  s.b.qp = NULL;
  CHECK(ibv_dealloc_pd(parent) == 0, "dealloc the parent domain");
  setup_close(&s);
}

static void case_reset_cq(void) {
  struct setup s;
  setup_open(&s, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_sge sge = {(uintptr_t)s.bbuf, 64, s.bmr->lkey};
  struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad;
  for (int i = 0; i < 4; i++) CHECK(ibv_post_recv(s.b.qp, &wr, &bad) == 0, "post_recv");
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_ERR;
  CHECK(ibv_modify_qp(s.b.qp, &a, IBV_QP_STATE) == 0, "to ERR");
  struct ibv_wc wc;
  CHECK(vp_poll(s.b.cq, &wc, 5000) == 1 && wc.status == IBV_WC_WR_FLUSH_ERR, "first receive flushed");
  a.qp_state = IBV_QPS_RESET;
  CHECK(ibv_modify_qp(s.b.qp, &a, IBV_QP_STATE) == 0, "to RESET");
  CHECK(ibv_poll_cq(s.b.cq, 1, &wc) == 0, "a completion of the QP before RESET is still queued");
  printf("reset_cq: flushed receives gone after RESET\n");
  setup_close(&s);
}

int main(int argc, char** argv) {
  static const struct vp_case cases[] = {{"rereg_access", case_rereg_access},   {"rereg_pd", case_rereg_pd},
                                         {"rereg_addr", case_rereg_addr},       {"rereg_errors", case_rereg_errors},
                                         {"parent_domain", case_parent_domain}, {"reset_cq", case_reset_cq}};
  return vp_run_case(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
