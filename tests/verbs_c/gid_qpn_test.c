/* gid_qpn_test: a GID and a QPN are enough.
 *
 * Two processes exchange over a TCP connection only what a RoCE peer needs — the GID (index
 * --gid-index, default 0: uroce's GID table lists the routable addresses first, loopback
 * last), the RC and UD QP numbers, the first PSN, an MR's address and rkey, and, only with
 * `--dlid lid`, the port's LID (in the other modes the LID field is sent as 0 and checked to
 * be 0) — then reach each other through address vectors with a GRH (is_global = 1, dgid =
 * the peer's GID, sgid_index = --gid-index) and a DLID chosen by --dlid. Each round:
 *
 *   RC, both directions at once: RDMA WRITE, SEND with immediate, RDMA READ, FETCH_AND_ADD, a
 *       CMP_AND_SWP that matches and one that does not; every byte, immediate, length and
 *       returned value verified, and each side's own counter checked after the round.
 *   UD, each direction in turn: a SEND with immediate to the peer's UD QP through an AH built
 *       the same way; the completion (IBV_WC_GRH, IBV_WC_WITH_IMM, src_qp, byte_len), the
 *       IP addresses in the GRH area (the IPv4 header, or the IPv6 one and wc.sl 0x9 with an
 *       IPv6 GID) and the payload verified. UD may lose a datagram, so
 *       the sender repeats it every 200 ms until the receiver confirms over TCP, for as long
 *       as the receiver waits for it (--timeout-ms; at least 10 times).
 *
 *   --dlid lid      DLID = the peer's LID (uroce: that process's private UDP port)
 *   --dlid 0        DLID 0: the host's RoCE port 4791, the QPN names the process
 *   --dlid 0xC123   a RoCE UDP source-port hint as mlx5 reads it (UCX's way): also port 4791
 *
 * Usage:
 *   gid_qpn_test --server --port P [--peers N] [OPTIONS]  accept N sessions (default 1)
 *   gid_qpn_test --client HOST --port P [OPTIONS]         one session with HOST:P
 *   gid_qpn_test [--server --port P --peers N] --connect HOST:PORT [--connect HOST:PORT...]
 *       listen and connect in one process: one session per peer, all sessions at the same
 *       time (a thread each, one device context), for a mesh of processes.
 * OPTIONS:
 *   --dlid lid|N      addressing mode, as above (default lid)
 *   --iters N         rounds per session (default 10)
 *   --pace-ms MS      pause after each round (default 0)
 *   --timeout-ms MS   limit of every wait for a completion or the peer (default 5000)
 *   --connect-ms MS   limit for connecting and for the exchange (default 15000)
 *   --deadline-s S    limit of the whole run, a watchdog (default 60)
 *   --gid-index I     source GID index (default 0)
 *   --name NAME       prefix of every output line (default: the role)
 *   --max-lost L      sessions whose peer died (its TCP connection closed while a wait was
 *                     under way) that may be replaced: a server accepts one more connection,
 *                     a connector connects again; for kill-and-restart runs (default 0)
 *   --loop K          the same as --peers K (K clients, one after another or together)
 *
 * Output: "ready NAME ..." once the device is open and the server listens, "NAME: SESSION:
 * round R ok" after each round, "PASS"/"FAIL"/"LOST" per session and a summary line. Exit
 * 0 only if every expected session passed; 1 on a failed check or a timeout; 2 on bad usage. */
#define _GNU_SOURCE /* POLLRDHUP */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "verbs_pair.h"

#define MAX_CONNECT 16
#define MAX_MSG 16384u
#define GRH_BYTES 40u
#define UD_MAX_PAYLOAD 512u
#define UD_SLOT 1024u /* GRH area + the largest UD payload, with room */
#define UD_SLOTS 8
#define UD_QKEY 0x11111111u
#define UD_ATTEMPTS 10
#define UD_RESEND_MS 200
#define RD_ATOMIC 4
#define INFO_BYTES 52
#define COUNTER_START 0x0123456789ABCDEFull

/* One session's buffer, one MR. The peer touches only COUNTER, A and B. */
enum {
  kOffCounter = 0,                   /* the peer's FETCH_AND_ADD / CMP_AND_SWP target */
  kOffResults = 64,                  /* 3 x 8 bytes: this side's atomic results */
  kOffA = 4096,                      /* the peer's RDMA WRITE lands here */
  kOffB = kOffA + MAX_MSG,           /* the peer's RDMA READ reads here */
  kOffW = kOffB + MAX_MSG,           /* this side's WRITE source */
  kOffS = kOffW + MAX_MSG,           /* SEND source */
  kOffR = kOffS + MAX_MSG,           /* receive buffer */
  kOffD = kOffR + MAX_MSG,           /* READ destination */
  kOffUdSend = kOffD + MAX_MSG,      /* UD SEND source */
  kOffUdRecv = kOffUdSend + UD_SLOT, /* UD receive slots */
  kBufBytes = kOffUdRecv + UD_SLOTS * UD_SLOT,
};

/* Work request ids of a round; the bit (1 << id) marks it awaited. */
enum { kWrWrite = 1, kWrSend, kWrRecv, kWrRead, kWrFetchAdd, kWrCasHit, kWrCasMiss, kWrCount };
static const enum ibv_wc_opcode kWcOpcode[kWrCount] = {
    [kWrWrite] = IBV_WC_RDMA_WRITE,  [kWrSend] = IBV_WC_SEND,          [kWrRecv] = IBV_WC_RECV,
    [kWrRead] = IBV_WC_RDMA_READ,    [kWrFetchAdd] = IBV_WC_FETCH_ADD, [kWrCasHit] = IBV_WC_COMP_SWAP,
    [kWrCasMiss] = IBV_WC_COMP_SWAP,
};

enum { kRoleAcceptor = 0, kRoleConnector = 1 };
enum Outcome { kPass, kFail, kLost };

struct options {
  int server, port, peers;
  const char* connect[MAX_CONNECT];
  int nconnect;
  int dlid_from_peer;
  uint16_t dlid;
  int iters, pace_ms, timeout_ms, connect_ms, deadline_s, max_lost, gid_index;
  const char* name;
};

/* What the two sides exchange (INFO_BYTES on the wire, big-endian). */
struct peer_info {
  uint8_t dlid_from_peer;
  uint16_t lid; /* 0 unless dlid_from_peer */
  union ibv_gid gid;
  uint32_t rc_qpn, ud_qpn, psn, rkey, iters;
  uint64_t addr;
};

struct session {
  int fd, role;
  char label[128];
  struct ibv_cq *cq, *ud_send_cq, *ud_recv_cq;
  struct ibv_qp *rc, *ud;
  struct ibv_ah* ah;
  struct ibv_mr* mr;
  uint8_t* buf;
  struct peer_info self, peer;
  uint64_t peer_counter; /* the peer's counter after this side's atomics so far */
  uint64_t own_counter;  /* this side's counter after the peer's atomics so far */
  int failed;            /* a check failed or a wait ended while the peer was alive */
  int gone;              /* a wait ended because the peer's TCP connection closed */
};

static struct options g_opt;
static struct ibv_context* g_ctx;
static struct ibv_pd* g_pd;
static union ibv_gid g_gid;
static uint16_t g_lid;
static enum ibv_mtu g_mtu;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_passed, g_failed, g_lost;          /* session outcomes */
static int g_replaced_accepts, g_acceptor_done; /* the accept loop's bookkeeping */

static void on_deadline(int sig) {
  (void)sig;
  static const char msg[] = "gid_qpn_test: TIMEOUT: the run exceeded --deadline-s; exiting\n";
  ssize_t n = write(STDOUT_FILENO, msg, sizeof msg - 1);
  (void)n;
  _exit(1);
}

/* ---- deterministic contents ------------------------------------------------------- */

static uint64_t mix(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t state = a * 0x100000001B3ull ^ b * 0x9E3779B97F4A7C15ull ^ c;
  return vp_rand(&state);
}

static void fill(uint8_t* p, uint32_t len, uint64_t seed) {
  uint64_t state = seed;
  for (uint32_t i = 0; i < len; i += 8) {
    uint64_t v = vp_rand(&state);
    uint32_t n = len - i < 8 ? len - i : 8;
    memcpy(p + i, &v, n);
  }
}

/* First mismatching byte of p against the pattern, or -1. */
static long mismatch(const uint8_t* p, uint32_t len, uint64_t seed) {
  uint8_t want[MAX_MSG];
  fill(want, len, seed);
  for (uint32_t i = 0; i < len; i++)
    if (p[i] != want[i]) return (long)i;
  return -1;
}

/* Message sizes: 1 byte to 16 pages at MTU 1024, so single and multi-packet messages. */
static const uint32_t kSizes[] = {1, 63, 1024, 1025, 4097, MAX_MSG};
#define NSIZES (sizeof kSizes / sizeof kSizes[0])
static uint32_t write_len(uint32_t r, int role) { return kSizes[(r + (uint32_t)role) % NSIZES]; }
static uint32_t send_len(uint32_t r, int role) { return kSizes[(r + (uint32_t)role + 2) % NSIZES]; }
static uint32_t read_len(uint32_t r, int role) { return kSizes[(r + (uint32_t)role + 4) % NSIZES]; }
static uint32_t ud_len(uint32_t r, int role) { return 9 + (r * 97 + (uint32_t)role * 211) % (UD_MAX_PAYLOAD - 9); }
static uint32_t imm_of(uint32_t r, uint32_t qpn) { return (uint32_t)mix(r, qpn, 'I'); }
/* The CMP_AND_SWP of round r swaps the counter to (value XOR this). */
static uint64_t swap_mask(uint32_t r) { return mix(r, 0, 'X') | 1; }

/* ---- reporting ---------------------------------------------------------------------- */

static void sfail(struct session* s, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  printf("FAIL %s: %s\n", s->label, msg);
  s->failed = 1;
}

/* Did the peer's TCP connection close (its process gone)? Waits up to `wait_ms` for the FIN,
 * which the kernel of a killed process sends at once. POLLRDHUP sees it even behind unread
 * bytes. */
static int peer_closed(int fd, int wait_ms) {
  struct pollfd p = {fd, POLLRDHUP, 0};
  return poll(&p, 1, wait_ms) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Polls `cq` for one completion until `deadline`: 1 got one, 0 timed out or the peer's
 * connection closed, -1 poll error. uroce retries RC forever with retry_cnt 7 (as rxe), so a
 * dead peer shows as its closed connection, looked at every 200 ms. */
static int poll_cq_until(struct session* s, struct ibv_cq* cq, struct ibv_wc* wc, double deadline) {
  for (;;) {
    int left = (int)(deadline - vp_now_ms());
    if (left <= 0) return 0;
    int got = vp_poll(cq, wc, left < 200 ? left : 200);
    if (got != 0) return got;
    if (peer_closed(s->fd, 0)) return 0;
  }
}

/* A wait ended without what it waited for: LOST if the peer is gone, else FAIL. */
static int trouble(struct session* s, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!s->failed && peer_closed(s->fd, 1000)) {
    printf("LOST %s: the peer's connection closed (%s)\n", s->label, msg);
    s->gone = 1;
  } else {
    sfail(s, "%s", msg);
  }
  return -1;
}

static void format_gid(const union ibv_gid* gid, char* out, size_t len) {
  static const uint8_t kV4Prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  if (!memcmp(gid->raw, kV4Prefix, 12)) {
    inet_ntop(AF_INET, gid->raw + 12, out, (socklen_t)len);
  } else {
    inet_ntop(AF_INET6, gid->raw, out, (socklen_t)len);
  }
}

/* ---- the TCP side channel ----------------------------------------------------------- */

static int send_all(int fd, const void* p, size_t n) {
  const uint8_t* b = p;
  while (n) {
    ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    b += k;
    n -= (size_t)k;
  }
  return 0;
}

/* 1: got n bytes; 0: timed out; -1: connection closed or failed. */
static int recv_all(int fd, void* p, size_t n, int timeout_ms) {
  uint8_t* b = p;
  double deadline = vp_now_ms() + timeout_ms;
  while (n) {
    int left = (int)(deadline - vp_now_ms());
    if (left <= 0) return 0;
    struct pollfd pfd = {fd, POLLIN, 0};
    int r = poll(&pfd, 1, left);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) return 0;
    ssize_t k = recv(fd, b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    b += k;
    n -= (size_t)k;
  }
  return 1;
}

/* Both sides send `tag` and wait for the peer's; a different tag is a protocol failure. */
static int barrier(struct session* s, uint8_t tag, const char* what) {
  uint8_t got = 0;
  if (send_all(s->fd, &tag, 1)) return trouble(s, "sending the %s barrier: %s", what, strerror(errno));
  int r = recv_all(s->fd, &got, 1, g_opt.timeout_ms);
  if (r == 0) return trouble(s, "timeout after %d ms waiting for the peer at the %s barrier", g_opt.timeout_ms, what);
  if (r < 0) return trouble(s, "connection closed at the %s barrier", what);
  if (got != tag) {
    sfail(s, "%s barrier: tag 0x%02x, expected 0x%02x", what, got, tag);
    return -1;
  }
  return 0;
}

static void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (24 - 8 * i));
}
static uint32_t get32(const uint8_t* p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void encode_info(const struct peer_info* in, uint8_t out[INFO_BYTES]) {
  memcpy(out, "GQN1", 4);
  out[4] = in->dlid_from_peer;
  out[5] = 0;
  out[6] = (uint8_t)(in->lid >> 8);
  out[7] = (uint8_t)in->lid;
  memcpy(out + 8, in->gid.raw, 16);
  put32(out + 24, in->rc_qpn);
  put32(out + 28, in->ud_qpn);
  put32(out + 32, in->psn);
  put32(out + 36, in->rkey);
  put32(out + 40, in->iters);
  put32(out + 44, (uint32_t)(in->addr >> 32));
  put32(out + 48, (uint32_t)in->addr);
}

static int decode_info(const uint8_t in[INFO_BYTES], struct peer_info* out) {
  if (memcmp(in, "GQN1", 4)) return -1;
  out->dlid_from_peer = in[4];
  out->lid = (uint16_t)(in[6] << 8 | in[7]);
  memcpy(out->gid.raw, in + 8, 16);
  out->rc_qpn = get32(in + 24);
  out->ud_qpn = get32(in + 28);
  out->psn = get32(in + 32);
  out->rkey = get32(in + 36);
  out->iters = get32(in + 40);
  out->addr = (uint64_t)get32(in + 44) << 32 | get32(in + 48);
  return 0;
}

/* ---- verbs objects ------------------------------------------------------------------ */

static int modify(struct ibv_qp* qp, struct ibv_qp_attr* a, int mask, struct session* s, const char* what) {
  int rc = ibv_modify_qp(qp, a, mask);
  if (rc) sfail(s, "ibv_modify_qp %s: %s", what, strerror(rc));
  return rc ? -1 : 0;
}

static struct ibv_qp* create_qp(struct session* s, enum ibv_qp_type type, struct ibv_cq* scq, struct ibv_cq* rcq,
                                uint32_t sq, uint32_t rq) {
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = scq;
  ia.recv_cq = rcq;
  ia.qp_type = type;
  ia.cap.max_send_wr = sq;
  ia.cap.max_recv_wr = rq;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  struct ibv_qp* qp = ibv_create_qp(g_pd, &ia);
  if (!qp) sfail(s, "ibv_create_qp (%s): %s", type == IBV_QPT_RC ? "RC" : "UD", strerror(errno));
  return qp;
}

/* CQs, MR, the RC QP in INIT and the UD QP in RTS; fills s->self. */
static int session_create(struct session* s) {
  s->cq = ibv_create_cq(g_ctx, 32, NULL, NULL, 0);
  s->ud_send_cq = ibv_create_cq(g_ctx, 16, NULL, NULL, 0);
  s->ud_recv_cq = ibv_create_cq(g_ctx, 2 * UD_SLOTS, NULL, NULL, 0);
  if (!s->cq || !s->ud_send_cq || !s->ud_recv_cq) {
    sfail(s, "ibv_create_cq: %s", strerror(errno));
    return -1;
  }
  if (posix_memalign((void**)&s->buf, 4096, kBufBytes)) {
    sfail(s, "posix_memalign failed");
    return -1;
  }
  memset(s->buf, 0, kBufBytes);
  s->mr =
      ibv_reg_mr(g_pd, s->buf, kBufBytes,
                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
  if (!s->mr) {
    sfail(s, "ibv_reg_mr: %s", strerror(errno));
    return -1;
  }
  s->rc = create_qp(s, IBV_QPT_RC, s->cq, s->cq, 16, 4);
  s->ud = s->rc ? create_qp(s, IBV_QPT_UD, s->ud_send_cq, s->ud_recv_cq, 4, UD_SLOTS) : NULL;
  if (!s->ud) return -1;

  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  if (modify(s->rc, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, s, "RC INIT")) return -1;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = UD_QKEY;
  if (modify(s->ud, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, s, "UD INIT")) return -1;
  a.qp_state = IBV_QPS_RTR;
  if (modify(s->ud, &a, IBV_QP_STATE, s, "UD RTR")) return -1;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  if (modify(s->ud, &a, IBV_QP_STATE | IBV_QP_SQ_PSN, s, "UD RTS")) return -1;

  uint64_t seed = (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)s ^ (uint64_t)(vp_now_ms() * 1000);
  s->self.dlid_from_peer = (uint8_t)g_opt.dlid_from_peer;
  s->self.lid = g_opt.dlid_from_peer ? g_lid : 0;
  s->self.gid = g_gid;
  s->self.rc_qpn = s->rc->qp_num;
  s->self.ud_qpn = s->ud->qp_num;
  s->self.psn = (uint32_t)vp_rand(&seed) & 0xFFFFFF;
  s->self.rkey = s->mr->rkey;
  s->self.iters = (uint32_t)g_opt.iters;
  s->self.addr = (uint64_t)(uintptr_t)s->buf;
  return 0;
}

static void session_destroy(struct session* s) {
  if (s->ah) ibv_destroy_ah(s->ah);
  if (s->ud) ibv_destroy_qp(s->ud);
  if (s->rc) ibv_destroy_qp(s->rc);
  if (s->mr) ibv_dereg_mr(s->mr);
  if (s->ud_recv_cq) ibv_destroy_cq(s->ud_recv_cq);
  if (s->ud_send_cq) ibv_destroy_cq(s->ud_send_cq);
  if (s->cq) ibv_destroy_cq(s->cq);
  free(s->buf);
  if (s->fd >= 0) close(s->fd);
}

/* The address vector to the peer: a GRH to its GID, and the DLID --dlid chooses. */
static struct ibv_ah_attr av_to(const struct peer_info* peer) {
  struct ibv_ah_attr a;
  memset(&a, 0, sizeof a);
  a.is_global = 1;
  a.grh.dgid = peer->gid;
  a.grh.sgid_index = (uint8_t)g_opt.gid_index;
  a.grh.hop_limit = 64;
  a.dlid = g_opt.dlid_from_peer ? peer->lid : g_opt.dlid;
  a.port_num = 1;
  return a;
}

/* RC: RTR then RTS towards the peer; UD: the address handle. */
static int session_connect(struct session* s) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = g_mtu;
  a.dest_qp_num = s->peer.rc_qpn;
  a.rq_psn = s->peer.psn;
  a.max_dest_rd_atomic = RD_ATOMIC;
  a.min_rnr_timer = 1;
  a.ah_attr = av_to(&s->peer);
  if (modify(s->rc, &a,
             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                 IBV_QP_MIN_RNR_TIMER,
             s, "RC RTR"))
    return -1;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 16; /* 268 ms: an overloaded host (sanitizers) queues for longer than 67 ms */
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = s->self.psn;
  a.max_rd_atomic = RD_ATOMIC;
  if (modify(
          s->rc, &a,
          IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
          s, "RC RTS"))
    return -1;
  struct ibv_ah_attr ah = av_to(&s->peer);
  s->ah = ibv_create_ah(g_pd, &ah);
  if (!s->ah) {
    sfail(s, "ibv_create_ah: %s", strerror(errno));
    return -1;
  }
  return 0;
}

/* Sends this side's info and reads the peer's; checks that both use the same mode. */
static int exchange(struct session* s) {
  uint8_t out[INFO_BYTES], in[INFO_BYTES];
  encode_info(&s->self, out);
  if (send_all(s->fd, out, sizeof out)) return trouble(s, "sending the exchange: %s", strerror(errno));
  int r = recv_all(s->fd, in, sizeof in, g_opt.connect_ms);
  if (r == 0) return trouble(s, "timeout after %d ms waiting for the peer's exchange", g_opt.connect_ms);
  if (r < 0) return trouble(s, "connection closed during the exchange");
  if (decode_info(in, &s->peer)) {
    sfail(s, "the peer's exchange has no GQN1 magic");
    return -1;
  }
  if (s->peer.dlid_from_peer != s->self.dlid_from_peer || s->peer.iters != s->self.iters) {
    sfail(s, "mode/iters differ: peer dlid_from_peer %u iters %u, here %u %u", s->peer.dlid_from_peer, s->peer.iters,
          s->self.dlid_from_peer, s->self.iters);
    return -1;
  }
  if (!s->peer.dlid_from_peer && s->peer.lid != 0) {
    sfail(s, "the peer sent LID %u outside --dlid lid mode", s->peer.lid);
    return -1;
  }
  char gid[64];
  format_gid(&s->peer.gid, gid, sizeof gid);
  size_t len = strlen(s->label);
  snprintf(s->label + len, sizeof s->label - len, " <-> %s rc 0x%06x ud 0x%06x", gid, s->peer.rc_qpn, s->peer.ud_qpn);
  printf("%s: exchanged; dlid 0x%x\n", s->label, av_to(&s->peer).dlid);
  return 0;
}

/* ---- RC ------------------------------------------------------------------------------ */

static int post_recv(struct ibv_qp* qp, uint64_t wr_id, void* addr, uint32_t len, uint32_t lkey) {
  struct ibv_sge sge = {(uintptr_t)addr, len, lkey};
  struct ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return ibv_post_recv(qp, &wr, &bad);
}

/* Polls the RC CQ until every WR in `want` (bits 1 << id) completed successfully with its
 * opcode; the receive's completion goes to *recv_wc. */
static int wait_rc(struct session* s, unsigned want, struct ibv_wc* recv_wc, uint32_t r) {
  double deadline = vp_now_ms() + g_opt.timeout_ms;
  while (want) {
    struct ibv_wc wc;
    int got = poll_cq_until(s, s->cq, &wc, deadline);
    if (got < 0) {
      sfail(s, "round %u: ibv_poll_cq failed", r);
      return -1;
    }
    if (got == 0) return trouble(s, "round %u: RC WRs 0x%x still outstanding (limit %d ms)", r, want, g_opt.timeout_ms);
    if (wc.status != IBV_WC_SUCCESS)
      return trouble(s, "round %u: RC wr_id %llu completed with %s", r, (unsigned long long)wc.wr_id,
                     ibv_wc_status_str(wc.status));
    if (wc.wr_id >= kWrCount || !(want & 1u << wc.wr_id) || wc.opcode != kWcOpcode[wc.wr_id]) {
      sfail(s, "round %u: unexpected RC completion wr_id %llu opcode %d", r, (unsigned long long)wc.wr_id, wc.opcode);
      return -1;
    }
    if (wc.wr_id == kWrRecv) *recv_wc = wc;
    want &= ~(1u << wc.wr_id);
  }
  return 0;
}

static void set_wr(struct ibv_send_wr* wr, struct ibv_sge* sge, uint64_t id, enum ibv_wr_opcode op, uint8_t* addr,
                   uint32_t len, uint32_t lkey) {
  memset(wr, 0, sizeof *wr);
  sge->addr = (uintptr_t)addr;
  sge->length = len;
  sge->lkey = lkey;
  wr->wr_id = id;
  wr->sg_list = sge;
  wr->num_sge = 1;
  wr->opcode = op;
  wr->send_flags = IBV_SEND_SIGNALED;
}

/* WRITE, SEND with immediate, READ, FETCH_AND_ADD, a matching and a failing CMP_AND_SWP, as
 * one chain (the responder executes them in order, so the compare values are known). */
static int post_round(struct session* s, uint32_t r) {
  struct ibv_send_wr wr[6], *bad = NULL;
  struct ibv_sge sge[6];
  uint32_t lkey = s->mr->lkey, rkey = s->peer.rkey;
  uint64_t* results = (uint64_t*)(s->buf + kOffResults);
  uint64_t before = s->peer_counter, added = before + r + 1;

  set_wr(&wr[0], &sge[0], kWrWrite, IBV_WR_RDMA_WRITE, s->buf + kOffW, write_len(r, s->role), lkey);
  wr[0].wr.rdma.remote_addr = s->peer.addr + kOffA;
  wr[0].wr.rdma.rkey = rkey;
  set_wr(&wr[1], &sge[1], kWrSend, IBV_WR_SEND_WITH_IMM, s->buf + kOffS, send_len(r, s->role), lkey);
  wr[1].imm_data = htonl(imm_of(r, s->self.rc_qpn));
  set_wr(&wr[2], &sge[2], kWrRead, IBV_WR_RDMA_READ, s->buf + kOffD, read_len(r, 1 - s->role), lkey);
  wr[2].wr.rdma.remote_addr = s->peer.addr + kOffB;
  wr[2].wr.rdma.rkey = rkey;
  set_wr(&wr[3], &sge[3], kWrFetchAdd, IBV_WR_ATOMIC_FETCH_AND_ADD, (uint8_t*)&results[0], 8, lkey);
  wr[3].wr.atomic.compare_add = r + 1;
  set_wr(&wr[4], &sge[4], kWrCasHit, IBV_WR_ATOMIC_CMP_AND_SWP, (uint8_t*)&results[1], 8, lkey);
  wr[4].wr.atomic.compare_add = added;
  wr[4].wr.atomic.swap = added ^ swap_mask(r);
  set_wr(&wr[5], &sge[5], kWrCasMiss, IBV_WR_ATOMIC_CMP_AND_SWP, (uint8_t*)&results[2], 8, lkey);
  wr[5].wr.atomic.compare_add = added; /* stale now: must not swap */
  wr[5].wr.atomic.swap = 0;
  for (int i = 3; i < 6; i++) {
    wr[i].wr.atomic.remote_addr = s->peer.addr + kOffCounter;
    wr[i].wr.atomic.rkey = rkey;
  }
  for (int i = 0; i < 5; i++) wr[i].next = &wr[i + 1];
  int rc = ibv_post_send(s->rc, wr, &bad);
  if (rc) {
    sfail(s, "round %u: ibv_post_send: %s", r, strerror(rc));
    return -1;
  }
  return 0;
}

static void check_bytes(struct session* s, uint32_t r, const char* what, const uint8_t* p, uint32_t len,
                        uint64_t seed) {
  long at = mismatch(p, len, seed);
  if (at >= 0) sfail(s, "round %u: %s: byte %ld of %u differs", r, what, at, len);
}

/* Everything the round's completions and the peer's WRITE left here. */
static void verify_round(struct session* s, uint32_t r, const struct ibv_wc* rwc) {
  int peer = 1 - s->role;
  uint32_t peer_qpn = s->peer.rc_qpn;
  if (rwc->byte_len != send_len(r, peer))
    sfail(s, "round %u: SEND byte_len %u, expected %u", r, rwc->byte_len, send_len(r, peer));
  if (!(rwc->wc_flags & IBV_WC_WITH_IMM) || ntohl(rwc->imm_data) != imm_of(r, peer_qpn))
    sfail(s, "round %u: SEND immediate missing or wrong (flags 0x%x imm 0x%08x)", r, rwc->wc_flags,
          ntohl(rwc->imm_data));
  if (rwc->qp_num != s->self.rc_qpn) sfail(s, "round %u: receive completion on QP 0x%x", r, rwc->qp_num);
  check_bytes(s, r, "SEND payload", s->buf + kOffR, send_len(r, peer), mix(r, peer_qpn, 'S'));
  /* The peer's WRITE came before its SEND on one RC QP (IBA ordering): it is here now. */
  check_bytes(s, r, "RDMA WRITE target", s->buf + kOffA, write_len(r, peer), mix(r, peer_qpn, 'W'));
  check_bytes(s, r, "RDMA READ result", s->buf + kOffD, read_len(r, peer), mix(r, peer_qpn, 'B'));

  const uint64_t* results = (const uint64_t*)(s->buf + kOffResults);
  uint64_t before = s->peer_counter, added = before + r + 1, swapped = added ^ swap_mask(r);
  if (results[0] != before)
    sfail(s, "round %u: FETCH_AND_ADD returned 0x%016llx, expected 0x%016llx", r, (unsigned long long)results[0],
          (unsigned long long)before);
  if (results[1] != added)
    sfail(s, "round %u: CMP_AND_SWP (match) returned 0x%016llx, expected 0x%016llx", r, (unsigned long long)results[1],
          (unsigned long long)added);
  if (results[2] != swapped)
    sfail(s, "round %u: CMP_AND_SWP (no match) returned 0x%016llx, expected 0x%016llx", r,
          (unsigned long long)results[2], (unsigned long long)swapped);
  s->peer_counter = swapped;
}

/* ---- UD ------------------------------------------------------------------------------ */

static uint8_t* ud_slot(struct session* s, unsigned i) { return s->buf + kOffUdRecv + i * UD_SLOT; }

static int ud_repost(struct session* s, unsigned slot) {
  int rc = post_recv(s->ud, slot, ud_slot(s, slot), UD_SLOT, s->mr->lkey);
  if (rc) sfail(s, "UD ibv_post_recv: %s", strerror(rc));
  return rc ? -1 : 0;
}

/* Sends round r's datagram until the receiver's confirmation arrives over TCP. */
static int ud_send(struct session* s, uint32_t r) {
  uint32_t len = ud_len(r, s->role);
  uint8_t* p = s->buf + kOffUdSend;
  int attempts = g_opt.timeout_ms / UD_RESEND_MS > UD_ATTEMPTS ? g_opt.timeout_ms / UD_RESEND_MS : UD_ATTEMPTS;
  for (int attempt = 0; attempt < attempts; attempt++) {
    put32(p, r);
    put32(p + 4, (uint32_t)attempt);
    fill(p + 8, len - 8, mix(r, s->self.ud_qpn, 'U'));
    struct ibv_sge sge;
    struct ibv_send_wr wr, *bad = NULL;
    set_wr(&wr, &sge, 100 + (uint64_t)attempt, IBV_WR_SEND_WITH_IMM, p, len, s->mr->lkey);
    wr.imm_data = htonl(imm_of(r, s->self.ud_qpn));
    wr.wr.ud.ah = s->ah;
    wr.wr.ud.remote_qpn = s->peer.ud_qpn;
    wr.wr.ud.remote_qkey = UD_QKEY;
    int rc = ibv_post_send(s->ud, &wr, &bad);
    if (rc) {
      sfail(s, "round %u: UD ibv_post_send: %s", r, strerror(rc));
      return -1;
    }
    struct ibv_wc wc;
    int got = vp_poll(s->ud_send_cq, &wc, g_opt.timeout_ms);
    if (got <= 0 || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_SEND) {
      sfail(s, "round %u: UD send completion: %s", r,
            got < 0    ? "poll failed"
            : got == 0 ? "timeout"
                       : ibv_wc_status_str(wc.status));
      return -1;
    }
    uint8_t ack = 0;
    int k = recv_all(s->fd, &ack, 1, UD_RESEND_MS);
    if (k < 0) return trouble(s, "round %u: connection closed waiting for the UD confirmation", r);
    if (k == 1) {
      if (ack != (uint8_t)(0xA0 ^ r)) {
        sfail(s, "round %u: UD confirmation 0x%02x, expected 0x%02x", r, ack, (uint8_t)(0xA0 ^ r));
        return -1;
      }
      if (attempt) printf("%s: round %u: UD datagram confirmed after %d resends\n", s->label, r, attempt);
      return 0;
    }
  }
  return trouble(s, "round %u: UD datagram not confirmed after %d sends %d ms apart", r, attempts, UD_RESEND_MS);
}

/* Checks one received datagram of round r: completion fields, GRH area, payload. */
static void ud_verify(struct session* s, uint32_t r, const struct ibv_wc* wc, const uint8_t* d) {
  uint32_t len = ud_len(r, 1 - s->role);
  if (wc->byte_len != GRH_BYTES + len)
    sfail(s, "round %u: UD byte_len %u, expected %u", r, wc->byte_len, GRH_BYTES + len);
  if (!(wc->wc_flags & IBV_WC_GRH)) sfail(s, "round %u: UD completion without IBV_WC_GRH", r);
  if (!(wc->wc_flags & IBV_WC_WITH_IMM) || ntohl(wc->imm_data) != imm_of(r, s->peer.ud_qpn))
    sfail(s, "round %u: UD immediate missing or wrong", r);
  if (wc->src_qp != s->peer.ud_qpn) sfail(s, "round %u: UD src_qp 0x%x, expected 0x%x", r, wc->src_qp, s->peer.ud_qpn);
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  if (memcmp(s->self.gid.raw, kMapped, 12) != 0) {
    /* RoCEv2 over IPv6: the IPv6 header, whose addresses are the GIDs. */
    if ((d[0] >> 4) != 6 || memcmp(d + 8, s->peer.gid.raw, 16) || memcmp(d + 24, s->self.gid.raw, 16))
      sfail(s, "round %u: the GRH area's IPv6 header does not name the peer's and this GID", r);
    if (wc->sl != 0x9) sfail(s, "round %u: UD wc.sl 0x%x, not 0x9 (RoCE v2 over IPv6)", r, wc->sl);
  } else {
    /* RoCEv2 over IPv4: 20 unused bytes, then the IPv4 header (rdma-core's ibv_grh layout). */
    const uint8_t* ip = d + 20;
    if ((ip[0] >> 4) != 4 || memcmp(ip + 12, s->peer.gid.raw + 12, 4) || memcmp(ip + 16, s->self.gid.raw + 12, 4))
      sfail(s, "round %u: the GRH area's IPv4 header does not name the peer's and this GID", r);
  }
  if (wc->byte_len == GRH_BYTES + len)
    check_bytes(s, r, "UD payload", d + GRH_BYTES + 8, len - 8, mix(r, s->peer.ud_qpn, 'U'));
}

/* Waits for round r's datagram (older rounds' repeats are dropped), verifies it, confirms. */
static int ud_receive(struct session* s, uint32_t r) {
  double deadline = vp_now_ms() + g_opt.timeout_ms;
  for (;;) {
    struct ibv_wc wc;
    int got = poll_cq_until(s, s->ud_recv_cq, &wc, deadline);
    if (got < 0) {
      sfail(s, "round %u: UD ibv_poll_cq failed", r);
      return -1;
    }
    if (got == 0) return trouble(s, "round %u: no UD datagram (limit %d ms)", r, g_opt.timeout_ms);
    if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.wr_id >= UD_SLOTS) {
      sfail(s, "round %u: UD receive completion: %s opcode %d", r, ibv_wc_status_str(wc.status), wc.opcode);
      return -1;
    }
    const uint8_t* d = ud_slot(s, (unsigned)wc.wr_id);
    uint32_t round = wc.byte_len >= GRH_BYTES + 8 ? get32(d + GRH_BYTES) : UINT32_MAX;
    if (round < r) { /* a repeat of an earlier round's datagram */
      if (ud_repost(s, (unsigned)wc.wr_id)) return -1;
      continue;
    }
    if (round != r) sfail(s, "round %u: UD datagram of round %u", r, round);
    ud_verify(s, r, &wc, d);
    if (ud_repost(s, (unsigned)wc.wr_id)) return -1;
    uint8_t ack = (uint8_t)(0xA0 ^ r);
    if (send_all(s->fd, &ack, 1)) return trouble(s, "round %u: sending the UD confirmation", r);
    return s->failed ? -1 : 0;
  }
}

/* ---- a session ------------------------------------------------------------------------ */

static int run_round(struct session* s, uint32_t r) {
  int me = s->role;
  if (post_recv(s->rc, kWrRecv, s->buf + kOffR, MAX_MSG, s->mr->lkey)) {
    sfail(s, "round %u: ibv_post_recv failed", r);
    return -1;
  }
  fill(s->buf + kOffB, read_len(r, me), mix(r, s->self.rc_qpn, 'B'));
  fill(s->buf + kOffW, write_len(r, me), mix(r, s->self.rc_qpn, 'W'));
  fill(s->buf + kOffS, send_len(r, me), mix(r, s->self.rc_qpn, 'S'));
  memset(s->buf + kOffD, 0, MAX_MSG);
  /* Start: the peer's receive is posted and its READ source filled. */
  if (barrier(s, (uint8_t)(2 * r), "round start") || post_round(s, r)) return -1;
  struct ibv_wc rwc;
  memset(&rwc, 0, sizeof rwc);
  unsigned want = 1u << kWrWrite | 1u << kWrSend | 1u << kWrRecv | 1u << kWrRead | 1u << kWrFetchAdd | 1u << kWrCasHit |
                  1u << kWrCasMiss;
  if (wait_rc(s, want, &rwc, r)) return -1;
  verify_round(s, r, &rwc);
  /* UD: the acceptor's datagram first, then the connector's. */
  for (int sender = kRoleAcceptor; sender <= kRoleConnector; sender++)
    if ((sender == me ? ud_send(s, r) : ud_receive(s, r)) != 0) return -1;
  /* End: the peer is done with this side's A, B and counter. */
  if (barrier(s, (uint8_t)(2 * r + 1), "round end")) return -1;
  uint64_t want_counter = (s->own_counter + r + 1) ^ swap_mask(r);
  uint64_t counter = __atomic_load_n((uint64_t*)(s->buf + kOffCounter), __ATOMIC_ACQUIRE);
  if (counter != want_counter)
    sfail(s, "round %u: counter 0x%016llx after the peer's atomics, expected 0x%016llx", r, (unsigned long long)counter,
          (unsigned long long)want_counter);
  s->own_counter = want_counter;
  return s->failed ? -1 : 0;
}

static enum Outcome run_session(int fd, int role, const char* what) {
  struct session s;
  memset(&s, 0, sizeof s);
  s.fd = fd;
  s.role = role;
  snprintf(s.label, sizeof s.label, "%s: %s", g_opt.name, what);
  int ok = session_create(&s) == 0;
  if (ok) {
    *(uint64_t*)(s.buf + kOffCounter) = COUNTER_START;
    s.own_counter = s.peer_counter = COUNTER_START;
    for (unsigned i = 0; ok && i < UD_SLOTS; i++) ok = ud_repost(&s, i) == 0;
  }
  ok = ok && exchange(&s) == 0 && session_connect(&s) == 0;
  for (uint32_t r = 0; ok && r < (uint32_t)g_opt.iters; r++) {
    ok = run_round(&s, r) == 0;
    if (ok) printf("%s: round %u ok\n", s.label, r);
    if (ok && g_opt.pace_ms) vp_sleep_ms(g_opt.pace_ms);
  }
  ok = ok && barrier(&s, 0xEE, "final") == 0;
  enum Outcome out = ok ? kPass : s.gone ? kLost : kFail;
  if (out == kPass) printf("PASS %s: %d rounds\n", s.label, g_opt.iters);
  session_destroy(&s);
  return out;
}

/* Counts an outcome; 1 if a LOST session may be replaced (within --max-lost). */
static int record(enum Outcome out, int acceptor) {
  int replace = 0;
  pthread_mutex_lock(&g_lock);
  if (out == kPass) g_passed++;
  if (out == kFail) g_failed++;
  if (out == kLost) {
    replace = ++g_lost <= g_opt.max_lost;
    if (!replace) g_failed++;
    if (replace && acceptor) g_replaced_accepts++;
  }
  if (acceptor) g_acceptor_done++;
  pthread_mutex_unlock(&g_lock);
  return replace;
}

/* ---- threads, sockets, main ------------------------------------------------------------ */

struct job {
  int fd;
  char target[128];
  char what[160];
};

static void* acceptor_thread(void* arg) {
  struct job* j = arg;
  record(run_session(j->fd, kRoleAcceptor, j->what), 1);
  return NULL;
}

/* Connects to HOST:PORT, retrying refused connections for --connect-ms. */
static int connect_to(const char* target) {
  char host[128];
  snprintf(host, sizeof host, "%s", target);
  char* colon = strrchr(host, ':');
  if (!colon) return -1;
  *colon = 0;
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, colon + 1, &hints, &ai) || !ai) {
    printf("%s: cannot resolve %s\n", g_opt.name, target);
    return -1;
  }
  double deadline = vp_now_ms() + g_opt.connect_ms;
  int fd = -1;
  while (fd < 0 && vp_now_ms() < deadline) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
      vp_sleep_ms(50);
    }
  }
  freeaddrinfo(ai);
  if (fd < 0) {
    printf("%s: TIMEOUT: cannot connect to %s within %d ms\n", g_opt.name, target, g_opt.connect_ms);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static void* connector_thread(void* arg) {
  struct job* j = arg;
  for (int attempt = 1;; attempt++) {
    int fd = connect_to(j->target);
    if (fd < 0) {
      record(kFail, 0);
      return NULL;
    }
    snprintf(j->what, sizeof j->what, "to %s #%d", j->target, attempt);
    if (!record(run_session(fd, kRoleConnector, j->what), 0)) return NULL;
    printf("%s: session to %s lost; connecting again (--max-lost)\n", g_opt.name, j->target);
  }
}

static int listen_on(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
      bind(fd, (struct sockaddr*)&sa, sizeof sa) || listen(fd, 16)) {
    printf("%s: cannot listen on TCP port %d: %s\n", g_opt.name, port, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

/* Accepts --peers sessions, plus one for each LOST session --max-lost lets be replaced;
 * returns once all of them finished. */
static int accept_loop(int lfd, pthread_t* threads, struct job* jobs, int capacity, int* nthreads) {
  int accepted = 0;
  for (;;) {
    pthread_mutex_lock(&g_lock);
    int target = g_opt.peers + g_replaced_accepts, done = g_acceptor_done;
    pthread_mutex_unlock(&g_lock);
    if (accepted >= target) {
      if (done >= accepted) return 0;
      vp_sleep_ms(10);
      continue;
    }
    struct pollfd p = {lfd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    struct sockaddr_in peer;
    socklen_t len = sizeof peer;
    int fd = accept(lfd, (struct sockaddr*)&peer, &len);
    if (fd < 0) continue;
    if (*nthreads >= capacity) {
      close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct job* j = &jobs[*nthreads];
    char addr[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &peer.sin_addr, addr, sizeof addr);
    j->fd = fd;
    snprintf(j->what, sizeof j->what, "from %s:%u", addr, ntohs(peer.sin_port));
    if (pthread_create(&threads[*nthreads], NULL, acceptor_thread, j)) {
      printf("%s: pthread_create failed\n", g_opt.name);
      close(fd);
      return -1;
    }
    ++*nthreads;
    accepted++;
  }
}

static void usage(void) {
  fprintf(stderr,
          "usage: gid_qpn_test --server --port P [--peers N]\n"
          "       gid_qpn_test --client HOST --port P\n"
          "       gid_qpn_test [--server --port P --peers N] --connect HOST:PORT ...\n"
          "  [--dlid lid|N] [--iters N] [--pace-ms MS] [--timeout-ms MS] [--connect-ms MS]\n"
          "  [--deadline-s S] [--gid-index I] [--name NAME] [--max-lost L] [--loop K]\n");
  exit(2);
}

static int int_arg(const char* v, long lo, long hi) {
  char* end = NULL;
  long x = strtol(v, &end, 0);
  if (!*v || *end || x < lo || x > hi) usage();
  return (int)x;
}

static void parse(int argc, char** argv) {
  static char connect_buf[MAX_CONNECT][128];
  const char* client = NULL;
  struct options* o = &g_opt;
  o->peers = 1;
  o->dlid_from_peer = 1;
  o->iters = 10;
  o->timeout_ms = 5000;
  o->connect_ms = 15000;
  o->deadline_s = 60;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--server")) {
      o->server = 1;
      continue;
    }
    if (!v) usage();
    i++;
    if (!strcmp(a, "--client")) {
      client = v;
    } else if (!strcmp(a, "--connect")) {
      if (o->nconnect == MAX_CONNECT) usage();
      o->connect[o->nconnect++] = v;
    } else if (!strcmp(a, "--port")) {
      o->port = int_arg(v, 1, 65535);
    } else if (!strcmp(a, "--peers") || !strcmp(a, "--loop")) {
      o->peers = int_arg(v, 0, 256);
    } else if (!strcmp(a, "--dlid")) {
      o->dlid_from_peer = !strcmp(v, "lid");
      if (!o->dlid_from_peer) o->dlid = (uint16_t)int_arg(v, 0, 0xFFFF);
    } else if (!strcmp(a, "--iters")) {
      o->iters = int_arg(v, 1, 1000000);
    } else if (!strcmp(a, "--pace-ms")) {
      o->pace_ms = int_arg(v, 0, 60000);
    } else if (!strcmp(a, "--timeout-ms")) {
      o->timeout_ms = int_arg(v, 1, 3600000);
    } else if (!strcmp(a, "--connect-ms")) {
      o->connect_ms = int_arg(v, 1, 3600000);
    } else if (!strcmp(a, "--deadline-s")) {
      o->deadline_s = int_arg(v, 1, 86400);
    } else if (!strcmp(a, "--gid-index")) {
      o->gid_index = int_arg(v, 0, 255);
    } else if (!strcmp(a, "--name")) {
      o->name = v;
    } else if (!strcmp(a, "--max-lost")) {
      o->max_lost = int_arg(v, 0, 1000);
    } else {
      usage();
    }
  }
  if (client) {
    if (!o->port || o->nconnect == MAX_CONNECT) usage();
    snprintf(connect_buf[0], sizeof connect_buf[0], "%s:%d", client, o->port);
    o->connect[o->nconnect++] = connect_buf[0];
  }
  if ((o->server && !o->port) || (!o->server && !o->nconnect)) usage();
  if (!o->server) o->peers = 0;
  if (!o->name) o->name = o->server ? "server" : "client";
}

static int open_device(void) {
  int num = 0;
  struct ibv_device** list = ibv_get_device_list(&num);
  if (!list || num < 1) {
    printf("%s: no RDMA device\n", g_opt.name);
    if (list) ibv_free_device_list(list);
    return -1;
  }
  g_ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  struct ibv_port_attr pa;
  if (!g_ctx || ibv_query_port(g_ctx, 1, &pa) || ibv_query_gid(g_ctx, 1, g_opt.gid_index, &g_gid)) {
    printf("%s: ibv_open_device / ibv_query_port / ibv_query_gid(%d) failed\n", g_opt.name, g_opt.gid_index);
    return -1;
  }
  g_lid = pa.lid;
  g_mtu = pa.active_mtu < IBV_MTU_1024 ? pa.active_mtu : IBV_MTU_1024;
  g_pd = ibv_alloc_pd(g_ctx);
  if (!g_pd) {
    printf("%s: ibv_alloc_pd: %s\n", g_opt.name, strerror(errno));
    return -1;
  }
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  parse(argc, argv);
  signal(SIGALRM, on_deadline);
  alarm((unsigned)g_opt.deadline_s);
  if (open_device()) return 1;
  int lfd = g_opt.server ? listen_on(g_opt.port) : -1;
  if (g_opt.server && lfd < 0) return 1;
  char gid[64];
  format_gid(&g_gid, gid, sizeof gid);
  char mode[16];
  snprintf(mode, sizeof mode, g_opt.dlid_from_peer ? "lid" : "0x%x", g_opt.dlid);
  printf("ready %s pid %d gid[%d] %s lid %u dlid %s\n", g_opt.name, (int)getpid(), g_opt.gid_index, gid, g_lid, mode);

  int capacity = g_opt.peers + g_opt.max_lost + g_opt.nconnect;
  pthread_t* threads = calloc((size_t)capacity + 1, sizeof *threads);
  struct job* jobs = calloc((size_t)capacity + 1, sizeof *jobs);
  int nthreads = 0, status = 0;
  for (int i = 0; i < g_opt.nconnect; i++, nthreads++) {
    snprintf(jobs[nthreads].target, sizeof jobs[nthreads].target, "%s", g_opt.connect[i]);
    if (pthread_create(&threads[nthreads], NULL, connector_thread, &jobs[nthreads])) {
      printf("%s: pthread_create failed\n", g_opt.name);
      return 1;
    }
  }
  if (lfd >= 0 && accept_loop(lfd, threads, jobs, capacity, &nthreads)) status = 1;
  for (int i = 0; i < nthreads; i++) pthread_join(threads[i], NULL);
  if (lfd >= 0) close(lfd);
  free(threads);
  free(jobs);
  ibv_dealloc_pd(g_pd);
  ibv_close_device(g_ctx);

  int expected = g_opt.peers + g_opt.nconnect;
  if (g_failed || g_passed != expected || status) {
    printf("FAILED %s: %d of %d sessions passed, %d failed, %d lost\n", g_opt.name, g_passed, expected, g_failed,
           g_lost);
    return 1;
  }
  printf("PASSED %s: %d sessions, %d rounds each (%d lost and replaced)\n", g_opt.name, g_passed, g_opt.iters, g_lost);
  return 0;
}
