// Helpers shared by the rdma_cm C tests (cm_test.c, cm_ipv6_test.c, ...): failure
// reporting, bounded waits for events and peers, an asynchronous client and a
// listener that accepts with a QP of its own. Written against rdma-core's
// public headers only. Every wait is bounded.
#pragma once

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char* g_program = "cm_test";
static const char* g_case = "";
static char g_port[16];

// Where failures are reported: stderr, unless a test captured stderr itself.
static int g_report_fd = 2;

static inline void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  dprintf(g_report_fd, "%s %s [pid %d]: FAILED: ", g_program, g_case, (int)getpid());
  vdprintf(g_report_fd, fmt, ap);
  dprintf(g_report_fd, "\n");
  va_end(ap);
  exit(1);
}

// The CM tests' one check: a failed REQUIRE reports and ends the process (the
// tests fork a server and a client, and each must stop at its first failure).
// The verbs tests' CHECK (verbs_pair.h) counts a failure and goes on.
#define REQUIRE(cond, ...)          \
  do {                              \
    if (!(cond)) fail(__VA_ARGS__); \
  } while (0)

static inline double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Waits (poll on channel->fd, so the fd must work with poll) for the next
// event; fails after timeout_ms. The caller acknowledges it.
static inline struct rdma_cm_event* next_event(struct rdma_event_channel* ch, int timeout_ms) {
  struct pollfd p = {.fd = ch->fd, .events = POLLIN};
  int r = poll(&p, 1, timeout_ms);
  REQUIRE(r == 1, "no rdma_cm event within %d ms (poll returned %d)", timeout_ms, r);
  struct rdma_cm_event* e;
  REQUIRE(rdma_get_cm_event(ch, &e) == 0, "rdma_get_cm_event: %s", strerror(errno));
  return e;
}

static inline struct rdma_cm_event* expect_event(struct rdma_event_channel* ch, enum rdma_cm_event_type type,
                                                 int timeout_ms) {
  struct rdma_cm_event* e = next_event(ch, timeout_ms);
  REQUIRE(e->event == type, "expected %s, got %s (status %d)", rdma_event_str(type), rdma_event_str(e->event),
          e->status);
  return e;
}

static inline void ack_expected(struct rdma_event_channel* ch, enum rdma_cm_event_type type, int timeout_ms) {
  rdma_ack_cm_event(expect_event(ch, type, timeout_ms));
}

static inline struct sockaddr_in loopback(int port) {
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Resident set size in KiB (VmRSS of /proc/self/status), -1 if unknown.
static inline long rss_kib(void) {
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  fclose(f);
  return kib;
}

// Whether a sanitizer runtime (preloaded by `uroce run` for a sanitizer build
// of liburoce) manages this process's memory.
static inline int sanitizer_runtime(void) {
  return dlsym(RTLD_DEFAULT, "__asan_init") != NULL || dlsym(RTLD_DEFAULT, "__tsan_init") != NULL;
}

static inline int open_fds(void) {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

// A one-byte pipe message, so that one process waits for the other.
static inline void signal_peer(int fd) { REQUIRE(write(fd, "x", 1) == 1, "pipe write"); }
static inline void wait_peer(int fd, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  REQUIRE(poll(&p, 1, timeout_ms) == 1, "peer did not signal within %d ms", timeout_ms);
  char c;
  REQUIRE(read(fd, &c, 1) == 1, "peer exited early");
}

static inline int reap(pid_t pid, int timeout_ms) {
  double end = now_ms() + timeout_ms;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (now_ms() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      fail("child %d did not exit within %d ms", (int)pid, timeout_ms);
    }
    usleep(10000);
  }
  return status;
}

static inline void expect_child_ok(pid_t pid) {
  int status = reap(pid, 30000);
  REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed (status 0x%x)", status);
}

// ---- an asynchronous client, step by step ----

struct async_client {
  struct rdma_event_channel* ch;
  struct rdma_cm_id* id;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
};

// Resolves 127.0.0.1:port and creates an RC QP on the id.
static inline void async_client_setup(struct async_client* c, int port) {
  c->ch = rdma_create_event_channel();
  REQUIRE(c->ch, "rdma_create_event_channel: %s", strerror(errno));
  REQUIRE(rdma_create_id(c->ch, &c->id, c, RDMA_PS_TCP) == 0, "rdma_create_id: %s", strerror(errno));
  struct sockaddr_in dst = loopback(port);
  REQUIRE(rdma_resolve_addr(c->id, NULL, (struct sockaddr*)&dst, 2000) == 0, "rdma_resolve_addr: %s", strerror(errno));
  ack_expected(c->ch, RDMA_CM_EVENT_ADDR_RESOLVED, 3000);
  REQUIRE(c->id->verbs, "no verbs context after ADDR_RESOLVED (127.0.0.1 must resolve to the uroce device)");
  union ibv_gid gid;
  REQUIRE(ibv_query_gid(c->id->verbs, 1, 0, &gid) == 0, "ibv_query_gid");
  REQUIRE(gid.raw[10] == 0xff && gid.raw[11] == 0xff, "GID 0 is not IPv4-mapped");
  REQUIRE(rdma_resolve_route(c->id, 2000) == 0, "rdma_resolve_route: %s", strerror(errno));
  ack_expected(c->ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 3000);
  c->pd = ibv_alloc_pd(c->id->verbs);
  c->cq = ibv_create_cq(c->id->verbs, 8, NULL, NULL, 0);
  REQUIRE(c->pd && c->cq, "pd/cq");
  struct ibv_qp_init_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.send_cq = attr.recv_cq = c->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  REQUIRE(rdma_create_qp(c->id, c->pd, &attr) == 0, "rdma_create_qp: %s", strerror(errno));
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qi;
  REQUIRE(ibv_query_qp(c->id->qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_INIT,
          "rdma_create_qp did not leave the QP in INIT");
}

static inline void async_client_teardown(struct async_client* c) {
  rdma_destroy_qp(c->id);
  REQUIRE(rdma_destroy_id(c->id) == 0, "rdma_destroy_id: %s", strerror(errno));
  ibv_destroy_cq(c->cq);
  ibv_dealloc_pd(c->pd);
  rdma_destroy_event_channel(c->ch);
}

static inline struct rdma_conn_param basic_param(const void* data, uint8_t len) {
  struct rdma_conn_param p;
  memset(&p, 0, sizeof p);
  p.private_data = data;
  p.private_data_len = len;
  p.responder_resources = 1;
  p.initiator_depth = 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  return p;
}

// A listener with an asynchronous channel; accepts every request with a QP of its own.
struct server {
  struct rdma_event_channel* ch;
  struct rdma_cm_id* listen_id;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
};

static inline void server_listen_backlog(struct server* s, int backlog) {
  s->ch = rdma_create_event_channel();
  REQUIRE(rdma_create_id(s->ch, &s->listen_id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
  struct sockaddr_in a = loopback(atoi(g_port));
  REQUIRE(rdma_bind_addr(s->listen_id, (struct sockaddr*)&a) == 0, "rdma_bind_addr: %s", strerror(errno));
  REQUIRE(rdma_listen(s->listen_id, backlog) == 0, "rdma_listen");
  // A listener bound to 127.0.0.1 has no device yet (as in the kernel, a loopback
  // address is "any address"); its new ids get rdma_cm's device context, the
  // first (and only) one rdma_get_devices lists.
  struct ibv_context** devs = rdma_get_devices(NULL);
  REQUIRE(devs && devs[0], "rdma_get_devices");
  s->pd = ibv_alloc_pd(devs[0]);
  s->cq = ibv_create_cq(devs[0], 64, NULL, NULL, 0);
  rdma_free_devices(devs);
  REQUIRE(s->pd && s->cq, "server pd/cq");
}

static inline void server_listen(struct server* s) { server_listen_backlog(s, 16); }

// Releases what server_listen made (its PD and CQ too: LeakSanitizer checks the tests).
static inline void server_close(struct server* s) {
  if (s->cq) ibv_destroy_cq(s->cq);
  if (s->pd) ibv_dealloc_pd(s->pd);
  rdma_destroy_id(s->listen_id);
  rdma_destroy_event_channel(s->ch);
}

static inline struct rdma_cm_id* server_accept(struct server* s, int timeout_ms) {
  struct rdma_cm_event* e = expect_event(s->ch, RDMA_CM_EVENT_CONNECT_REQUEST, timeout_ms);
  struct rdma_cm_id* id = e->id;
  rdma_ack_cm_event(e);
  struct ibv_qp_init_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.send_cq = attr.recv_cq = s->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 2;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  REQUIRE(rdma_create_qp(id, s->pd, &attr) == 0, "server rdma_create_qp: %s", strerror(errno));
  struct rdma_conn_param p = basic_param(NULL, 0);
  REQUIRE(rdma_accept(id, &p) == 0, "rdma_accept: %s", strerror(errno));
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qi;
  REQUIRE(ibv_query_qp(id->qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_RTS,
          "passive QP not in RTS after rdma_accept");
  ack_expected(s->ch, RDMA_CM_EVENT_ESTABLISHED, timeout_ms);
  return id;
}
