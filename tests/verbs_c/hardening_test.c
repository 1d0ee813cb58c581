/* Registration checks, key variants, object limits and interrupted waits through the
 * public verbs API:
 *
 *   reg_mr_range  ibv_reg_mr checks its range as the kernel's pinning does: unmapped
 *                 (mmap + munmap), PROT_NONE, a hole, or a tail past the mapping -> EFAULT;
 *                 a PROT_READ mapping with LOCAL_WRITE / REMOTE_WRITE / MW_BIND -> EFAULT,
 *                 with read-only access -> registered; a range over two adjacent mappings
 *                 -> registered; a range wrapping the address space -> EINVAL (ODP too);
 *                 ODP over an unmapped range -> registered.
 *   keys          re-registrations reusing a key's slot (key >> 8) always get another key
 *                 variant (low 8 bits), MRs and windows alike, never key 0; the first keys
 *                 of eight fresh contexts are not all equal (2^-56 to fail by chance).
 *   limit_*       qp, cq, pd, ah, mr, mw, srq: a context holds exactly the max_* that
 *                 ibv_query_device reports; one more is NULL + ENOMEM; after destroying one,
 *                 creating succeeds again. limit_pd also fills the PDs from four threads
 *                 at once (counting is exact under concurrency).
 *   eintr_cq      a blocking ibv_get_cq_event interrupted by SIGALRM (handler without
 *                 SA_RESTART) returns -1 with errno EINTR, as rdma-core's plain read().
 *   eintr_async   the same for ibv_get_async_event.
 *   null_args     device queries given no place for their answer (ibv_query_gid,
 *                 ibv_query_pkey, ibv_init_ah_from_wc: -1 with errno EINVAL;
 *                 ibv_query_port: EINVAL returned) write nothing and do not crash.
 *   cancel_cq     a thread blocked in ibv_get_cq_event is cancelled (pthread_cancel, as
 *                 rping cancels its CQ thread): it ends, PTHREAD_CANCELED, and the
 *                 channel and CQ are destroyed afterwards (glibc's forced unwind passes
 *                 through uroce's exception guard instead of aborting the process).
 *
 * Every wait is bounded: a watchdog thread fails the test after 20 s.
 *
 * Usage: hardening_test CASE. Exit 0 when every check passes. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <unistd.h>

#include "verbs_pair.h"

static const int kLW = IBV_ACCESS_LOCAL_WRITE;
static const int kRemoteRW = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

/* ------------------------------------------------------------------------------------ */
/* Plumbing                                                                             */
/* ------------------------------------------------------------------------------------ */

static void* watchdog(void* arg) {
  (void)arg;
  sleep(20);
  printf("FAIL: watchdog: the case did not finish within 20 s\n");
  _exit(1);
  return NULL;
}

/* Starts the watchdog with every signal blocked in it, so signals reach the case's thread. */
static void start_watchdog(void) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  pthread_t t;
  if (pthread_create(&t, NULL, watchdog, NULL) != 0) {
    printf("FAIL: pthread_create\n");
    exit(1);
  }
  pthread_detach(t);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static struct ibv_context* open_first_device(void) {
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  struct ibv_context* ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
  if (list) ibv_free_device_list(list);
  if (!ctx) {
    printf("FAIL: no device could be opened: %s\n", strerror(errno));
    exit(1);
  }
  return ctx;
}

static struct ibv_device_attr query(struct ibv_context* ctx) {
  struct ibv_device_attr a;
  if (ibv_query_device(ctx, &a) != 0) {
    printf("FAIL: ibv_query_device\n");
    exit(1);
  }
  return a;
}

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static uint8_t* map_pages(size_t pages, int prot, int flags) {
  void* p = mmap(NULL, pages * page_size(), prot, flags | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    printf("FAIL: mmap: %s\n", strerror(errno));
    exit(1);
  }
  return p;
}

/* ibv_reg_mr that is expected to fail with `want`; `what` names the case. With `hole` (an
 * unmapped page in the range), returns false, to have the caller build its layout again,
 * when the registration succeeded because another thread mapped a page into the hole
 * meanwhile (msync fails with ENOMEM over unmapped memory), at most four rounds in a
 * row; the fifth checks regardless. (Seen under ASan for each of the three layouts that
 * have a hole.) */
static int reg_fails(struct ibv_pd* pd, void* addr, size_t len, int access, int want, void* hole, int round,
                     const char* what) {
  errno = 0;
  struct ibv_mr* mr = ibv_reg_mr(pd, addr, len, access);
  int err = errno;
  if (mr) ibv_dereg_mr(mr);
  if (mr && hole && round < 4 && msync(hole, page_size(), MS_ASYNC) == 0) {
    printf("%s: another thread mapped the hole; again\n", what);
    return 0;
  }
  CHECK(mr == NULL && err == want, "%s: ibv_reg_mr returned %p, errno %s (expected NULL, %s)", what, (void*)mr,
        strerror(err), strerror(want));
  return 1;
}

static void expect_reg_fails(struct ibv_pd* pd, void* addr, size_t len, int access, int want, const char* what) {
  (void)reg_fails(pd, addr, len, access, want, NULL, 0, what);
}

static void expect_reg_works(struct ibv_pd* pd, void* addr, size_t len, int access, const char* what) {
  struct ibv_mr* mr = ibv_reg_mr(pd, addr, len, access);
  CHECK(mr != NULL, "%s: ibv_reg_mr failed: %s", what, strerror(errno));
  if (mr) CHECK(ibv_dereg_mr(mr) == 0, "%s: ibv_dereg_mr", what);
}

/* ------------------------------------------------------------------------------------ */
/* reg_mr_range                                                                         */
/* ------------------------------------------------------------------------------------ */

static void case_reg_mr_range(void) {
  struct ibv_context* ctx = open_first_device();
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  const size_t pg = page_size();
  if (!pd) exit(1);

  /* Unmapped: a range that was mapped and is no more. Another thread of the process
   * (uroce's, or the sanitizer's allocator) may map a page into it before the check looks
   * at it: such a round proves nothing, and runs again on a new layout (as below). */
  uint8_t* gone = NULL;
  for (int round = 0;; ++round) {
    gone = map_pages(4, PROT_READ | PROT_WRITE, MAP_PRIVATE);
    munmap(gone, 4 * pg);
    if (reg_fails(pd, gone, 4 * pg, kLW, EFAULT, gone, round, "unmapped, LOCAL_WRITE") &&
        reg_fails(pd, gone, 16, 0, EFAULT, gone, round, "unmapped, no access flags"))
      break;
  }

  /* ODP may name unmapped memory. */
  struct ibv_mr* odp = ibv_reg_mr(pd, gone, 4 * pg, IBV_ACCESS_ON_DEMAND | kLW);
  CHECK(odp != NULL, "ODP over an unmapped range: %s", strerror(errno));
  if (odp) ibv_dereg_mr(odp);

  /* Read-only mapping: write access (as ib_access_writable: LOCAL_WRITE, REMOTE_WRITE,
   * REMOTE_ATOMIC, MW_BIND) needs a writable mapping; read-only access does not. */
  uint8_t* ro = map_pages(2, PROT_READ, MAP_PRIVATE);
  expect_reg_fails(pd, ro, 2 * pg, kLW, EFAULT, "PROT_READ, LOCAL_WRITE");
  expect_reg_fails(pd, ro, 2 * pg, kRemoteRW, EFAULT, "PROT_READ, REMOTE_WRITE");
  expect_reg_fails(pd, ro, 2 * pg, IBV_ACCESS_MW_BIND, EFAULT, "PROT_READ, MW_BIND");
  expect_reg_works(pd, ro, 2 * pg, 0, "PROT_READ, no access flags");
  expect_reg_works(pd, ro + 1, pg, IBV_ACCESS_REMOTE_READ, "PROT_READ, REMOTE_READ");

  /* PROT_NONE: not even readable. */
  uint8_t* none = map_pages(1, PROT_NONE, MAP_PRIVATE);
  expect_reg_fails(pd, none, pg, 0, EFAULT, "PROT_NONE");

  /* Two adjacent mappings (private then shared: two VMAs) are one registrable range; a
   * hole in the middle, or a tail past the end, is not. Another thread of the process
   * (uroce's, or the sanitizer's allocator) may map a page into a hole before the check
   * looks at it: such a round proves nothing, and runs again on a new layout. */
  uint8_t* two = NULL;
  for (int round = 0;; ++round) {
    two = map_pages(3, PROT_READ | PROT_WRITE, MAP_PRIVATE);
    if (mmap(two + pg, pg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
      exit(1);
    munmap(two + 2 * pg, pg);
    if (reg_fails(pd, two, 2 * pg + 1, kLW, EFAULT, two + 2 * pg, round, "one byte past the mappings")) break;
    munmap(two, 2 * pg);
  }
  expect_reg_works(pd, two + 100, 2 * pg - 200, kRemoteRW, "two adjacent mappings");
  expect_reg_works(pd, two, 2 * pg, kRemoteRW, "two adjacent mappings, whole");
  uint8_t* holed = NULL;
  for (int round = 0;; ++round) {
    holed = map_pages(3, PROT_READ | PROT_WRITE, MAP_PRIVATE);
    munmap(holed + pg, pg);
    if (reg_fails(pd, holed, 3 * pg, kLW, EFAULT, holed + pg, round, "a hole in the middle")) break;
    munmap(holed, pg);
    munmap(holed + 2 * pg, pg);
  }
  expect_reg_works(pd, holed + 2 * pg, pg, kLW, "the part after the hole");

  /* Wrapping around the address space: EINVAL, for ODP too (ib_umem_odp_get). */
  void* top = (void*)(UINTPTR_MAX - pg + 1);
  expect_reg_fails(pd, top, 2 * pg, kLW, EINVAL, "wrapping range");
  expect_reg_fails(pd, top, 2 * pg, IBV_ACCESS_ON_DEMAND | kLW, EINVAL, "wrapping range, ODP");
  expect_reg_fails(pd, (void*)(UINTPTR_MAX - 100), 50, 0, EINVAL, "range in the last page");

  munmap(ro, 2 * pg);
  munmap(none, pg);
  munmap(two, 2 * pg);
  munmap(holed, pg);
  munmap(holed + 2 * pg, pg);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

/* ------------------------------------------------------------------------------------ */
/* keys                                                                                 */
/* ------------------------------------------------------------------------------------ */

static void case_keys(void) {
  struct ibv_context* ctx = open_first_device();
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  static uint8_t buf[4096];
  if (!pd) exit(1);
  struct ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof buf, kRemoteRW);
  if (!mr) exit(1);
  uint32_t prev = mr->rkey;
  int reused = 0;
  for (int i = 0; i < 300; i++) {
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
    mr = ibv_reg_mr(pd, buf, sizeof buf, kRemoteRW);
    if (!mr) exit(1);
    CHECK(mr->rkey != 0 && mr->lkey != 0, "key 0");
    if ((mr->rkey >> 8) == (prev >> 8)) {
      reused++;
      CHECK((mr->rkey & 0xFF) != (prev & 0xFF), "slot 0x%x reused with the same variant 0x%02x", mr->rkey >> 8,
            mr->rkey & 0xFF);
    }
    prev = mr->rkey;
  }
  CHECK(reused == 300, "only %d of 300 re-registrations reused the slot", reused);
  ibv_dereg_mr(mr);

  /* Windows: the same rule; a bind's ibv_inc_rkey stays in the slot (see mw_test). */
  struct ibv_mw* mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
  if (!mw) exit(1);
  prev = mw->rkey;
  for (int i = 0; i < 100; i++) {
    CHECK(ibv_dealloc_mw(mw) == 0, "ibv_dealloc_mw");
    mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    if (!mw) exit(1);
    CHECK(mw->rkey != 0, "window key 0");
    if ((mw->rkey >> 8) == (prev >> 8))
      CHECK((mw->rkey & 0xFF) != (prev & 0xFF), "window slot reused with the same variant");
    prev = mw->rkey;
  }
  ibv_dealloc_mw(mw);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);

  /* The first key of a fresh context is not a constant. */
  uint32_t first[8];
  int all_equal = 1;
  for (int i = 0; i < 8; i++) {
    struct ibv_context* c = open_first_device();
    struct ibv_pd* p = ibv_alloc_pd(c);
    struct ibv_mr* m = p ? ibv_reg_mr(p, buf, sizeof buf, kLW) : NULL;
    if (!m) exit(1);
    first[i] = m->rkey;
    if (first[i] != first[0]) all_equal = 0;
    ibv_dereg_mr(m);
    ibv_dealloc_pd(p);
    ibv_close_device(c);
  }
  CHECK(!all_equal, "eight fresh contexts all gave the first key 0x%x", first[0]);
  printf("keys: first keys of fresh contexts 0x%x 0x%x 0x%x 0x%x ...\n", first[0], first[1], first[2], first[3]);
}

/* ------------------------------------------------------------------------------------ */
/* limit_*                                                                              */
/* ------------------------------------------------------------------------------------ */

/* One kind of object: create one (NULL + errno on failure) and destroy one. */
struct kind {
  const char* name;
  void* (*create)(void* env);
  int (*destroy)(void* obj);
};

/* Fills the context with `k` objects until creation fails; expects exactly `max` to
 * exist then (`existing` of them made before), the failure to be ENOMEM, and one
 * creation to succeed again after one destroy. Destroys what it made. */
static void fill_to_limit(const struct kind* k, void* env, int max, int existing) {
  void** objs = calloc((size_t)max + 1, sizeof *objs);
  if (!objs) exit(1);
  int n = 0;
  errno = 0;
  while (n <= max && (objs[n] = k->create(env)) != NULL) n++;
  int err = errno;
  CHECK(n + existing == max, "%s: created %d + %d existing, device reports max %d", k->name, n, existing, max);
  CHECK(err == ENOMEM, "%s: creation past the limit: errno %s (expected ENOMEM)", k->name, strerror(err));
  if (n > 0) {
    CHECK(k->destroy(objs[n - 1]) == 0, "%s: destroy", k->name);
    objs[n - 1] = k->create(env);
    CHECK(objs[n - 1] != NULL, "%s: create after destroying one: %s", k->name, strerror(errno));
    if (!objs[n - 1]) n--;
    errno = 0;
    void* extra = k->create(env);
    CHECK(extra == NULL && errno == ENOMEM, "%s: limit not enforced again after re-creating", k->name);
    if (extra) k->destroy(extra);
  }
  for (int i = 0; i < n; i++) CHECK(k->destroy(objs[i]) == 0, "%s: destroy %d", k->name, i);
  printf("limit: %s stops at %d (max reported %d)\n", k->name, n + existing, max);
  free(objs);
}

struct env {
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  struct ibv_srq* srq;
  struct ibv_ah_attr ah;
  uint8_t* buf;
};

static void* create_pd(void* e) { return ibv_alloc_pd(((struct env*)e)->ctx); }
static int destroy_pd(void* o) { return ibv_dealloc_pd(o); }
static void* create_cq(void* e) { return ibv_create_cq(((struct env*)e)->ctx, 1, NULL, NULL, 0); }
static int destroy_cq(void* o) { return ibv_destroy_cq(o); }
static void* create_ah(void* e) { return ibv_create_ah(((struct env*)e)->pd, &((struct env*)e)->ah); }
static int destroy_ah(void* o) { return ibv_destroy_ah(o); }
static void* create_mr(void* e) { return ibv_reg_mr(((struct env*)e)->pd, ((struct env*)e)->buf, 64, kLW); }
static int destroy_mr(void* o) { return ibv_dereg_mr(o); }
static void* create_mw(void* e) { return ibv_alloc_mw(((struct env*)e)->pd, IBV_MW_TYPE_2); }
static int destroy_mw(void* o) { return ibv_dealloc_mw(o); }
static void* create_srq(void* e) {
  struct ibv_srq_init_attr a = {.attr = {.max_wr = 1, .max_sge = 1}};
  return ibv_create_srq(((struct env*)e)->pd, &a);
}
static int destroy_srq(void* o) { return ibv_destroy_srq(o); }
static void* create_qp(void* e) {
  struct env* v = e;
  struct ibv_qp_init_attr a = {.send_cq = v->cq, .recv_cq = v->cq, .qp_type = IBV_QPT_RC};
  a.cap.max_send_wr = a.cap.max_recv_wr = a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  return ibv_create_qp(v->pd, &a);
}
static void* create_xrc_ini(void* e) {
  struct env* v = e;
  struct ibv_qp_init_attr_ex a = {.send_cq = v->cq, .qp_type = IBV_QPT_XRC_SEND, .pd = v->pd};
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.cap.max_send_wr = a.cap.max_send_sge = 1;
  return ibv_create_qp_ex(v->ctx, &a);
}
static int destroy_qp(void* o) { return ibv_destroy_qp(o); }

static void env_open(struct env* e) {
  memset(e, 0, sizeof *e);
  e->ctx = open_first_device();
  e->pd = ibv_alloc_pd(e->ctx);
  e->cq = ibv_create_cq(e->ctx, 16, NULL, NULL, 0);
  e->buf = calloc(1, 4096);
  struct ibv_port_attr pa;
  if (!e->pd || !e->cq || !e->buf || ibv_query_port(e->ctx, 1, &pa) || ibv_query_gid(e->ctx, 1, 0, &e->ah.grh.dgid))
    exit(1);
  e->ah.dlid = pa.lid;
  e->ah.is_global = 1;
  e->ah.port_num = 1;
  e->ah.grh.hop_limit = 64;
}

static void env_close(struct env* e) {
  ibv_destroy_cq(e->cq);
  ibv_dealloc_pd(e->pd);
  ibv_close_device(e->ctx);
  free(e->buf);
}

struct pd_filler {
  struct ibv_context* ctx;
  struct ibv_pd** pds;
  int n;
};

static void* fill_pds(void* arg) {
  struct pd_filler* f = arg;
  for (;;) {
    struct ibv_pd* pd = ibv_alloc_pd(f->ctx);
    if (!pd) {
      CHECK(errno == ENOMEM, "concurrent ibv_alloc_pd: %s", strerror(errno));
      return NULL;
    }
    f->pds[f->n++] = pd;
  }
}

/* Four threads allocate PDs until each fails: together they hold exactly max_pd. */
static void concurrent_pds(struct env* e, int max) {
  struct pd_filler f[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    f[i].ctx = e->ctx;
    f[i].n = 0;
    f[i].pds = calloc((size_t)max, sizeof *f[i].pds);
    if (!f[i].pds || pthread_create(&t[i], NULL, fill_pds, &f[i]) != 0) exit(1);
  }
  int total = 1; /* e->pd */
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    total += f[i].n;
  }
  CHECK(total == max, "four threads hold %d PDs, max_pd is %d", total, max);
  for (int i = 0; i < 4; i++) {
    for (int j = 0; j < f[i].n; j++) ibv_dealloc_pd(f[i].pds[j]);
    free(f[i].pds);
  }
  printf("limit: pd from four threads at once: %d\n", total);
}

static void case_limit(const char* what) {
  struct env e;
  env_open(&e);
  struct ibv_device_attr a = query(e.ctx);
  if (!strcmp(what, "pd")) {
    struct kind k = {"pd", create_pd, destroy_pd};
    fill_to_limit(&k, &e, a.max_pd, 1);
    concurrent_pds(&e, a.max_pd);
  } else if (!strcmp(what, "cq")) {
    struct kind k = {"cq", create_cq, destroy_cq};
    fill_to_limit(&k, &e, a.max_cq, 1);
  } else if (!strcmp(what, "ah")) {
    struct kind k = {"ah", create_ah, destroy_ah};
    fill_to_limit(&k, &e, a.max_ah, 0);
  } else if (!strcmp(what, "mr")) {
    struct kind k = {"mr", create_mr, destroy_mr};
    fill_to_limit(&k, &e, a.max_mr, 0);
  } else if (!strcmp(what, "mw")) {
    struct kind k = {"mw", create_mw, destroy_mw};
    fill_to_limit(&k, &e, a.max_mw, 0);
  } else if (!strcmp(what, "srq")) {
    struct kind k = {"srq", create_srq, destroy_srq};
    fill_to_limit(&k, &e, a.max_srq, 0);
  } else if (!strcmp(what, "qp")) {
    struct kind k = {"qp", create_qp, destroy_qp};
    fill_to_limit(&k, &e, a.max_qp, 0);
    /* XRC initiators count as QPs too: one RC QP less leaves room for exactly one. */
    struct kind x = {"qp (XRC initiators after max_qp - 1 RC QPs)", create_xrc_ini, destroy_qp};
    void** rc = calloc((size_t)a.max_qp, sizeof *rc);
    int n = 0;
    if (!rc) exit(1);
    while (n < a.max_qp - 1 && (rc[n] = create_qp(&e)) != NULL) n++;
    fill_to_limit(&x, &e, a.max_qp, n);
    for (int i = 0; i < n; i++) ibv_destroy_qp(rc[i]);
    free(rc);
  } else {
    fprintf(stderr, "unknown limit case %s\n", what);
    exit(2);
  }
  env_close(&e);
}

/* ------------------------------------------------------------------------------------ */
/* eintr_*                                                                              */
/* ------------------------------------------------------------------------------------ */

static volatile sig_atomic_t g_alarms;

static void on_alarm(int sig) {
  (void)sig;
  g_alarms++;
}

/* SIGALRM every 100 ms (so a wait that swallowed one interruption would meet more),
 * handled without SA_RESTART. */
static void start_alarms(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0; /* no SA_RESTART: the blocked read must return EINTR */
  struct itimerval it = {{0, 100000}, {0, 100000}};
  if (sigaction(SIGALRM, &sa, NULL) != 0 || setitimer(ITIMER_REAL, &it, NULL) != 0) exit(1);
}

static void stop_alarms(void) {
  struct itimerval off;
  memset(&off, 0, sizeof off);
  setitimer(ITIMER_REAL, &off, NULL);
  signal(SIGALRM, SIG_IGN);
}

static void case_eintr_cq(void) {
  struct ibv_context* ctx = open_first_device();
  struct ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
  struct ibv_cq* cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
  if (!cq || ibv_req_notify_cq(cq, 0)) exit(1);
  start_alarms();
  struct ibv_cq* got = NULL;
  void* cq_ctx = NULL;
  errno = 0;
  int r = ibv_get_cq_event(ch, &got, &cq_ctx); /* no completion will come */
  int err = errno;
  stop_alarms();
  CHECK(r == -1 && err == EINTR, "ibv_get_cq_event returned %d, errno %s (expected -1, EINTR)", r, strerror(err));
  CHECK(g_alarms >= 1, "no SIGALRM was handled");
  printf("eintr_cq: ibv_get_cq_event -> %d, %s after %d alarm(s)\n", r, strerror(err), (int)g_alarms);
  ibv_destroy_cq(cq);
  ibv_destroy_comp_channel(ch);
  ibv_close_device(ctx);
}

static void case_eintr_async(void) {
  struct ibv_context* ctx = open_first_device();
  /* Take the PORT_ACTIVE event of the open, so that the next read blocks. */
  struct pollfd pfd = {ctx->async_fd, POLLIN, 0};
  struct ibv_async_event ev;
  if (poll(&pfd, 1, 1000) == 1 && ibv_get_async_event(ctx, &ev) == 0) ibv_ack_async_event(&ev);
  start_alarms();
  errno = 0;
  int r = ibv_get_async_event(ctx, &ev);
  int err = errno;
  stop_alarms();
  CHECK(r == -1 && err == EINTR, "ibv_get_async_event returned %d, errno %s (expected -1, EINTR)", r, strerror(err));
  printf("eintr_async: ibv_get_async_event -> %d, %s after %d alarm(s)\n", r, strerror(err), (int)g_alarms);
  ibv_close_device(ctx);
}

/* ------------------------------------------------------------------------------------ */
/* cancel_cq                                                                            */
/* ------------------------------------------------------------------------------------ */

static atomic_int g_waiting;

static void* wait_cq_event(void* arg) {
  struct ibv_comp_channel* ch = arg;
  struct ibv_cq* got = NULL;
  void* cq_ctx = NULL;
  atomic_store(&g_waiting, 1);
  ibv_get_cq_event(ch, &got, &cq_ctx); /* no completion will come: only the cancel ends it */
  return NULL;
}

static void case_cancel_cq(void) {
  struct ibv_context* ctx = open_first_device();
  struct ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
  struct ibv_cq* cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
  if (!cq || ibv_req_notify_cq(cq, 0)) exit(1);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, wait_cq_event, ch) == 0, "pthread_create");
  while (!atomic_load(&g_waiting)) vp_sleep_ms(1);
  vp_sleep_ms(200); /* inside ibv_get_cq_event's read by now */
  CHECK(pthread_cancel(t) == 0, "pthread_cancel");
  void* ret = NULL;
  CHECK(pthread_join(t, &ret) == 0 && ret == PTHREAD_CANCELED, "the thread did not end cancelled");
  printf("cancel_cq: the thread blocked in ibv_get_cq_event ended PTHREAD_CANCELED\n");
  CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq after the cancel");
  CHECK(ibv_destroy_comp_channel(ch) == 0, "ibv_destroy_comp_channel after the cancel");
  ibv_close_device(ctx);
}

/* ------------------------------------------------------------------------------------ */
/* null_args                                                                            */
/* ------------------------------------------------------------------------------------ */

static void case_null_args(void) {
  struct ibv_context* ctx = open_first_device();
  errno = 0;
  CHECK(ibv_query_gid(ctx, 1, 0, NULL) == -1 && errno == EINVAL, "ibv_query_gid(NULL gid): errno %d", errno);
  errno = 0;
  CHECK(ibv_query_pkey(ctx, 1, 0, NULL) == -1 && errno == EINVAL, "ibv_query_pkey(NULL pkey): errno %d", errno);
  struct ibv_wc wc;
  memset(&wc, 0, sizeof wc);
  errno = 0;
  CHECK(ibv_init_ah_from_wc(ctx, 1, &wc, NULL, NULL) == -1 && errno == EINVAL,
        "ibv_init_ah_from_wc(NULL ah_attr): errno %d", errno);
  CHECK(ibv_query_port(ctx, 1, NULL) == EINVAL, "ibv_query_port(NULL attr) did not return EINVAL");
  union ibv_gid gid;
  CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "ibv_query_gid still answers: %s", strerror(errno));
  ibv_close_device(ctx);
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* c = argc == 2 ? argv[1] : "";
  start_watchdog();
  if (!strcmp(c, "reg_mr_range"))
    case_reg_mr_range();
  else if (!strcmp(c, "keys"))
    case_keys();
  else if (!strncmp(c, "limit_", 6))
    case_limit(c + 6);
  else if (!strcmp(c, "eintr_cq"))
    case_eintr_cq();
  else if (!strcmp(c, "eintr_async"))
    case_eintr_async();
  else if (!strcmp(c, "cancel_cq"))
    case_cancel_cq();
  else if (!strcmp(c, "null_args"))
    case_null_args();
  else {
    fprintf(stderr,
            "usage: %s reg_mr_range | keys | limit_{qp,cq,pd,ah,mr,mw,srq} | eintr_cq | eintr_async | cancel_cq | "
            "null_args\n",
            argv[0]);
    return 2;
  }
  printf("%s: %s\n", c, g_failures ? "FAILED" : "passed");
  return g_failures ? 1 : 0;
}
