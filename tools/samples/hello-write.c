/* hello-write: the smallest RDMA WRITE. The server registers a buffer for remote writes;
 * both sides exchange QP number, PSN, GID and the buffer's address and rkey over TCP; the
 * client RDMA-WRITEs "hello from <host>" into the server's buffer and then tells the server
 * over the socket how many bytes it wrote; the server prints what landed. */
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

static const char kUsage[] =
    "usage: hello-write [--port P] [--timeout S] [SERVER_IP]\n"
    "  without SERVER_IP: server, waits for one client on TCP port P (default 7471)\n"
    "  with SERVER_IP:    client, RDMA-WRITEs \"hello from <host>\" into the server's buffer\n"
    "  --timeout S        bound on every wait (default 10 s)\n";

enum { kBufSize = 256 };

int main(int argc, char** argv) {
  sample_init(argc, argv, kUsage);
  long port = 7471;
  const char* server = NULL;
  for (int i = 1; i < argc; ++i) {
    if (opt_long(argc, argv, &i, "--port", 1, 65535, &port) || opt_timeout(argc, argv, &i)) continue;
    if (argv[i][0] == '-' || server) bad_arg(argv[i]);
    server = argv[i];
  }

  /* Device, PD, CQ, a buffer and an RC QP in INIT. */
  struct rc_dev dev;
  rc_dev_open(&dev, 16);
  char* buf = calloc(1, kBufSize);
  struct ibv_mr* mr = rc_reg(&dev, buf, kBufSize, IBV_ACCESS_REMOTE_WRITE);
  struct rc_info self, peer;
  struct ibv_qp* qp = rc_qp_create(&dev, 16, IBV_ACCESS_REMOTE_WRITE, &self);
  self.addr = (uintptr_t)buf;
  self.rkey = mr->rkey;
  self.len = kBufSize;

  /* Out of band: exchange QP information over TCP, then connect the QP. */
  int fd = server ? tcp_connect(server, (int)port) : tcp_accept_one((int)port);
  rc_info_send(fd, &self);
  rc_info_recv(fd, &peer);
  rc_qp_connect(&dev, qp, &self, &peer);
  tcp_sync(fd); /* both QPs are ready to receive */

  if (server) {
    /* Client: write the greeting into the server's buffer, wait for its completion,
     * then tell the server how many bytes landed. */
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    int len = snprintf(buf, kBufSize, "hello from %s (pid %d)", host, (int)getpid());
    if ((uint32_t)len + 1 > peer.len) die("the server's buffer (%u bytes) is too small", peer.len);
    post_rdma(qp, IBV_WR_RDMA_WRITE, mr, buf, (uint32_t)len + 1, peer.addr, peer.rkey, 0, 1);
    poll_one(dev.cq, "the RDMA WRITE");
    uint32_t n = htonl((uint32_t)len + 1);
    tcp_send(fd, &n, sizeof n);
    tcp_recv(fd, &n, sizeof n, "the server's acknowledgement");
    printf("wrote %d bytes: %s\n", len + 1, buf);
  } else {
    /* Server: the data arrives without any CPU involvement here; the client's message
     * on the socket says it is complete. */
    uint32_t n;
    tcp_recv(fd, &n, sizeof n, "the client's \"written\" message");
    n = ntohl(n);
    if (n == 0 || n > kBufSize || buf[n - 1] != '\0') die("the client reported %u bytes, buffer holds no string", n);
    printf("received: %s\n", buf);
    tcp_send(fd, &n, sizeof n);
  }

  close(fd);
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(dev.cq);
  ibv_dealloc_pd(dev.pd);
  ibv_close_device(dev.ctx);
  free(buf);
  return 0;
}
