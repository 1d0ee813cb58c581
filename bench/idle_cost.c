/*
 * idle_cost — what an idle uroce process costs: CPU time over a quiet period with a device
 * open (and then with QPs connected, nothing in flight), and memory per QP.
 *
 *   uroce run build/bin/idle_cost [-t SECONDS] [-n QPS]
 *
 * 1. Opens the first device, allocates a PD and a CQ, sleeps SECONDS (default 10) and prints
 *    the process's CPU time over that sleep (all threads: the progress thread included).
 * 2. Creates QPS RC QPs (default 1000) in pairs connected to each other through the port's
 *    GID 0 (RTS, nothing posted), prints the resident memory they added per QP, then sleeps
 *    SECONDS again and prints the CPU time of that second quiet period.
 * Prints, e.g.:
 *   idle_cost: device open, 10.0 s idle: 0.4 ms CPU (0.004 % of a core)
 *   idle_cost: 1000 RC QPs at RTS: 5.1 KiB resident per QP
 *   idle_cost: 1000 connected QPs, 10.0 s idle: 0.5 ms CPU (0.005 % of a core)
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double cpu_ms(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

static long rss_bytes(void) {
  long pages = 0, resident = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  fclose(f);
  return resident * sysconf(_SC_PAGESIZE);
}

static void quiet(double seconds, const char* what) {
  double before = cpu_ms();
  struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
  double used = cpu_ms() - before;
  printf("idle_cost: %s, %.1f s idle: %.1f ms CPU (%.3f %% of a core)\n", what, seconds, used,
         used / (seconds * 1e3) * 100);
  fflush(stdout);
}

static int connect_qp(struct ibv_qp* qp, uint32_t dest, uint16_t lid, const union ibv_gid* gid) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return -1;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = *gid;
  a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.dlid = lid;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return -1;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
}

int main(int argc, char** argv) {
  double seconds = 10;
  int nqp = 1000, opt;
  while ((opt = getopt(argc, argv, "t:n:")) != -1) {
    if (opt == 't') seconds = atof(optarg);
    else if (opt == 'n') nqp = atoi(optarg) & ~1;
    else {
      fprintf(stderr, "usage: idle_cost [-t SECONDS] [-n QPS]\n");
      return 2;
    }
  }
  int ndev = 0;
  struct ibv_device** devs = ibv_get_device_list(&ndev);
  if (!devs || ndev == 0) {
    fprintf(stderr, "idle_cost: no RDMA device (run it under `uroce run`)\n");
    return 1;
  }
  struct ibv_context* ctx = ibv_open_device(devs[0]);
  struct ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : NULL;
  struct ibv_cq* cq = pd ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
  struct ibv_port_attr port;
  union ibv_gid gid;
  if (!cq || ibv_query_port(ctx, 1, &port) || ibv_query_gid(ctx, 1, 0, &gid)) {
    fprintf(stderr, "idle_cost: cannot open the device\n");
    return 1;
  }
  sleep(1);  // let start-up activity end
  quiet(seconds, "device open");

  struct ibv_qp** qps = calloc((size_t)nqp, sizeof *qps);
  long before = rss_bytes();
  for (int i = 0; i < nqp; ++i) {
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 16;
    ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    qps[i] = ibv_create_qp(pd, &ia);
    if (!qps[i]) {
      fprintf(stderr, "idle_cost: ibv_create_qp failed after %d QPs\n", i);
      return 1;
    }
  }
  for (int i = 0; i < nqp; i += 2) {
    if (connect_qp(qps[i], qps[i + 1]->qp_num, port.lid, &gid) ||
        connect_qp(qps[i + 1], qps[i]->qp_num, port.lid, &gid)) {
      fprintf(stderr, "idle_cost: connecting QP pair %d failed\n", i / 2);
      return 1;
    }
  }
  printf("idle_cost: %d RC QPs at RTS: %.1f KiB resident per QP\n", nqp,
         (double)(rss_bytes() - before) / nqp / 1024);
  char what[64];
  snprintf(what, sizeof what, "%d connected QPs", nqp);
  quiet(seconds, what);
  for (int i = 0; i < nqp; ++i) ibv_destroy_qp(qps[i]);
  free(qps);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(devs);
  return 0;
}
