/* rw-client: the client half of an RC RDMA READ / WRITE exchange (server: rw-server).
 * The TCP socket only bootstraps the QP; buffer descriptions go over RC as SEND/RECV.
 * --mode read: RDMA-READ the server's buffer and check it. --mode write: RDMA-WRITE the
 * server's buffer while it writes ours, then check what it put here. A "done" SEND ends it. */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

static const char kUsage[] =
    "usage: rw-client [--port P] [--mode read|write] [--timeout S] SERVER_IP\n"
    "  connects to rw-server at SERVER_IP, TCP port P (default 7472); --mode must match the server's\n"
    "  read:  RDMA-READ the server's buffer and check it\n"
    "  write: RDMA-WRITE the server's buffer; the server writes ours\n"
    "  --timeout S  bound on every wait (default 10 s)\n";

enum { kSize = 4096 };
static const char kServerText[] = "data from rw-server";
static const char kClientText[] = "data from rw-client";

struct region {
  char exposed[kSize]; /* the server writes this (write mode); READ lands here (read mode) */
  char source[kSize];  /* what we RDMA-WRITE into the server's buffer */
  struct buf_desc desc_out, desc_in;
  char done_out[8], done_in[8];
};

int main(int argc, char** argv) {
  sample_init(argc, argv, kUsage);
  long port = 7472;
  const char *mode = "read", *server = NULL;
  for (int i = 1; i < argc; ++i) {
    if (opt_long(argc, argv, &i, "--port", 1, 65535, &port) || opt_timeout(argc, argv, &i) ||
        opt_str(argc, argv, &i, "--mode", &mode))
      continue;
    if (argv[i][0] == '-' || server) bad_arg(argv[i]);
    server = argv[i];
  }
  if (!server) die("missing SERVER_IP (try --help)");
  int write_mode = !strcmp(mode, "write");
  if (!write_mode && strcmp(mode, "read")) die("--mode must be read or write, got '%s'", mode);

  struct rc_dev dev;
  rc_dev_open(&dev, 32);
  struct region* r = calloc(1, sizeof *r);
  struct ibv_mr* mr = rc_reg(&dev, r, sizeof *r, IBV_ACCESS_REMOTE_WRITE);
  struct rc_info self, peer;
  struct ibv_qp* qp = rc_qp_create(&dev, 16, IBV_ACCESS_REMOTE_WRITE, &self);
  fill_pattern(r->source, kSize, kClientText, 1);

  post_recv(qp, mr, &r->desc_in, sizeof r->desc_in, 1);
  if (write_mode) post_recv(qp, mr, r->done_in, sizeof r->done_in, 2);

  int fd = tcp_connect(server, (int)port);
  rc_info_send(fd, &self);
  rc_info_recv(fd, &peer);
  rc_qp_connect(&dev, qp, &self, &peer);
  tcp_sync(fd);

  desc_pack(&r->desc_out, r->exposed, mr->rkey, kSize);
  post_send(qp, mr, &r->desc_out, sizeof r->desc_out, 3);
  poll_one(dev.cq, "the descriptor exchange");
  poll_one(dev.cq, "the descriptor exchange");
  struct buf_desc remote = desc_unpack(&r->desc_in);
  if (remote.len < kSize) die("the server's buffer is %u bytes, need %d", remote.len, kSize);

  if (write_mode) {
    post_rdma(qp, IBV_WR_RDMA_WRITE, mr, r->source, kSize, remote.addr, remote.rkey, 0, 4);
    poll_one(dev.cq, "the RDMA WRITE");
  } else {
    post_rdma(qp, IBV_WR_RDMA_READ, mr, r->exposed, kSize, remote.addr, remote.rkey, 0, 4);
    poll_one(dev.cq, "the RDMA READ");
  }
  memcpy(r->done_out, "done", 5);
  post_send(qp, mr, r->done_out, sizeof r->done_out, 5);
  for (int pending = write_mode ? 2 : 1; pending > 0; --pending) poll_one(dev.cq, "the server's \"done\"");
  if (write_mode && strcmp(r->done_in, "done")) die("unexpected message from the server instead of \"done\"");

  /* Same check both ways: the server's pattern is now in our buffer. */
  if (!check_pattern(r->exposed, kSize, kServerText, 2))
    die("%s", write_mode ? "the server's RDMA WRITE left wrong data" : "the RDMA READ returned wrong data");
  printf("%s %d bytes: \"%s\" + pattern, all checked\n", write_mode ? "the server wrote" : "read", kSize, r->exposed);
  printf("rw-client: %s mode OK\n", mode);

  close(fd);
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(dev.cq);
  ibv_dealloc_pd(dev.pd);
  ibv_close_device(dev.ctx);
  free(r);
  return 0;
}
