/* rc_stress: RC data-path stress through the public verbs API.
 *
 * One process, two RC sides on two contexts of the first device: A (requester) and B
 * (responder; it only posts receives). Until --mib MiB of payload have moved, A posts a
 * random mix of SEND, RDMA WRITE (A -> B) and RDMA READ (A <- B), each 1 B .. 1 MiB with
 * random gather/scatter lists of 1..max_sge segments at random unaligned offsets, keeping
 * up to kDepth WRs in flight. Each in-flight op owns slot (seq % kDepth) of a source and a
 * destination region on both sides, so ops never share memory. A's first PSN lies just
 * below 2^24, so the PSN wraps early in every run.
 *
 * Checked, failing (exit 1) with op number, opcode, size and offset on the first error:
 *  - every send WR completes exactly once, in posting order (wr_id = op number), with
 *    IBV_WC_SUCCESS, the right opcode and A's QP number; a READ with byte_len = size;
 *  - every SEND consumes B's receives in SEND order: IBV_WC_RECV, wr_id = op number,
 *    byte_len = size, IBV_WC_SUCCESS;
 *  - after each completion, every byte of the destination (B's slot for SEND/WRITE, A's
 *    for READ) equals the source, whose content depends on the op number (a stale or
 *    duplicate delivery does not match), receive bytes past the message end and all guard
 *    bytes around and between segments are untouched (the whole 2 MiB slot is checked);
 *  - each completion arrives within 30 s; at the end no extra completion shows up on
 *    either CQ and the guard zones around the regions are intact.
 *
 * Usage: rc_stress [--mib N] [--seed S] [--mtu BYTES]. Prints one summary line and exits 0
 * on success. --mtu 256 makes a 1 MiB READ 4096 responses, more than the requester's window
 * (1024): it is asked for in parts. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_pair.h"

enum {
  kDepth = 8,                         /* outstanding WRs on A's send queue */
  kMaxMsg = 1 << 20,                  /* largest message */
  kSlot = 2 << 20,                    /* one in-flight op's share of a region */
  kRegion = kDepth * kSlot,           /* source or destination region: 16 MiB */
  kZone = 4096,                       /* guard zone before and after the regions */
  kBufSize = 2 * kZone + 2 * kRegion, /* one registered buffer per side */
  kMinGap = 64,                       /* guard bytes at least around every segment */
  kMaxSge = 4,
  kPollMs = 30000,
  kGuard = 0xE7,
};

struct seg {
  uint32_t off, len; /* offset within a slot */
};
struct layout {
  int n;
  struct seg s[kMaxSge];
};
struct op {
  uint64_t seq;
  enum ibv_wr_opcode opcode;
  uint32_t size;
  struct layout local;  /* A: gather list (SEND, WRITE) or scatter list (READ) */
  struct layout remote; /* B: receive scatter list (SEND) or one range (WRITE, READ) */
};
struct side {
  struct vp_side vp;
  uint8_t* buf;
  struct ibv_mr* mr;
};

static struct side g_a, g_b;
static uint64_t g_seed;
static int g_max_sge, g_max_sge_rd;
static uint8_t g_expect[kMaxMsg]; /* the message of the op being filled or verified */
static uint8_t g_guard[kSlot];    /* kSlot guard bytes to compare with */

static uint8_t* src_slot(struct side* s, uint64_t seq) { return s->buf + kZone + (seq % kDepth) * kSlot; }
static uint8_t* dst_slot(struct side* s, uint64_t seq) { return s->buf + kZone + kRegion + (seq % kDepth) * kSlot; }
static uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }

static const char* op_name(enum ibv_wr_opcode op) {
  return op == IBV_WR_SEND ? "SEND" : op == IBV_WR_RDMA_WRITE ? "WRITE" : "READ";
}

/* Message content of op `seq`: pseudo-random, different for every op and seed. */
static void make_message(uint64_t seq, uint32_t size) {
  uint64_t st = g_seed * 0xD1B54A32D192ED03ull ^ (seq + 1) * 0x9E3779B97F4A7C15ull;
  for (uint32_t i = 0; i < size; i += 8) {
    uint64_t v = vp_rand(&st);
    uint32_t n = min_u32(8, size - i);
    memcpy(g_expect + i, &v, n);
  }
}

static void print_layout(const char* name, const struct layout* l) {
  printf("  %s:", name);
  for (int i = 0; i < l->n; i++) printf(" [slot offset %u, %u B]", l->s[i].off, l->s[i].len);
  printf("\n");
}

static void print_op(const struct op* o) {
  printf("  op %" PRIu64 " %s %u B, seed %" PRIu64 ", slot %u\n", o->seq, op_name(o->opcode), o->size, g_seed,
         (unsigned)(o->seq % kDepth));
  print_layout("A local ", &o->local);
  print_layout("B remote", &o->remote);
}

/* 1 B .. 1 MiB, skewed: a power of two 2^0..2^20 plus a random remainder below it. */
static uint32_t random_size(uint64_t* rng) {
  uint32_t k = (uint32_t)(vp_rand(rng) % 21);
  uint32_t size = (1u << k) + (uint32_t)(vp_rand(rng) % (1u << k));
  return min_u32(size, kMaxMsg);
}

/* `total` bytes split into 1..max_n segments of random lengths, placed in a slot in a
 * random order at random offsets with at least kMinGap guard bytes around each. */
static void random_layout(uint64_t* rng, struct layout* l, uint32_t total, int max_n) {
  int n = 1 + (int)(vp_rand(rng) % (uint64_t)max_n);
  if ((uint32_t)n > total) n = (int)total;
  uint32_t cut[kMaxSge + 1];
  cut[0] = 0;
  for (int i = 1; i < n; i++) { /* sorted distinct cut points in 1..total-1 */
    uint32_t c = 1 + (uint32_t)(vp_rand(rng) % (total - 1));
    int j = i;
    while (j > 1 && cut[j - 1] > c) cut[j] = cut[j - 1], j--;
    cut[j] = c;
  }
  int m = 1;
  for (int i = 1; i < n; i++)
    if (cut[i] != cut[m - 1]) cut[m++] = cut[i];
  n = m;
  cut[n] = total;
  int order[kMaxSge]; /* placement order in memory, a random permutation */
  for (int i = 0; i < n; i++) order[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(vp_rand(rng) % (uint64_t)(i + 1)), t = order[i];
    order[i] = order[j], order[j] = t;
  }
  uint32_t spare = (kSlot - total - (uint32_t)(n + 1) * kMinGap) / (uint32_t)(n + 1);
  uint32_t at = 0;
  l->n = n;
  for (int k = 0; k < n; k++) {
    struct seg* s = &l->s[order[k]];
    at += kMinGap + (uint32_t)(vp_rand(rng) % (spare + 1));
    s->off = at;
    s->len = cut[order[k] + 1] - cut[order[k]];
    at += s->len;
  }
}

static void plan_op(uint64_t* rng, uint64_t seq, struct op* o) {
  static const enum ibv_wr_opcode kOps[3] = {IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ};
  memset(o, 0, sizeof *o);
  o->seq = seq;
  o->opcode = kOps[vp_rand(rng) % 3];
  o->size = random_size(rng);
  random_layout(rng, &o->local, o->size, o->opcode == IBV_WR_RDMA_READ ? g_max_sge_rd : g_max_sge);
  if (o->opcode == IBV_WR_SEND) { /* a receive as large as the message, or larger */
    uint32_t extra = vp_rand(rng) % 4 == 0 ? 0 : (uint32_t)(vp_rand(rng) % (o->size / 4 + 256));
    random_layout(rng, &o->remote, o->size + extra, g_max_sge);
  } else {
    random_layout(rng, &o->remote, o->size, 1);
  }
}

/* Copies the message into the segments of `l` (in list order) inside `slot`. */
static void scatter_message(uint8_t* slot, const struct layout* l, uint32_t size) {
  uint32_t pos = 0;
  for (int i = 0; i < l->n && pos < size; i++) {
    uint32_t n = min_u32(l->s[i].len, size - pos);
    memcpy(slot + l->s[i].off, g_expect + pos, n);
    pos += n;
  }
}

static int to_sges(struct ibv_sge* sge, struct side* s, uint8_t* slot, const struct layout* l) {
  for (int i = 0; i < l->n; i++) {
    sge[i].addr = (uintptr_t)(slot + l->s[i].off);
    sge[i].length = l->s[i].len;
    sge[i].lkey = s->mr->lkey;
  }
  return l->n;
}

/* Fills the source, posts B's receive for a SEND, then A's signaled send WR. */
static int post_op(const struct op* o) {
  struct ibv_sge local[kMaxSge], remote[kMaxSge];
  make_message(o->seq, o->size);
  if (o->opcode == IBV_WR_RDMA_READ)
    scatter_message(src_slot(&g_b, o->seq), &o->remote, o->size);
  else
    scatter_message(src_slot(&g_a, o->seq), &o->local, o->size);
  uint8_t* a_slot = o->opcode == IBV_WR_RDMA_READ ? dst_slot(&g_a, o->seq) : src_slot(&g_a, o->seq);
  if (o->opcode == IBV_WR_SEND) {
    struct ibv_recv_wr rwr = {.wr_id = o->seq, .sg_list = remote, .num_sge = 0}, *bad_rwr = NULL;
    rwr.num_sge = to_sges(remote, &g_b, dst_slot(&g_b, o->seq), &o->remote);
    int rc = ibv_post_recv(g_b.vp.qp, &rwr, &bad_rwr);
    if (rc) {
      printf("rc_stress: FAIL ibv_post_recv on B: %s\n", strerror(rc));
      print_op(o);
      return -1;
    }
  }
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = o->seq;
  wr.sg_list = local;
  wr.num_sge = to_sges(local, &g_a, a_slot, &o->local);
  wr.opcode = o->opcode;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (o->opcode != IBV_WR_SEND) {
    uint8_t* b_slot = o->opcode == IBV_WR_RDMA_READ ? src_slot(&g_b, o->seq) : dst_slot(&g_b, o->seq);
    wr.wr.rdma.remote_addr = (uintptr_t)(b_slot + o->remote.s[0].off);
    wr.wr.rdma.rkey = g_b.mr->rkey;
  }
  int rc = ibv_post_send(g_a.vp.qp, &wr, &bad);
  if (rc) {
    printf("rc_stress: FAIL ibv_post_send on A: %s\n", strerror(rc));
    print_op(o);
  }
  return rc ? -1 : 0;
}

/* Index of the first byte where a and b differ (n if none). */
static uint32_t first_diff(const uint8_t* a, const uint8_t* b, uint32_t n) {
  uint32_t i = 0;
  while (i < n && a[i] == b[i]) i++;
  return i;
}

/* Compares `n` bytes at slot offset `off` with `want`; reports the first difference. */
static int check_range(const struct op* o, const char* where, const uint8_t* slot, uint32_t off, const uint8_t* want,
                       uint32_t n, const char* what) {
  if (n == 0 || memcmp(slot + off, want, n) == 0) return 0;
  uint32_t i = first_diff(slot + off, want, n);
  printf("rc_stress: FAIL op %" PRIu64
         " (%s, %u B): %s slot, %s: first bad byte at slot offset %u is 0x%02x, "
         "expected 0x%02x\n",
         o->seq, op_name(o->opcode), o->size, where, what, off + i, slot[off + i], want[i]);
  print_op(o);
  return -1;
}

/* Verifies the whole destination slot after `o` completed, then resets its segments to
 * guard bytes for the slot's next op. */
static int verify_slot(const struct op* o, const char* where, uint8_t* slot, const struct layout* l) {
  make_message(o->seq, o->size);
  uint32_t pos = 0;
  char what[64];
  for (int i = 0; i < l->n; i++) {
    uint32_t data = min_u32(l->s[i].len, o->size - pos);
    snprintf(what, sizeof what, "segment %d, message bytes %u..", i, pos);
    if (check_range(o, where, slot, l->s[i].off, g_expect + pos, data, what)) return -1;
    snprintf(what, sizeof what, "segment %d past the message end", i);
    if (check_range(o, where, slot, l->s[i].off + data, g_guard, l->s[i].len - data, what)) return -1;
    pos += data;
  }
  uint32_t at = 0; /* guards: the gaps between segments, in address order */
  for (;;) {
    const struct seg* next = NULL;
    for (int i = 0; i < l->n; i++)
      if (l->s[i].off >= at && (!next || l->s[i].off < next->off)) next = &l->s[i];
    uint32_t end = next ? next->off : kSlot;
    if (check_range(o, where, slot, at, g_guard, end - at, "guard bytes")) return -1;
    if (!next) break;
    at = next->off + next->len;
  }
  for (int i = 0; i < l->n; i++) memset(slot + l->s[i].off, kGuard, l->s[i].len);
  return 0;
}

static int poll_one(struct side* s, const char* name, const struct op* o, struct ibv_wc* wc) {
  int rc = vp_poll(s->vp.cq, wc, kPollMs);
  if (rc == 1) return 0;
  printf("rc_stress: FAIL %s's CQ: %s while waiting for op %" PRIu64 "\n", name,
         rc == 0 ? "no completion within 30 s" : "ibv_poll_cq error", o->seq);
  print_op(o);
  return -1;
}

static int check_wc(const struct op* o, const char* name, const struct ibv_wc* wc, enum ibv_wc_opcode opcode,
                    uint32_t qpn, int check_len) {
  if (wc->wr_id == o->seq && wc->status == IBV_WC_SUCCESS && wc->opcode == opcode && wc->qp_num == qpn &&
      (!check_len || wc->byte_len == o->size))
    return 0;
  printf("rc_stress: FAIL op %" PRIu64 " (%s, %u B): %s completion wr_id %" PRIu64 " (want %" PRIu64
         "), status %s, opcode %d (want %d), qp %u (want %u), byte_len %u\n",
         o->seq, op_name(o->opcode), o->size, name, wc->wr_id, o->seq, ibv_wc_status_str(wc->status), (int)wc->opcode,
         (int)opcode, wc->qp_num, qpn, wc->byte_len);
  print_op(o);
  return -1;
}

/* Waits for the oldest op's completion (and B's receive for a SEND) and verifies it. */
static int complete_op(const struct op* o) {
  struct ibv_wc wc;
  if (poll_one(&g_a, "A", o, &wc)) return -1;
  switch (o->opcode) {
    case IBV_WR_SEND:
      if (check_wc(o, "A send", &wc, IBV_WC_SEND, g_a.vp.qp->qp_num, 0)) return -1;
      if (poll_one(&g_b, "B", o, &wc) || check_wc(o, "B receive", &wc, IBV_WC_RECV, g_b.vp.qp->qp_num, 1)) return -1;
      return verify_slot(o, "B destination", dst_slot(&g_b, o->seq), &o->remote);
    case IBV_WR_RDMA_WRITE:
      if (check_wc(o, "A write", &wc, IBV_WC_RDMA_WRITE, g_a.vp.qp->qp_num, 0)) return -1;
      return verify_slot(o, "B destination", dst_slot(&g_b, o->seq), &o->remote);
    default:
      if (check_wc(o, "A read", &wc, IBV_WC_RDMA_READ, g_a.vp.qp->qp_num, 1)) return -1;
      return verify_slot(o, "A destination", dst_slot(&g_a, o->seq), &o->local);
  }
}

/* Device limits: max_sge (max_sge_rd for READ scatter lists) and READ credits. */
static int query_limits(struct vp_params* p) {
  int num = 0;
  struct ibv_device** list = ibv_get_device_list(&num);
  struct ibv_context* ctx = list && num > 0 ? ibv_open_device(list[0]) : NULL;
  if (list) ibv_free_device_list(list);
  struct ibv_device_attr attr;
  int rc = ctx ? ibv_query_device(ctx, &attr) : -1;
  if (ctx) ibv_close_device(ctx);
  if (rc) {
    printf("rc_stress: FAIL no RDMA device or ibv_query_device failed\n");
    return -1;
  }
  g_max_sge = attr.max_sge < kMaxSge ? attr.max_sge : kMaxSge;
  g_max_sge_rd = attr.max_sge_rd > 0 && attr.max_sge_rd < g_max_sge ? attr.max_sge_rd : g_max_sge;
  int rd = attr.max_qp_rd_atom < attr.max_qp_init_rd_atom ? attr.max_qp_rd_atom : attr.max_qp_init_rd_atom;
  p->rd_atomic = (uint8_t)(rd < 16 ? rd : 16);
  p->max_sge = (uint32_t)g_max_sge;
  return 0;
}

static int setup_side(struct side* s, const struct vp_params* p, uint32_t psn) {
  if (vp_open(&s->vp, p, psn)) return -1;
  s->buf = aligned_alloc(4096, kBufSize);
  if (!s->buf) return -1;
  memset(s->buf, kGuard, kBufSize);
  s->mr =
      ibv_reg_mr(s->vp.pd, s->buf, kBufSize, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!s->mr) printf("rc_stress: FAIL ibv_reg_mr of %d bytes\n", kBufSize);
  return s->mr ? 0 : -1;
}

static void teardown_side(struct side* s) {
  if (s->mr) ibv_dereg_mr(s->mr);
  vp_close(&s->vp);
  free(s->buf);
  memset(s, 0, sizeof *s);
}

/* After the run: no stray completion on either CQ, guard zones and destination regions
 * (reset after every op) hold nothing but guard bytes. */
static int final_checks(void) {
  struct side* sides[2] = {&g_a, &g_b};
  struct ibv_wc wc;
  for (int i = 0; i < 2; i++) {
    if (vp_poll(sides[i]->vp.cq, &wc, 100) != 0) {
      printf("rc_stress: FAIL extra completion on %s's CQ: wr_id %" PRIu64 ", status %s, opcode %d\n", i ? "B" : "A",
             wc.wr_id, ibv_wc_status_str(wc.status), (int)wc.opcode);
      return -1;
    }
    const uint8_t* b = sides[i]->buf;
    const uint8_t* parts[3] = {b, b + kZone + kRegion, b + kZone + 2 * kRegion};
    const uint32_t sizes[3] = {kZone, kRegion, kZone};
    for (int k = 0; k < 3; k++)
      for (uint32_t off = 0; off < sizes[k]; off += kSlot) {
        uint32_t n = min_u32(kSlot, sizes[k] - off);
        if (memcmp(parts[k] + off, g_guard, n) != 0) {
          printf("rc_stress: FAIL %s's buffer: guard byte overwritten at buffer offset %u\n", i ? "B" : "A",
                 (unsigned)(parts[k] - b) + off + first_diff(parts[k] + off, g_guard, n));
          return -1;
        }
      }
  }
  return 0;
}

/* The path MTU enum for `bytes` (256..4096), or 0. */
static enum ibv_mtu mtu_of(uint64_t bytes) {
  for (int m = IBV_MTU_256; m <= IBV_MTU_4096; ++m)
    if (bytes == 128u << m) return (enum ibv_mtu)m;
  return (enum ibv_mtu)0;
}

static int parse_args(int argc, char** argv, uint64_t* mib, enum ibv_mtu* mtu) {
  for (int i = 1; i < argc; i += 2) { /* options come in pairs: --mib N, --seed S, --mtu B */
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf(
          "usage: %s [--mib N] [--seed S] [--mtu BYTES]\n  RC SEND/WRITE/READ stress between two local QPs, "
          "every byte and completion verified (default: --mib 256 --seed 1 --mtu 4096)\n",
          argv[0]);
      exit(0);
    }
    char* end = NULL;
    int known = !strcmp(argv[i], "--mib") || !strcmp(argv[i], "--seed") || !strcmp(argv[i], "--mtu");
    uint64_t v = known && i + 1 < argc ? strtoull(argv[i + 1], &end, 0) : 0;
    if (!end || end == argv[i + 1] || *end || (!strcmp(argv[i], "--mtu") && !mtu_of(v))) {
      printf("rc_stress: bad argument '%s' (try --help)\n", argv[i]);
      return -1;
    }
    if (!strcmp(argv[i], "--mtu"))
      *mtu = mtu_of(v);
    else
      *(!strcmp(argv[i], "--mib") ? mib : &g_seed) = v;
  }
  return 0;
}

int main(int argc, char** argv) {
  uint64_t mib = 256;
  enum ibv_mtu mtu = IBV_MTU_4096;
  g_seed = 1;
  if (parse_args(argc, argv, &mib, &mtu)) return 1;
  setvbuf(stdout, NULL, _IOLBF, 0);
  memset(g_guard, kGuard, sizeof g_guard);

  struct vp_params p;
  vp_default_params(&p);
  p.mtu = mtu;
  p.sq_depth = 2 * kDepth;
  p.rq_depth = 2 * kDepth;
  if (query_limits(&p)) return 1;
  uint64_t rng = g_seed;
  uint32_t psn_a = 0xFFFFFF - (uint32_t)(vp_rand(&rng) % 4096); /* A's PSNs wrap early */
  if (setup_side(&g_a, &p, psn_a) || setup_side(&g_b, &p, (uint32_t)(vp_rand(&rng) & 0xFFFFFF)) ||
      vp_connect(&g_a.vp, &p, &g_b.vp.self) || vp_connect(&g_b.vp, &p, &g_a.vp.self)) {
    printf("rc_stress: FAIL setup\n");
    teardown_side(&g_a);
    teardown_side(&g_b);
    return 1;
  }

  struct op ring[kDepth];
  uint64_t target = mib << 20, posted = 0, bytes = 0, next = 0, done = 0, count[3] = {0, 0, 0};
  double t0 = vp_now_ms();
  int failed = 0;
  while (!failed && (done < next || posted < target)) {
    while (!failed && next - done < kDepth && posted < target) {
      struct op* o = &ring[next % kDepth];
      plan_op(&rng, next++, o);
      failed = post_op(o);
      posted += o->size;
    }
    if (failed) break;
    const struct op* o = &ring[done++ % kDepth];
    failed = complete_op(o);
    bytes += o->size;
    count[o->opcode == IBV_WR_SEND ? 0 : o->opcode == IBV_WR_RDMA_WRITE ? 1 : 2]++;
  }
  double secs = (vp_now_ms() - t0) / 1e3;
  if (!failed) failed = final_checks();
  if (!failed)
    printf("rc_stress: %" PRIu64 " ops (%" PRIu64 " send, %" PRIu64 " write, %" PRIu64
           " read), %.1f MiB, %.1f s, every byte verified\n",
           done, count[0], count[1], count[2], (double)bytes / (1 << 20), secs);
  teardown_side(&g_a);
  teardown_side(&g_b);
  return failed ? 1 : 0;
}
