/* rw-server: the server half of an RC RDMA READ / WRITE exchange (client: rw-client).
 * The TCP socket only bootstraps the QP (QPN, PSN, GID); the buffer descriptions go over
 * RC as SEND/RECV messages. --mode read: the client RDMA-READs this server's buffer.
 * --mode write: each side RDMA-WRITEs the other's buffer. A "done" SEND ends it; the
 * server then checks and prints what the client put in its buffer (write mode). */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

static const char kUsage[] =
    "usage: rw-server [--port P] [--mode read|write] [--timeout S]\n"
    "  waits for one rw-client on TCP port P (default 7472); --mode must match the client's\n"
    "  read:  the client RDMA-READs this server's buffer\n"
    "  write: client and server RDMA-WRITE each other's buffer\n"
    "  --timeout S  bound on every wait (default 10 s)\n";

enum { kSize = 4096 };
static const char kServerText[] = "data from rw-server";
static const char kClientText[] = "data from rw-client";

/* Everything this side registers: one MR. */
struct region {
  char exposed[kSize]; /* the peer reads or writes this */
  char source[kSize];  /* what we RDMA-WRITE into the peer's buffer */
  struct buf_desc desc_out, desc_in;
  char done_out[8], done_in[8];
};

int main(int argc, char** argv) {
  sample_init(argc, argv, kUsage);
  long port = 7472;
  const char* mode = "read";
  for (int i = 1; i < argc; ++i) {
    if (opt_long(argc, argv, &i, "--port", 1, 65535, &port) || opt_timeout(argc, argv, &i) ||
        opt_str(argc, argv, &i, "--mode", &mode))
      continue;
    bad_arg(argv[i]);
  }
  int write_mode = !strcmp(mode, "write");
  if (!write_mode && strcmp(mode, "read")) die("--mode must be read or write, got '%s'", mode);

  /* Resources: one region for data and messages, an RC QP in INIT. */
  struct rc_dev dev;
  rc_dev_open(&dev, 32);
  struct region* r = calloc(1, sizeof *r);
  struct ibv_mr* mr = rc_reg(&dev, r, sizeof *r, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
  struct rc_info self, peer;
  struct ibv_qp* qp = rc_qp_create(&dev, 16, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE, &self);
  if (write_mode)
    fill_pattern(r->source, kSize, kServerText, 2);
  else
    fill_pattern(r->exposed, kSize, kServerText, 2);

  /* Receives for the client's two messages (descriptor, done) go in before it can send. */
  post_recv(qp, mr, &r->desc_in, sizeof r->desc_in, 1);
  post_recv(qp, mr, r->done_in, sizeof r->done_in, 2);

  /* Bootstrap over TCP: QP information only. */
  int fd = tcp_accept_one((int)port);
  rc_info_send(fd, &self);
  rc_info_recv(fd, &peer);
  rc_qp_connect(&dev, qp, &self, &peer);
  tcp_sync(fd);

  /* Exchange buffer descriptions over RC: our SEND and the client's arrive in any order. */
  desc_pack(&r->desc_out, r->exposed, mr->rkey, kSize);
  post_send(qp, mr, &r->desc_out, sizeof r->desc_out, 3);
  poll_one(dev.cq, "the descriptor exchange");
  poll_one(dev.cq, "the descriptor exchange");
  struct buf_desc remote = desc_unpack(&r->desc_in);
  if (remote.len < kSize) die("the client's buffer is %u bytes, need %d", remote.len, kSize);

  if (write_mode) {
    post_rdma(qp, IBV_WR_RDMA_WRITE, mr, r->source, kSize, remote.addr, remote.rkey, 0, 4);
    poll_one(dev.cq, "the RDMA WRITE");
    memcpy(r->done_out, "done", 5);
    post_send(qp, mr, r->done_out, sizeof r->done_out, 5);
  }
  /* The client's "done" (and, in write mode, our own done's completion). */
  for (int pending = write_mode ? 2 : 1; pending > 0; --pending) poll_one(dev.cq, "the client's \"done\"");
  if (strcmp(r->done_in, "done")) die("unexpected message from the client instead of \"done\"");

  if (write_mode) {
    if (!check_pattern(r->exposed, kSize, kClientText, 1)) die("the client's RDMA WRITE left wrong data");
    printf("the client wrote %d bytes into my buffer: \"%s\" + pattern, all checked\n", kSize, r->exposed);
  } else {
    printf("the client read my %d-byte buffer (\"%s\" + pattern)\n", kSize, kServerText);
  }
  printf("rw-server: %s mode OK\n", mode);

  close(fd);
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(dev.cq);
  ibv_dealloc_pd(dev.pd);
  ibv_close_device(dev.ctx);
  free(r);
  return 0;
}
