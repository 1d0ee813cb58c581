/* file-send: sends FILE to file-recv over RC. The TCP socket bootstraps the QP and tells
 * where the receiver's ring of chunk slots is; each chunk goes by RDMA WRITE with immediate
 * (the chunk's length) into the next slot, only while the receiver has granted a credit
 * (a zero-byte SEND per slot it has written out). A final SEND carries the size and the
 * FNV-1a 64 hash; the receiver's verdict comes back over the socket. */
#define _DEFAULT_SOURCE
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

static const char kUsage[] =
    "usage: file-send [--port P] [--timeout S] FILE SERVER_IP\n"
    "  sends FILE over RDMA to file-recv at SERVER_IP, TCP port P (default 7473)\n"
    "  --timeout S  bound on every wait (default 10 s)\n";

enum { kChunk = 64 * 1024, kMaxSlots = 64 };

struct trailer {
  uint64_t size;
  uint64_t hash;
};

int main(int argc, char** argv) {
  sample_init(argc, argv, kUsage);
  long port = 7473;
  const char *path = NULL, *server = NULL;
  for (int i = 1; i < argc; ++i) {
    if (opt_long(argc, argv, &i, "--port", 1, 65535, &port) || opt_timeout(argc, argv, &i)) continue;
    if (argv[i][0] == '-' || server) bad_arg(argv[i]);
    if (path)
      server = argv[i];
    else
      path = argv[i];
  }
  if (!path || !server) die("missing FILE or SERVER_IP (try --help)");
  FILE* in = fopen(path, "rb");
  struct stat st;
  if (!in || fstat(fileno(in), &st)) die("cannot read '%s': %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) die("cannot read '%s': %s", path, strerror(EISDIR));

  struct rc_dev dev;
  rc_dev_open(&dev, 2 * kMaxSlots + 4);
  char* ring = malloc((size_t)kChunk * kMaxSlots);
  struct trailer* tr = calloc(1, sizeof *tr);
  if (!ring || !tr) die("out of memory");
  struct ibv_mr* ring_mr = rc_reg(&dev, ring, (size_t)kChunk * kMaxSlots, 0);
  struct ibv_mr* tr_mr = rc_reg(&dev, tr, sizeof *tr, 0);
  struct rc_info self, peer;
  struct ibv_qp* qp = rc_qp_create(&dev, kMaxSlots + 2, 0, &self);
  /* Receives for the credits: zero-byte SENDs. */
  for (int i = 0; i < kMaxSlots; ++i) post_recv(qp, NULL, NULL, 0, 0);

  int fd = tcp_connect(server, (int)port);
  rc_info_send(fd, &self);
  rc_info_recv(fd, &peer);
  uint32_t slots = peer.len / kChunk;
  if (slots < 1 || slots > kMaxSlots) die("the receiver's ring (%u bytes) has no usable slot count", peer.len);
  rc_qp_connect(&dev, qp, &self, &peer);
  tcp_sync(fd);

  /* Send chunks while credits last; a slot of our ring is reused only once its previous
   * WRITE has completed. */
  uint64_t hash = FNV_INIT, size = 0, seq = 0, writes_done = 0;
  uint32_t credits = slots;
  for (int eof = 0; !eof;) {
    while (credits == 0 || writes_done + slots <= seq) {
      struct ibv_wc wc = poll_one(dev.cq, "a credit from the receiver");
      if (wc.opcode == IBV_WC_RECV) {
        ++credits;
        post_recv(qp, NULL, NULL, 0, 0);
      } else if (wc.opcode == IBV_WC_RDMA_WRITE) {
        ++writes_done;
      }
    }
    char* slot = ring + (size_t)(seq % slots) * kChunk;
    size_t n = fread(slot, 1, kChunk, in);
    if (ferror(in)) die("reading '%s': %s", path, strerror(errno));
    if (n == 0) break;
    eof = n < kChunk;
    hash = fnv1a64(hash, slot, n);
    size += n;
    post_rdma(qp, IBV_WR_RDMA_WRITE_WITH_IMM, ring_mr, slot, (uint32_t)n, peer.addr + (seq % slots) * (uint64_t)kChunk,
              peer.rkey, (uint32_t)n, 2);
    --credits;
    ++seq;
  }
  fclose(in);

  /* The trailer needs a credit too; then wait for it and every WRITE to complete. */
  while (credits == 0) {
    struct ibv_wc wc = poll_one(dev.cq, "a credit from the receiver");
    if (wc.opcode == IBV_WC_RECV) {
      ++credits;
      post_recv(qp, NULL, NULL, 0, 0);
    } else if (wc.opcode == IBV_WC_RDMA_WRITE) {
      ++writes_done;
    }
  }
  tr->size = htobe64(size);
  tr->hash = htobe64(hash);
  post_send(qp, tr_mr, tr, sizeof *tr, 3);
  for (int sent = 0; !sent || writes_done < seq;) {
    struct ibv_wc wc = poll_one(dev.cq, "the last WRITEs and the trailer");
    if (wc.opcode == IBV_WC_SEND) sent = 1;
    if (wc.opcode == IBV_WC_RDMA_WRITE) ++writes_done;
    if (wc.opcode == IBV_WC_RECV) post_recv(qp, NULL, NULL, 0, 0);
  }
  char verdict;
  tcp_recv(fd, &verdict, 1, "the receiver's verdict");
  if (verdict != 'Y') die("the receiver reports a checksum mismatch");
  printf("sent %s: %llu bytes in %llu chunks, fnv1a64 %016llx: receiver confirms the checksum\n", path,
         (unsigned long long)size, (unsigned long long)seq, (unsigned long long)hash);

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
