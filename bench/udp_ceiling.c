/*
 * udp_ceiling — what raw UDP can do between two processes, on one host or across two: the
 * ceilings that bench/compare.sh sets uroce's figures against.
 *
 *   udp_ceiling server [-p PORT] [-B ADDR] [-r BUFFER_BYTES] [-W IDLE_SECONDS]
 *   udp_ceiling client HOST -m MODE [-p PORT] [-s BYTES] [-t SECONDS] [-n ITERATIONS]
 *                     [-w WARMUP] [-b BATCH] [-r BUFFER_BYTES] [-W SECONDS]
 *
 * One server runs any number of tests, one after the other; each client run is one test and
 * prints one line. MODE:
 *   mmsg   bandwidth: the client sends datagrams of BYTES (default 4112) with sendmmsg, BATCH
 *          (default 32) a call, for SECONDS (default 2); the server drains them with recvmmsg.
 *   gso    bandwidth: the client sends UDP GSO super-datagrams (UDP_SEGMENT = BYTES, as many
 *          whole segments as fit in one 64 KiB UDP datagram) with one sendmsg each (BATCH
 *          default 1: super-datagrams per sendmmsg call); the server has UDP_GRO on.
 *   poll   latency: ping-pong of BYTES (default 64) datagrams, ITERATIONS (default 20000)
 *          after WARMUP (default 1000) exchanges; both sides busy-poll (recv MSG_DONTWAIT).
 *   block  latency: the same, both sides blocking in recv.
 *   ack    latency: as poll, but every ping and pong is one UDP GSO message of two datagrams,
 *          BYTES and 20 bytes behind it ('A': the shape of a RoCE reply that carries the ACK
 *          of the message it answers, BTH + AETH + ICRC, as uroce sends it); both sides have
 *          UDP_GRO on. Against poll, it shows what the second datagram costs the kernel.
 *
 * The client's line (key=value fields; GB/s = 1e9 B/s of UDP payload; latency is one way,
 * RTT/2, in microseconds):
 *   udp_ceiling bw mode=gso size=4112 segments_per_send=15 sends_per_call=1 seconds=2.000
 *     tx_GBps=7.1 rx_GBps=6.9 rx_Mpps=1.68 tx_segments=... rx_segments=... lost_pct=2.1
 *   udp_ceiling lat mode=poll size=64 iterations=20000 min_us=2.8 typical_us=3.0 avg_us=3.1
 *     p99_us=4.2 max_us=30.1 retries=0
 * On failure: "udp_ceiling ... error=WHAT" and exit status 1. Every wait is bounded: the
 * client gives up after -W seconds (default 10) without an answer; the server abandons a
 * test after -W seconds (default 10) without a datagram and exits after 10 times that with
 * no test at all. The bandwidth figure is the receiver's: bytes that arrived, between the
 * first and the last arrival.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

enum {
  kMaxUdpPayload = 65507, /* 65535 - 20 (IPv4) - 8 (UDP) */
  kMaxGsoSegments = 64,   /* UDP_MAX_SEGMENTS of older kernels */
  kRecvBatch = 32,        /* datagrams per recvmmsg */
  kGroBatch = 8,          /* 64 KiB buffers per recvmmsg with UDP_GRO */
  kMinSize = 4,           /* type byte + 24-bit sequence number */
  kHandshakeIntervalMs = 20,
  kAckBytes = 20, /* mode ack: the trailing datagram (BTH 12 + AETH 4 + ICRC 4) */
};

/* Control datagrams: H(ello) client->server, h server->client, F(in) client->server,
 * R(eport) server->client, each carrying the test's id. Data datagrams (and each segment of
 * a GSO send) start with 'D'; pings with 'P' then a 24-bit sequence number. */
struct Control {
  char type;
  char mode;
  uint16_t reserved;
  uint32_t id;
  uint32_t size;
  uint32_t pad;
  uint64_t bytes;       /* R: payload bytes received */
  uint64_t segments;    /* R: datagrams (segments) received */
  uint64_t ns;          /* R: time from first to last arrival */
  uint64_t first_bytes; /* R: bytes of the first receive call (not timed) */
};

struct Options {
  const char* host;
  const char* bind_addr;
  int port;
  char mode;
  size_t size;
  double seconds;
  unsigned iterations;
  unsigned warmup;
  unsigned batch;
  int buffer;
  double wait_s;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void usage(void) {
  fprintf(stderr,
          "usage: udp_ceiling server [-p PORT] [-B ADDR] [-r BUFFER] [-W IDLE_S]\n"
          "       udp_ceiling client HOST -m mmsg|gso|poll|block|ack [-p PORT] [-s BYTES] [-t SECONDS]\n"
          "                   [-n ITERATIONS] [-w WARMUP] [-b BATCH] [-r BUFFER] [-W SECONDS]\n");
  exit(2);
}

static const char* mode_name(char m) {
  switch (m) {
    case 'm':
      return "mmsg";
    case 'g':
      return "gso";
    case 'p':
      return "poll";
    case 'b':
      return "block";
    case 'a':
      return "ack";
    default:
      return "?";
  }
}

static char parse_mode(const char* name) {
  static const char kModes[] = "mgpba";
  for (const char* m = kModes; *m; ++m)
    if (strcmp(name, mode_name(*m)) == 0) return *m;
  usage();
  return 0;
}

static bool is_bw(char m) { return m == 'm' || m == 'g'; }
static bool uses_gro(char m) { return m == 'g' || m == 'a'; }

/* Sends p[0, len) as one UDP GSO message of `segment`-byte datagrams (the last shorter). */
static void send_gso(int fd, const char* p, size_t len, uint16_t segment, const struct sockaddr_in* to) {
  struct iovec iov = {.iov_base = (void*)p, .iov_len = len};
  union {
    char buf[CMSG_SPACE(sizeof(uint16_t))];
    struct cmsghdr align;
  } control;
  struct msghdr h = {.msg_name = (void*)to,
                     .msg_namelen = sizeof *to,
                     .msg_iov = &iov,
                     .msg_iovlen = 1,
                     .msg_control = control.buf,
                     .msg_controllen = sizeof control.buf};
  struct cmsghdr* c = CMSG_FIRSTHDR(&h);
  c->cmsg_level = IPPROTO_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof segment);
  memcpy(CMSG_DATA(c), &segment, sizeof segment);
  (void)sendmsg(fd, &h, 0);
}

/* Socket buffers as large as asked: SO_*BUFFORCE when privileged, else up to *mem_max. */
static void set_buffers(int fd, int bytes) {
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof bytes) != 0)
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof bytes) != 0)
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
}

static void set_recv_timeout(int fd, uint64_t ns) {
  struct timeval tv = {.tv_sec = (time_t)(ns / 1000000000u), .tv_usec = (suseconds_t)(ns % 1000000000u / 1000)};
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

static int udp_socket(const struct sockaddr_in* bind_to, int buffer) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) {
    perror("udp_ceiling: socket");
    exit(1);
  }
  set_buffers(fd, buffer);
  if (bind(fd, (const struct sockaddr*)bind_to, sizeof *bind_to) != 0) {
    perror("udp_ceiling: bind");
    exit(1);
  }
  return fd;
}

static bool resolve(const char* host, int port, struct sockaddr_in* out) {
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM};
  struct addrinfo* res = NULL;
  if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res) return false;
  *out = *(const struct sockaddr_in*)res->ai_addr;
  out->sin_port = htons((uint16_t)port);
  freeaddrinfo(res);
  return true;
}

static void send_control(int fd, const struct Control* c, const struct sockaddr_in* to) {
  (void)sendto(fd, c, sizeof *c, 0, (const struct sockaddr*)to, sizeof *to);
}

/* ------------------------------------------------------------------------------------ */
/* Server                                                                                */

struct ServerTest {
  uint32_t id;
  char mode;
  size_t size;
  bool finished;
  uint64_t bytes, segments, first_bytes, t_first, t_last;
  struct sockaddr_in peer;
};

struct RecvBuffers {
  char* data;
  size_t stride;
  unsigned count;
  struct mmsghdr msgs[kRecvBatch];
  struct iovec iov[kRecvBatch];
  struct sockaddr_in src[kRecvBatch];
  char cmsg[kRecvBatch][CMSG_SPACE(sizeof(int))];
};

static void setup_recv(struct RecvBuffers* rb, size_t stride, unsigned count) {
  rb->stride = stride;
  rb->count = count;
  for (unsigned i = 0; i < count; ++i) {
    rb->iov[i] = (struct iovec){.iov_base = rb->data + i * stride, .iov_len = stride};
    rb->msgs[i].msg_hdr = (struct msghdr){.msg_name = &rb->src[i],
                                          .msg_namelen = sizeof rb->src[i],
                                          .msg_iov = &rb->iov[i],
                                          .msg_iovlen = 1,
                                          .msg_control = rb->cmsg[i],
                                          .msg_controllen = sizeof rb->cmsg[i]};
  }
}

static int gro_size(struct msghdr* h) {
  for (struct cmsghdr* c = CMSG_FIRSTHDR(h); c; c = CMSG_NXTHDR(h, c)) {
    if (c->cmsg_level == IPPROTO_UDP && c->cmsg_type == UDP_GRO) {
      int v;
      memcpy(&v, CMSG_DATA(c), sizeof v);
      return v;
    }
  }
  return 0;
}

static void report(int fd, const struct ServerTest* t) {
  struct Control r = {.type = 'R', .mode = t->mode, .id = t->id, .size = (uint32_t)t->size};
  r.bytes = t->bytes;
  r.segments = t->segments;
  r.first_bytes = t->first_bytes;
  r.ns = t->t_last > t->t_first ? t->t_last - t->t_first : 0;
  send_control(fd, &r, &t->peer);
}

/* One control datagram at the server. */
static void server_control(int fd, const char* p, size_t len, const struct sockaddr_in* src, struct ServerTest* t) {
  if (len < sizeof(struct Control)) return;
  struct Control c;
  memcpy(&c, p, sizeof c);
  if (c.type == 'H') {
    if (c.id != t->id) {
      *t = (struct ServerTest){.id = c.id, .mode = c.mode, .size = c.size, .peer = *src};
      int gro = uses_gro(c.mode);
      (void)setsockopt(fd, IPPROTO_UDP, UDP_GRO, &gro, sizeof gro);
    }
    struct Control h = {.type = 'h', .mode = c.mode, .id = c.id, .size = c.size};
    send_control(fd, &h, src);
  } else if (c.type == 'F' && c.id == t->id) {
    if (!t->finished && is_bw(t->mode))
      printf("udp_ceiling server bw mode=%s size=%zu rx_segments=%llu rx_bytes=%llu\n", mode_name(t->mode), t->size,
             (unsigned long long)t->segments, (unsigned long long)t->bytes);
    fflush(stdout);
    t->finished = true;
    report(fd, t);
  }
}

/* One received datagram (with UDP_GRO: possibly several segments of seg bytes). */
static void server_datagram(int fd, char* p, size_t len, int seg, const struct sockaddr_in* src, struct ServerTest* t,
                            uint64_t now, bool* got_data) {
  size_t step = seg > 0 ? (size_t)seg : len;
  for (size_t off = 0; off < len; off += step) {
    size_t n = len - off < step ? len - off : step;
    char* s = p + off;
    if (s[0] == 'D') {
      if (t->finished) continue;
      if (t->t_first == 0) t->t_first = now;
      t->bytes += n;
      t->segments++;
      *got_data = true;
    } else if (s[0] == 'P' && t->mode == 'a') {
      /* The pong in the ping's shape, also when the ack's datagram was not coalesced with
       * it (it follows alone and is skipped): the buffer has room behind the ping. */
      memset(s + n, 'A', kAckBytes);
      send_gso(fd, s, n + kAckBytes, (uint16_t)n, src);
      return;
    } else if (s[0] == 'P') {
      (void)sendto(fd, s, n, 0, (const struct sockaddr*)src, sizeof *src);
    } else if (s[0] == 'A') {
      continue; /* an ack's datagram that arrived alone (not coalesced) */
    } else {
      server_control(fd, s, n, src, t);
    }
  }
}

static int run_server(const struct Options* o) {
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
  if (o->bind_addr && !resolve(o->bind_addr, o->port, &addr)) {
    fprintf(stderr, "udp_ceiling: cannot resolve %s\n", o->bind_addr);
    return 1;
  }
  int fd = udp_socket(&addr, o->buffer);
  struct RecvBuffers rb;
  rb.data = malloc((size_t)kRecvBatch * 65536);
  if (!rb.data) return 1;
  printf("udp_ceiling server listening on UDP port %d\n", o->port);
  fflush(stdout);

  const uint64_t slice = 100000000u; /* 100 ms */
  const uint64_t idle_limit = (uint64_t)(o->wait_s * 1e9);
  struct ServerTest t = {0};
  uint64_t last_activity = now_ns();
  set_recv_timeout(fd, slice);
  unsigned spins = 0;
  setup_recv(&rb, 65536, kRecvBatch);
  for (;;) {
    bool polling = (t.mode == 'p' || t.mode == 'a') && !t.finished;
    bool gro = uses_gro(t.mode) && !t.finished;
    rb.count = gro ? kGroBatch : kRecvBatch;
    int flags = polling ? MSG_DONTWAIT : MSG_WAITFORONE;
    int n = recvmmsg(fd, rb.msgs, polling ? 1 : rb.count, flags, NULL);
    uint64_t now;
    if (n <= 0) {
      if (polling && ++spins % 4096 != 0) continue;
      now = now_ns();
      if (t.id != 0 && !t.finished && now - last_activity > idle_limit) {
        fprintf(stderr, "udp_ceiling server: test %s abandoned after %.0f s without a datagram\n", mode_name(t.mode),
                o->wait_s);
        t.finished = true;
      }
      if (now - last_activity > 10 * idle_limit) {
        fprintf(stderr, "udp_ceiling server: idle for %.0f s, exiting\n", 10 * o->wait_s);
        return 0;
      }
      continue;
    }
    now = now_ns();
    last_activity = now;
    bool got_data = false;
    uint64_t before = t.bytes;
    bool first = t.t_first == 0;
    for (int i = 0; i < n; ++i) {
      struct msghdr* h = &rb.msgs[i].msg_hdr;
      server_datagram(fd, rb.iov[i].iov_base, rb.msgs[i].msg_len, gro ? gro_size(h) : 0, &rb.src[i], &t, now,
                      &got_data);
      rb.msgs[i].msg_hdr.msg_controllen = sizeof rb.cmsg[i];
      rb.msgs[i].msg_hdr.msg_namelen = sizeof rb.src[i];
    }
    if (got_data) {
      t.t_last = now;
      if (first) t.first_bytes = t.bytes - before;
    }
  }
}

/* ------------------------------------------------------------------------------------ */
/* Client                                                                                */

/* Waits up to timeout for a control datagram of type `want` and test id `id`. */
static bool await_control(int fd, char want, uint32_t id, uint64_t timeout, struct Control* out) {
  uint64_t deadline = now_ns() + timeout;
  char buf[65536];
  for (;;) {
    uint64_t now = now_ns();
    if (now >= deadline) return false;
    set_recv_timeout(fd, deadline - now < 1000000 ? 1000000 : deadline - now);
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < (ssize_t)sizeof *out) continue;
    memcpy(out, buf, sizeof *out);
    if (out->type == want && out->id == id) return true;
  }
}

/* Sends c every kHandshakeIntervalMs until the answer `want` arrives, for at most wait_s. */
static bool exchange(int fd, const struct sockaddr_in* to, const struct Control* c, char want, double wait_s,
                     struct Control* answer) {
  uint64_t deadline = now_ns() + (uint64_t)(wait_s * 1e9);
  while (now_ns() < deadline) {
    send_control(fd, c, to);
    if (await_control(fd, want, c->id, kHandshakeIntervalMs * 1000000ull, answer)) return true;
  }
  return false;
}

static void print_prefix(const struct Options* o) {
  printf("udp_ceiling %s mode=%s size=%zu", is_bw(o->mode) ? "bw" : "lat", mode_name(o->mode), o->size);
}

static int fail(const struct Options* o, const char* what) {
  print_prefix(o);
  printf(" error=%s\n", what);
  return 1;
}

static int run_bw(const struct Options* o, int fd, const struct sockaddr_in* to, uint32_t id) {
  bool gso = o->mode == 'g';
  unsigned segs = 1;
  if (gso) {
    segs = (unsigned)(kMaxUdpPayload / o->size);
    if (segs > kMaxGsoSegments) segs = kMaxGsoSegments;
    if (segs < 1) return fail(o, "size_too_large");
    int seg = (int)o->size;
    if (setsockopt(fd, IPPROTO_UDP, UDP_SEGMENT, &seg, sizeof seg) != 0) return fail(o, "gso_unsupported");
  }
  unsigned batch = o->batch ? o->batch : (gso ? 1 : 32);
  size_t msg_len = o->size * segs;
  char* buf = malloc(msg_len);
  struct mmsghdr* msgs = calloc(batch, sizeof *msgs);
  struct iovec* iov = calloc(batch, sizeof *iov);
  if (!buf || !msgs || !iov) return fail(o, "out_of_memory");
  memset(buf, 0, msg_len);
  for (unsigned s = 0; s < segs; ++s) buf[s * o->size] = 'D';
  for (unsigned i = 0; i < batch; ++i) {
    iov[i] = (struct iovec){.iov_base = buf, .iov_len = msg_len};
    msgs[i].msg_hdr =
        (struct msghdr){.msg_name = (void*)to, .msg_namelen = sizeof *to, .msg_iov = &iov[i], .msg_iovlen = 1};
  }

  uint64_t start = now_ns(), end = start + (uint64_t)(o->seconds * 1e9), now = start;
  uint64_t sent_segments = 0, send_errors = 0;
  while (now < end) {
    int n = sendmmsg(fd, msgs, batch, 0);
    if (n > 0)
      sent_segments += (uint64_t)n * segs;
    else
      send_errors++;
    now = now_ns();
  }
  double tx_s = (double)(now - start) * 1e-9;

  struct Control fin = {.type = 'F', .mode = o->mode, .id = id, .size = (uint32_t)o->size}, r;
  if (!exchange(fd, to, &fin, 'R', o->wait_s, &r)) return fail(o, "no_report_from_server");
  double rx_s = (double)r.ns * 1e-9;
  double rx_bytes = (double)(r.bytes - r.first_bytes);
  double rx_gbps = rx_s > 0 ? rx_bytes / rx_s * 1e-9 : 0;
  double rx_mpps = rx_s > 0 ? rx_bytes / (double)o->size / rx_s * 1e-6 : 0;
  double lost = sent_segments ? 100.0 * (1.0 - (double)r.segments / (double)sent_segments) : 0;
  print_prefix(o);
  printf(
      " segments_per_send=%u sends_per_call=%u seconds=%.3f tx_GBps=%.3f rx_GBps=%.3f rx_Mpps=%.3f"
      " tx_segments=%llu rx_segments=%llu lost_pct=%.1f send_errors=%llu\n",
      segs, batch, tx_s, (double)sent_segments * (double)o->size / tx_s * 1e-9, rx_gbps, rx_mpps,
      (unsigned long long)sent_segments, (unsigned long long)r.segments, lost < 0 ? 0 : lost,
      (unsigned long long)send_errors);
  free(buf);
  free(msgs);
  free(iov);
  return rx_gbps > 0 ? 0 : 1;
}

static int compare_u64(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

/* Waits for the echo of ping `seq` until deadline; busy-polls or blocks. */
static bool await_pong(int fd, bool poll, char* buf, size_t size, uint32_t seq, uint64_t deadline) {
  unsigned spins = 0;
  for (;;) {
    ssize_t n = recv(fd, buf, size, poll ? MSG_DONTWAIT : 0);
    if (n >= kMinSize && buf[0] == 'P') {
      uint32_t got = (uint8_t)buf[1] | (uint32_t)(uint8_t)buf[2] << 8 | (uint32_t)(uint8_t)buf[3] << 16;
      if (got == (seq & 0xffffff)) return true;
      continue;
    }
    if (n < 0 && (!poll || ++spins % 1024 == 0) && now_ns() >= deadline) return false;
  }
}

static int run_lat(const struct Options* o, int fd, const struct sockaddr_in* to, uint32_t id) {
  bool poll = o->mode == 'p' || o->mode == 'a';
  bool ack = o->mode == 'a';
  size_t out_len = o->size + (ack ? kAckBytes : 0);
  char* out = calloc(1, out_len);
  char* in = calloc(1, out_len + 64);
  uint64_t* rtt = calloc(o->iterations, sizeof *rtt);
  if (!out || !in || !rtt) return fail(o, "out_of_memory");
  out[0] = 'P';
  if (ack) {
    out[o->size] = 'A';
    int on = 1;
    if (setsockopt(fd, IPPROTO_UDP, UDP_GRO, &on, sizeof on) != 0) return fail(o, "gro_unsupported");
  }
  if (!poll) set_recv_timeout(fd, 100000000u);
  const uint64_t per_try = 1000000000u; /* 1 s, then the ping is sent again */
  unsigned retries = 0;
  for (unsigned i = 0; i < o->warmup + o->iterations; ++i) {
    out[1] = (char)(i & 0xff);
    out[2] = (char)(i >> 8 & 0xff);
    out[3] = (char)(i >> 16 & 0xff);
    uint64_t t0 = now_ns();
    bool ok = false;
    for (unsigned attempt = 0; attempt < 4 && !ok; ++attempt) {
      if (attempt) retries++;
      if (ack)
        send_gso(fd, out, out_len, (uint16_t)o->size, to);
      else
        (void)sendto(fd, out, o->size, 0, (const struct sockaddr*)to, sizeof *to);
      ok = await_pong(fd, poll, in, out_len + 64, i, now_ns() + per_try);
    }
    if (!ok) return fail(o, "no_echo_from_server");
    if (i >= o->warmup) rtt[i - o->warmup] = now_ns() - t0;
  }
  struct Control fin = {.type = 'F', .mode = o->mode, .id = id, .size = (uint32_t)o->size}, r;
  (void)exchange(fd, to, &fin, 'R', 1.0, &r);

  qsort(rtt, o->iterations, sizeof *rtt, compare_u64);
  double sum = 0;
  for (unsigned i = 0; i < o->iterations; ++i) sum += (double)rtt[i];
  unsigned n = o->iterations;
  /* One way: half the round trip, in microseconds. */
  double half_us = 0.5e-3;
  print_prefix(o);
  printf(" iterations=%u min_us=%.2f typical_us=%.2f avg_us=%.2f p99_us=%.2f max_us=%.2f retries=%u\n", n,
         (double)rtt[0] * half_us, (double)rtt[n / 2] * half_us, sum / n * half_us,
         (double)rtt[(size_t)((n - 1) * 0.99)] * half_us, (double)rtt[n - 1] * half_us, retries);
  free(out);
  free(in);
  free(rtt);
  return 0;
}

static int run_client(const struct Options* o) {
  struct sockaddr_in to;
  if (!resolve(o->host, o->port, &to)) return fail(o, "cannot_resolve_host");
  struct sockaddr_in any = {.sin_family = AF_INET};
  int fd = udp_socket(&any, o->buffer);
  uint32_t id = (uint32_t)(now_ns() ^ (uint64_t)getpid() << 16) | 1u;
  struct Control hello = {.type = 'H', .mode = o->mode, .id = id, .size = (uint32_t)o->size}, answer;
  if (!exchange(fd, &to, &hello, 'h', o->wait_s, &answer)) return fail(o, "no_answer_from_server");
  int rc = is_bw(o->mode) ? run_bw(o, fd, &to, id) : run_lat(o, fd, &to, id);
  fflush(stdout);
  close(fd);
  return rc;
}

int main(int argc, char** argv) {
  if (argc < 2) usage();
  bool server = strcmp(argv[1], "server") == 0;
  if (!server && strcmp(argv[1], "client") != 0) usage();
  struct Options o = {
      .port = 18515, .size = 0, .seconds = 2, .iterations = 20000, .warmup = 1000, .buffer = 4 << 20, .wait_s = 10};
  int first = 2;
  if (!server) {
    if (argc < 3 || argv[2][0] == '-') usage();
    o.host = argv[2];
    first = 3;
  }
  optind = first;
  int c;
  while ((c = getopt(argc, argv, "+p:B:m:s:t:n:w:b:r:W:")) != -1) {
    switch (c) {
      case 'p':
        o.port = atoi(optarg);
        break;
      case 'B':
        o.bind_addr = optarg;
        break;
      case 'm':
        o.mode = parse_mode(optarg);
        break;
      case 's':
        o.size = strtoul(optarg, NULL, 10);
        break;
      case 't':
        o.seconds = atof(optarg);
        break;
      case 'n':
        o.iterations = (unsigned)strtoul(optarg, NULL, 10);
        break;
      case 'w':
        o.warmup = (unsigned)strtoul(optarg, NULL, 10);
        break;
      case 'b':
        o.batch = (unsigned)strtoul(optarg, NULL, 10);
        break;
      case 'r':
        o.buffer = atoi(optarg);
        break;
      case 'W':
        o.wait_s = atof(optarg);
        break;
      default:
        usage();
    }
  }
  if (optind != argc || o.port <= 0 || o.port > 65535 || o.wait_s <= 0) usage();
  if (server) return run_server(&o);
  if (!o.mode) usage();
  if (o.size == 0) o.size = is_bw(o.mode) ? 4112 : 64;
  if (o.size < kMinSize || o.size > kMaxUdpPayload || o.iterations == 0 || o.batch > 1024 || o.seconds <= 0) usage();
  if (o.mode == 'a' && (o.size < kAckBytes || o.size + kAckBytes > kMaxUdpPayload)) usage();
  return run_client(&o);
}
