/* atomic-counter: one 8-byte counter on the server, incremented by several clients at once
 * with RDMA atomics. The server registers the counter (and a "claim" word) for remote
 * atomics, accepts K clients' TCP bootstraps (one RC QP each), starts them together and
 * waits until each reports how many increments it made; then it checks the counter holds
 * their sum. Each client does M FETCH_AND_ADD(1) (each returned value must exceed its
 * previous one), a non-modifying CMP_AND_SWP read every few operations (it must show at
 * least our own increments), and one CMP_AND_SWP(claim: 0 -> client id) that exactly one
 * client wins. With --values-dir the returned values go to DIR/atomic-counter.PID.values. */
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

static const char kUsage[] =
    "usage: atomic-counter [--port P] [--clients K] [--timeout S]            (server)\n"
    "       atomic-counter [--port P] [--iters M] [--values-dir DIR] [--timeout S] SERVER_IP  (client)\n"
    "  server: exposes one 8-byte counter on TCP port P (default 7475), serves K clients\n"
    "          (default 1) concurrently, checks the final value is the sum of their increments\n"
    "  client: M FETCH_AND_ADD(1) (default 1000) and CMP_AND_SWP reads, returned values checked;\n"
    "          --values-dir DIR writes the fetched values to DIR/atomic-counter.PID.values\n"
    "  --timeout S  bound on every wait (default 10 s)\n";

enum { kMaxClients = 64 };

/* What the server exposes: the counter and the claim word. */
struct shared {
  uint64_t counter;
  uint64_t claim;
};

static int run_server(int port, int nclients) {
  struct rc_dev dev;
  rc_dev_open(&dev, 16);
  struct shared* sh = aligned_alloc(8, sizeof *sh);
  memset(sh, 0, sizeof *sh);
  int access = IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ;
  struct ibv_mr* mr = rc_reg(&dev, sh, sizeof *sh, access);

  /* One QP and one TCP connection per client. */
  int fds[kMaxClients];
  struct ibv_qp* qps[kMaxClients];
  int lfd = tcp_listen(port);
  printf("serving %d clients on port %d\n", nclients, port);
  for (int k = 0; k < nclients; ++k) {
    fds[k] = tcp_accept_next(lfd);
    struct rc_info self, peer;
    qps[k] = rc_qp_create(&dev, 4, access, &self);
    self.addr = (uintptr_t)sh;
    self.rkey = mr->rkey;
    self.len = sizeof *sh;
    rc_info_send(fds[k], &self);
    rc_info_recv(fds[k], &peer);
    rc_qp_connect(&dev, qps[k], &self, &peer);
  }
  close(lfd);
  for (int k = 0; k < nclients; ++k) tcp_sync(fds[k]); /* go: all clients start together */

  /* Each client reports its increment count when it is done. */
  uint64_t expected = 0;
  for (int k = 0; k < nclients; ++k) {
    uint64_t n;
    tcp_recv(fds[k], &n, sizeof n, "a client to finish");
    expected += be64toh(n);
  }
  uint64_t final = __atomic_load_n(&sh->counter, __ATOMIC_SEQ_CST);
  uint64_t claim = __atomic_load_n(&sh->claim, __ATOMIC_SEQ_CST);
  char verdict = final == expected && claim != 0 ? 'Y' : 'N';
  for (int k = 0; k < nclients; ++k) tcp_send(fds[k], &verdict, 1);
  if (final != expected)
    die("final counter %llu, expected %llu", (unsigned long long) final, (unsigned long long)expected);
  if (!claim) die("no client claimed the claim word");
  printf("final counter %llu == expected %llu (%d clients); claim won by client %llu: OK\n", (unsigned long long) final,
         (unsigned long long)expected, nclients, (unsigned long long)claim);

  for (int k = 0; k < nclients; ++k) {
    close(fds[k]);
    ibv_destroy_qp(qps[k]);
  }
  ibv_dereg_mr(mr);
  ibv_destroy_cq(dev.cq);
  ibv_dealloc_pd(dev.pd);
  ibv_close_device(dev.ctx);
  free(sh);
  return 0;
}

static int run_client(const char* server_ip, int port, long iters, const char* values_dir) {
  FILE* values = NULL;
  char path[4096];
  if (values_dir) {
    snprintf(path, sizeof path, "%s/atomic-counter.%d.values", values_dir, (int)getpid());
    values = fopen(path, "w");
    if (!values) die("cannot write '%s': %s", path, strerror(errno));
  }
  struct rc_dev dev;
  rc_dev_open(&dev, 16);
  uint64_t* result = aligned_alloc(8, 8);
  struct ibv_mr* mr = rc_reg(&dev, result, 8, 0);
  struct rc_info self, peer;
  struct ibv_qp* qp = rc_qp_create(&dev, 4, 0, &self);

  int fd = tcp_connect(server_ip, port);
  rc_info_send(fd, &self);
  rc_info_recv(fd, &peer);
  if (peer.len < sizeof(struct shared)) die("the server exposes %u bytes, need 16", peer.len);
  rc_qp_connect(&dev, qp, &self, &peer);
  tcp_sync(fd); /* the server's go */
  const uint64_t counter = peer.addr, claim = peer.addr + 8;

  /* The claim: CMP_AND_SWP(0 -> our id); the returned 0 means we won. */
  const uint64_t my_id = (uint64_t)getpid();
  post_atomic(qp, IBV_WR_ATOMIC_CMP_AND_SWP, mr, result, claim, peer.rkey, 0, my_id, 1);
  poll_one(dev.cq, "CMP_AND_SWP on the claim word");
  const int won = *result == 0;

  uint64_t last = 0, reads = 0;
  for (long i = 0; i < iters; ++i) {
    post_atomic(qp, IBV_WR_ATOMIC_FETCH_AND_ADD, mr, result, counter, peer.rkey, 1, 0, 2);
    poll_one(dev.cq, "FETCH_AND_ADD");
    const uint64_t v = *result;
    if (i > 0 && v <= last)
      die("FETCH_AND_ADD %ld returned %llu after %llu", i, (unsigned long long)v, (unsigned long long)last);
    if ((uint64_t)i > v)
      die("FETCH_AND_ADD %ld returned %llu: fewer than our own increments", i, (unsigned long long)v);
    if (values) fprintf(values, "%llu\n", (unsigned long long)v);
    last = v;
    if (i % 16 == 15) {
      /* Atomic read: compare == swap, so the counter never changes; it is past our add. */
      post_atomic(qp, IBV_WR_ATOMIC_CMP_AND_SWP, mr, result, counter, peer.rkey, v, v, 3);
      poll_one(dev.cq, "CMP_AND_SWP read");
      if (*result <= v)
        die("CMP_AND_SWP read %llu, but our FETCH_AND_ADD already returned %llu", (unsigned long long)*result,
            (unsigned long long)v);
      ++reads;
    }
  }
  if (values && fclose(values)) die("writing '%s': %s", path, strerror(errno));

  uint64_t n = htobe64((uint64_t)iters);
  tcp_send(fd, &n, sizeof n);
  char verdict;
  tcp_recv(fd, &verdict, 1, "the server's final check");
  if (verdict != 'Y') die("the server's final check failed");
  printf(
      "%ld FETCH_AND_ADDs (last returned %llu) and %llu CMP_AND_SWP reads checked; %s the claim; server: final "
      "value OK\n",
      iters, (unsigned long long)last, (unsigned long long)reads, won ? "won" : "lost");

  close(fd);
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(dev.cq);
  ibv_dealloc_pd(dev.pd);
  ibv_close_device(dev.ctx);
  free(result);
  return 0;
}

int main(int argc, char** argv) {
  sample_init(argc, argv, kUsage);
  long port = 7475, clients = 1, iters = 1000;
  const char *server_ip = NULL, *values_dir = NULL;
  for (int i = 1; i < argc; ++i) {
    if (opt_long(argc, argv, &i, "--port", 1, 65535, &port) ||
        opt_long(argc, argv, &i, "--clients", 1, kMaxClients, &clients) ||
        opt_long(argc, argv, &i, "--iters", 1, 100000000, &iters) || opt_timeout(argc, argv, &i) ||
        opt_str(argc, argv, &i, "--values-dir", &values_dir))
      continue;
    if (argv[i][0] == '-' || server_ip) bad_arg(argv[i]);
    server_ip = argv[i];
  }
  return server_ip ? run_client(server_ip, (int)port, iters, values_dir) : run_server((int)port, (int)clients);
}
