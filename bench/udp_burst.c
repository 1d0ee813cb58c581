/*
 * udp_burst — raw UDP throughput of this machine over 127.0.0.1, the ceiling for uroce's
 * UDP transport. A sender thread pushes bursts of datagrams with sendmmsg(), a receiver
 * thread drains them with recvmmsg(); after the run it prints what was received.
 *
 *   udp_burst [-s PAYLOAD_BYTES] [-b BURST] [-t SECONDS]
 *
 * Defaults: 4156-byte payload (4096 B of data + 60 B, about what a 4096-MTU RoCEv2
 * packet carries: BTH 12 + RETH 16 + ICRC 4, and some), bursts of 32, 3 seconds.
 * Prints, e.g.:
 *   udp_burst: payload 4156 B, burst 32, 3.00 s: 23.456 Gbit/s, 0.705 Mpps received
 *              (0.761 Mpps sent, 7.4% not received)
 * Gbit/s counts UDP payload bytes only.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MAX_BURST 1024

struct config {
  size_t payload;
  unsigned burst;
  double seconds;
};

static atomic_bool stop_sending;
static atomic_bool stop_receiving;

struct sender_args {
  const struct config* cfg;
  int fd;
  struct sockaddr_in dst;
  uint64_t sent;
};

struct receiver_args {
  const struct config* cfg;
  int fd;
  uint64_t packets;
  uint64_t bytes;
};

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char* what) {
  perror(what);
  exit(1);
}

static void* sender(void* p) {
  struct sender_args* a = p;
  unsigned burst = a->cfg->burst;
  char* buf = calloc(1, a->cfg->payload);
  struct mmsghdr* msgs = calloc(burst, sizeof *msgs);
  struct iovec* iov = calloc(burst, sizeof *iov);
  if (!buf || !msgs || !iov) die("calloc");
  for (unsigned i = 0; i < burst; ++i) {
    iov[i].iov_base = buf;
    iov[i].iov_len = a->cfg->payload;
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
    msgs[i].msg_hdr.msg_name = &a->dst;
    msgs[i].msg_hdr.msg_namelen = sizeof a->dst;
  }
  while (!atomic_load_explicit(&stop_sending, memory_order_relaxed)) {
    int n = sendmmsg(a->fd, msgs, burst, 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ENOBUFS) continue;
      die("sendmmsg");
    }
    a->sent += (unsigned)n;
  }
  free(iov);
  free(msgs);
  free(buf);
  return NULL;
}

static void* receiver(void* p) {
  struct receiver_args* a = p;
  unsigned burst = a->cfg->burst;
  size_t size = a->cfg->payload;
  char* buf = malloc(size * burst);
  struct mmsghdr* msgs = calloc(burst, sizeof *msgs);
  struct iovec* iov = calloc(burst, sizeof *iov);
  if (!buf || !msgs || !iov) die("malloc");
  for (unsigned i = 0; i < burst; ++i) {
    iov[i].iov_base = buf + i * size;
    iov[i].iov_len = size;
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
  }
  while (!atomic_load_explicit(&stop_receiving, memory_order_relaxed)) {
    int n = recvmmsg(a->fd, msgs, burst, MSG_WAITFORONE, NULL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue; /* EAGAIN: SO_RCVTIMEO expired */
      die("recvmmsg");
    }
    for (int i = 0; i < n; ++i) a->bytes += msgs[i].msg_len;
    a->packets += (unsigned)n;
  }
  free(iov);
  free(msgs);
  free(buf);
  return NULL;
}

static void usage(const char* argv0) {
  fprintf(stderr,
          "usage: %s [-s PAYLOAD_BYTES] [-b BURST] [-t SECONDS]\n"
          "  -s  UDP payload per datagram (default 4156, max 65507)\n"
          "  -b  datagrams per sendmmsg/recvmmsg call (default 32, max %d)\n"
          "  -t  duration in seconds (default 3)\n",
          argv0, MAX_BURST);
  exit(2);
}

int main(int argc, char** argv) {
  struct config cfg = {.payload = 4096 + 60, .burst = 32, .seconds = 3.0};
  int opt;
  while ((opt = getopt(argc, argv, "s:b:t:h")) != -1) {
    switch (opt) {
      case 's':
        cfg.payload = strtoul(optarg, NULL, 0);
        break;
      case 'b':
        cfg.burst = (unsigned)strtoul(optarg, NULL, 0);
        break;
      case 't':
        cfg.seconds = strtod(optarg, NULL);
        break;
      default:
        usage(argv[0]);
    }
  }
  if (optind != argc || cfg.payload < 1 || cfg.payload > 65507 || cfg.burst < 1 || cfg.burst > MAX_BURST ||
      !(cfg.seconds > 0))
    usage(argv[0]);

  int rx = socket(AF_INET, SOCK_DGRAM, 0);
  int tx = socket(AF_INET, SOCK_DGRAM, 0);
  if (rx < 0 || tx < 0) die("socket");
  int bufsize = 8 << 20; /* capped by net.core.{r,w}mem_max unless root uses *FORCE */
  if (setsockopt(rx, SOL_SOCKET, SO_RCVBUFFORCE, &bufsize, sizeof bufsize) != 0)
    setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof bufsize);
  if (setsockopt(tx, SOL_SOCKET, SO_SNDBUFFORCE, &bufsize, sizeof bufsize) != 0)
    setsockopt(tx, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof bufsize);
  struct timeval tmo = {.tv_sec = 0, .tv_usec = 100000}; /* lets the receiver see "stop" */
  if (setsockopt(rx, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof tmo) != 0) die("SO_RCVTIMEO");

  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(rx, (struct sockaddr*)&addr, sizeof addr) != 0) die("bind");
  socklen_t len = sizeof addr;
  if (getsockname(rx, (struct sockaddr*)&addr, &len) != 0) die("getsockname");

  struct receiver_args ra = {.cfg = &cfg, .fd = rx};
  struct sender_args sa = {.cfg = &cfg, .fd = tx, .dst = addr};
  pthread_t rt, st;
  if (pthread_create(&rt, NULL, receiver, &ra) != 0) die("pthread_create");

  double start = now();
  if (pthread_create(&st, NULL, sender, &sa) != 0) die("pthread_create");
  struct timespec run = {.tv_sec = (time_t)cfg.seconds,
                         .tv_nsec = (long)((cfg.seconds - (double)(time_t)cfg.seconds) * 1e9)};
  while (nanosleep(&run, &run) != 0 && errno == EINTR) {
  }
  atomic_store(&stop_sending, true);
  pthread_join(st, NULL);
  double sent_at = now();
  usleep(50000); /* let the receiver drain what is still queued */
  atomic_store(&stop_receiving, true);
  pthread_join(rt, NULL);

  double elapsed = sent_at - start;
  double gbits = (double)ra.bytes * 8 / elapsed / 1e9;
  double mpps = (double)ra.packets / elapsed / 1e6;
  double sent_mpps = (double)sa.sent / elapsed / 1e6;
  double lost = sa.sent ? 100.0 * (double)(sa.sent - ra.packets) / (double)sa.sent : 0;
  printf(
      "udp_burst: payload %zu B, burst %u, %.2f s: %.3f Gbit/s, %.3f Mpps received "
      "(%.3f Mpps sent, %.1f%% not received)\n",
      cfg.payload, cfg.burst, elapsed, gbits, mpps, sent_mpps, lost);
  close(tx);
  close(rx);
  return 0;
}
