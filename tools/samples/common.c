/* Shared plumbing of uroce's sample programs; see common.h. */
#define _DEFAULT_SOURCE
#include "common.h"

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

const char* g_prog = "sample";
int g_timeout_s = 10;
static const char* g_usage = "";
static const char* g_watchdog_what;

/* ---- errors and arguments ---- */

void die(const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fflush(stdout);
  fprintf(stderr, "%s: %s\n", g_prog, msg);
  exit(1);
}

void bad_arg(const char* arg) { die("unknown argument '%s' (try --help)", arg); }

void sample_init(int argc, char** argv, const char* usage) {
  const char* slash = strrchr(argv[0], '/');
  g_prog = slash ? slash + 1 : argv[0];
  g_usage = usage;
  signal(SIGPIPE, SIG_IGN); /* a dead peer is an EPIPE error, not a silent death */
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      printf("%s", g_usage);
      exit(0);
    }
  }
}

int opt_str(int argc, char** argv, int* i, const char* name, const char** out) {
  if (strcmp(argv[*i], name)) return 0;
  if (*i + 1 >= argc) die("%s needs a value (try --help)", name);
  *out = argv[++*i];
  return 1;
}

int opt_long(int argc, char** argv, int* i, const char* name, long min, long max, long* out) {
  const char* s;
  if (!opt_str(argc, argv, i, name, &s)) return 0;
  char* end;
  errno = 0;
  long v = strtol(s, &end, 0);
  if (errno || !*s || *end || v < min || v > max) die("%s: expected a number in %ld..%ld, got '%s'", name, min, max, s);
  *out = v;
  return 1;
}

int opt_timeout(int argc, char** argv, int* i) {
  long v;
  if (!opt_long(argc, argv, i, "--timeout", 1, 3600, &v)) return 0;
  g_timeout_s = (int)v;
  return 1;
}

static void on_alarm(int sig) {
  (void)sig;
  char msg[256];
  int n = snprintf(msg, sizeof msg, "%s: timed out after %d s waiting for %s\n", g_prog, g_timeout_s,
                   g_watchdog_what ? g_watchdog_what : "the peer");
  if (n > 0) (void)!write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
  _exit(1);
}

void watchdog_arm(const char* what) {
  g_watchdog_what = what;
  if (!what) {
    alarm(0);
    return;
  }
  signal(SIGALRM, on_alarm);
  alarm((unsigned)g_timeout_s);
}

/* ---- TCP out-of-band exchange ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Waits until FD is ready for EVENTS or DEADLINE passes (fatal). */
static void wait_fd(int fd, short events, double deadline, const char* what) {
  for (;;) {
    int ms = (int)((deadline - now_s()) * 1000);
    if (ms <= 0) die("timed out after %d s waiting for %s", g_timeout_s, what);
    struct pollfd p = {.fd = fd, .events = events};
    int n = poll(&p, 1, ms);
    if (n > 0) return;
    if (n < 0 && errno != EINTR) die("poll: %s", strerror(errno));
  }
}

int tcp_listen(int port) {
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  int v6only = 0, one = 1;
  if (fd < 0) { /* no IPv6: IPv4 only */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr*)&a, sizeof a)) die("bind to TCP port %d: %s", port, strerror(errno));
  } else {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = in6addr_any};
    if (bind(fd, (struct sockaddr*)&a, sizeof a)) die("bind to TCP port %d: %s", port, strerror(errno));
  }
  if (listen(fd, 16)) die("listen: %s", strerror(errno));
  return fd;
}

int tcp_accept_next(int listen_fd) {
  wait_fd(listen_fd, POLLIN, now_s() + g_timeout_s, "a client to connect");
  int fd = accept(listen_fd, NULL, NULL);
  if (fd < 0) die("accept: %s", strerror(errno));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int tcp_accept_one(int port) {
  int lfd = tcp_listen(port);
  int fd = tcp_accept_next(lfd);
  close(lfd);
  return fd;
}

int tcp_connect(const char* host, int port) {
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
  int rc = getaddrinfo(host, service, &hints, &res);
  if (rc) die("cannot resolve '%s': %s", host, gai_strerror(rc));
  int fd = socket(res->ai_family, SOCK_STREAM, 0);
  if (fd < 0) die("socket: %s", strerror(errno));
  fcntl(fd, F_SETFL, O_NONBLOCK);
  if (connect(fd, res->ai_addr, res->ai_addrlen) && errno != EINPROGRESS)
    die("connect to %s:%d: %s", host, port, strerror(errno));
  freeaddrinfo(res);
  char what[300];
  snprintf(what, sizeof what, "the connection to %s:%d", host, port);
  wait_fd(fd, POLLOUT, now_s() + g_timeout_s, what);
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) die("connect to %s:%d: %s", host, port, strerror(err));
  fcntl(fd, F_SETFL, 0);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void tcp_send(int fd, const void* buf, size_t len) {
  const char* p = buf;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) die("send to peer: %s", n < 0 ? strerror(errno) : "connection closed");
    p += n;
    len -= (size_t)n;
  }
}

void tcp_recv(int fd, void* buf, size_t len, const char* what) {
  char* p = buf;
  double deadline = now_s() + g_timeout_s;
  while (len) {
    wait_fd(fd, POLLIN, deadline, what);
    ssize_t n = recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ECONNRESET) die("peer reset the connection while we waited for %s", what);
    if (n < 0) die("receiving %s: %s", what, strerror(errno));
    if (n == 0) die("peer closed the connection while we waited for %s", what);
    p += n;
    len -= (size_t)n;
  }
}

void tcp_sync(int fd) {
  char c = 's';
  tcp_send(fd, &c, 1);
  tcp_recv(fd, &c, 1, "the peer to be ready");
}

/* ---- RC queue pairs ---- */

void rc_dev_open(struct rc_dev* d, int cq_depth) {
  memset(d, 0, sizeof *d);
  int num = 0;
  struct ibv_device** list = ibv_get_device_list(&num);
  if (!list || num < 1) die("no RDMA device found (run under `uroce run`?)");
  d->ctx = ibv_open_device(list[0]);
  if (!d->ctx) die("ibv_open_device(%s): %s", ibv_get_device_name(list[0]), strerror(errno));
  ibv_free_device_list(list);
  struct ibv_port_attr pa;
  if (ibv_query_port(d->ctx, 1, &pa)) die("ibv_query_port: %s", strerror(errno));
  d->mtu = pa.active_mtu < IBV_MTU_4096 ? pa.active_mtu : IBV_MTU_4096;
  if (ibv_query_gid(d->ctx, 1, 0, &d->gid)) die("ibv_query_gid(index 0): %s", strerror(errno));
  d->pd = ibv_alloc_pd(d->ctx);
  if (!d->pd) die("ibv_alloc_pd: %s", strerror(errno));
  d->cq = ibv_create_cq(d->ctx, cq_depth, NULL, NULL, 0);
  if (!d->cq) die("ibv_create_cq: %s", strerror(errno));
}

struct ibv_mr* rc_reg(struct rc_dev* d, void* buf, size_t len, int access) {
  struct ibv_mr* mr = ibv_reg_mr(d->pd, buf, len, access | IBV_ACCESS_LOCAL_WRITE);
  if (!mr) die("ibv_reg_mr(%zu bytes): %s", len, strerror(errno));
  return mr;
}

struct ibv_qp* rc_qp_create(struct rc_dev* d, int depth, int access, struct rc_info* self) {
  struct ibv_qp_init_attr ia = {
      .send_cq = d->cq,
      .recv_cq = d->cq,
      .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = (uint32_t)depth, .max_recv_wr = (uint32_t)depth, .max_send_sge = 1, .max_recv_sge = 1},
  };
  struct ibv_qp* qp = ibv_create_qp(d->pd, &ia);
  if (!qp) die("ibv_create_qp: %s", strerror(errno));
  struct ibv_qp_attr a = {
      .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qp_access_flags = (unsigned)access};
  int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc) die("ibv_modify_qp(INIT): %s", strerror(rc));
  memset(self, 0, sizeof *self);
  self->qpn = qp->qp_num;
  self->psn = ((uint32_t)getpid() * 2654435761u ^ (uint32_t)time(NULL) ^ qp->qp_num) & 0xffffff;
  self->gid = d->gid;
  return qp;
}

void rc_qp_connect(struct rc_dev* d, struct ibv_qp* qp, const struct rc_info* self, const struct rc_info* peer) {
  struct ibv_qp_attr a = {
      .qp_state = IBV_QPS_RTR,
      .path_mtu = d->mtu,
      .dest_qp_num = peer->qpn,
      .rq_psn = peer->psn,
      .max_dest_rd_atomic = 16,
      .min_rnr_timer = 12,
      .ah_attr = {.is_global = 1, .port_num = 1, .grh = {.dgid = peer->gid, .sgid_index = 0, .hop_limit = 64}},
  };
  int rc = ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc) die("ibv_modify_qp(RTR): %s", strerror(rc));
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = self->psn;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 16;
  rc = ibv_modify_qp(
      qp, &a,
      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc) die("ibv_modify_qp(RTS): %s", strerror(rc));
}

void rc_info_send(int fd, const struct rc_info* info) {
  struct rc_info w = *info;
  w.qpn = htonl(w.qpn);
  w.psn = htonl(w.psn);
  w.addr = htobe64(w.addr);
  w.rkey = htonl(w.rkey);
  w.len = htonl(w.len);
  tcp_send(fd, &w, sizeof w);
}

void rc_info_recv(int fd, struct rc_info* info) {
  tcp_recv(fd, info, sizeof *info, "the peer's QP information");
  info->qpn = ntohl(info->qpn);
  info->psn = ntohl(info->psn);
  info->addr = be64toh(info->addr);
  info->rkey = ntohl(info->rkey);
  info->len = ntohl(info->len);
}

void post_recv(struct ibv_qp* qp, struct ibv_mr* mr, void* buf, uint32_t len, uint64_t wr_id) {
  struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = len, .lkey = mr ? mr->lkey : 0};
  struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = len ? 1 : 0}, *bad;
  int rc = ibv_post_recv(qp, &wr, &bad);
  if (rc) die("ibv_post_recv: %s", strerror(rc));
}

static void post(struct ibv_qp* qp, struct ibv_send_wr* wr, const char* what) {
  struct ibv_send_wr* bad;
  int rc = ibv_post_send(qp, wr, &bad);
  if (rc) die("ibv_post_send(%s): %s", what, strerror(rc));
}

void post_send(struct ibv_qp* qp, struct ibv_mr* mr, void* buf, uint32_t len, uint64_t wr_id) {
  struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = len, .lkey = mr ? mr->lkey : 0};
  struct ibv_send_wr wr = {
      .wr_id = wr_id, .sg_list = &sge, .num_sge = len ? 1 : 0, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
  post(qp, &wr, "SEND");
}

void post_rdma(struct ibv_qp* qp, enum ibv_wr_opcode opcode, struct ibv_mr* mr, void* buf, uint32_t len, uint64_t raddr,
               uint32_t rkey, uint32_t imm, uint64_t wr_id) {
  struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = len, .lkey = mr ? mr->lkey : 0};
  struct ibv_send_wr wr = {
      .wr_id = wr_id, .sg_list = &sge, .num_sge = len ? 1 : 0, .opcode = opcode, .send_flags = IBV_SEND_SIGNALED};
  wr.imm_data = htonl(imm);
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  post(qp, &wr, "RDMA");
}

void post_atomic(struct ibv_qp* qp, enum ibv_wr_opcode opcode, struct ibv_mr* mr, uint64_t* result, uint64_t raddr,
                 uint32_t rkey, uint64_t compare_add, uint64_t swap, uint64_t wr_id) {
  struct ibv_sge sge = {.addr = (uintptr_t)result, .length = 8, .lkey = mr->lkey};
  struct ibv_send_wr wr = {
      .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = opcode, .send_flags = IBV_SEND_SIGNALED};
  wr.wr.atomic.remote_addr = raddr;
  wr.wr.atomic.rkey = rkey;
  wr.wr.atomic.compare_add = compare_add;
  wr.wr.atomic.swap = swap;
  post(qp, &wr, "atomic");
}

struct ibv_wc poll_one(struct ibv_cq* cq, const char* what) {
  struct ibv_wc wc;
  double deadline = now_s() + g_timeout_s;
  unsigned spins = 0;
  for (;;) {
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) die("ibv_poll_cq failed");
    if (n == 1) break;
    if ((++spins & 1023) == 0) {
      if (now_s() > deadline) die("timed out after %d s waiting for %s", g_timeout_s, what);
      struct timespec ts = {0, 20000}; /* don't starve a peer on the same core */
      nanosleep(&ts, NULL);
    }
  }
  if (wc.status != IBV_WC_SUCCESS)
    die("%s failed: %s (wr_id %llu)", what, ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id);
  return wc;
}

void desc_pack(struct buf_desc* wire, const void* addr, uint32_t rkey, uint32_t len) {
  wire->addr = htobe64((uintptr_t)addr);
  wire->rkey = htonl(rkey);
  wire->len = htonl(len);
}

struct buf_desc desc_unpack(const struct buf_desc* wire) {
  struct buf_desc d = {.addr = be64toh(wire->addr), .rkey = ntohl(wire->rkey), .len = ntohl(wire->len)};
  return d;
}

void fill_pattern(char* buf, size_t len, const char* text, unsigned seed) {
  size_t n = strlen(text) + 1;
  memcpy(buf, text, n < len ? n : len);
  for (size_t i = n; i < len; ++i) buf[i] = (char)((i * 31 + seed) & 0xff);
}

int check_pattern(const char* buf, size_t len, const char* text, unsigned seed) {
  size_t n = strlen(text) + 1;
  if (n > len || memcmp(buf, text, n)) return 0;
  for (size_t i = n; i < len; ++i)
    if (buf[i] != (char)((i * 31 + seed) & 0xff)) return 0;
  return 1;
}

uint64_t fnv1a64(uint64_t h, const void* buf, size_t len) {
  const unsigned char* p = buf;
  for (size_t i = 0; i < len; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}
