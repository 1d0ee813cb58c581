// The rdma_cm listener under abuse (issue 10, item 7): junk, idle and
// half-open CM connections and descriptor exhaustion must cost the listening
// process bounded memory, bounded log output and little CPU, and must never
// keep a real client from being served for longer than the abuse lasts.
// Written, like cm_test.c, against rdma-core's public headers; the abuser
// speaks raw TCP to the listener's port, since a CM connection is a TCP
// connection to it (design §6).
//
//   cm_abuse_test CASE PORT      (cm_abuse_test --list prints the cases)
//
// Each case forks before any rdma_cm use: the listener runs in a child, the
// abusers and the real client in the parent (or another child). Every wait
// is bounded.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cm_test_util.h"

enum {
  kMadSize = 256,
  kFloodBytes = 64 << 20,  // random junk pushed at the listener in total
  kFloodStreams = 4,       // ... through this many connections at a time
  kIdleLinks = 300,        // more than the listener keeps pending (256)
  kQuietMs = 5000,         // uroce closes a connection without a REQ after this
};

// ---- raw TCP connections to the listener ----

static int tcp_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0, "socket: %s", strerror(errno));
  struct sockaddr_in a = loopback(port);
  REQUIRE(connect(fd, (struct sockaddr*)&a, sizeof a) == 0, "connect to the listener: %s", strerror(errno));
  REQUIRE(fcntl(fd, F_SETFL, O_NONBLOCK) == 0, "fcntl");
  return fd;
}

// Reads (and drops: the listener's greeting) what has arrived. 1 if the
// listener has closed the connection, 0 if it is still open.
static int drain_closed(int fd) {
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n == 0) return 1;
    if (errno == EINTR) continue;
    return errno != EAGAIN && errno != EWOULDBLOCK;  // ECONNRESET: closed
  }
}

// A well-formed CM MAD that names no connection: a DREQ with comm IDs 0.
static void useless_mad(uint8_t* m) {
  memset(m, 0, kMadSize);
  m[0] = 1;      // BaseVersion
  m[1] = 0x07;   // MgmtClass: CM
  m[2] = 2;      // ClassVersion
  m[3] = 0x03;   // Method: Send
  m[17] = 0x15;  // AttributeID: DREQ
}

// xorshift: reproducible junk.
static void fill_junk(uint8_t* buf, size_t len, uint64_t* state) {
  for (size_t i = 0; i < len; i++) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    buf[i] = (uint8_t)*state;
  }
  buf[0] = 0xFF;  // never a MAD's BaseVersion: the first frame is malformed
}

// ---- a real client and the listener's side of it ----

// One RC connection's messages: [0, 64) receives, [64, 128) sends.
struct msgs {
  struct ibv_mr* mr;
  char buf[128];
};

static void msgs_init(struct msgs* m, struct ibv_pd* pd) {
  memset(m->buf, 0, sizeof m->buf);
  m->mr = ibv_reg_mr(pd, m->buf, sizeof m->buf, IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(m->mr, "ibv_reg_mr: %s", strerror(errno));
}

static void msgs_post_recv(struct rdma_cm_id* id, struct msgs* m) {
  struct ibv_sge sge = {.addr = (uintptr_t)m->buf, .length = 64, .lkey = m->mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad;
  REQUIRE(ibv_post_recv(id->qp, &wr, &bad) == 0, "ibv_post_recv");
}

static void msgs_post_send(struct rdma_cm_id* id, struct msgs* m, const char* text) {
  snprintf(m->buf + 64, 64, "%s", text);
  struct ibv_sge sge = {.addr = (uintptr_t)(m->buf + 64), .length = 64, .lkey = m->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 2,
                           .sg_list = &sge,
                           .num_sge = 1,
                           .opcode = IBV_WR_SEND,
                           .send_flags = IBV_SEND_SIGNALED},
                     *bad;
  REQUIRE(ibv_post_send(id->qp, &wr, &bad) == 0, "ibv_post_send");
}

// Waits for `sends` send and `recvs` receive completions, all successful.
static void wait_completions(struct ibv_cq* cq, int sends, int recvs, int timeout_ms) {
  double end = now_ms() + timeout_ms;
  while (sends > 0 || recvs > 0) {
    struct ibv_wc wc;
    int n = ibv_poll_cq(cq, 1, &wc);
    REQUIRE(n >= 0, "ibv_poll_cq");
    if (n == 0) {
      REQUIRE(now_ms() < end, "completions missing after %d ms (%d sends, %d receives)", timeout_ms, sends, recvs);
      usleep(100);
      continue;
    }
    REQUIRE(wc.status == IBV_WC_SUCCESS, "completion %s", ibv_wc_status_str(wc.status));
    if (wc.opcode == IBV_WC_RECV) {
      recvs--;
    } else {
      sends--;
    }
  }
}

// The listener's side: answers "ping N" with "pong N" `rounds` times. With
// `expect_quiet`, checks before each answer that nothing has happened to the
// connection (no DISCONNECTED queued) while it was quiet.
static void serve_pings(struct server* s, struct rdma_cm_id* id, struct msgs* m, int rounds, int expect_quiet) {
  for (int i = 0; i < rounds; i++) {
    wait_completions(s->cq, 0, 1, 60000);
    char expect[64];
    snprintf(expect, sizeof expect, "ping %d", i);
    REQUIRE(strcmp(m->buf, expect) == 0, "listener got '%s', expected '%s'", m->buf, expect);
    if (expect_quiet) {
      struct pollfd p = {.fd = s->ch->fd, .events = POLLIN};
      REQUIRE(poll(&p, 1, 0) == 0, "an rdma_cm event arrived on the listener's channel while the connection was quiet");
    }
    msgs_post_recv(id, m);
    snprintf(expect, sizeof expect, "pong %d", i);
    msgs_post_send(id, m, expect);
    wait_completions(s->cq, 1, 0, 10000);
  }
}

// Accepts one real client (after whatever the abusers do), serves its pings,
// waits for its disconnection and frees everything.
static void serve_one_client(struct server* s, int rounds, int expect_quiet) {
  struct rdma_cm_event* e = expect_event(s->ch, RDMA_CM_EVENT_CONNECT_REQUEST, 30000);
  struct rdma_cm_id* id = e->id;
  rdma_ack_cm_event(e);
  struct ibv_qp_init_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.send_cq = attr.recv_cq = s->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 2;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  REQUIRE(rdma_create_qp(id, s->pd, &attr) == 0, "listener rdma_create_qp: %s", strerror(errno));
  struct msgs m;
  msgs_init(&m, s->pd);
  msgs_post_recv(id, &m);
  struct rdma_conn_param p = basic_param(NULL, 0);
  REQUIRE(rdma_accept(id, &p) == 0, "rdma_accept: %s", strerror(errno));
  ack_expected(s->ch, RDMA_CM_EVENT_ESTABLISHED, 10000);
  serve_pings(s, id, &m, rounds, expect_quiet);
  ack_expected(s->ch, RDMA_CM_EVENT_DISCONNECTED, 30000);
  rdma_disconnect(id);
  rdma_destroy_qp(id);
  ibv_dereg_mr(m.mr);
  REQUIRE(rdma_destroy_id(id) == 0, "rdma_destroy_id");
}

struct client {
  struct async_client c;
  struct msgs m;
  int round;
};

static void client_connect(struct client* cl, int port) {
  async_client_setup(&cl->c, port);
  msgs_init(&cl->m, cl->c.pd);
  cl->round = 0;
  struct rdma_conn_param p = basic_param(NULL, 0);
  REQUIRE(rdma_connect(cl->c.id, &p) == 0, "rdma_connect: %s", strerror(errno));
  ack_expected(cl->c.ch, RDMA_CM_EVENT_ESTABLISHED, 30000);
}

static void client_ping(struct client* cl) {
  char text[64], expect[64];
  snprintf(text, sizeof text, "ping %d", cl->round);
  snprintf(expect, sizeof expect, "pong %d", cl->round);
  cl->round++;
  msgs_post_recv(cl->c.id, &cl->m);
  msgs_post_send(cl->c.id, &cl->m, text);
  wait_completions(cl->c.cq, 1, 1, 30000);
  REQUIRE(strcmp(cl->m.buf, expect) == 0, "client got '%s', expected '%s'", cl->m.buf, expect);
}

static void client_disconnect(struct client* cl) {
  REQUIRE(rdma_disconnect(cl->c.id) == 0, "rdma_disconnect: %s", strerror(errno));
  ack_expected(cl->c.ch, RDMA_CM_EVENT_DISCONNECTED, 10000);
  ibv_dereg_mr(cl->m.mr);
  async_client_teardown(&cl->c);
}

// ---- the listener's stderr, captured to count its log lines ----

static int g_captured = -1;

static void capture_stderr(void) {
  g_report_fd = dup(2);
  g_captured = memfd_create("stderr", MFD_CLOEXEC);
  REQUIRE(g_report_fd >= 0 && g_captured >= 0 && dup2(g_captured, 2) == 2, "capturing stderr");
}

// Lines written to stderr so far; the first few are copied to stdout.
static int captured_lines(void) {
  fflush(stderr);
  off_t len = lseek(g_captured, 0, SEEK_END);
  char* text = calloc(1, (size_t)len + 1);
  REQUIRE(text && pread(g_captured, text, (size_t)len, 0) == len, "reading captured stderr");
  int lines = 0;
  for (char *p = text, *nl; (nl = strchr(p, '\n')); p = nl + 1) {
    if (lines < 8) printf("  listener stderr: %.*s\n", (int)(nl - p), p);
    lines++;
  }
  free(text);
  return lines;
}

// ---- junk: 64 MiB of random bytes, then well-formed MADs that ask for nothing ----

static void junk_listener(int ready_fd, int done_fd) {
  capture_stderr();
  struct server s;
  server_listen(&s);
  const long rss_before = rss_kib();
  const int fds_before = open_fds();
  const double t0 = now_ms();
  signal_peer(ready_fd);
  serve_one_client(&s, 10, 0);
  wait_peer(done_fd, 120000);  // the abuser has seen every connection closed
  const long rss_after = rss_kib();
  const int fds_after = open_fds();
  const double secs = (now_ms() - t0) / 1000;
  const int lines = captured_lines();
  printf("listener: VmRSS %ld -> %ld KiB, %d -> %d fds, %d log lines in %.1f s\n", rss_before, rss_after, fds_before,
         fds_after, lines, secs);
  // Before: 300 MB after 512 MiB of junk, one line per bad frame.
  REQUIRE(rss_after - rss_before < 16 * 1024, "memory grew by %ld KiB", rss_after - rss_before);
  REQUIRE(fds_after <= fds_before + 2, "%d descriptors more than before the junk", fds_after - fds_before);
  REQUIRE(lines <= 5 * ((int)secs + 2), "%d log lines in %.1f s: not rate-limited", lines, secs);
  server_close(&s);
}

// Random junk through kFloodStreams connections at a time until kFloodBytes
// have been written; each connection must be closed by the listener.
static void flood_random(int port, int started_fd) {
  static uint8_t chunk[64 << 10];
  uint64_t state = 0x9E3779B97F4A7C15ull;
  int fds[kFloodStreams];
  for (int i = 0; i < kFloodStreams; i++) fds[i] = tcp_connect(port);
  long long written = 0;
  int closed = 0;
  double last_progress = now_ms();
  while (written < kFloodBytes) {
    struct pollfd p[kFloodStreams];
    for (int i = 0; i < kFloodStreams; i++) p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN | POLLOUT};
    REQUIRE(poll(p, kFloodStreams, 1000) >= 0, "poll");
    for (int i = 0; i < kFloodStreams; i++) {
      int gone = (p[i].revents & (POLLIN | POLLHUP | POLLERR)) && drain_closed(fds[i]);
      if (!gone && (p[i].revents & POLLOUT)) {
        fill_junk(chunk, sizeof chunk, &state);
        ssize_t n = send(fds[i], chunk, sizeof chunk, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          written += n;
          last_progress = now_ms();
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          gone = 1;  // EPIPE / ECONNRESET: the listener closed it
        }
      }
      if (gone) {
        close(fds[i]);
        if (++closed == 1) signal_peer(started_fd);
        fds[i] = tcp_connect(port);
        last_progress = now_ms();
      }
    }
    REQUIRE(now_ms() - last_progress < 10000, "no junk connection closed or written to for 10 s");
  }
  // The last connections must be closed too (each gets junk, in case it
  // was opened just now).
  for (int i = 0; i < kFloodStreams; i++) {
    fill_junk(chunk, kMadSize, &state);
    (void)send(fds[i], chunk, kMadSize, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  for (int i = 0; i < kFloodStreams; i++) {
    double end = now_ms() + 10000;
    while (!drain_closed(fds[i])) {
      REQUIRE(now_ms() < end, "a junk connection still open 10 s after its junk");
      struct pollfd p = {.fd = fds[i], .events = POLLIN};
      poll(&p, 1, 100);
    }
    close(fds[i]);
    closed++;
  }
  printf("abuser: %lld MiB of random junk through %d connections, each closed by the listener\n", written >> 20,
         closed);
}

// Two connections chatter well-formed MADs that name no connection, one sends
// half a MAD and stops: none ever sends a REQ, so the listener must close
// them after its request timeout, memory bounded all along.
static void flood_useless(int port) {
  static uint8_t stream[64 * kMadSize];
  for (int i = 0; i < 64; i++) useless_mad(stream + i * kMadSize);
  int fds[3] = {tcp_connect(port), tcp_connect(port), tcp_connect(port)};
  REQUIRE(send(fds[2], stream, kMadSize / 2, MSG_NOSIGNAL) == kMadSize / 2, "half a MAD");
  const double t0 = now_ms();
  long long written = 0;
  int open = 3;
  while (open > 0) {
    REQUIRE(now_ms() - t0 < kQuietMs + 10000, "connections without a REQ still open after %d ms", kQuietMs + 10000);
    struct pollfd p[3];
    for (int i = 0; i < 3; i++)
      p[i] = (struct pollfd){.fd = fds[i], .events = fds[i] < 0 ? 0 : POLLIN | (i < 2 ? POLLOUT : 0)};
    REQUIRE(poll(p, 3, 100) >= 0, "poll");
    for (int i = 0; i < 3; i++) {
      if (fds[i] < 0) continue;
      int gone = (p[i].revents & (POLLIN | POLLHUP | POLLERR)) && drain_closed(fds[i]);
      if (!gone && (p[i].revents & POLLOUT)) {
        ssize_t n = send(fds[i], stream, sizeof stream, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) written += n;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) gone = 1;
      }
      if (gone) {
        printf("abuser: connection %d %s closed after %.1f s\n", i, i < 2 ? "(well-formed MADs)" : "(half a MAD)",
               (now_ms() - t0) / 1000);
        close(fds[i]);
        fds[i] = -1;
        open--;
      }
    }
  }
  printf("abuser: %lld MiB of well-formed MADs without a REQ\n", written >> 20);
}

static void case_junk_flood(void) {
  const int port = atoi(g_port);
  int ready[2], done[2], started[2];
  REQUIRE(pipe(ready) == 0 && pipe(done) == 0 && pipe(started) == 0, "pipe");
  pid_t listener = fork();
  REQUIRE(listener >= 0, "fork");
  if (listener == 0) {
    junk_listener(ready[1], done[0]);
    exit(0);
  }
  wait_peer(ready[0], 10000);
  pid_t abuser = fork();
  REQUIRE(abuser >= 0, "fork");
  if (abuser == 0) {
    flood_random(port, started[1]);
    flood_useless(port);
    exit(0);
  }
  // A real client, served while the junk flows.
  wait_peer(started[0], 10000);
  struct client cl;
  client_connect(&cl, port);
  for (int i = 0; i < 10; i++) client_ping(&cl);
  client_disconnect(&cl);
  printf("real client: connected and exchanged 10 messages during the flood\n");
  int status = reap(abuser, 90000);
  REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "abuser failed (status 0x%x)", status);
  signal_peer(done[1]);
  expect_child_ok(listener);
}

// ---- many idle connections: closed after the timeout; a quiet rdma_cm connection is not ----

static void idle_listener(int ready_fd, int done_fd) {
  struct server s;
  server_listen(&s);
  const int fds_before = open_fds();
  signal_peer(ready_fd);
  serve_one_client(&s, 2, 1);
  wait_peer(done_fd, 60000);
  const int fds_after = open_fds();
  printf("listener: %d fds before the idle connections, %d after\n", fds_before, fds_after);
  REQUIRE(fds_after <= fds_before + 2, "%d descriptors more than before", fds_after - fds_before);
  server_close(&s);
}

static void case_idle_links(void) {
  const int port = atoi(g_port);
  int ready[2], done[2];
  REQUIRE(pipe(ready) == 0 && pipe(done) == 0, "pipe");
  pid_t listener = fork();
  REQUIRE(listener >= 0, "fork");
  if (listener == 0) {
    idle_listener(ready[1], done[0]);
    exit(0);
  }
  wait_peer(ready[0], 10000);
  // kIdleLinks connections that never send a REQ: most send nothing, some
  // half a MAD, some one well-formed MAD that names no connection.
  static int fds[kIdleLinks];
  uint8_t mad[kMadSize];
  useless_mad(mad);
  const double t0 = now_ms();
  for (int i = 0; i < kIdleLinks; i++) {
    fds[i] = tcp_connect(port);
    if (i % 15 == 1) REQUIRE(send(fds[i], mad, kMadSize / 2, MSG_NOSIGNAL) == kMadSize / 2, "half a MAD");
    if (i % 15 == 2) REQUIRE(send(fds[i], mad, kMadSize, MSG_NOSIGNAL) == kMadSize, "a MAD");
  }
  // A real client is served at once, idle connections or not.
  struct client cl;
  client_connect(&cl, port);
  client_ping(&cl);
  printf("real client: served %.0f ms after %d idle connections were opened\n", now_ms() - t0, kIdleLinks);
  // Every idle connection is closed by the listener: the oldest at once
  // (beyond its 256 pending), the others after its request timeout.
  int open = kIdleLinks, early = 0;
  double last = 0;
  while (open > 0) {
    REQUIRE(now_ms() - t0 < kQuietMs + 15000, "%d idle connections still open after %d ms", open, kQuietMs + 15000);
    for (int i = 0; i < kIdleLinks; i++) {
      if (fds[i] < 0 || !drain_closed(fds[i])) continue;
      close(fds[i]);
      fds[i] = -1;
      open--;
      last = now_ms() - t0;
      if (last < kQuietMs / 2) early++;
    }
    usleep(20000);
  }
  printf("idle connections: all %d closed by the listener (%d within %d ms, the last after %.0f ms)\n", kIdleLinks,
         early, kQuietMs / 2, last);
  // The rdma_cm connection has been quiet for longer than the request
  // timeout: it must still be up (serve_pings checks the listener's side).
  usleep(1000 * 1000);
  struct pollfd p = {.fd = cl.c.ch->fd, .events = POLLIN};
  REQUIRE(poll(&p, 1, 0) == 0, "an rdma_cm event arrived on the client's channel while the connection was quiet");
  client_ping(&cl);
  client_disconnect(&cl);
  signal_peer(done[1]);
  expect_child_ok(listener);
}

// ---- accept() out of descriptors: no spinning, and served once they are back ----

static double cpu_ms(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

enum { kEmfileFlood = 32, kEmfileFreed = 16, kEmfileWindowMs = 2000 };

static void emfile_listener(int to_parent, int from_parent) {
  struct server s;
  server_listen(&s);
  // Lower the limit and use every descriptor left.
  struct rlimit rl;
  REQUIRE(getrlimit(RLIMIT_NOFILE, &rl) == 0, "getrlimit");
  rl.rlim_cur = 256;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit: %s", strerror(errno));
  static int filler[256];
  int nfill = 0;
  for (;;) {
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    REQUIRE(nfill < 256, "RLIMIT_NOFILE not enforced");
    filler[nfill++] = fd;
  }
  REQUIRE(errno == EMFILE && nfill >= kEmfileFreed, "filling the descriptor table: %s after %d", strerror(errno),
          nfill);
  signal_peer(to_parent);
  wait_peer(from_parent, 10000);  // kEmfileFlood connections wait in the backlog
  // accept() now fails with EMFILE whenever it is tried.
  const double cpu0 = cpu_ms(), t0 = now_ms();
  usleep(kEmfileWindowMs * 1000);
  const double cpu = cpu_ms() - cpu0, wall = now_ms() - t0;
  printf("listener out of descriptors: %.0f ms of CPU in %.0f ms with %d connections waiting\n", cpu, wall,
         kEmfileFlood);
  // Spinning on accept() costs a whole core (the CM thread at ~100 %).
  REQUIRE(cpu < wall / 4, "%.0f ms of CPU in %.0f ms: the listener spins on EMFILE", cpu, wall);
  for (int i = 0; i < kEmfileFreed; i++) close(filler[--nfill]);
  signal_peer(to_parent);
  serve_one_client(&s, 1, 0);
  while (nfill > 0) close(filler[--nfill]);
  server_close(&s);
}

static void case_accept_emfile(void) {
  const int port = atoi(g_port);
  int up[2], down[2];
  REQUIRE(pipe(up) == 0 && pipe(down) == 0, "pipe");
  pid_t listener = fork();
  REQUIRE(listener >= 0, "fork");
  if (listener == 0) {
    emfile_listener(up[1], down[0]);
    exit(0);
  }
  wait_peer(up[0], 10000);
  int fds[kEmfileFlood];
  for (int i = 0; i < kEmfileFlood; i++) fds[i] = tcp_connect(port);  // completed by the kernel's backlog
  signal_peer(down[1]);
  wait_peer(up[0], 10000 + kEmfileWindowMs);
  // Descriptors are back: every waiting connection is accepted (it gets the
  // greeting) or, beyond the descriptors freed, closed to make room.
  const double t0 = now_ms();
  int greeted = 0, closed = 0;
  for (int i = 0; i < kEmfileFlood; i++) {
    struct pollfd p = {.fd = fds[i], .events = POLLIN};
    REQUIRE(poll(&p, 1, 10000) == 1, "connection %d neither accepted nor closed 10 s after descriptors were freed", i);
    char b;
    ssize_t n = recv(fds[i], &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 1) {
      greeted++;
    } else {
      closed++;
    }
  }
  printf("after descriptors were freed: %d waiting connections greeted, %d closed, within %.0f ms\n", greeted, closed,
         now_ms() - t0);
  // They have served their purpose: closing them gives the listener its
  // descriptors back for the real client (and whatever its verbs need).
  for (int i = 0; i < kEmfileFlood; i++) close(fds[i]);
  struct client cl;
  client_connect(&cl, port);
  client_ping(&cl);
  client_disconnect(&cl);
  expect_child_ok(listener);
}

int main(int argc, char** argv) {
  static const char* cases[] = {"junk_flood", "idle_links", "accept_emfile"};
  if (argc == 2 && strcmp(argv[1], "--list") == 0) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) printf("%s\n", cases[i]);
    return 0;
  }
  if (argc != 3) {
    fprintf(stderr, "usage: cm_abuse_test CASE PORT | --list\n");
    return 2;
  }
  g_program = "cm_abuse_test";
  g_case = argv[1];
  snprintf(g_port, sizeof g_port, "%s", argv[2]);
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!strcmp(g_case, "junk_flood")) {
    case_junk_flood();
  } else if (!strcmp(g_case, "idle_links")) {
    case_idle_links();
  } else if (!strcmp(g_case, "accept_emfile")) {
    case_accept_emfile();
  } else {
    fprintf(stderr, "unknown case %s\n", g_case);
    return 2;
  }
  printf("cm_abuse_test %s: passed\n", g_case);
  return 0;
}
