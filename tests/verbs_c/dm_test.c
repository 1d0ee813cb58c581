/* Device memory and implicit ODP, through the public verbs API only.
 *
 *   dm_test CASE     (CASE: limits | device_memory | implicit_odp)
 *
 * limits:        ibv_query_device_ex reports max_dm_size and IBV_ODP_SUPPORT_IMPLICIT;
 *                ibv_alloc_dm beyond max_dm_size: ENOMEM; ibv_reg_dm_mr without
 *                IBV_ACCESS_ZERO_BASED or beyond the allocation: EINVAL; ibv_memcpy_to_dm /
 *                from_dm beyond it: EFAULT, at an offset or of a length not a multiple of
 *                4: EINVAL (mlx5's word access); a zero-length DM MR registers;
 *                ibv_free_dm while an MR uses it: EBUSY.
 * device_memory: two connected RC QPs of one process; an RDMA WRITE from host memory into
 *                a zero-based DM MR at remote address 100 (an offset), a SEND whose gather
 *                list is in device memory (local address = offset), an RDMA READ of the DM
 *                MR — every byte checked, DM read back with ibv_memcpy_from_dm.
 * implicit_odp:  one MR for the whole address space (NULL, SIZE_MAX, ON_DEMAND, remote
 *                write): an RDMA WRITE into a malloc'ed buffer never registered on its own
 *                lands; a WRITE to an unmapped address completes with
 *                IBV_WC_REM_ACCESS_ERR and leaves the process running. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "verbs_pair.h"

static int pair_open(struct vp_side* a, struct vp_side* b, struct vp_params* p) {
  vp_default_params(p);
  if (vp_open(a, p, 100) || vp_open(b, p, 200)) return -1;
  if (vp_connect(a, p, &b->self) || vp_connect(b, p, &a->self)) return -1;
  return 0;
}

/* Posts one signaled WR on `s` and waits for its completion; returns its status. */
static enum ibv_wc_status run_wr(struct vp_side* s, struct ibv_send_wr* wr) {
  struct ibv_send_wr* bad = NULL;
  wr->send_flags |= IBV_SEND_SIGNALED;
  if (ibv_post_send(s->qp, wr, &bad)) return IBV_WC_GENERAL_ERR;
  struct ibv_wc wc;
  if (vp_poll(s->cq, &wc, 5000) != 1) return IBV_WC_GENERAL_ERR;
  return wc.status;
}

static void case_limits(void) {
  struct ibv_device** list = ibv_get_device_list(NULL);
  struct ibv_context* ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
  CHECK(ctx, "open device");
  if (!ctx) return;
  struct ibv_device_attr_ex attr;
  CHECK(ibv_query_device_ex(ctx, NULL, &attr) == 0, "query_device_ex");
  CHECK(attr.max_dm_size >= 4096, "max_dm_size %llu", (unsigned long long)attr.max_dm_size);
  CHECK(attr.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT, "implicit ODP not reported");

  struct ibv_alloc_dm_attr big = {.length = attr.max_dm_size + 1};
  errno = 0;
  CHECK(!ibv_alloc_dm(ctx, &big) && errno == ENOMEM, "alloc beyond max_dm_size: errno %d", errno);
  struct ibv_alloc_dm_attr da = {.length = 4096};
  struct ibv_dm* dm = ibv_alloc_dm(ctx, &da);
  CHECK(dm, "alloc_dm 4096: errno %d", errno);
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  if (dm && pd) {
    errno = 0;
    CHECK(!ibv_reg_dm_mr(pd, dm, 0, 4096, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL,
          "reg_dm_mr without ZERO_BASED: errno %d", errno);
    errno = 0;
    CHECK(!ibv_reg_dm_mr(pd, dm, 4000, 200, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED) && errno == EINVAL,
          "reg_dm_mr beyond the allocation: errno %d", errno);
    char buf[64] = {0};
    CHECK(ibv_memcpy_to_dm(dm, 4090, buf, 10) == EFAULT, "memcpy_to_dm beyond");
    CHECK(ibv_memcpy_from_dm(buf, dm, 4096, 1) == EFAULT, "memcpy_from_dm beyond");
    CHECK(ibv_memcpy_to_dm(dm, 1, buf, 4) == EINVAL, "memcpy_to_dm at an unaligned offset");
    CHECK(ibv_memcpy_to_dm(dm, 4, buf, 3) == EINVAL, "memcpy_to_dm of an unaligned length");
    CHECK(ibv_memcpy_from_dm(buf, dm, 3, 4) == EINVAL, "memcpy_from_dm at an unaligned offset");
    CHECK(ibv_memcpy_from_dm(buf, dm, 0, 6) == EINVAL, "memcpy_from_dm of an unaligned length");
    CHECK(ibv_memcpy_to_dm(dm, 4092, buf, 4) == 0 && ibv_memcpy_from_dm(buf, dm, 4092, 4) == 0, "last word");
    struct ibv_mr* empty = ibv_reg_dm_mr(pd, dm, 0, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED);
    CHECK(empty, "reg_dm_mr of length 0: errno %d", errno);
    if (empty) CHECK(ibv_dereg_mr(empty) == 0, "dereg the zero-length DM MR");
    struct ibv_mr* mr = ibv_reg_dm_mr(pd, dm, 0, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED);
    CHECK(mr, "reg_dm_mr: errno %d", errno);
    CHECK(ibv_free_dm(dm) == EBUSY, "free_dm with an MR on it must be EBUSY");
    if (mr) CHECK(ibv_dereg_mr(mr) == 0, "dereg");
    CHECK(ibv_free_dm(dm) == 0, "free_dm");
  }
  if (pd) ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
}

static void case_device_memory(void) {
  struct vp_side a = {0}, b = {0};
  struct vp_params p;
  if (pair_open(&a, &b, &p)) {
    CHECK(0, "pair");
    return;
  }
  enum { kLen = 8192 };
  struct ibv_alloc_dm_attr da = {.length = kLen};
  struct ibv_dm* dm = ibv_alloc_dm(b.ctx, &da);
  struct ibv_mr* dm_mr = dm ? ibv_reg_dm_mr(b.pd, dm, 0, kLen,
                                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                                IBV_ACCESS_ZERO_BASED)
                            : NULL;
  uint8_t* host = malloc(kLen);
  uint8_t* back = calloc(1, kLen);
  struct ibv_mr* host_mr = ibv_reg_mr(a.pd, host, kLen, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr* back_mr = ibv_reg_mr(a.pd, back, kLen, IBV_ACCESS_LOCAL_WRITE);
  CHECK(dm && dm_mr && host_mr && back_mr, "setup: errno %d", errno);
  if (dm && dm_mr && host_mr && back_mr) {
    for (int i = 0; i < kLen; ++i) host[i] = (uint8_t)(i * 7 + 3);
    /* WRITE 5000 bytes to the DM MR's address 100: an offset, the MR is zero-based. */
    struct ibv_sge sge = {.addr = (uintptr_t)host, .length = 5000, .lkey = host_mr->lkey};
    struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
    wr.wr.rdma.remote_addr = 100;
    wr.wr.rdma.rkey = dm_mr->rkey;
    CHECK(run_wr(&a, &wr) == IBV_WC_SUCCESS, "WRITE into device memory");
    uint8_t check[5000];
    CHECK(ibv_memcpy_from_dm(check, dm, 100, sizeof check) == 0, "memcpy_from_dm");
    CHECK(memcmp(check, host, sizeof check) == 0, "device memory holds what was written");
    /* READ it back from the DM MR (remote address 100) into host memory. */
    struct ibv_sge rsge = {.addr = (uintptr_t)back, .length = 5000, .lkey = back_mr->lkey};
    struct ibv_send_wr rd = {.wr_id = 2, .sg_list = &rsge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ};
    rd.wr.rdma.remote_addr = 100;
    rd.wr.rdma.rkey = dm_mr->rkey;
    CHECK(run_wr(&a, &rd) == IBV_WC_SUCCESS, "READ from device memory");
    CHECK(memcmp(back, host, 5000) == 0, "READ returned device memory's bytes");
    /* A SEND gathered from device memory: the SGE's address is the offset 100. */
    memset(back, 0, kLen);
    struct ibv_recv_wr rw = {.wr_id = 3, .sg_list = &rsge, .num_sge = 1}, *bad_rw = NULL;
    CHECK(ibv_post_recv(a.qp, &rw, &bad_rw) == 0, "post_recv");
    struct ibv_sge dsge = {.addr = 100, .length = 3000, .lkey = dm_mr->lkey};
    struct ibv_send_wr sd = {.wr_id = 4, .sg_list = &dsge, .num_sge = 1, .opcode = IBV_WR_SEND};
    CHECK(run_wr(&b, &sd) == IBV_WC_SUCCESS, "SEND from device memory");
    struct ibv_wc wc;
    CHECK(vp_poll(a.cq, &wc, 5000) == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 3000, "receive");
    CHECK(memcmp(back, host, 3000) == 0, "the SEND carried device memory's bytes");
    /* An address past the DM MR's end (zero-based: length 8192). */
    rd.wr.rdma.remote_addr = kLen - 100;
    rsge.length = 200;
    CHECK(run_wr(&a, &rd) == IBV_WC_REM_ACCESS_ERR, "READ past the DM MR must be a remote access error");
  }
  if (dm_mr) ibv_dereg_mr(dm_mr);
  if (host_mr) ibv_dereg_mr(host_mr);
  if (back_mr) ibv_dereg_mr(back_mr);
  if (dm) CHECK(ibv_free_dm(dm) == 0, "free_dm");
  free(host);
  free(back);
  vp_close(&a);
  vp_close(&b);
}

static void case_implicit_odp(void) {
  struct vp_side a = {0}, b = {0};
  struct vp_params p;
  if (pair_open(&a, &b, &p)) {
    CHECK(0, "pair");
    return;
  }
  struct ibv_mr* all =
      ibv_reg_mr(b.pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  CHECK(all, "implicit ODP MR: errno %d", errno);
  uint8_t* src = malloc(10000);
  uint8_t* dst = calloc(1, 10000); /* never registered on its own */
  struct ibv_mr* src_mr = ibv_reg_mr(a.pd, src, 10000, IBV_ACCESS_LOCAL_WRITE);
  if (all && src_mr) {
    for (int i = 0; i < 10000; ++i) src[i] = (uint8_t)(i ^ 0x5a);
    struct ibv_sge sge = {.addr = (uintptr_t)src, .length = 10000, .lkey = src_mr->lkey};
    struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
    wr.wr.rdma.remote_addr = (uintptr_t)dst;
    wr.wr.rdma.rkey = all->rkey;
    CHECK(run_wr(&a, &wr) == IBV_WC_SUCCESS, "WRITE through the implicit MR");
    CHECK(memcmp(src, dst, 10000) == 0, "the bytes landed");
    /* A page the kernel will not let anyone touch: a remote access error, the process lives
     * on. It stays mapped (PROT_NONE) during the WRITE: an unmapped hole could be taken by
     * any other mapping meanwhile (the progress thread's, ASan's), and the WRITE, through
     * an MR that covers the whole address space, would then land in it. */
    void* hole = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(hole != MAP_FAILED, "mmap");
    wr.wr.rdma.remote_addr = (uintptr_t)hole;
    sge.length = 64;
    if (hole != MAP_FAILED) {
      CHECK(run_wr(&a, &wr) == IBV_WC_REM_ACCESS_ERR, "WRITE to an inaccessible page must be a remote access error");
      munmap(hole, 4096);
    }
  }
  if (src_mr) ibv_dereg_mr(src_mr);
  if (all) CHECK(ibv_dereg_mr(all) == 0, "dereg implicit MR");
  free(src);
  free(dst);
  vp_close(&a);
  vp_close(&b);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s limits|device_memory|implicit_odp\n", argv[0]);
    return 2;
  }
  if (!strcmp(argv[1], "limits"))
    case_limits();
  else if (!strcmp(argv[1], "device_memory"))
    case_device_memory();
  else if (!strcmp(argv[1], "implicit_odp"))
    case_implicit_odp();
  else {
    fprintf(stderr, "unknown case %s\n", argv[1]);
    return 2;
  }
  printf("%s: %s\n", argv[1], g_failures ? "FAILED" : "PASSED");
  return g_failures ? 1 : 0;
}
