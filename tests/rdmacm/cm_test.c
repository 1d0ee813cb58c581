// librdmacm behaviour, written against rdma-core's public <rdma/rdma_cma.h>
// and <rdma/rdma_verbs.h> and linked with -lrdmacm -libverbs, so it runs
// unchanged on rxe or hardware; under `uroce run` it exercises uroce.
//
//   cm_test CASE PORT      (cm_test --list prints the cases)
//
// Two-sided cases fork: the child is one side, the parent the other, each
// using rdma_cm only after the fork. Every wait is bounded.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cm_test_util.h"

static enum ibv_qp_type g_qp_type = IBV_QPT_RC;  // of the endpoint ping-pong

// ---- endpoint ping-pong: rdma_getaddrinfo + rdma_create_ep + rdma_get_request + rdma_verbs.h ----

enum { kMsgSize = 64, kPingPongs = 100 };
static const char kConnectData[] = "connect-private-data";
static const char kAcceptData[] = "accept-private-data";

static void ep_qp_attr(struct ibv_qp_init_attr* attr) {
  memset(attr, 0, sizeof *attr);
  attr->cap.max_send_wr = attr->cap.max_recv_wr = 4;
  attr->cap.max_send_sge = attr->cap.max_recv_sge = 1;
  attr->sq_sig_all = 1;
}

static void endpoint_server(int ready_fd) {
  struct rdma_addrinfo hints, *res;
  memset(&hints, 0, sizeof hints);
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  hints.ai_qp_type = g_qp_type;
  REQUIRE(rdma_getaddrinfo("127.0.0.1", g_port, &hints, &res) == 0, "server rdma_getaddrinfo: %s", strerror(errno));
  REQUIRE(res->ai_src_addr && res->ai_qp_type == (int)g_qp_type, "passive rdma_getaddrinfo without source address");
  struct ibv_qp_init_attr attr;
  ep_qp_attr(&attr);
  struct rdma_cm_id *listen_id, *id;
  REQUIRE(rdma_create_ep(&listen_id, res, NULL, &attr) == 0, "rdma_create_ep (passive): %s", strerror(errno));
  rdma_freeaddrinfo(res);
  REQUIRE(rdma_listen(listen_id, 1) == 0, "rdma_listen: %s", strerror(errno));
  REQUIRE(ntohs(rdma_get_src_port(listen_id)) == atoi(g_port), "listener port %u", ntohs(rdma_get_src_port(listen_id)));
  signal_peer(ready_fd);

  REQUIRE(rdma_get_request(listen_id, &id) == 0, "rdma_get_request: %s", strerror(errno));
  REQUIRE(id->verbs && id->pd && id->qp && id->qp->qp_type == g_qp_type, "new id without verbs/pd/qp");
  REQUIRE(id->event && id->event->event == RDMA_CM_EVENT_CONNECT_REQUEST, "no CONNECT_REQUEST on the new id");
  REQUIRE(id->event->listen_id == listen_id, "listen_id of CONNECT_REQUEST");
  REQUIRE(id->event->param.conn.private_data_len >= sizeof kConnectData &&
              memcmp(id->event->param.conn.private_data, kConnectData, sizeof kConnectData) == 0,
          "connect private data not delivered (len %u)", id->event->param.conn.private_data_len);
  REQUIRE(g_qp_type != IBV_QPT_RC ||
              (id->event->param.conn.initiator_depth == 1 && id->event->param.conn.responder_resources == 1),
          "CONNECT_REQUEST resources %u/%u", id->event->param.conn.responder_resources,
          id->event->param.conn.initiator_depth);
  REQUIRE(rdma_get_dst_port(id) != 0 && rdma_get_src_port(id) == rdma_get_src_port(listen_id), "new id ports");

  char* recv_buf = calloc(1, kMsgSize);
  char* send_buf = calloc(1, kMsgSize);
  struct ibv_mr* recv_mr = rdma_reg_msgs(id, recv_buf, kMsgSize);
  struct ibv_mr* send_mr = rdma_reg_msgs(id, send_buf, kMsgSize);
  REQUIRE(recv_mr && send_mr, "rdma_reg_msgs: %s", strerror(errno));
  REQUIRE(rdma_post_recv(id, NULL, recv_buf, kMsgSize, recv_mr) == 0, "rdma_post_recv: %s", strerror(errno));
  struct rdma_conn_param param;
  memset(&param, 0, sizeof param);
  param.private_data = kAcceptData;
  param.private_data_len = sizeof kAcceptData;
  param.responder_resources = 1;
  param.initiator_depth = 1;
  REQUIRE(rdma_accept(id, &param) == 0, "rdma_accept: %s", strerror(errno));

  struct ibv_wc wc;
  for (int i = 0; i < kPingPongs; i++) {
    REQUIRE(rdma_get_recv_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "server recv %d: %s", i,
            ibv_wc_status_str(wc.status));
    char expect[kMsgSize];
    snprintf(expect, sizeof expect, "ping %d", i);
    REQUIRE(strcmp(recv_buf, expect) == 0, "server got '%s', expected '%s'", recv_buf, expect);
    REQUIRE(rdma_post_recv(id, NULL, recv_buf, kMsgSize, recv_mr) == 0, "rdma_post_recv");
    snprintf(send_buf, kMsgSize, "pong %d", i);
    REQUIRE(rdma_post_send(id, NULL, send_buf, kMsgSize, send_mr, 0) == 0, "rdma_post_send: %s", strerror(errno));
    REQUIRE(rdma_get_send_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "server send %d", i);
  }
  // The client disconnects first: DISCONNECTED arrives on the new id's own
  // channel, and our rdma_disconnect answers it (synchronous: it waits for
  // that DISCONNECTED event).
  REQUIRE(rdma_disconnect(id) == 0, "server rdma_disconnect: %s", strerror(errno));
  REQUIRE(id->event && id->event->event == RDMA_CM_EVENT_DISCONNECTED, "server: no DISCONNECTED after disconnect");
  rdma_dereg_mr(recv_mr);
  rdma_dereg_mr(send_mr);
  free(recv_buf);
  free(send_buf);
  rdma_destroy_ep(id);
  rdma_destroy_ep(listen_id);
}

static void endpoint_client(void) {
  struct rdma_addrinfo hints, *res;
  memset(&hints, 0, sizeof hints);
  hints.ai_port_space = RDMA_PS_TCP;
  hints.ai_qp_type = g_qp_type;
  REQUIRE(rdma_getaddrinfo("127.0.0.1", g_port, &hints, &res) == 0, "client rdma_getaddrinfo: %s", strerror(errno));
  REQUIRE(res->ai_dst_addr && !(res->ai_flags & RAI_PASSIVE), "active rdma_getaddrinfo without destination");
  struct ibv_qp_init_attr attr;
  ep_qp_attr(&attr);
  struct rdma_cm_id* id;
  REQUIRE(rdma_create_ep(&id, res, NULL, &attr) == 0, "rdma_create_ep (active): %s", strerror(errno));
  rdma_freeaddrinfo(res);
  REQUIRE(id->verbs && id->pd && id->qp && id->send_cq && id->recv_cq, "active endpoint incomplete");
  REQUIRE(id->route.num_paths == 1 && id->route.path_rec, "no path record after route resolution");

  char* recv_buf = calloc(1, kMsgSize);
  char* send_buf = calloc(1, kMsgSize);
  struct ibv_mr* recv_mr = rdma_reg_msgs(id, recv_buf, kMsgSize);
  struct ibv_mr* send_mr = rdma_reg_msgs(id, send_buf, kMsgSize);
  REQUIRE(recv_mr && send_mr, "rdma_reg_msgs: %s", strerror(errno));
  REQUIRE(rdma_post_recv(id, NULL, recv_buf, kMsgSize, recv_mr) == 0, "rdma_post_recv: %s", strerror(errno));
  struct rdma_conn_param param;
  memset(&param, 0, sizeof param);
  param.private_data = kConnectData;
  param.private_data_len = sizeof kConnectData;
  param.responder_resources = 1;
  param.initiator_depth = 1;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  REQUIRE(rdma_connect(id, &param) == 0, "rdma_connect: %s", strerror(errno));
  REQUIRE(id->event && id->event->event == RDMA_CM_EVENT_ESTABLISHED, "no ESTABLISHED after rdma_connect");
  REQUIRE(id->event->param.conn.private_data_len >= sizeof kAcceptData &&
              memcmp(id->event->param.conn.private_data, kAcceptData, sizeof kAcceptData) == 0,
          "accept private data not delivered");
  REQUIRE(id->event->param.conn.qp_num != 0, "ESTABLISHED without the peer's QPN");

  struct ibv_wc wc;
  for (int i = 0; i < kPingPongs; i++) {
    snprintf(send_buf, kMsgSize, "ping %d", i);
    REQUIRE(rdma_post_send(id, NULL, send_buf, kMsgSize, send_mr, 0) == 0, "rdma_post_send: %s", strerror(errno));
    REQUIRE(rdma_get_send_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "client send %d: %s", i,
            ibv_wc_status_str(wc.status));
    REQUIRE(rdma_get_recv_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "client recv %d", i);
    char expect[kMsgSize];
    snprintf(expect, sizeof expect, "pong %d", i);
    REQUIRE(strcmp(recv_buf, expect) == 0, "client got '%s', expected '%s'", recv_buf, expect);
    REQUIRE(rdma_post_recv(id, NULL, recv_buf, kMsgSize, recv_mr) == 0, "rdma_post_recv");
  }
  REQUIRE(rdma_disconnect(id) == 0, "client rdma_disconnect: %s", strerror(errno));
  REQUIRE(id->event && id->event->event == RDMA_CM_EVENT_DISCONNECTED, "client: no DISCONNECTED after disconnect");
  rdma_dereg_mr(recv_mr);
  rdma_dereg_mr(send_mr);
  free(recv_buf);
  free(send_buf);
  rdma_destroy_ep(id);
}

static void case_endpoint_pingpong(void) {
  int fds[2];
  REQUIRE(pipe(fds) == 0, "pipe");
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    close(fds[0]);
    endpoint_server(fds[1]);
    exit(0);
  }
  close(fds[1]);
  wait_peer(fds[0], 10000);
  endpoint_client();
  expect_child_ok(pid);
}

// A listener's backlog (rdma_listen(id, 4)) bounds the connection requests the
// application has not retrieved, as the kernel's ucma does. Eight clients connect
// while the server retrieves nothing; then it finds exactly four CONNECT_REQUESTs.
// The other four REQs were dropped and their CMs send them again: all eight connect
// once the server accepts.
enum { kBacklog = 4, kBacklogClients = 8 };

// Waits until `want` of the clients are connected (ESTABLISHED), at most timeout_ms;
// returns how many are.
static int backlog_outcomes(struct async_client* c, int* outcome, int want, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  int done = 0;
  for (int i = 0; i < kBacklogClients; i++) done += outcome[i] != 0;
  while (done < want && now_ms() < deadline) {
    struct pollfd p[kBacklogClients];
    for (int i = 0; i < kBacklogClients; i++)
      p[i] = (struct pollfd){.fd = outcome[i] ? -1 : c[i].ch->fd, .events = POLLIN};
    if (poll(p, kBacklogClients, (int)(deadline - now_ms()) + 1) <= 0) continue;
    for (int i = 0; i < kBacklogClients; i++) {
      if (!(p[i].revents & POLLIN)) continue;
      struct rdma_cm_event* e = next_event(c[i].ch, 0);
      REQUIRE(e->event == RDMA_CM_EVENT_ESTABLISHED, "client %d: %s, status %d", i, rdma_event_str(e->event),
              e->status);
      outcome[i] = e->event;
      rdma_ack_cm_event(e);
      done++;
    }
  }
  return done;
}

static void case_backlog(void) {
  int to_child[2], to_parent[2];
  REQUIRE(pipe(to_child) == 0 && pipe(to_parent) == 0, "pipe");
  pid_t pid = fork();  // before any rdma_cm use
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    struct server s;
    server_listen_backlog(&s, kBacklog);
    signal_peer(to_parent[1]);
    wait_peer(to_child[0], 20000);  // every REQ has arrived (and the surplus was dropped)
    struct rdma_cm_id* ids[kBacklogClients];
    int queued = 0;
    for (struct pollfd p = {.fd = s.ch->fd, .events = POLLIN}; poll(&p, 1, 0) == 1;) {
      struct rdma_cm_event* e = expect_event(s.ch, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
      REQUIRE(queued < kBacklogClients, "more requests than clients");
      ids[queued++] = e->id;
      rdma_ack_cm_event(e);
    }
    printf("server: %d connection requests queued for backlog %d\n", queued, kBacklog);
    REQUIRE(queued == kBacklog, "%d requests queued, backlog %d", queued, kBacklog);
    for (int i = 0; i < queued; i++) {
      struct rdma_conn_param p = basic_param(NULL, 0);
      REQUIRE(rdma_accept(ids[i], &p) == 0, "rdma_accept: %s", strerror(errno));
    }
    int accepted = queued;
    while (accepted < kBacklogClients) {  // the dropped REQs come again
      struct rdma_cm_event* e = next_event(s.ch, 10000);
      if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
        ids[accepted++] = e->id;
        struct rdma_conn_param p = basic_param(NULL, 0);
        REQUIRE(rdma_accept(e->id, &p) == 0, "rdma_accept: %s", strerror(errno));
      }
      rdma_ack_cm_event(e);
    }
    wait_peer(to_child[0], 20000);  // the clients are done
    for (int i = 0; i < accepted; i++) rdma_destroy_id(ids[i]);
    server_close(&s);
    exit(0);
  }
  wait_peer(to_parent[0], 10000);
  struct async_client c[kBacklogClients];
  for (int i = 0; i < kBacklogClients; i++) {
    async_client_setup(&c[i], atoi(g_port));
    struct rdma_conn_param p = basic_param(NULL, 0);
    REQUIRE(rdma_connect(c[i].id, &p) == 0, "rdma_connect %d: %s", i, strerror(errno));
  }
  int outcome[kBacklogClients] = {0};  // 0 waiting, else the event that ended the wait
  usleep(200 * 1000);                  // the REQs have arrived; their first resend is due at 500 ms
  signal_peer(to_child[1]);
  double t0 = now_ms();
  int connected = backlog_outcomes(c, outcome, kBacklogClients, 10000);
  printf("client: %d connected in %.0f ms after the server drained its backlog\n", connected, now_ms() - t0);
  REQUIRE(connected == kBacklogClients, "%d connected, want %d", connected, kBacklogClients);
  signal_peer(to_child[1]);
  for (int i = 0; i < kBacklogClients; i++) {
    rdma_disconnect(c[i].id);
    async_client_teardown(&c[i]);
  }
  expect_child_ok(pid);
}

// Sets up a client on g_port, connects it (start time in *t0) and returns its
// first event, which the caller acknowledges.
static struct rdma_cm_event* connect_first_event(struct async_client* c, int timeout_ms, double* t0) {
  async_client_setup(c, atoi(g_port));
  struct rdma_conn_param p = basic_param(NULL, 0);
  *t0 = now_ms();
  REQUIRE(rdma_connect(c->id, &p) == 0, "rdma_connect: %s", strerror(errno));
  return next_event(c->ch, timeout_ms);
}

// A server that takes a connection request and returns from main without answering
// it: as the kernel's CM when a process's rdma_cm file closes, the CM's exit handler
// rejects it (consumer defined), and the client has REJECTED at once instead of waiting
// 60 s for a REP.
static void case_peer_exits(void) {
  int to_child[2];
  REQUIRE(pipe(to_child) == 0, "pipe");
  pid_t pid = fork();  // before any rdma_cm use
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    struct server s;
    server_listen(&s);
    signal_peer(to_child[1]);
    rdma_ack_cm_event(expect_event(s.ch, RDMA_CM_EVENT_CONNECT_REQUEST, 10000));
    exit(0);  // the request unanswered, the ids alive
  }
  wait_peer(to_child[0], 10000);
  struct async_client c;
  double t0;
  struct rdma_cm_event* e = connect_first_event(&c, 10000, &t0);
  printf("server exited: %s, status %d, after %.1f ms\n", rdma_event_str(e->event), e->status, now_ms() - t0);
  REQUIRE(e->event == RDMA_CM_EVENT_REJECTED && e->status == 28, "want REJECTED, status 28");
  rdma_ack_cm_event(e);
  async_client_teardown(&c);
  expect_child_ok(pid);
}

// Connecting to a port nobody listens on: REJECTED or UNREACHABLE after the 0.5 s grace,
// not the 60 s wait for a REP. The limit, 5 s, leaves room for a loaded machine (an ASan
// build under ctest -j2 once took over 1 s); the time is printed.
static void case_no_listener(void) {
  struct async_client c;
  double t0;
  struct rdma_cm_event* e = connect_first_event(&c, 5000, &t0);
  REQUIRE(e->event == RDMA_CM_EVENT_REJECTED || e->event == RDMA_CM_EVENT_UNREACHABLE,
          "expected REJECTED or UNREACHABLE, got %s", rdma_event_str(e->event));
  printf("no listener: %s, status %d, after %.1f ms\n", rdma_event_str(e->event), e->status, now_ms() - t0);
  rdma_ack_cm_event(e);
  async_client_teardown(&c);
}

// An address nobody answers: ADDR_ERROR with a negative status once the
// timeout has passed (with no route at all, rdma_resolve_addr fails at once).
// `addr` (cm_test addr_timeout PORT ADDR: IPv4, or IPv6 with %interface when
// link-local) names one whose route exists and whose next hop is silent
// (run_addr_timeout.sh makes them in a namespace): then the event is required.
// Without it, TEST-NET-2 198.51.100.77 (RFC 5737), never assigned. Resolution
// waits only for the route's next hop, as the kernel's rdma_resolve_addr for
// RoCE: behind a default gateway that answers ARP, the kernel too reports
// ADDR_RESOLVED; that is noted, not failed.
static void case_addr_timeout(const char* addr) {
  struct rdma_event_channel* ch = rdma_create_event_channel();
  struct rdma_cm_id* id;
  REQUIRE(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
  struct addrinfo hints = {.ai_flags = AI_NUMERICHOST, .ai_socktype = SOCK_STREAM}, *res;
  int gai = getaddrinfo(addr ? addr : "198.51.100.77", g_port, &hints, &res);
  REQUIRE(gai == 0, "getaddrinfo %s: %s", addr, gai_strerror(gai));
  double t0 = now_ms();
  int r = rdma_resolve_addr(id, NULL, res->ai_addr, 500);
  freeaddrinfo(res);
  if (r == 0) {
    struct rdma_cm_event* e = next_event(ch, 5000);
    double dt = now_ms() - t0;
    printf("unanswered address: %s, status %d, after %.1f ms\n", rdma_event_str(e->event), e->status, dt);
    if (e->event == RDMA_CM_EVENT_ADDR_RESOLVED && !addr) {
      printf("unanswered address: only the next hop must answer, and it did (as for the kernel's)\n");
    } else {
      REQUIRE(e->event == RDMA_CM_EVENT_ADDR_ERROR, "expected ADDR_ERROR, got %s", rdma_event_str(e->event));
      REQUIRE(e->status < 0, "ADDR_ERROR status %d", e->status);
      // A silent next hop (elsewhere an ICMP error may come sooner):
      if (addr) REQUIRE(e->status == -ETIMEDOUT && dt >= 450, "ADDR_ERROR status %d after %.1f ms", e->status, dt);
    }
    rdma_ack_cm_event(e);
  } else {
    REQUIRE(!addr, "rdma_resolve_addr %s failed at once: %s", addr, strerror(errno));
    printf("unanswered address: rdma_resolve_addr failed at once: %s\n", strerror(errno));
  }
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
}

// Private data over the IB CM limits is refused with EINVAL (56 on connect,
// 196 on accept, 148 on reject); data within them arrives intact.
static void case_private_data_limits(void) {
  int fds[2];
  REQUIRE(pipe(fds) == 0, "pipe");
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    close(fds[0]);
    struct rdma_event_channel* ch = rdma_create_event_channel();
    struct rdma_cm_id* listen_id;
    REQUIRE(rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    struct sockaddr_in a = loopback(atoi(g_port));
    REQUIRE(rdma_bind_addr(listen_id, (struct sockaddr*)&a) == 0, "rdma_bind_addr: %s", strerror(errno));
    // As the kernel's: a loopback address is "any address" to rdma_bind_addr.
    REQUIRE(!listen_id->verbs, "binding 127.0.0.1 attached a device (the kernel attaches none)");
    REQUIRE(rdma_listen(listen_id, 4) == 0, "rdma_listen");
    signal_peer(fds[1]);
    struct rdma_cm_event* e = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 10000);
    struct rdma_cm_id* id = e->id;
    REQUIRE(e->listen_id == listen_id && id != listen_id, "CONNECT_REQUEST ids");
    REQUIRE(id->verbs, "CONNECT_REQUEST's new id has no verbs context");
    REQUIRE(e->param.conn.private_data_len == 56, "REQ private data length %u, expected 56",
            e->param.conn.private_data_len);
    const uint8_t* pd = e->param.conn.private_data;
    for (int i = 0; i < 56; i++) REQUIRE(pd[i] == (uint8_t)(0xA0 + i), "REQ private data byte %d", i);
    uint8_t big[256];
    memset(big, 0x5A, sizeof big);
    struct rdma_conn_param p = basic_param(big, 197);
    REQUIRE(rdma_accept(id, &p) == -1 && errno == EINVAL, "rdma_accept with 197 bytes did not fail with EINVAL");
    REQUIRE(rdma_reject(id, big, 149) == -1 && errno == EINVAL, "rdma_reject with 149 bytes did not fail with EINVAL");
    for (int i = 0; i < 148; i++) big[i] = (uint8_t)i;
    REQUIRE(rdma_reject(id, big, 148) == 0, "rdma_reject with 148 bytes: %s", strerror(errno));
    rdma_ack_cm_event(e);
    rdma_destroy_id(id);
    rdma_destroy_id(listen_id);
    rdma_destroy_event_channel(ch);
    exit(0);
  }
  close(fds[1]);
  wait_peer(fds[0], 10000);
  struct async_client c;
  async_client_setup(&c, atoi(g_port));
  uint8_t data[64];
  for (int i = 0; i < 64; i++) data[i] = (uint8_t)(0xA0 + i);
  struct rdma_conn_param p = basic_param(data, 57);
  REQUIRE(rdma_connect(c.id, &p) == -1 && errno == EINVAL, "rdma_connect with 57 bytes did not fail with EINVAL");
  p.private_data_len = 56;
  REQUIRE(rdma_connect(c.id, &p) == 0, "rdma_connect with 56 bytes: %s", strerror(errno));
  struct rdma_cm_event* e = expect_event(c.ch, RDMA_CM_EVENT_REJECTED, 10000);
  REQUIRE(e->status == 28, "REJECTED status %d, expected 28 (consumer defined)", e->status);
  REQUIRE(e->param.conn.private_data_len == 148, "REJ private data length %u", e->param.conn.private_data_len);
  const uint8_t* rd = e->param.conn.private_data;
  for (int i = 0; i < 148; i++) REQUIRE(rd[i] == (uint8_t)i, "REJ private data byte %d", i);
  rdma_ack_cm_event(e);
  async_client_teardown(&c);
  expect_child_ok(pid);
}

// A client killed mid-connection: DISCONNECTED on the server within a few seconds.
static void case_peer_killed(void) {
  int to_child[2], to_parent[2];
  REQUIRE(pipe(to_child) == 0 && pipe(to_parent) == 0, "pipe");
  pid_t pid = fork();  // before any rdma_cm use: a forked child inherits no CM thread
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    wait_peer(to_child[0], 10000);
    struct async_client c;
    async_client_setup(&c, atoi(g_port));
    struct rdma_conn_param p = basic_param(NULL, 0);
    REQUIRE(rdma_connect(c.id, &p) == 0, "rdma_connect");
    ack_expected(c.ch, RDMA_CM_EVENT_ESTABLISHED, 10000);
    signal_peer(to_parent[1]);
    pause();  // until killed
    exit(0);
  }
  struct server s;
  server_listen(&s);
  signal_peer(to_child[1]);
  struct rdma_cm_id* id = server_accept(&s, 10000);
  wait_peer(to_parent[0], 10000);
  double t0 = now_ms();
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  ack_expected(s.ch, RDMA_CM_EVENT_DISCONNECTED, 5000);
  printf("peer killed: DISCONNECTED after %.1f ms\n", now_ms() - t0);
  rdma_disconnect(id);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  server_close(&s);
}

// A listener survives many connect/disconnect cycles without leaking fds.
static void case_cycles(int cycles) {
  int fds[2];
  REQUIRE(pipe(fds) == 0, "pipe");
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    close(fds[0]);
    struct server s;
    server_listen(&s);
    int fds_before = -1;
    long rss_before = -1;
    signal_peer(fds[1]);
    for (int i = 0; i < cycles; i++) {
      struct rdma_cm_id* id = server_accept(&s, 10000);
      ack_expected(s.ch, RDMA_CM_EVENT_DISCONNECTED, 10000);
      REQUIRE(rdma_disconnect(id) == 0, "server rdma_disconnect: %s", strerror(errno));
      rdma_destroy_qp(id);
      REQUIRE(rdma_destroy_id(id) == 0, "rdma_destroy_id");
      if (i == 9) {
        fds_before = open_fds();
        rss_before = rss_kib();
      }
    }
    int fds_after = open_fds();
    long rss_after = rss_kib();
    printf("server after 10 cycles: %d fds, %ld KiB; after %d: %d fds, %ld KiB\n", fds_before, rss_before, cycles,
           fds_after, rss_after);
    REQUIRE(fds_after <= fds_before + 2, "fd leak: %d -> %d", fds_before, fds_after);
    // Connection state is freed with its id; allow for allocator noise only.
    // (Under ASan/TSan, freed memory sits in the sanitizer's quarantine: RSS
    // says nothing about leaks there, and LeakSanitizer does that job.)
    REQUIRE(sanitizer_runtime() || rss_after - rss_before < 4096, "memory grows with connections: %ld -> %ld KiB",
            rss_before, rss_after);
    server_close(&s);
    exit(0);
  }
  close(fds[1]);
  wait_peer(fds[0], 10000);
  double t0 = now_ms();
  for (int i = 0; i < cycles; i++) {
    struct async_client c;
    async_client_setup(&c, atoi(g_port));
    struct rdma_conn_param p = basic_param(NULL, 0);
    REQUIRE(rdma_connect(c.id, &p) == 0, "rdma_connect");
    ack_expected(c.ch, RDMA_CM_EVENT_ESTABLISHED, 10000);
    REQUIRE(rdma_disconnect(c.id) == 0, "rdma_disconnect: %s", strerror(errno));
    ack_expected(c.ch, RDMA_CM_EVENT_DISCONNECTED, 10000);
    async_client_teardown(&c);
  }
  printf("%d connect/disconnect cycles in %.0f ms\n", cycles, now_ms() - t0);
  expect_child_ok(pid);
}

// QPs the application owns (not attached to the id): programmed with
// rdma_init_qp_attr, CONNECT_RESPONSE on the active side, rdma_establish.
static struct ibv_qp* own_qp(struct ibv_pd* pd, struct ibv_cq* cq) {
  struct ibv_qp_init_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.send_cq = attr.recv_cq = cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 2;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  struct ibv_qp* qp = ibv_create_qp(pd, &attr);
  REQUIRE(qp, "ibv_create_qp: %s", strerror(errno));
  return qp;
}

static void move_qp(struct rdma_cm_id* id, struct ibv_qp* qp, enum ibv_qp_state state) {
  struct ibv_qp_attr attr;
  int mask = 0;
  attr.qp_state = state;
  REQUIRE(rdma_init_qp_attr(id, &attr, &mask) == 0, "rdma_init_qp_attr(%d): %s", (int)state, strerror(errno));
  REQUIRE(ibv_modify_qp(qp, &attr, mask) == 0, "ibv_modify_qp to %d with the CM's attributes", (int)state);
}

static void case_external_qp(void) {
  int fds[2];
  REQUIRE(pipe(fds) == 0, "pipe");
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    close(fds[0]);
    struct rdma_event_channel* ch = rdma_create_event_channel();
    struct rdma_cm_id* listen_id;
    REQUIRE(rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
    struct sockaddr_in a = loopback(atoi(g_port));
    REQUIRE(rdma_bind_addr(listen_id, (struct sockaddr*)&a) == 0 && rdma_listen(listen_id, 1) == 0, "listen");
    signal_peer(fds[1]);
    struct rdma_cm_event* e = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 10000);
    struct rdma_cm_id* id = e->id;
    rdma_ack_cm_event(e);
    struct ibv_pd* pd = ibv_alloc_pd(id->verbs);
    struct ibv_cq* cq = ibv_create_cq(id->verbs, 4, NULL, NULL, 0);
    struct ibv_qp* qp = own_qp(pd, cq);
    move_qp(id, qp, IBV_QPS_INIT);
    move_qp(id, qp, IBV_QPS_RTR);
    move_qp(id, qp, IBV_QPS_RTS);
    uint64_t word = 0;
    struct ibv_mr* mr = ibv_reg_mr(pd, &word, sizeof word, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_sge sge = {.addr = (uintptr_t)&word, .length = sizeof word, .lkey = mr->lkey};
    struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad;
    REQUIRE(ibv_post_recv(qp, &rwr, &bad) == 0, "ibv_post_recv");
    struct rdma_conn_param p = basic_param(NULL, 0);
    p.qp_num = qp->qp_num;
    REQUIRE(rdma_accept(id, &p) == 0, "rdma_accept with qp_num: %s", strerror(errno));
    ack_expected(ch, RDMA_CM_EVENT_ESTABLISHED, 10000);
    struct ibv_wc wc;
    double end = now_ms() + 10000;
    int n;
    while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now_ms() < end) usleep(100);
    REQUIRE(n == 1 && wc.status == IBV_WC_SUCCESS && word == 0x1122334455667788ull, "no SEND over the QPs");
    ack_expected(ch, RDMA_CM_EVENT_DISCONNECTED, 10000);
    rdma_disconnect(id);
    ibv_destroy_qp(qp);
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    rdma_destroy_id(id);
    rdma_destroy_id(listen_id);
    rdma_destroy_event_channel(ch);
    exit(0);
  }
  close(fds[1]);
  wait_peer(fds[0], 10000);
  struct rdma_event_channel* ch = rdma_create_event_channel();
  struct rdma_cm_id* id;
  REQUIRE(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
  struct sockaddr_in dst = loopback(atoi(g_port));
  REQUIRE(rdma_resolve_addr(id, NULL, (struct sockaddr*)&dst, 2000) == 0, "rdma_resolve_addr");
  ack_expected(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 3000);
  REQUIRE(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
  ack_expected(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 3000);
  struct ibv_pd* pd = ibv_alloc_pd(id->verbs);
  struct ibv_cq* cq = ibv_create_cq(id->verbs, 4, NULL, NULL, 0);
  struct ibv_qp* qp = own_qp(pd, cq);
  move_qp(id, qp, IBV_QPS_INIT);
  struct ibv_qp_attr attr;
  int mask;
  attr.qp_state = IBV_QPS_RTR;
  REQUIRE(rdma_init_qp_attr(id, &attr, &mask) == -1 && errno == EINVAL, "RTR attributes before the REP");
  struct rdma_conn_param p = basic_param(NULL, 0);
  p.qp_num = qp->qp_num;
  REQUIRE(rdma_connect(id, &p) == 0, "rdma_connect with qp_num: %s", strerror(errno));
  struct rdma_cm_event* e = expect_event(ch, RDMA_CM_EVENT_CONNECT_RESPONSE, 10000);
  REQUIRE(e->param.conn.qp_num != 0 && e->param.conn.qp_num != qp->qp_num, "CONNECT_RESPONSE qp_num %u",
          e->param.conn.qp_num);
  rdma_ack_cm_event(e);
  move_qp(id, qp, IBV_QPS_RTR);
  move_qp(id, qp, IBV_QPS_RTS);
  REQUIRE(rdma_establish(id) == 0, "rdma_establish: %s", strerror(errno));
  uint64_t word = 0x1122334455667788ull;
  struct ibv_mr* mr = ibv_reg_mr(pd, &word, sizeof word, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_sge sge = {.addr = (uintptr_t)&word, .length = sizeof word, .lkey = mr->lkey};
  struct ibv_send_wr swr = {.wr_id = 2,
                            .sg_list = &sge,
                            .num_sge = 1,
                            .opcode = IBV_WR_SEND,
                            .send_flags = IBV_SEND_SIGNALED},
                     *bad;
  REQUIRE(ibv_post_send(qp, &swr, &bad) == 0, "ibv_post_send");
  struct ibv_wc wc;
  double end = now_ms() + 10000;
  int n;
  while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now_ms() < end) usleep(100);
  REQUIRE(n == 1 && wc.status == IBV_WC_SUCCESS, "SEND did not complete: %s", ibv_wc_status_str(wc.status));
  REQUIRE(rdma_disconnect(id) == 0, "rdma_disconnect");
  ack_expected(ch, RDMA_CM_EVENT_DISCONNECTED, 10000);
  expect_child_ok(pid);
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
}

// Event channel basics: a non-blocking fd gives EAGAIN; devices and event names.
static void case_channel_basics(void) {
  struct rdma_event_channel* ch = rdma_create_event_channel();
  REQUIRE(ch && ch->fd >= 0, "rdma_create_event_channel");
  int flags = fcntl(ch->fd, F_GETFL);
  REQUIRE(fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) == 0, "fcntl");
  struct rdma_cm_event* e;
  REQUIRE(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN, "non-blocking rdma_get_cm_event did not say EAGAIN");
  int n = 0;
  struct ibv_context** devs = rdma_get_devices(&n);
  REQUIRE(devs && n >= 1 && devs[0] && devs[n] == NULL, "rdma_get_devices: %d devices", n);
  rdma_free_devices(devs);
  REQUIRE(strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED") == 0, "rdma_event_str");
  REQUIRE(strcmp(rdma_event_str((enum rdma_cm_event_type)99), "UNKNOWN EVENT") == 0, "rdma_event_str(99)");
  struct rdma_cm_id* id;
  REQUIRE(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
  uint8_t tos = 32;
  REQUIRE(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos) == 0, "TOS option");
  uint8_t timeout = 16;
  REQUIRE(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof timeout) == 0,
          "ACK timeout option");
  struct sockaddr_in a = loopback(0);
  REQUIRE(rdma_bind_addr(id, (struct sockaddr*)&a) == 0, "bind to port 0");
  REQUIRE(rdma_get_src_port(id) != 0, "no port allocated by binding port 0");
  struct rdma_event_channel* ch2 = rdma_create_event_channel();
  REQUIRE(rdma_migrate_id(id, ch2) == 0 && id->channel == ch2, "rdma_migrate_id");
  REQUIRE(rdma_destroy_id(id) == 0, "rdma_destroy_id");
  rdma_destroy_event_channel(ch);
  rdma_destroy_event_channel(ch2);
  struct sockaddr_in bogus = loopback(1);
  bogus.sin_addr.s_addr = inet_addr("203.0.113.9");
  REQUIRE(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0, "synchronous rdma_create_id");
  REQUIRE(rdma_bind_addr(id, (struct sockaddr*)&bogus) == -1 && errno == EADDRNOTAVAIL,
          "binding a foreign address did not fail with EADDRNOTAVAIL (%s)", strerror(errno));
  rdma_destroy_id(id);
}

// ---- rdma_get_cm_event and signals ----
//
// librdmacm waits with a plain read() of the rdma_cm device: a signal whose
// handler lacks SA_RESTART ends the wait with -1/EINTR, one with SA_RESTART
// is handled and the wait goes on. A helper thread signals the main thread
// (pthread_kill, so that no other thread takes the signal) every 50 ms while
// it waits, so at least one signal lands during the blocking wait whatever
// the scheduling; after `event_after_ms` it makes an event arrive (an address
// resolution on the same channel), which bounds the wait if EINTR never comes.

static volatile sig_atomic_t g_signals;
static void count_signal(int sig) {
  (void)sig;
  g_signals = g_signals + 1;
}

struct signaller {
  pthread_t target;
  struct rdma_event_channel* ch;
  int event_after_ms;
  atomic_int done;  // the main thread's wait returned
  struct rdma_cm_id* id;
};

static void* signaller_main(void* arg) {
  struct signaller* s = arg;
  double start = now_ms();
  while (!atomic_load(&s->done) && now_ms() - start < s->event_after_ms) {
    pthread_kill(s->target, SIGUSR1);
    usleep(50 * 1000);
  }
  if (!atomic_load(&s->done)) {
    REQUIRE(rdma_create_id(s->ch, &s->id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id: %s", strerror(errno));
    struct sockaddr_in dst = loopback(atoi(g_port));  // nobody listens: resolves at once
    REQUIRE(rdma_resolve_addr(s->id, NULL, (struct sockaddr*)&dst, 2000) == 0, "rdma_resolve_addr: %s",
            strerror(errno));
  }
  return NULL;
}

// Waits in rdma_get_cm_event while signalled; returns its result, errno in *err.
static int wait_while_signalled(struct rdma_event_channel* ch, int restart, int event_after_ms,
                                struct rdma_cm_event** e, int* err, struct rdma_cm_id** helper_id) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = count_signal;
  sa.sa_flags = restart ? SA_RESTART : 0;
  sigemptyset(&sa.sa_mask);
  REQUIRE(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction");
  struct signaller s = {.target = pthread_self(), .ch = ch, .event_after_ms = event_after_ms};
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, signaller_main, &s) == 0, "pthread_create");
  int r = rdma_get_cm_event(ch, e);
  *err = errno;
  atomic_store(&s.done, 1);
  pthread_join(t, NULL);
  *helper_id = s.id;
  return r;
}

static void case_get_event_eintr(void) {
  struct rdma_event_channel* ch = rdma_create_event_channel();
  REQUIRE(ch, "rdma_create_event_channel: %s", strerror(errno));
  struct rdma_cm_event* e = NULL;
  struct rdma_cm_id* helper_id = NULL;
  int err = 0;
  g_signals = 0;
  int r = wait_while_signalled(ch, 0, 3000, &e, &err, &helper_id);
  REQUIRE(r == -1 && err == EINTR, "without SA_RESTART: rdma_get_cm_event returned %d (%s), expected -1/EINTR", r,
          r ? strerror(err) : rdma_event_str(e->event));
  REQUIRE(g_signals >= 1, "the handler did not run");
  printf("without SA_RESTART: -1/EINTR after %d signal(s)\n", (int)g_signals);

  g_signals = 0;
  r = wait_while_signalled(ch, 1, 300, &e, &err, &helper_id);
  REQUIRE(r == 0, "with SA_RESTART: rdma_get_cm_event returned -1 (%s), expected the event", strerror(err));
  REQUIRE(e->event == RDMA_CM_EVENT_ADDR_RESOLVED && e->id == helper_id, "with SA_RESTART: got %s",
          rdma_event_str(e->event));
  REQUIRE(g_signals >= 1, "the handler did not run");
  printf("with SA_RESTART: the wait went on through %d signal(s) and returned %s\n", (int)g_signals,
         rdma_event_str(e->event));
  rdma_ack_cm_event(e);
  REQUIRE(rdma_destroy_id(helper_id) == 0, "rdma_destroy_id");
  rdma_destroy_event_channel(ch);
}

// ---- get_event_cancel: a thread blocked in rdma_get_cm_event can be cancelled ----
// (pthread_cancel: glibc's forced unwind must pass through uroce's exception guard,
// as through librdmacm's C frames, instead of aborting the process.)

static atomic_int g_cancel_waiting;

static void* wait_cm_event(void* arg) {
  struct rdma_event_channel* ch = arg;
  struct rdma_cm_event* e = NULL;
  atomic_store(&g_cancel_waiting, 1);
  rdma_get_cm_event(ch, &e);  // no event will come: only the cancel ends it
  return NULL;
}

static void case_get_event_cancel(void) {
  struct rdma_event_channel* ch = rdma_create_event_channel();
  REQUIRE(ch, "rdma_create_event_channel: %s", strerror(errno));
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, wait_cm_event, ch) == 0, "pthread_create");
  while (!atomic_load(&g_cancel_waiting)) usleep(1000);
  usleep(200 * 1000);  // inside rdma_get_cm_event's read by now
  REQUIRE(pthread_cancel(t) == 0, "pthread_cancel");
  void* ret = NULL;
  REQUIRE(pthread_join(t, &ret) == 0 && ret == PTHREAD_CANCELED, "the thread did not end cancelled");
  printf("the thread blocked in rdma_get_cm_event ended PTHREAD_CANCELED\n");
  // The channel still delivers: an id on it resolves an address (nobody listens).
  struct rdma_cm_id* id = NULL;
  REQUIRE(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id: %s", strerror(errno));
  struct sockaddr_in dst = loopback(atoi(g_port));
  REQUIRE(rdma_resolve_addr(id, NULL, (struct sockaddr*)&dst, 2000) == 0, "rdma_resolve_addr: %s", strerror(errno));
  ack_expected(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 3000);
  printf("the channel delivered ADDR_RESOLVED after the cancel\n");
  REQUIRE(rdma_destroy_id(id) == 0, "rdma_destroy_id");
  rdma_destroy_event_channel(ch);
}

int main(int argc, char** argv) {
  static const char* cases[] = {"endpoint_pingpong",   "endpoint_pingpong_uc", "no_listener",      "addr_timeout",
                                "private_data_limits", "peer_killed",          "cycles_1000",      "channel_basics",
                                "external_qp",         "get_event_eintr",      "get_event_cancel", "backlog"};
  if (argc == 2 && strcmp(argv[1], "--list") == 0) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) printf("%s\n", cases[i]);
    return 0;
  }
  // addr_timeout takes an address nobody answers (see case_addr_timeout).
  if (argc != 3 && !(argc == 4 && !strcmp(argv[1], "addr_timeout"))) {
    fprintf(stderr, "usage: cm_test CASE PORT | cm_test addr_timeout PORT [ADDR] | --list\n");
    return 2;
  }
  g_case = argv[1];
  snprintf(g_port, sizeof g_port, "%s", argv[2]);
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!strcmp(g_case, "endpoint_pingpong")) {
    case_endpoint_pingpong();
  } else if (!strcmp(g_case, "endpoint_pingpong_uc")) {
    g_qp_type = IBV_QPT_UC;
    case_endpoint_pingpong();
  } else if (!strcmp(g_case, "no_listener")) {
    case_no_listener();
  } else if (!strcmp(g_case, "addr_timeout")) {
    case_addr_timeout(argc == 4 ? argv[3] : NULL);
  } else if (!strcmp(g_case, "private_data_limits")) {
    case_private_data_limits();
  } else if (!strcmp(g_case, "peer_killed")) {
    case_peer_killed();
  } else if (!strcmp(g_case, "cycles_1000")) {
    case_cycles(1000);
  } else if (!strcmp(g_case, "external_qp")) {
    case_external_qp();
  } else if (!strcmp(g_case, "get_event_eintr")) {
    case_get_event_eintr();
  } else if (!strcmp(g_case, "peer_exits")) {
    case_peer_exits();
  } else if (!strcmp(g_case, "backlog")) {
    case_backlog();
  } else if (!strcmp(g_case, "get_event_cancel")) {
    case_get_event_cancel();
  } else if (!strcmp(g_case, "channel_basics")) {
    case_channel_basics();
  } else {
    fprintf(stderr, "unknown case %s\n", g_case);
    return 2;
  }
  printf("cm_test %s: passed\n", g_case);
  return 0;
}
