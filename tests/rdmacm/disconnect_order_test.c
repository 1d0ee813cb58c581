// The seed sample's disconnect: a CM event is surfaced only after the
// data-path packets that arrived before it from that peer (no DISCONNECTED before the
// last completion). Each iteration, repeated over a new connection:
//   - the client connects (RC, 127.0.0.1:PORT) with its buffer's address and R_Key in
//     the private data, and a receive posted;
//   - the server RDMA-WRITEs into that buffer, then posts a signaled SEND;
//   - the client, as soon as the SEND's receive completion arrives, checks the written
//     data and disconnects at once (its responder ACKed the SEND before that);
//   - the server, as the sample: a CQ thread polls the send CQ for the SEND's completion
//     and disconnects on it, while the main thread waits for DISCONNECTED, then joins the
//     CQ thread and destroys QP, CQs and id.
// When the main thread has DISCONNECTED, the SEND's completion (IBV_WC_SUCCESS) must be
// there: the main thread raises a flag, and a CQ thread that sees the flag before the
// completion polls once more; an empty CQ then is an order violation (DISCONNECTED
// overtook the ACK). Nothing is destroyed before the CQ thread is joined, so a violation
// is reported, not a crash. The test fails on any violation or non-success completion.
//
//   disconnect_order_test [disconnect_order] PORT [ITERATIONS]     (default 500)
//
// The server is a fork()ed child (rdma_cm is used only after the fork); pipes pace the
// iterations; every wait is bounded.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>

#include "cm_test_util.h"

enum { kDataLen = 4096, kWaitMs = 10000, kReportedViolations = 10 };
enum { kWrWrite = 1, kWrSend = 2, kWrRecv = 3 };

// The client's connect private data: where the server writes.
struct buffer_desc {
  uint64_t addr;
  uint32_t rkey;
  uint32_t iteration;
};

static char pattern_byte(int iteration, int i) { return (char)('a' + (i + iteration) % 26); }

static pid_t g_server_pid;  // in the client (parent): the server to kill if we fail

static void kill_server(void) {
  if (g_server_pid > 0) {
    kill(g_server_pid, SIGKILL);
    waitpid(g_server_pid, NULL, 0);
  }
}

// ---- server ----

// One connection on the server. The CQ thread writes the outcome fields; the main
// thread reads them after joining it.
struct server_conn {
  int iteration;
  struct rdma_cm_id* id;
  struct ibv_cq* send_cq;
  struct ibv_cq* recv_cq;
  struct ibv_mr* mr;
  struct buffer_desc peer;
  atomic_int disconnected;  // set by the main thread once it has DISCONNECTED
  double disconnected_ms;   // when (now_ms), for the report
  struct {
    char data[kDataLen];  // written into the client's buffer
    uint32_t msg;         // the SEND: the iteration
  } buf;
  // Outcome, written by the CQ thread.
  int completed;              // the SEND's completion came (within kWaitMs)
  int violation;              // DISCONNECTED came first
  int at_last_poll;           // found by the poll after the flag (a close race)
  double late_ms;             // violation: how long after DISCONNECTED it came
  enum ibv_wc_status status;  // of the SEND's completion
  uint64_t wr_id;             // of the completion
  int disconnect_errno;       // of the CQ thread's rdma_disconnect (0: succeeded)
};

static void* cq_thread(void* arg) {
  struct server_conn* c = arg;
  double deadline = now_ms() + kWaitMs;
  for (;;) {
    // The flag is read before the poll: if it was up and the CQ is still empty, the
    // completion was not there when the main thread had DISCONNECTED.
    int disconnected = atomic_load_explicit(&c->disconnected, memory_order_acquire);
    struct ibv_wc wc;
    int n = ibv_poll_cq(c->send_cq, 1, &wc);
    if (n < 0) break;  // completed stays 0: reported by the main thread
    if (n == 1) {
      c->completed = 1;
      c->status = wc.status;
      c->wr_id = wc.wr_id;
      if (c->violation) {
        c->late_ms = now_ms() - c->disconnected_ms;
      } else if (disconnected) {
        c->at_last_poll = 1;
      }
      break;
    }
    if (disconnected && !c->violation) c->violation = 1;  // keep polling: how late, what status
    if (now_ms() > deadline) break;
  }
  // The sample: the CQ thread disconnects on the last completion (after DISCONNECTED
  // too: that sends the DREP).
  c->disconnect_errno = rdma_disconnect(c->id) == 0 ? 0 : errno;
  return NULL;
}

static void post_write_and_send(struct server_conn* c) {
  struct ibv_sge wsge = {(uintptr_t)c->buf.data, kDataLen, c->mr->lkey};
  struct ibv_sge ssge = {(uintptr_t)&c->buf.msg, sizeof c->buf.msg, c->mr->lkey};
  struct ibv_send_wr send, write, *bad;
  memset(&send, 0, sizeof send);
  send.wr_id = kWrSend;
  send.sg_list = &ssge;
  send.num_sge = 1;
  send.opcode = IBV_WR_SEND;
  send.send_flags = IBV_SEND_SIGNALED;
  memset(&write, 0, sizeof write);
  write.wr_id = kWrWrite;
  write.sg_list = &wsge;
  write.num_sge = 1;
  write.opcode = IBV_WR_RDMA_WRITE;  // unsignaled: the SEND's completion is the last one
  write.wr.rdma.remote_addr = c->peer.addr;
  write.wr.rdma.rkey = c->peer.rkey;
  write.next = &send;
  REQUIRE(ibv_post_send(c->id->qp, &write, &bad) == 0, "ibv_post_send: %s", strerror(errno));
}

// Accepts one connection: CONNECT_REQUEST (with the client's buffer), CQs, MR, QP,
// rdma_accept, ESTABLISHED.
static void server_accept_conn(struct rdma_event_channel* ch, struct server_conn* c) {
  struct rdma_cm_event* e = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, kWaitMs);
  c->id = e->id;
  REQUIRE(e->param.conn.private_data && e->param.conn.private_data_len >= sizeof c->peer,
          "CONNECT_REQUEST without the client's buffer (private data length %u)", e->param.conn.private_data_len);
  memcpy(&c->peer, e->param.conn.private_data, sizeof c->peer);
  rdma_ack_cm_event(e);
  REQUIRE(c->peer.iteration == (uint32_t)c->iteration, "CONNECT_REQUEST of iteration %u", c->peer.iteration);
  c->send_cq = ibv_create_cq(c->id->verbs, 4, NULL, NULL, 0);
  c->recv_cq = ibv_create_cq(c->id->verbs, 4, NULL, NULL, 0);
  REQUIRE(c->send_cq && c->recv_cq, "ibv_create_cq: %s", strerror(errno));
  for (int i = 0; i < kDataLen; i++) c->buf.data[i] = pattern_byte(c->iteration, i);
  c->buf.msg = (uint32_t)c->iteration;
  c->mr = ibv_reg_mr(c->id->pd, &c->buf, sizeof c->buf, IBV_ACCESS_LOCAL_WRITE);
  REQUIRE(c->mr, "ibv_reg_mr: %s", strerror(errno));
  struct ibv_qp_init_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.send_cq = c->send_cq;
  attr.recv_cq = c->recv_cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  REQUIRE(rdma_create_qp(c->id, c->id->pd, &attr) == 0, "rdma_create_qp: %s", strerror(errno));
  struct rdma_conn_param p = basic_param(NULL, 0);
  REQUIRE(rdma_accept(c->id, &p) == 0, "rdma_accept: %s", strerror(errno));
  e = expect_event(ch, RDMA_CM_EVENT_ESTABLISHED, kWaitMs);
  REQUIRE(e->id == c->id, "ESTABLISHED for another id");
  rdma_ack_cm_event(e);
}

static void server_destroy_conn(struct server_conn* c) {
  rdma_destroy_qp(c->id);
  REQUIRE(rdma_destroy_id(c->id) == 0, "rdma_destroy_id: %s", strerror(errno));
  ibv_dereg_mr(c->mr);
  ibv_destroy_cq(c->send_cq);
  ibv_destroy_cq(c->recv_cq);
}

// Returns the process's exit status: 0 when every iteration kept the order and
// completed successfully.
static int server(int iterations, int ready_fd) {
  g_case = "server";
  struct rdma_event_channel* ch = rdma_create_event_channel();
  REQUIRE(ch, "rdma_create_event_channel: %s", strerror(errno));
  struct rdma_cm_id* listener;
  REQUIRE(rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) == 0, "rdma_create_id: %s", strerror(errno));
  struct sockaddr_in a = loopback(atoi(g_port));
  REQUIRE(rdma_bind_addr(listener, (struct sockaddr*)&a) == 0, "rdma_bind_addr: %s", strerror(errno));
  REQUIRE(rdma_listen(listener, 4) == 0, "rdma_listen: %s", strerror(errno));
  signal_peer(ready_fd);

  int violations = 0, failed = 0, at_last_poll = 0;
  double t0 = now_ms();
  static struct server_conn c;  // static: its buffer is registered memory
  for (int it = 0; it < iterations; it++) {
    memset(&c, 0, sizeof c);
    c.iteration = it;
    server_accept_conn(ch, &c);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, cq_thread, &c) == 0, "pthread_create");
    post_write_and_send(&c);

    struct rdma_cm_event* e = next_event(ch, kWaitMs);
    c.disconnected_ms = now_ms();
    atomic_store_explicit(&c.disconnected, 1, memory_order_release);
    enum rdma_cm_event_type type = e->event;
    int right_id = e->id == c.id;
    rdma_ack_cm_event(e);
    REQUIRE(pthread_join(t, NULL) == 0, "pthread_join");
    REQUIRE(type == RDMA_CM_EVENT_DISCONNECTED && right_id, "iteration %d: expected DISCONNECTED, got %s%s", it,
            rdma_event_str(type), right_id ? "" : " for another id");
    REQUIRE(c.completed, "iteration %d: no completion of the SEND within %d ms", it, kWaitMs);
    REQUIRE(c.wr_id == kWrSend, "iteration %d: completion of wr %llu", it, (unsigned long long)c.wr_id);
    REQUIRE(c.disconnect_errno == 0 || c.disconnect_errno == EINVAL, "iteration %d: rdma_disconnect: %s", it,
            strerror(c.disconnect_errno));
    if (c.violation && violations++ < kReportedViolations)
      printf("iteration %d: DISCONNECTED before the SEND's completion (%s, %.3f ms later)\n", it,
             ibv_wc_status_str(c.status), c.late_ms);
    if (c.status != IBV_WC_SUCCESS && failed++ < kReportedViolations)
      printf("iteration %d: the SEND completed with %s\n", it, ibv_wc_status_str(c.status));
    at_last_poll += c.at_last_poll;
    server_destroy_conn(&c);
    signal_peer(ready_fd);  // the client may connect again
  }
  printf("disconnect_order: %d iterations, %d violations, %d failed completions (%d found by the last poll), %.0f ms\n",
         iterations, violations, failed, at_last_poll, now_ms() - t0);
  rdma_destroy_id(listener);
  rdma_destroy_event_channel(ch);
  return violations || failed ? 1 : 0;
}

// ---- client ----

static void client_once(int iteration) {
  static struct {
    char data[kDataLen];  // the server writes here
    uint32_t msg;         // ... and SENDs here
  } buf;
  memset(&buf, 0, sizeof buf);
  struct async_client c;
  async_client_setup(&c, atoi(g_port));
  struct ibv_mr* mr = ibv_reg_mr(c.pd, &buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  REQUIRE(mr, "ibv_reg_mr: %s", strerror(errno));
  struct ibv_sge sge = {(uintptr_t)&buf.msg, sizeof buf.msg, mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = kWrRecv, .sg_list = &sge, .num_sge = 1}, *bad;
  REQUIRE(ibv_post_recv(c.id->qp, &wr, &bad) == 0, "ibv_post_recv: %s", strerror(errno));
  struct buffer_desc desc = {(uintptr_t)buf.data, mr->rkey, (uint32_t)iteration};
  struct rdma_conn_param p = basic_param(&desc, sizeof desc);
  REQUIRE(rdma_connect(c.id, &p) == 0, "rdma_connect: %s", strerror(errno));
  ack_expected(c.ch, RDMA_CM_EVENT_ESTABLISHED, kWaitMs);

  struct ibv_wc wc;
  double deadline = now_ms() + kWaitMs;
  int n;
  while ((n = ibv_poll_cq(c.cq, 1, &wc)) == 0) REQUIRE(now_ms() < deadline, "no SEND within %d ms", kWaitMs);
  REQUIRE(n == 1, "ibv_poll_cq");
  REQUIRE(wc.status == IBV_WC_SUCCESS && wc.wr_id == kWrRecv && wc.opcode == IBV_WC_RECV,
          "receive completion: %s (wr %llu, opcode %d)", ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id,
          (int)wc.opcode);
  REQUIRE(buf.msg == (uint32_t)iteration, "the SEND carries iteration %u", buf.msg);
  // The WRITE came before the SEND: its data is here.
  for (int i = 0; i < kDataLen; i++)
    REQUIRE(buf.data[i] == pattern_byte(iteration, i), "written data wrong at byte %d", i);
  // At once: our ACK of the SEND is on its way, the DREQ follows it.
  REQUIRE(rdma_disconnect(c.id) == 0, "rdma_disconnect: %s", strerror(errno));
  ack_expected(c.ch, RDMA_CM_EVENT_DISCONNECTED, kWaitMs);
  ibv_dereg_mr(mr);
  async_client_teardown(&c);
}

int main(int argc, char** argv) {
  g_program = "disconnect_order_test";
  if (argc > 1 && strcmp(argv[1], "disconnect_order") == 0) {  // the case name is optional
    argc--;
    argv++;
  }
  if (argc < 2 || argc > 3 || atoi(argv[1]) <= 0 || (argc == 3 && atoi(argv[2]) <= 0)) {
    fprintf(stderr, "usage: disconnect_order_test [disconnect_order] PORT [ITERATIONS]\n");
    return 2;
  }
  snprintf(g_port, sizeof g_port, "%s", argv[1]);
  int iterations = argc == 3 ? atoi(argv[2]) : 500;
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);

  int to_client[2];
  REQUIRE(pipe(to_client) == 0, "pipe");
  pid_t pid = fork();  // before any rdma_cm use: a forked child inherits no CM thread
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    close(to_client[0]);
    exit(server(iterations, to_client[1]));
  }
  close(to_client[1]);
  g_server_pid = pid;
  atexit(kill_server);  // a failing client takes the server with it
  g_case = "client";
  wait_peer(to_client[0], kWaitMs);  // listening
  for (int it = 0; it < iterations; it++) {
    client_once(it);
    wait_peer(to_client[0], kWaitMs);  // the server destroyed this connection
  }
  g_server_pid = 0;
  int status = reap(pid, kWaitMs);
  REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the server failed (status 0x%x)", status);
  return 0;
}
