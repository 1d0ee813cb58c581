// rdma_cm with AF_INET6 addresses, written against rdma-core's public
// <rdma/rdma_cma.h> and linked with -lrdmacm -libverbs, so it runs unchanged on
// rxe or hardware with IPv6 GIDs; under `uroce run` it exercises uroce.
//
//   cm_ipv6_test CASE PORT      (cm_ipv6_test --list prints the cases)
//
//   ipv6_connect       a listener bound to [::1]:PORT, a client resolving ::1: every
//                      address the ids report is AF_INET6 ::1, the route's GIDs and the
//                      QPs' address vectors name ::1's GID, a SEND each way arrives.
//   ipv6_dual_listener a listener on [::] takes an IPv4 client (its new id reports
//                      AF_INET addresses) and an IPv6 one (AF_INET6);
//   ipv6_afonly_listener bound with RDMA_OPTION_ID_AFONLY, the IPv6 one only.
//   ipv6_bad_input     an id bound to 127.0.0.1 cannot resolve ::1 (EINVAL); a
//                      link-local destination without its interface fails cleanly.
//   no_route           (run in a namespace without routes) a destination without a
//                      route, IPv6 and IPv4, fails rdma_resolve_addr at once with
//                      ENETUNREACH, as the kernel's rdma_resolve_ip.
//
// Two-sided cases fork: the child is the server. Every wait is bounded.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cm_test_util.h"

enum { kMsg = 64 };

static struct sockaddr_in6 addr6(const char* text, int port) {
  struct sockaddr_in6 a;
  memset(&a, 0, sizeof a);
  a.sin6_family = AF_INET6;
  a.sin6_port = htons((uint16_t)port);
  REQUIRE(inet_pton(AF_INET6, text, &a.sin6_addr) == 1, "inet_pton %s", text);
  return a;
}

static const struct in6_addr* in6_of(const struct sockaddr* sa) { return &((const struct sockaddr_in6*)sa)->sin6_addr; }

// The address `sa` must be AF_INET6 ::1.
static void expect_loopback6(const struct sockaddr* sa, const char* what) {
  REQUIRE(sa->sa_family == AF_INET6, "%s: family %d, not AF_INET6", what, sa->sa_family);
  REQUIRE(IN6_IS_ADDR_LOOPBACK(in6_of(sa)), "%s is not ::1", what);
}

static int is_loopback6_gid(const union ibv_gid* g) {
  static const uint8_t kLoopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return memcmp(g->raw, kLoopback, 16) == 0;
}

// The QP's address vector names ::1 (destination GID and its source GID).
static void expect_qp_on_loopback6(struct rdma_cm_id* id, const char* who) {
  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qi;
  REQUIRE(ibv_query_qp(id->qp, &qa, IBV_QP_AV, &qi) == 0, "%s: ibv_query_qp", who);
  REQUIRE(qa.ah_attr.is_global && is_loopback6_gid(&qa.ah_attr.grh.dgid), "%s: the QP's destination GID is not ::1",
          who);
  union ibv_gid sgid;
  REQUIRE(ibv_query_gid(id->verbs, 1, qa.ah_attr.grh.sgid_index, &sgid) == 0 && is_loopback6_gid(&sgid),
          "%s: the QP's source GID (index %u) is not ::1", who, qa.ah_attr.grh.sgid_index);
}

struct side {
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  struct ibv_mr* mr;
  char buf[2 * kMsg];
};

static void side_qp(struct side* s, struct rdma_cm_id* id) {
  s->pd = ibv_alloc_pd(id->verbs);
  s->cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
  s->mr = s->pd ? ibv_reg_mr(s->pd, s->buf, sizeof s->buf, IBV_ACCESS_LOCAL_WRITE) : NULL;
  REQUIRE(s->pd && s->cq && s->mr, "pd/cq/mr");
  struct ibv_qp_init_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.send_cq = attr.recv_cq = s->cq;
  attr.qp_type = IBV_QPT_RC;
  attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
  attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
  REQUIRE(rdma_create_qp(id, s->pd, &attr) == 0, "rdma_create_qp: %s", strerror(errno));
  struct ibv_sge sge = {(uintptr_t)s->buf, kMsg, s->mr->lkey};
  struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad;
  REQUIRE(ibv_post_recv(id->qp, &wr, &bad) == 0, "ibv_post_recv");
}

static void side_close(struct side* s, struct rdma_cm_id* id) {
  rdma_destroy_qp(id);
  ibv_dereg_mr(s->mr);
  ibv_destroy_cq(s->cq);
  ibv_dealloc_pd(s->pd);
}

static struct ibv_wc poll_one(struct ibv_cq* cq, int timeout_ms) {
  struct ibv_wc wc;
  double end = now_ms() + timeout_ms;
  int n;
  while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) REQUIRE(now_ms() < end, "no completion within %d ms", timeout_ms);
  REQUIRE(n == 1 && wc.status == IBV_WC_SUCCESS, "completion: %s", ibv_wc_status_str(wc.status));
  return wc;
}

static void send_text(struct side* s, struct rdma_cm_id* id, const char* text) {
  snprintf(s->buf + kMsg, kMsg, "%s", text);
  struct ibv_sge sge = {(uintptr_t)(s->buf + kMsg), kMsg, s->mr->lkey};
  struct ibv_send_wr wr = {.wr_id = 2,
                           .sg_list = &sge,
                           .num_sge = 1,
                           .opcode = IBV_WR_SEND,
                           .send_flags = IBV_SEND_SIGNALED},
                     *bad;
  REQUIRE(ibv_post_send(id->qp, &wr, &bad) == 0, "ibv_post_send");
}

// Waits for `n` completions, the RECV of `text` among them.
static void expect_text(struct side* s, const char* text, int n) {
  int recv = 0;
  for (int i = 0; i < n; i++)
    if (poll_one(s->cq, 5000).opcode == IBV_WC_RECV) recv = 1;
  REQUIRE(recv && strcmp(s->buf, text) == 0, "received '%.*s', expected '%s'", kMsg, s->buf, text);
}

// ---- ipv6_connect ----

static void connect_server(int ready_fd) {
  struct rdma_event_channel* ch = rdma_create_event_channel();
  struct rdma_cm_id* listen_id;
  REQUIRE(ch && rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
  struct sockaddr_in6 a = addr6("::1", atoi(g_port));
  REQUIRE(rdma_bind_addr(listen_id, (struct sockaddr*)&a) == 0, "rdma_bind_addr([::1]): %s", strerror(errno));
  expect_loopback6(rdma_get_local_addr(listen_id), "the listener's address");
  REQUIRE(rdma_listen(listen_id, 4) == 0, "rdma_listen: %s", strerror(errno));
  signal_peer(ready_fd);

  struct rdma_cm_event* e = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 10000);
  struct rdma_cm_id* id = e->id;
  REQUIRE(e->param.conn.private_data_len >= 4 && memcmp(e->param.conn.private_data, "six", 4) == 0,
          "private data not delivered");
  rdma_ack_cm_event(e);
  expect_loopback6(rdma_get_local_addr(id), "the new id's local address");
  expect_loopback6(rdma_get_peer_addr(id), "the new id's peer address");
  REQUIRE(id->verbs, "the new id has no device");
  struct side s;
  side_qp(&s, id);
  struct rdma_conn_param p = basic_param(NULL, 0);
  REQUIRE(rdma_accept(id, &p) == 0, "rdma_accept: %s", strerror(errno));
  ack_expected(ch, RDMA_CM_EVENT_ESTABLISHED, 5000);
  expect_qp_on_loopback6(id, "server");
  expect_text(&s, "hello over ::1", 1);
  send_text(&s, id, "reply over ::1");
  poll_one(s.cq, 5000);
  ack_expected(ch, RDMA_CM_EVENT_DISCONNECTED, 10000);
  side_close(&s, id);
  rdma_destroy_id(id);
  rdma_destroy_id(listen_id);
  rdma_destroy_event_channel(ch);
}

static void case_ipv6_connect(void) {
  int fds[2];
  REQUIRE(pipe(fds) == 0, "pipe");
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    close(fds[0]);
    connect_server(fds[1]);
    exit(0);
  }
  close(fds[1]);
  wait_peer(fds[0], 10000);

  struct rdma_event_channel* ch = rdma_create_event_channel();
  struct rdma_cm_id* id;
  REQUIRE(ch && rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
  struct sockaddr_in6 dst = addr6("::1", atoi(g_port));
  REQUIRE(rdma_resolve_addr(id, NULL, (struct sockaddr*)&dst, 2000) == 0, "rdma_resolve_addr(::1): %s",
          strerror(errno));
  ack_expected(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 3000);
  REQUIRE(id->verbs, "no device after ADDR_RESOLVED");
  expect_loopback6(rdma_get_local_addr(id), "the client's local address");
  expect_loopback6(rdma_get_peer_addr(id), "the client's peer address");
  REQUIRE(is_loopback6_gid(&id->route.addr.addr.ibaddr.sgid) && is_loopback6_gid(&id->route.addr.addr.ibaddr.dgid),
          "route GIDs are not ::1");
  REQUIRE(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route: %s", strerror(errno));
  ack_expected(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 3000);
  REQUIRE(id->route.num_paths == 1 && is_loopback6_gid(&id->route.path_rec->sgid) &&
              is_loopback6_gid(&id->route.path_rec->dgid),
          "path record GIDs are not ::1");
  struct side s;
  side_qp(&s, id);
  struct rdma_conn_param p = basic_param("six", 4);
  REQUIRE(rdma_connect(id, &p) == 0, "rdma_connect: %s", strerror(errno));
  ack_expected(ch, RDMA_CM_EVENT_ESTABLISHED, 5000);
  expect_qp_on_loopback6(id, "client");
  send_text(&s, id, "hello over ::1");
  expect_text(&s, "reply over ::1", 2);
  printf("ipv6_connect: connected over [::1]:%s, a SEND each way\n", g_port);
  REQUIRE(rdma_disconnect(id) == 0, "rdma_disconnect");
  ack_expected(ch, RDMA_CM_EVENT_DISCONNECTED, 5000);
  side_close(&s, id);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
  expect_child_ok(pid);
}

// ---- ipv6_dual_listener ----

enum { kRejectedByConsumer = 28 };  // IB CM REJ reason: the listener's rdma_reject (no listener: 8)

// A client that connects to `dst`: the REJECTED event's status (the IB CM
// reason), or -1 for anything else.
static int dual_client(const struct sockaddr* dst) {
  struct rdma_event_channel* ch = rdma_create_event_channel();
  struct rdma_cm_id* id;
  REQUIRE(ch && rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
  int result = -1;
  if (rdma_resolve_addr(id, NULL, (struct sockaddr*)dst, 2000) == 0) {
    struct rdma_cm_event* e = next_event(ch, 5000);
    int ok = e->event == RDMA_CM_EVENT_ADDR_RESOLVED;
    rdma_ack_cm_event(e);
    if (ok && rdma_resolve_route(id, 2000) == 0) {
      e = next_event(ch, 5000);
      ok = e->event == RDMA_CM_EVENT_ROUTE_RESOLVED;
      rdma_ack_cm_event(e);
      struct side s;
      if (ok) side_qp(&s, id);
      struct rdma_conn_param p = basic_param(NULL, 0);
      if (ok && rdma_connect(id, &p) == 0) {
        e = next_event(ch, 10000);
        result = e->event == RDMA_CM_EVENT_REJECTED ? e->status : -1;
        rdma_ack_cm_event(e);
      }
      if (ok) side_close(&s, id);
    }
  }
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
  return result;
}

// The listener's side: every request is rejected after its addresses' family
// is checked against `families` (one letter per request: '4' or '6').
static void dual_server(int ready_fd, int afonly, const char* families) {
  struct rdma_event_channel* ch = rdma_create_event_channel();
  struct rdma_cm_id* listen_id;
  REQUIRE(ch && rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
  if (afonly) {
    int one = 1;
    REQUIRE(rdma_set_option(listen_id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof one) == 0,
            "rdma_set_option(AFONLY): %s", strerror(errno));
  }
  struct sockaddr_in6 any = addr6("::", atoi(g_port));
  REQUIRE(rdma_bind_addr(listen_id, (struct sockaddr*)&any) == 0, "rdma_bind_addr([::]): %s", strerror(errno));
  REQUIRE(rdma_listen(listen_id, 4) == 0, "rdma_listen: %s", strerror(errno));
  signal_peer(ready_fd);
  for (const char* f = families; *f; f++) {
    struct rdma_cm_event* e = expect_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 10000);
    int want = *f == '4' ? AF_INET : AF_INET6;
    REQUIRE(rdma_get_local_addr(e->id)->sa_family == want && rdma_get_peer_addr(e->id)->sa_family == want,
            "request %ld: addresses of family %d/%d, expected %d", (long)(f - families),
            rdma_get_local_addr(e->id)->sa_family, rdma_get_peer_addr(e->id)->sa_family, want);
    struct rdma_cm_id* id = e->id;
    rdma_ack_cm_event(e);
    REQUIRE(rdma_reject(id, NULL, 0) == 0, "rdma_reject");
    rdma_destroy_id(id);
  }
  // No other request (an IPv4 client of an AFONLY listener) may arrive.
  struct pollfd pf = {.fd = ch->fd, .events = POLLIN};
  REQUIRE(poll(&pf, 1, 500) == 0, "an unexpected rdma_cm event at the listener");
  rdma_destroy_id(listen_id);
  rdma_destroy_event_channel(ch);
}

static void dual_round(int afonly, const char* families) {
  int fds[2];
  REQUIRE(pipe(fds) == 0, "pipe");
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    close(fds[0]);
    dual_server(fds[1], afonly, families);
    exit(0);
  }
  close(fds[1]);
  wait_peer(fds[0], 10000);
  struct sockaddr_in v4 = loopback(atoi(g_port));
  struct sockaddr_in6 v6 = addr6("::1", atoi(g_port));
  int r4 = dual_client((struct sockaddr*)&v4);
  int r6 = dual_client((struct sockaddr*)&v6);
  REQUIRE(r6 == kRejectedByConsumer, "the IPv6 client was not rejected by the listener (result %d)", r6);
  if (afonly) {
    REQUIRE(r4 != kRejectedByConsumer, "an IPv4 client reached an AFONLY [::] listener");
  } else {
    REQUIRE(r4 == kRejectedByConsumer, "the IPv4 client was not rejected by the [::] listener (result %d)", r4);
  }
  expect_child_ok(pid);
  close(fds[0]);
}

// (One round per process: a child forked after the parent used rdma_cm
// cannot use it.)
static void case_ipv6_dual_listener(void) {
  dual_round(0, "46");
  printf("ipv6_dual_listener: [::] took an IPv4 (AF_INET) and an IPv6 (AF_INET6) client\n");
}

static void case_ipv6_afonly_listener(void) {
  dual_round(1, "6");
  printf("ipv6_afonly_listener: [::] with AFONLY took the IPv6 client only\n");
}

// ---- ipv6_bad_input ----

static void case_ipv6_bad_input(void) {
  struct rdma_event_channel* ch = rdma_create_event_channel();
  struct rdma_cm_id* id;
  REQUIRE(ch && rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
  struct sockaddr_in v4 = loopback(0);
  REQUIRE(rdma_bind_addr(id, (struct sockaddr*)&v4) == 0, "rdma_bind_addr(127.0.0.1)");
  struct sockaddr_in6 v6 = addr6("::1", atoi(g_port));
  errno = 0;
  REQUIRE(rdma_resolve_addr(id, NULL, (struct sockaddr*)&v6, 1000) == -1 && errno == EINVAL,
          "an id bound to 127.0.0.1 resolving ::1: errno %d, expected EINVAL", errno);
  rdma_destroy_id(id);

  // A link-local destination needs its interface (sin6_scope_id): without it
  // the address resolution fails, at once or by an ADDR_ERROR event.
  REQUIRE(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
  struct sockaddr_in6 ll = addr6("fe80::1", atoi(g_port));
  double t0 = now_ms();
  errno = 0;
  if (rdma_resolve_addr(id, NULL, (struct sockaddr*)&ll, 1000) == 0) {
    struct rdma_cm_event* e = next_event(ch, 5000);
    REQUIRE(e->event == RDMA_CM_EVENT_ADDR_ERROR && e->status < 0, "fe80::1 without a scope: %s (status %d)",
            rdma_event_str(e->event), e->status);
    printf("ipv6_bad_input: fe80::1 without a scope: ADDR_ERROR, status %d\n", e->status);
    rdma_ack_cm_event(e);
  } else {
    printf("ipv6_bad_input: fe80::1 without a scope: rdma_resolve_addr failed at once: %s\n", strerror(errno));
  }
  // Bounded by next_event's timeout; the time is a figure, not a check.
  printf("ipv6_bad_input: the failure took %.0f ms\n", now_ms() - t0);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
}

// ---- no_route ----

static void resolve_unroutable(const struct sockaddr* dst, const char* text) {
  struct rdma_event_channel* ch = rdma_create_event_channel();
  struct rdma_cm_id* id;
  REQUIRE(ch && rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
  double t0 = now_ms();
  errno = 0;
  int r = rdma_resolve_addr(id, NULL, (struct sockaddr*)dst, 2000);
  REQUIRE(r == -1 && errno == ENETUNREACH, "rdma_resolve_addr(%s) = %d, errno %d (%s), expected ENETUNREACH", text, r,
          errno, strerror(errno));
  // r == -1 already says it failed at once (synchronously); no event follows.
  double took = now_ms() - t0;
  struct pollfd pf = {.fd = ch->fd, .events = POLLIN};
  REQUIRE(poll(&pf, 1, 200) == 0, "an event after a failed rdma_resolve_addr");
  printf("no_route: %s: rdma_resolve_addr failed at once (%.0f ms): %s\n", text, took, strerror(errno));
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
}

static void case_no_route(void) {
  struct sockaddr_in6 v6 = addr6("fd99::1", atoi(g_port));
  resolve_unroutable((struct sockaddr*)&v6, "fd99::1");
  struct sockaddr_in v4 = loopback(atoi(g_port));
  v4.sin_addr.s_addr = inet_addr("10.99.0.1");
  resolve_unroutable((struct sockaddr*)&v4, "10.99.0.1");
}

int main(int argc, char** argv) {
  static const char* cases[] = {"ipv6_connect", "ipv6_dual_listener", "ipv6_afonly_listener", "ipv6_bad_input",
                                "no_route"};
  g_program = "cm_ipv6_test";
  if (argc == 2 && strcmp(argv[1], "--list") == 0) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) printf("%s\n", cases[i]);
    return 0;
  }
  if (argc != 3) {
    fprintf(stderr, "usage: cm_ipv6_test CASE PORT | --list\n");
    return 2;
  }
  g_case = argv[1];
  snprintf(g_port, sizeof g_port, "%s", argv[2]);
  // Without IPv6 on this host (no ::1) there is nothing to test: skipped.
  int probe = socket(AF_INET6, SOCK_DGRAM, 0);
  struct sockaddr_in6 lo6 = addr6("::1", 0);
  if (probe < 0 || bind(probe, (struct sockaddr*)&lo6, sizeof lo6) != 0) {
    printf("cm_ipv6_test %s: no IPv6 (::1) here: skipped\n", g_case);
    return 77;
  }
  close(probe);
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!strcmp(g_case, "ipv6_connect")) {
    case_ipv6_connect();
  } else if (!strcmp(g_case, "ipv6_dual_listener")) {
    case_ipv6_dual_listener();
  } else if (!strcmp(g_case, "ipv6_afonly_listener")) {
    case_ipv6_afonly_listener();
  } else if (!strcmp(g_case, "ipv6_bad_input")) {
    case_ipv6_bad_input();
  } else if (!strcmp(g_case, "no_route")) {
    case_no_route();
  } else {
    fprintf(stderr, "unknown case %s\n", g_case);
    return 2;
  }
  printf("cm_ipv6_test %s: passed\n", g_case);
  return 0;
}
