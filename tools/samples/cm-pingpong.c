/* cm-pingpong: ping-pong over an RC connection set up with rdma_cm's endpoint API, as in
 * rdma-core's rdma_server.c / rdma_client.c. The server: rdma_getaddrinfo(RAI_PASSIVE),
 * rdma_create_ep, rdma_listen, rdma_get_request, rdma_reg_msgs, rdma_post_recv,
 * rdma_accept; the client: rdma_getaddrinfo, rdma_create_ep, rdma_connect. Then N
 * messages of S bytes go back and forth (rdma_post_send, rdma_get_send_comp,
 * rdma_get_recv_comp), every payload checked; both print the average round trip. */
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"

static const char kUsage[] =
    "usage: cm-pingpong [--port P] [--iters N] [--size S] [--timeout S] [SERVER_IP]\n"
    "  without SERVER_IP: server, listens (rdma_cm) on port P (default 7474)\n"
    "  with SERVER_IP:    client, N ping-pongs (default 1000) of S bytes (default 64, >= 16);\n"
    "                     the server learns N and S from the connect request\n"
    "  --bind ADDR        server: listen on ADDR only (default: all addresses)\n"
    "  --timeout S        bound on every wait (default 10 s)\n";

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* Waits for the completion of the last send / receive on ID (bounded by the watchdog). */
static void get_comp(struct rdma_cm_id* id, int send, long iter) {
  struct ibv_wc wc;
  watchdog_arm(send ? "a send completion" : "the peer's message");
  int n = send ? rdma_get_send_comp(id, &wc) : rdma_get_recv_comp(id, &wc);
  if (n != 1) die("rdma_get_%s_comp: %s", send ? "send" : "recv", strerror(errno));
  if (wc.status != IBV_WC_SUCCESS)
    die("%s %ld failed: %s", send ? "send" : "receive", iter, ibv_wc_status_str(wc.status));
}

int main(int argc, char** argv) {
  sample_init(argc, argv, kUsage);
  long port = 7474, iters = 1000, size = 64;
  const char *server_ip = NULL, *bind_addr = NULL;
  for (int i = 1; i < argc; ++i) {
    if (opt_long(argc, argv, &i, "--port", 1, 65535, &port) ||
        opt_long(argc, argv, &i, "--iters", 1, 100000000, &iters) ||
        opt_long(argc, argv, &i, "--size", 16, 1 << 20, &size) || opt_timeout(argc, argv, &i) ||
        opt_str(argc, argv, &i, "--bind", &bind_addr))
      continue;
    if (argv[i][0] == '-' || server_ip) bad_arg(argv[i]);
    server_ip = argv[i];
  }
  const int client = server_ip != NULL;
  char service[16];
  snprintf(service, sizeof service, "%ld", port);

  /* Address and endpoint: a passive one (listener) on the server, an active one, with its
   * route resolved, on the client. rdma_create_ep also creates the QP. */
  struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP, .ai_flags = client ? 0 : RAI_PASSIVE}, *res;
  watchdog_arm("address resolution");
  if (rdma_getaddrinfo(client ? server_ip : bind_addr, service, &hints, &res))
    die("rdma_getaddrinfo(%s): %s", client ? server_ip : (bind_addr ? bind_addr : "any"), strerror(errno));
  struct ibv_qp_init_attr attr = {.cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
                                  .sq_sig_all = 1};
  struct rdma_cm_id *listen_id = NULL, *id;
  if (rdma_create_ep(client ? &id : &listen_id, res, NULL, &attr)) die("rdma_create_ep: %s", strerror(errno));
  rdma_freeaddrinfo(res);
  if (!client) {
    if (rdma_listen(listen_id, 1)) die("rdma_listen on port %ld: %s", port, strerror(errno));
    printf("listening on port %ld\n", port);
    watchdog_arm("a connection request");
    /* The new connection's id comes with its own QP, made from the listener's attr. */
    if (rdma_get_request(listen_id, &id)) die("rdma_get_request: %s", strerror(errno));
    /* The client's connect request carries the message count and size. */
    uint32_t req[2];
    if (id->event->param.conn.private_data_len < sizeof req) die("connect request without count and size");
    memcpy(req, id->event->param.conn.private_data, sizeof req);
    iters = ntohl(req[0]);
    size = ntohl(req[1]);
    if (iters < 1 || size < 16 || size > 1 << 20) die("bad count %ld / size %ld from the client", iters, size);
  }

  /* Message buffers, registered for SEND/RECV, and the first receive before connecting. */
  char* send_buf = calloc(1, (size_t)size);
  char* recv_buf = calloc(1, (size_t)size);
  struct ibv_mr* send_mr = rdma_reg_msgs(id, send_buf, (size_t)size);
  struct ibv_mr* recv_mr = rdma_reg_msgs(id, recv_buf, (size_t)size);
  if (!send_buf || !recv_buf || !send_mr || !recv_mr) die("rdma_reg_msgs: %s", strerror(errno));
  if (rdma_post_recv(id, NULL, recv_buf, (size_t)size, recv_mr)) die("rdma_post_recv: %s", strerror(errno));

  watchdog_arm(client ? "the server to accept" : "the connection to be established");
  uint32_t req[2] = {htonl((uint32_t)iters), htonl((uint32_t)size)};
  struct rdma_conn_param param = {
      .private_data = req, .private_data_len = sizeof req, .retry_count = 7, .rnr_retry_count = 7};
  if (client ? rdma_connect(id, &param) : rdma_accept(id, NULL))
    die("%s: %s", client ? "rdma_connect" : "rdma_accept", strerror(errno));

  /* Ping-pong: the client sends "ping I" + pattern, the server checks it and answers with
   * "pong I" + pattern; the client checks the answer. */
  double t0 = now_us();
  for (long i = 0; i < iters; ++i) {
    char text[32], expect[32];
    snprintf(text, sizeof text, "%s %ld", client ? "ping" : "pong", i);
    snprintf(expect, sizeof expect, "%s %ld", client ? "pong" : "ping", i);
    if (client) {
      fill_pattern(send_buf, (size_t)size, text, (unsigned)i);
      if (rdma_post_send(id, NULL, send_buf, (size_t)size, send_mr, 0)) die("rdma_post_send: %s", strerror(errno));
      get_comp(id, 1, i);
      get_comp(id, 0, i);
    } else {
      get_comp(id, 0, i);
    }
    if (!check_pattern(recv_buf, (size_t)size, expect, (unsigned)i)) die("message %ld: wrong payload", i);
    if (i + 1 < iters && rdma_post_recv(id, NULL, recv_buf, (size_t)size, recv_mr))
      die("rdma_post_recv: %s", strerror(errno));
    if (!client) {
      fill_pattern(send_buf, (size_t)size, text, (unsigned)i);
      if (rdma_post_send(id, NULL, send_buf, (size_t)size, send_mr, 0)) die("rdma_post_send: %s", strerror(errno));
      get_comp(id, 1, i);
    }
  }
  double elapsed = now_us() - t0;
  printf("%ld ping-pongs of %ld bytes, payload checked: average round trip %.2f us\n", iters, size, elapsed / iters);

  watchdog_arm("the disconnection");
  rdma_disconnect(id);
  watchdog_arm(NULL);
  rdma_dereg_mr(send_mr);
  rdma_dereg_mr(recv_mr);
  free(send_buf);
  free(recv_buf);
  rdma_destroy_ep(id);
  if (listen_id) rdma_destroy_ep(listen_id);
  return 0;
}
