// ACK before completion over rdma_cm: the client/server program people
// write while learning RDMA, repeated. Each connection: both sides exchange buffer
// descriptions (address, R_Key) in a SEND, RDMA-WRITE their data into the peer's buffer,
// send DONE, check and print the peer's data, and disconnect at once. A side that
// disconnects right after receiving DONE must not cause the peer's DONE (delivered) to be
// flushed: the responder ACKs a message before its receive completion is visible, and the
// peer's completion arrives before the DREQ. Every connection must succeed.
//
//   ack_order_cm_test [ack_order_disconnect] PORT [CONNECTIONS]     (default 50)
//
// The server is a fork()ed child (rdma_cm is used only after the fork); every wait is
// bounded.
#define _GNU_SOURCE
#include <arpa/inet.h>
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

enum { kDataLen = 4096, kWaitMs = 10000 };
enum { kWrMsg = 1, kWrWrite = 2, kWrDone = 3, kWrRecv = 4 };
enum { kMsgBuffer = 1, kMsgDone = 2 };

static const char* g_role = "client";
static int g_conn = -1;

static void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ack_order_cm_test %s [connection %d]: FAILED: ", g_role, g_conn);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
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

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// The message both sides send twice: the buffer description, then DONE.
struct msg {
  uint32_t type;
  uint32_t rkey;
  uint64_t addr;
};

// One connection's resources on one side.
struct conn {
  struct rdma_cm_id* id;
  struct ibv_cq* cq;
  struct ibv_mr* mr;
  unsigned done;  // wr_ids completed (bit per wr_id)
  struct {
    struct msg send, recv[2];
    char data[kDataLen];  // the peer writes here
    char mine[kDataLen];  // what we write to the peer
  } buf;
};

static struct rdma_cm_event* expect_event(struct rdma_event_channel* ch, enum rdma_cm_event_type type) {
  struct pollfd p = {.fd = ch->fd, .events = POLLIN};
  REQUIRE(poll(&p, 1, kWaitMs) == 1, "no rdma_cm event within %d ms (waiting for %s)", kWaitMs, rdma_event_str(type));
  struct rdma_cm_event* e;
  REQUIRE(rdma_get_cm_event(ch, &e) == 0, "rdma_get_cm_event: %s", strerror(errno));
  REQUIRE(e->event == type, "expected %s, got %s (status %d)", rdma_event_str(type), rdma_event_str(e->event),
          e->status);
  return e;
}

static void ack_expected(struct rdma_event_channel* ch, enum rdma_cm_event_type type) {
  rdma_ack_cm_event(expect_event(ch, type));
}

// CQ, MR, QP on the id's device, and both receives posted before the connection exists.
static void conn_setup(struct conn* c, int side) {
  c->cq = ibv_create_cq(c->id->verbs, 16, NULL, NULL, 0);
  REQUIRE(c->cq, "ibv_create_cq: %s", strerror(errno));
  c->mr = ibv_reg_mr(c->id->pd, &c->buf, sizeof c->buf,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  REQUIRE(c->mr, "ibv_reg_mr: %s", strerror(errno));
  struct ibv_qp_init_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.send_cq = attr.recv_cq = c->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  REQUIRE(rdma_create_qp(c->id, c->id->pd, &attr) == 0, "rdma_create_qp: %s", strerror(errno));
  for (int i = 0; i < 2; i++) {
    struct ibv_sge sge = {(uintptr_t)&c->buf.recv[i], sizeof(struct msg), c->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = kWrRecv + (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad;
    REQUIRE(ibv_post_recv(c->id->qp, &wr, &bad) == 0, "ibv_post_recv");
  }
  for (int i = 0; i < kDataLen; i++) c->buf.mine[i] = (char)('a' + (i + g_conn + side) % 26);
}

static void conn_teardown(struct conn* c) {
  rdma_destroy_qp(c->id);
  ibv_dereg_mr(c->mr);
  ibv_destroy_cq(c->cq);
  rdma_destroy_id(c->id);
}

static void post(struct conn* c, uint64_t wr_id, enum ibv_wr_opcode op, void* addr, uint32_t len,
                 const struct msg* peer) {
  struct ibv_sge sge = {(uintptr_t)addr, len, c->mr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (peer) {
    wr.wr.rdma.remote_addr = peer->addr;
    wr.wr.rdma.rkey = peer->rkey;
  }
  REQUIRE(ibv_post_send(c->id->qp, &wr, &bad) == 0, "ibv_post_send");
}

// Polls until the completions named in `want` (bit per wr_id) have all arrived; each
// must be IBV_WC_SUCCESS. Completions that arrive early (the peer's DONE before our
// WRITE's completion) are remembered in c->done.
static void wait_completions(struct conn* c, unsigned want) {
  double deadline = now_ms() + kWaitMs;
  while ((c->done & want) != want) {
    struct ibv_wc wc;
    int n = ibv_poll_cq(c->cq, 1, &wc);
    REQUIRE(n >= 0, "ibv_poll_cq");
    if (n == 0) {
      REQUIRE(now_ms() < deadline, "completions 0x%x missing after %d ms", want & ~c->done, kWaitMs);
      continue;
    }
    REQUIRE(wc.status == IBV_WC_SUCCESS, "wr %llu completed with %s", (unsigned long long)wc.wr_id,
            ibv_wc_status_str(wc.status));
    REQUIRE(wc.wr_id < 32 && !(c->done & (1u << wc.wr_id)), "unexpected completion of wr %llu",
            (unsigned long long)wc.wr_id);
    c->done |= 1u << wc.wr_id;
  }
}

// The exchange, identical on both sides once the connection is established.
static void exchange(struct conn* c, int side) {
  c->buf.send = (struct msg){kMsgBuffer, c->mr->rkey, (uintptr_t)c->buf.data};
  post(c, kWrMsg, IBV_WR_SEND, &c->buf.send, sizeof c->buf.send, NULL);
  wait_completions(c, 1u << kWrMsg | 1u << kWrRecv);
  struct msg peer = c->buf.recv[0];
  REQUIRE(peer.type == kMsgBuffer, "first message of type %u", peer.type);
  post(c, kWrWrite, IBV_WR_RDMA_WRITE, c->buf.mine, kDataLen, &peer);
  wait_completions(c, 1u << kWrWrite);
  c->buf.send = (struct msg){kMsgDone, 0, 0};
  post(c, kWrDone, IBV_WR_SEND, &c->buf.send, sizeof c->buf.send, NULL);
  wait_completions(c, 1u << kWrDone | 1u << (kWrRecv + 1));
  REQUIRE(c->buf.recv[1].type == kMsgDone, "second message of type %u", c->buf.recv[1].type);
  // The peer's WRITE came before its DONE: its data is here.
  for (int i = 0; i < kDataLen; i++)
    REQUIRE(c->buf.data[i] == (char)('a' + (i + g_conn + !side) % 26), "peer's data wrong at byte %d", i);
  if (g_conn == 0) printf("%s: peer's data: %.26s...\n", g_role, c->buf.data);
}

// Disconnects at once and waits for DISCONNECTED (our DREQ answered, or the peer's).
static void disconnect(struct rdma_event_channel* ch, struct conn* c) {
  REQUIRE(rdma_disconnect(c->id) == 0 || errno == EINVAL, "rdma_disconnect: %s", strerror(errno));
  ack_expected(ch, RDMA_CM_EVENT_DISCONNECTED);
}

static struct sockaddr_in loopback(int port) {
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

static void server(int port, int connections, int ready_fd) {
  g_role = "server";
  alarm(300);  // never outlive a parent that failed
  struct rdma_event_channel* ch = rdma_create_event_channel();
  struct rdma_cm_id* listener;
  REQUIRE(ch && rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) == 0, "rdma_create_id: %s", strerror(errno));
  struct sockaddr_in a = loopback(port);
  REQUIRE(rdma_bind_addr(listener, (struct sockaddr*)&a) == 0, "rdma_bind_addr: %s", strerror(errno));
  REQUIRE(rdma_listen(listener, 4) == 0, "rdma_listen: %s", strerror(errno));
  REQUIRE(write(ready_fd, "r", 1) == 1, "pipe");
  for (g_conn = 0; g_conn < connections; g_conn++) {
    struct rdma_cm_event* e = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    struct conn c = {.id = e->id};
    rdma_ack_cm_event(e);
    conn_setup(&c, 1);
    struct rdma_conn_param param = {.responder_resources = 1, .initiator_depth = 1};
    REQUIRE(rdma_accept(c.id, &param) == 0, "rdma_accept: %s", strerror(errno));
    ack_expected(ch, RDMA_CM_EVENT_ESTABLISHED);
    exchange(&c, 1);
    disconnect(ch, &c);
    conn_teardown(&c);
  }
  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ch);
}

static void client_once(int port) {
  struct rdma_event_channel* ch = rdma_create_event_channel();
  struct conn c;
  memset(&c, 0, sizeof c);
  REQUIRE(ch && rdma_create_id(ch, &c.id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id: %s", strerror(errno));
  struct sockaddr_in a = loopback(port);
  REQUIRE(rdma_resolve_addr(c.id, NULL, (struct sockaddr*)&a, kWaitMs) == 0, "rdma_resolve_addr: %s", strerror(errno));
  ack_expected(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
  REQUIRE(rdma_resolve_route(c.id, kWaitMs) == 0, "rdma_resolve_route: %s", strerror(errno));
  ack_expected(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
  conn_setup(&c, 0);
  struct rdma_conn_param param = {
      .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7};
  REQUIRE(rdma_connect(c.id, &param) == 0, "rdma_connect: %s", strerror(errno));
  ack_expected(ch, RDMA_CM_EVENT_ESTABLISHED);
  exchange(&c, 0);
  disconnect(ch, &c);
  conn_teardown(&c);
  rdma_destroy_event_channel(ch);
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "ack_order_disconnect") == 0) {  // the case name is optional
    argc--;
    argv++;
  }
  if (argc < 2) {
    fprintf(stderr, "usage: ack_order_cm_test [ack_order_disconnect] PORT [CONNECTIONS]\n");
    return 2;
  }
  int port = atoi(argv[1]);
  int connections = argc > 2 ? atoi(argv[2]) : 50;
  setvbuf(stdout, NULL, _IOLBF, 0);
  int ready[2];
  REQUIRE(pipe(ready) == 0, "pipe");
  pid_t child = fork();
  REQUIRE(child >= 0, "fork");
  if (child == 0) {
    close(ready[0]);
    server(port, connections, ready[1]);
    exit(0);
  }
  close(ready[1]);
  struct pollfd p = {.fd = ready[0], .events = POLLIN};
  char r;
  if (poll(&p, 1, kWaitMs) != 1 || read(ready[0], &r, 1) != 1) {
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    fail("the server did not start listening");
  }
  for (g_conn = 0; g_conn < connections; g_conn++) {
    pid_t c = fork();  // each client connection is its own process, like the program people run
    REQUIRE(c >= 0, "fork");
    if (c == 0) {
      client_once(port);
      exit(0);
    }
    int status = 0;
    double deadline = now_ms() + 3 * kWaitMs;
    while (waitpid(c, &status, WNOHANG) == 0 && now_ms() < deadline) usleep(1000);
    if (now_ms() >= deadline) {
      kill(c, SIGKILL);
      waitpid(c, &status, 0);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      kill(child, SIGKILL);
      waitpid(child, NULL, 0);
      fail("the client of connection %d failed (status 0x%x)", g_conn, status);
    }
  }
  g_conn = -1;
  int status = 0;
  double deadline = now_ms() + kWaitMs;
  while (waitpid(child, &status, WNOHANG) == 0 && now_ms() < deadline) usleep(1000);
  if (now_ms() >= deadline) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
  }
  REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the server failed (status 0x%x)", status);
  printf("ack_order_cm_test: %d connections, all succeeded\n", connections);
  return 0;
}
