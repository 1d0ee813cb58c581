/* file-recv: receives a file from file-send over RC and writes it to OUTPUT. The sender
 * RDMA-WRITEs (with immediate: the chunk's length) each chunk into one slot of a ring this
 * side exposes; each chunk is written to OUTPUT, its slot handed back with a zero-byte
 * SEND (a credit: flow control). A final SEND carries the file's size and FNV-1a 64 hash,
 * checked here; the verdict goes back over the TCP socket that bootstrapped the QP. */
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

static const char kUsage[] =
    "usage: file-recv [--port P] [--timeout S] OUTPUT\n"
    "  waits for file-send on TCP port P (default 7473), receives one file over RDMA, checks its\n"
    "  FNV-1a 64 hash and writes it to OUTPUT\n"
    "  --timeout S  bound on every wait (default 10 s)\n";

enum { kChunk = 64 * 1024, kSlots = 8, kSqDepth = kSlots + 2 };

/* The final message: total size and hash, big-endian. */
struct trailer {
  uint64_t size;
  uint64_t hash;
};

int main(int argc, char** argv) {
  sample_init(argc, argv, kUsage);
  long port = 7473;
  const char* path = NULL;
  for (int i = 1; i < argc; ++i) {
    if (opt_long(argc, argv, &i, "--port", 1, 65535, &port) || opt_timeout(argc, argv, &i)) continue;
    if (argv[i][0] == '-' || path) bad_arg(argv[i]);
    path = argv[i];
  }
  if (!path) die("missing OUTPUT (try --help)");
  FILE* out = fopen(path, "wb");
  if (!out) die("cannot write '%s': %s", path, strerror(errno));

  /* The ring the sender writes into, the trailer buffer, an RC QP. */
  struct rc_dev dev;
  rc_dev_open(&dev, 2 * kSlots + 4);
  char* ring = malloc((size_t)kChunk * kSlots);
  struct trailer* tr = calloc(1, sizeof *tr);
  if (!ring || !tr) die("out of memory");
  struct ibv_mr* ring_mr = rc_reg(&dev, ring, (size_t)kChunk * kSlots, IBV_ACCESS_REMOTE_WRITE);
  struct ibv_mr* tr_mr = rc_reg(&dev, tr, sizeof *tr, 0);
  struct rc_info self, peer;
  struct ibv_qp* qp = rc_qp_create(&dev, kSqDepth, IBV_ACCESS_REMOTE_WRITE, &self);
  self.addr = (uintptr_t)ring;
  self.rkey = ring_mr->rkey;
  self.len = (uint32_t)kChunk * kSlots;
  /* One receive per slot: a WRITE with immediate consumes one (its data goes to the ring,
   * nothing to the trailer buffer); the trailer SEND uses the last credit. */
  for (int i = 0; i < kSlots; ++i) post_recv(qp, tr_mr, tr, sizeof *tr, 0);

  int fd = tcp_accept_one((int)port);
  rc_info_send(fd, &self);
  rc_info_recv(fd, &peer);
  rc_qp_connect(&dev, qp, &self, &peer);
  tcp_sync(fd);

  uint64_t hash = FNV_INIT, size = 0, chunks = 0;
  int finished = 0, sends_out = 0, credits_owed = 0;
  while (!finished || sends_out > 0) {
    struct ibv_wc wc = poll_one(dev.cq, finished ? "credit completions" : "the next chunk");
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      uint32_t len = ntohl(wc.imm_data);
      if (len == 0 || len > kChunk) die("bad chunk length %u from the sender", len);
      const char* slot = ring + (size_t)(chunks % kSlots) * kChunk;
      if (fwrite(slot, 1, len, out) != len) die("writing '%s': %s", path, strerror(errno));
      hash = fnv1a64(hash, slot, len);
      size += len;
      ++chunks;
      post_recv(qp, tr_mr, tr, sizeof *tr, 0);
      ++credits_owed;
    } else if (wc.opcode == IBV_WC_RECV) {
      finished = 1;
    } else if (wc.opcode == IBV_WC_SEND) {
      --sends_out;
    }
    /* Hand consumed slots back: a zero-byte SEND each, as many as the send queue takes. */
    for (; credits_owed > 0 && sends_out < kSqDepth; --credits_owed, ++sends_out) post_send(qp, NULL, NULL, 0, 1);
  }
  if (fclose(out)) die("writing '%s': %s", path, strerror(errno));

  uint64_t want_size = be64toh(tr->size), want_hash = be64toh(tr->hash);
  int ok = want_size == size && want_hash == hash;
  char verdict = ok ? 'Y' : 'N';
  tcp_send(fd, &verdict, 1);
  if (!ok)
    die("checksum mismatch: received %llu bytes, hash %016llx; sender says %llu bytes, hash %016llx",
        (unsigned long long)size, (unsigned long long)hash, (unsigned long long)want_size,
        (unsigned long long)want_hash);
  printf("received %llu bytes in %llu chunks into %s, fnv1a64 %016llx: checksum OK\n", (unsigned long long)size,
         (unsigned long long)chunks, path, (unsigned long long)hash);

  close(fd);
  ibv_destroy_qp(qp);
  ibv_dereg_mr(ring_mr);
  ibv_dereg_mr(tr_mr);
  ibv_destroy_cq(dev.cq);
  ibv_dealloc_pd(dev.pd);
  ibv_close_device(dev.ctx);
  free(ring);
  free(tr);
  return 0;
}
