/* Cost of memory registration: ibv_reg_mr + ibv_dereg_mr pairs per second for a 4 KiB
 * and a 1 GiB region (anonymous memory, never touched), in a process with its usual
 * mappings and then with N extra ones (uroce reads /proc/self/maps on every non-ODP
 * registration, so the cost grows with the number of mappings below the region), and
 * for IBV_ACCESS_ON_DEMAND (no range check). Public verbs API only: run it under
 * `uroce run`, or against any other provider for comparison.
 *
 * Usage: reg_mr_bench [EXTRA_MAPPINGS (default 1000)] [SECONDS_PER_FIGURE (default 1)] */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int count_mappings(void) {
  FILE* f = fopen("/proc/self/maps", "r");
  int n = 0;
  for (int c; f && (c = fgetc(f)) != EOF;) n += c == '\n';
  if (f) fclose(f);
  return n;
}

/* Registration + deregistration pairs per second over `seconds`. */
static double pairs_per_s(struct ibv_pd* pd, void* addr, size_t len, int access, double seconds) {
  long n = 0;
  double t0 = now_s(), t;
  do {
    for (int i = 0; i < 64; i++, n++) {
      struct ibv_mr* mr = ibv_reg_mr(pd, addr, len, access);
      if (!mr || ibv_dereg_mr(mr)) {
        perror("ibv_reg_mr/ibv_dereg_mr");
        exit(1);
      }
    }
  } while ((t = now_s() - t0) < seconds);
  return (double)n / t;
}

static void report(struct ibv_pd* pd, void* small, void* big, size_t big_len, double secs) {
  const int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  int maps = count_mappings();
  printf("  %5d mappings  4 KiB: %9.0f /s   1 GiB: %9.0f /s   4 KiB ODP: %9.0f /s\n", maps,
         pairs_per_s(pd, small, 4096, rw, secs), pairs_per_s(pd, big, big_len, rw, secs),
         pairs_per_s(pd, small, 4096, rw | IBV_ACCESS_ON_DEMAND, secs));
}

int main(int argc, char** argv) {
  int extra = argc > 1 ? atoi(argv[1]) : 1000;
  double secs = argc > 2 ? atof(argv[2]) : 1.0;
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  struct ibv_context* ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
  struct ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : NULL;
  if (!pd) {
    fprintf(stderr, "no RDMA device\n");
    return 1;
  }
  const size_t big_len = (size_t)1 << 30;
  void* big = mmap(NULL, big_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* small = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (big == MAP_FAILED || small == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  printf("reg_mr_bench: ibv_reg_mr + ibv_dereg_mr pairs per second (%s)\n", ibv_get_device_name(list[0]));
  report(pd, small, big, big_len, secs);
  /* Extra single-page mappings with alternating protections, so that none merge. */
  const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  char* area = mmap(NULL, (size_t)extra * 2 * pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (area == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  for (int i = 0; i < extra; i++) mprotect(area + (size_t)i * 2 * pg, pg, PROT_READ);
  report(pd, small, big, big_len, secs);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}
