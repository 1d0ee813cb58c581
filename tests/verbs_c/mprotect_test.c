/* Registered memory whose protection the application changes after ibv_reg_mr.
 * A NIC pinned the pages at registration and reaches them whatever the process
 * does to its own mappings later; uroce copies with the CPU, so these accesses used to end
 * the process with SIGSEGV (or SIGBUS) in the responder's copy. A writes into or reads
 * from B's memory; every case must end with the process alive.
 *
 *   write_readonly   B's MR (LOCAL_WRITE | REMOTE_WRITE, private anonymous) made PROT_READ:
 *                    A's WRITEs (one packet, several packets) complete IBV_WC_SUCCESS and the
 *                    bytes are there, as on the NIC's pinned pages.
 *   read_prot_none   B's MR (REMOTE_READ) made PROT_NONE: A's READs (small, one page, several
 *                    pages) complete with B's bytes.
 *   atomic_readonly  B's MR (REMOTE_ATOMIC) made PROT_READ, then PROT_NONE: FETCH_AND_ADD and
 *                    CMP_AND_SWP complete with the old value and change the memory.
 *   local_prot_none  A's own source buffer made PROT_NONE after registration: A's WRITE from
 *                    it completes and B receives its bytes.
 *   write_shared_ro  B's MR in a shared mapping made PROT_READ: the kernel writes a read-only
 *                    page only of a private mapping, so A's WRITE completes
 *                    IBV_WC_REM_ACCESS_ERR and B's memory is unchanged.
 *   write_truncated  B's MR in a shared file mapping whose file is then truncated (SIGBUS
 *                    territory): A's WRITE completes IBV_WC_REM_ACCESS_ERR.
 *
 * Usage: mprotect_test CASE. Exit 0 when every check passes. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, mkstemp */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "verbs_pair.h"

#define PAGE 4096
#define PAGES 4
#define LEN (PAGES * PAGE)

struct setup {
  struct vp_params p;
  struct vp_side a, b;
  uint8_t *abuf, *bbuf;
  struct ibv_mr *amr, *bmr;
};

static uint8_t* map_pages(int flags, int fd) {
  void* m = mmap(NULL, LEN, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (m == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  return m;
}

/* A and B connected; A's buffer anonymous private, B's `bbuf` (LEN bytes, mapped by the
 * caller) registered with `b_access`. */
static void setup_open(struct setup* s, uint8_t* bbuf, int b_access) {
  vp_default_params(&s->p);
  if (vp_open(&s->a, &s->p, 0x10) || vp_open(&s->b, &s->p, 0x20) || vp_connect(&s->a, &s->p, &s->b.self) ||
      vp_connect(&s->b, &s->p, &s->a.self))
    exit(1);
  s->abuf = map_pages(MAP_PRIVATE | MAP_ANONYMOUS, -1);
  s->bbuf = bbuf;
  s->amr = ibv_reg_mr(s->a.pd, s->abuf, LEN, IBV_ACCESS_LOCAL_WRITE);
  s->bmr = ibv_reg_mr(s->b.pd, s->bbuf, LEN, b_access);
  if (!s->amr || !s->bmr) {
    perror("ibv_reg_mr");
    exit(1);
  }
}

static void setup_close(struct setup* s) {
  ibv_dereg_mr(s->amr);
  ibv_dereg_mr(s->bmr);
  vp_close(&s->a);
  vp_close(&s->b);
  munmap(s->abuf, LEN);
  munmap(s->bbuf, LEN);
}

static void fill(uint8_t* p, uint32_t len, int seed) {
  for (uint32_t i = 0; i < len; i++) p[i] = (uint8_t)(i * 7 + (unsigned)seed);
}

static void protect(void* p, int prot) {
  if (mprotect(p, LEN, prot)) {
    perror("mprotect");
    exit(1);
  }
}

/* Posts one signaled work request on A and waits for its completion status. */
static enum ibv_wc_status run_on_a(struct setup* s, struct ibv_send_wr* wr) {
  struct ibv_send_wr* bad;
  wr->send_flags = IBV_SEND_SIGNALED;
  if (ibv_post_send(s->a.qp, wr, &bad)) return IBV_WC_GENERAL_ERR;
  struct ibv_wc wc;
  if (vp_poll(s->a.cq, &wc, 5000) != 1) {
    CHECK(0, "no completion within 5 s");
    return IBV_WC_GENERAL_ERR;
  }
  return wc.status;
}

/* A's RDMA WRITE or READ of `len` bytes between A's buffer at `a_off` and B's at `b_off`. */
static enum ibv_wc_status rdma(struct setup* s, enum ibv_wr_opcode op, uint32_t a_off, uint32_t b_off, uint32_t len) {
  struct ibv_sge sge = {(uintptr_t)s->abuf + a_off, len, s->amr->lkey};
  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof wr);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.wr.rdma.remote_addr = (uintptr_t)s->bbuf + b_off;
  wr.wr.rdma.rkey = s->bmr->rkey;
  return run_on_a(s, &wr);
}

static enum ibv_wc_status atomic(struct setup* s, enum ibv_wr_opcode op, uint32_t b_off, uint64_t compare_add,
                                 uint64_t swap) {
  struct ibv_sge sge = {(uintptr_t)s->abuf, 8, s->amr->lkey};
  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof wr);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.wr.atomic.remote_addr = (uintptr_t)s->bbuf + b_off;
  wr.wr.atomic.rkey = s->bmr->rkey;
  wr.wr.atomic.compare_add = compare_add;
  wr.wr.atomic.swap = swap;
  return run_on_a(s, &wr);
}

/* Sizes that take each way a payload goes: a few bytes, one packet, several packets
 * crossing pages (MTU 1024); and where in B's buffer each goes (apart from the others). */
static const uint32_t kSizes[] = {24, 1000, 3 * PAGE + 100};
static const uint32_t kOffsets[] = {100, 200, 3000};

static void case_write_readonly(void) {
  struct setup s;
  setup_open(&s, map_pages(MAP_PRIVATE | MAP_ANONYMOUS, -1), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  memset(s.bbuf, 0xEE, LEN);
  protect(s.bbuf, PROT_READ);
  for (unsigned i = 0; i < sizeof kSizes / sizeof kSizes[0]; i++) {
    uint32_t len = kSizes[i], off = kOffsets[i];
    fill(s.abuf, len, (int)i);
    enum ibv_wc_status st = rdma(&s, IBV_WR_RDMA_WRITE, 0, off, len);
    CHECK(st == IBV_WC_SUCCESS, "WRITE of %u bytes into a read-only MR: %s", len, ibv_wc_status_str(st));
    CHECK(!memcmp(s.bbuf + off, s.abuf, len), "WRITE of %u bytes: data differs", len);
    CHECK(s.bbuf[off - 1] == 0xEE && s.bbuf[off + len] == 0xEE, "WRITE of %u bytes: bytes around it changed", len);
  }
  printf("write_readonly: WRITEs into a PROT_READ region landed\n");
  setup_close(&s);
}

static void case_read_prot_none(void) {
  struct setup s;
  setup_open(&s, map_pages(MAP_PRIVATE | MAP_ANONYMOUS, -1), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  fill(s.bbuf, LEN, 9);
  protect(s.bbuf, PROT_NONE);
  for (unsigned i = 0; i < sizeof kSizes / sizeof kSizes[0]; i++) {
    uint32_t len = kSizes[i], off = kOffsets[i];
    memset(s.abuf, 0, LEN);
    enum ibv_wc_status st = rdma(&s, IBV_WR_RDMA_READ, 0, off, len);
    CHECK(st == IBV_WC_SUCCESS, "READ of %u bytes from a PROT_NONE MR: %s", len, ibv_wc_status_str(st));
    protect(s.bbuf, PROT_READ);
    CHECK(!memcmp(s.abuf, s.bbuf + off, len), "READ of %u bytes: data differs", len);
    protect(s.bbuf, PROT_NONE);
  }
  printf("read_prot_none: READs from a PROT_NONE region returned its bytes\n");
  setup_close(&s);
}

static void case_atomic_readonly(void) {
  struct setup s;
  setup_open(&s, map_pages(MAP_PRIVATE | MAP_ANONYMOUS, -1), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  uint64_t* target = (uint64_t*)s.bbuf;
  uint64_t* result = (uint64_t*)s.abuf;
  target[1] = 40;
  target[2] = 7;
  protect(s.bbuf, PROT_READ);
  enum ibv_wc_status st = atomic(&s, IBV_WR_ATOMIC_FETCH_AND_ADD, 8, 2, 0);
  CHECK(st == IBV_WC_SUCCESS && *result == 40 && target[1] == 42, "FAA on PROT_READ: %s, result %llu, target %llu",
        ibv_wc_status_str(st), (unsigned long long)*result, (unsigned long long)target[1]);
  protect(s.bbuf, PROT_NONE);
  st = atomic(&s, IBV_WR_ATOMIC_CMP_AND_SWP, 16, 7, 99);
  CHECK(st == IBV_WC_SUCCESS && *result == 7, "CAS on PROT_NONE: %s, result %llu", ibv_wc_status_str(st),
        (unsigned long long)*result);
  st = atomic(&s, IBV_WR_ATOMIC_CMP_AND_SWP, 16, 7, 1);
  CHECK(st == IBV_WC_SUCCESS && *result == 99, "stale CAS on PROT_NONE: %s, result %llu", ibv_wc_status_str(st),
        (unsigned long long)*result);
  protect(s.bbuf, PROT_READ);
  CHECK(target[2] == 99, "CAS on PROT_NONE: target %llu", (unsigned long long)target[2]);
  printf("atomic_readonly: FETCH_AND_ADD and CMP_AND_SWP on PROT_READ / PROT_NONE memory executed\n");
  setup_close(&s);
}

static void case_local_prot_none(void) {
  struct setup s;
  setup_open(&s, map_pages(MAP_PRIVATE | MAP_ANONYMOUS, -1), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  fill(s.abuf, LEN, 3);
  protect(s.abuf, PROT_NONE);
  for (unsigned i = 0; i < sizeof kSizes / sizeof kSizes[0]; i++) {
    uint32_t len = kSizes[i], off = 8 * i;
    memset(s.bbuf, 0, LEN);
    enum ibv_wc_status st = rdma(&s, IBV_WR_RDMA_WRITE, off, 0, len);
    CHECK(st == IBV_WC_SUCCESS, "WRITE of %u bytes from a PROT_NONE source: %s", len, ibv_wc_status_str(st));
    protect(s.abuf, PROT_READ);
    CHECK(!memcmp(s.bbuf, s.abuf + off, len), "WRITE of %u bytes from a PROT_NONE source: data differs", len);
    protect(s.abuf, PROT_NONE);
  }
  protect(s.abuf, PROT_READ | PROT_WRITE);
  printf("local_prot_none: WRITEs from a PROT_NONE source sent its bytes\n");
  setup_close(&s);
}

/* A WRITE the kernel refuses to force (a shared mapping B cannot write to): remote access
 * error at A, B's memory unchanged, and both QPs answer for themselves afterwards. */
static void expect_refused_write(struct setup* s, const char* what) {
  fill(s->abuf, 2 * PAGE, 5);
  enum ibv_wc_status st = rdma(s, IBV_WR_RDMA_WRITE, 0, 64, 2 * PAGE);
  CHECK(st == IBV_WC_REM_ACCESS_ERR, "WRITE into %s: %s", what, ibv_wc_status_str(st));
  struct ibv_qp_attr attr;
  struct ibv_qp_init_attr init;
  CHECK(ibv_query_qp(s->a.qp, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state == IBV_QPS_ERR,
        "requester QP not in ERR after the remote access error");
  printf("%s: WRITE -> %s\n", what, ibv_wc_status_str(st));
}

static void case_write_shared_ro(void) {
  struct setup s;
  setup_open(&s, map_pages(MAP_SHARED | MAP_ANONYMOUS, -1), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  memset(s.bbuf, 0xEE, LEN);
  protect(s.bbuf, PROT_READ);
  expect_refused_write(&s, "write_shared_ro");
  int intact = 1;
  for (uint32_t i = 0; i < LEN; i++) intact &= s.bbuf[i] == 0xEE;
  CHECK(intact, "a refused WRITE changed B's memory");
  setup_close(&s);
}

static void case_write_truncated(void) {
  char path[] = "/tmp/uroce_mprotect_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0 || unlink(path) || ftruncate(fd, LEN)) {
    perror("temporary file");
    exit(1);
  }
  struct setup s;
  setup_open(&s, map_pages(MAP_SHARED, fd), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (ftruncate(fd, 0)) {
    perror("ftruncate");
    exit(1);
  }
  expect_refused_write(&s, "write_truncated");
  setup_close(&s);
  close(fd);
}

int main(int argc, char** argv) {
  static const struct vp_case cases[] = {
      {"write_readonly", case_write_readonly},   {"read_prot_none", case_read_prot_none},
      {"atomic_readonly", case_atomic_readonly}, {"local_prot_none", case_local_prot_none},
      {"write_shared_ro", case_write_shared_ro}, {"write_truncated", case_write_truncated}};
  return vp_run_case(argc, argv, cases, sizeof cases / sizeof cases[0]);
}
