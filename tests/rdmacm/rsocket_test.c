// rsockets over uroce, against librdmacm's public <rdma/rsocket.h>: bad input
// (errno as librdmacm), a stream with half-close and rpoll over a mix of
// descriptors, riomap/riowrite, a raw peer whose message lies about its
// length, and the queue options. The server is a forked child; every wait is
// bounded.
// Usage: rsocket_test CASE PORT.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // before any system header (cm_test_util.h needs it)
#endif
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <rdma/rsocket.h>
#include <sys/mman.h>
#include <sys/uio.h>

#include "cm_test_util.h"

static unsigned char pattern(size_t i) { return (unsigned char)(i * 7 + (i >> 11)); }

// A listening rsocket on the test's port (the child's side).
static int listen_on_port(void) {
  int ls = rsocket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(ls >= 0, "rsocket: %s", strerror(errno));
  struct sockaddr_in a = loopback(atoi(g_port));
  REQUIRE(rbind(ls, (struct sockaddr*)&a, sizeof a) == 0, "rbind: %s", strerror(errno));
  REQUIRE(rlisten(ls, 4) == 0, "rlisten: %s", strerror(errno));
  return ls;
}

static int connect_to_port(void) {
  int s = rsocket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0, "rsocket: %s", strerror(errno));
  struct sockaddr_in a = loopback(atoi(g_port));
  REQUIRE(rconnect(s, (struct sockaddr*)&a, sizeof a) == 0, "rconnect: %s", strerror(errno));
  return s;
}

// Reads exactly n bytes (blocking), failing on EOF or error.
static void read_all(int s, void* buf, size_t n) {
  for (size_t got = 0; got < n;) {
    ssize_t r = rrecv(s, (char*)buf + got, n - got, 0);
    REQUIRE(r > 0, "rrecv after %zu of %zu bytes: %zd (%s)", got, n, r, r < 0 ? strerror(errno) : "EOF");
    got += (size_t)r;
  }
}

// Bad input: each call fails with librdmacm's errno and nothing is created.
static void case_errors(void) {
  REQUIRE(rsocket(AF_UNIX, SOCK_STREAM, 0) == -1 && errno == ENOTSUP, "AF_UNIX: errno %d", errno);
  REQUIRE(rsocket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) == -1 && errno == ENOTSUP, "SOCK_CLOEXEC: errno %d", errno);
  REQUIRE(rsocket(AF_INET, SOCK_DGRAM, 0) == -1 && errno == ENOSYS, "SOCK_DGRAM: errno %d", errno);
  char b[8];
  REQUIRE(rsend(1 << 20, b, sizeof b, 0) == -1 && errno == EBADF, "rsend on a non-rsocket: errno %d", errno);
  REQUIRE(rclose(1 << 20) == -1 && errno == EBADF, "rclose on a non-rsocket: errno %d", errno);
  int s = rsocket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0, "rsocket: %s", strerror(errno));
  REQUIRE(rrecv(s, b, sizeof b, 0) == -1 && errno == ENOTCONN, "rrecv unconnected: errno %d", errno);
  REQUIRE(rsend(s, b, sizeof b, 0) == -1 && errno == ENOTCONN, "rsend unconnected: errno %d", errno);
  // The length alone, as librspreload asks it before it moves a socket to the kernel.
  socklen_t name_len = 0;
  REQUIRE(rgetsockname(s, NULL, &name_len) == 0 && name_len == sizeof(struct sockaddr_in),
          "rgetsockname(NULL, 0): errno %d, length %u", errno, (unsigned)name_len);
  name_len = 4;
  REQUIRE(rgetsockname(s, NULL, &name_len) == -1 && errno == EFAULT, "rgetsockname(NULL, 4): errno %d", errno);
  int v = 1;
  REQUIRE(rsetsockopt(s, SOL_SOCKET, SO_BROADCAST, &v, sizeof v) == -1 && errno == ENOPROTOOPT,
          "unknown option: errno %d", errno);
  REQUIRE(rsetsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v) == 0, "TCP_NODELAY: %s", strerror(errno));
  socklen_t len = sizeof v;
  v = 0;
  REQUIRE(rgetsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, &len) == 0 && v == 1, "TCP_NODELAY reads back %d", v);
  REQUIRE(rfcntl(s, F_SETFL, O_NONBLOCK) == 0 && (rfcntl(s, F_GETFL) & O_NONBLOCK), "rfcntl O_NONBLOCK");
  // Nobody listens on the test's port: refused.
  struct sockaddr_in a = loopback(atoi(g_port));
  REQUIRE(rconnect(s, (struct sockaddr*)&a, sizeof a) == -1 && errno == ECONNREFUSED, "rconnect: errno %d", errno);
  REQUIRE(rclose(s) == 0, "rclose: %s", strerror(errno));
}

// The child: accepts one connection, reads until the client's SHUT_WR (EOF),
// then answers the byte count and a checksum on the same socket, and closes.
static int g_server_queue;  // RDMA_SQSIZE and RDMA_RQSIZE of the server's listener, if set

static void stream_server(int ready_fd) {
  int ls = listen_on_port();
  if (g_server_queue) {  // inherited by the accepted socket, as librdmacm's
    REQUIRE(rsetsockopt(ls, SOL_RDMA, RDMA_RQSIZE, &g_server_queue, sizeof g_server_queue) == 0 &&
                rsetsockopt(ls, SOL_RDMA, RDMA_SQSIZE, &g_server_queue, sizeof g_server_queue) == 0,
            "server RDMA_RQSIZE/RDMA_SQSIZE: %s", strerror(errno));
  }
  signal_peer(ready_fd);
  int s = raccept(ls, NULL, NULL);
  REQUIRE(s >= 0, "raccept: %s", strerror(errno));
  static unsigned char buf[1 << 16];
  uint64_t total = 0, sum = 0;
  for (;;) {
    ssize_t r = rrecv(s, buf, sizeof buf, 0);
    REQUIRE(r >= 0, "server rrecv: %s", strerror(errno));
    if (r == 0) break;  // the client's SHUT_WR
    for (ssize_t i = 0; i < r; ++i) {
      REQUIRE(buf[i] == pattern(total + (size_t)i), "server: byte %llu is %u", (unsigned long long)(total + i), buf[i]);
      sum += buf[i];
    }
    total += (uint64_t)r;
  }
  uint64_t reply[2] = {total, sum};
  REQUIRE(rsend(s, reply, sizeof reply, 0) == (ssize_t)sizeof reply, "server rsend after EOF: %s", strerror(errno));
  REQUIRE(rclose(s) == 0 && rclose(ls) == 0, "server rclose");
  exit(0);
}

// Forks the server (which exits when done) and returns once it listens.
static pid_t start_server(void (*server)(int ready_fd)) {
  int fds[2];
  REQUIRE(pipe(fds) == 0, "pipe");
  pid_t pid = fork();
  REQUIRE(pid >= 0, "fork");
  if (pid == 0) {
    close(fds[0]);
    server(fds[1]);
  }
  close(fds[1]);
  wait_peer(fds[0], 10000);
  close(fds[0]);
  return pid;
}

// 3 MB in gathered pieces, then SHUT_WR; stream_server's answer must be their
// count and sum.
static void send_and_check(int s) {
  const size_t kBytes = 3 << 20;
  unsigned char* data = malloc(kBytes);
  REQUIRE(data, "malloc");
  uint64_t sum = 0;
  for (size_t i = 0; i < kBytes; ++i) sum += data[i] = pattern(i);
  for (size_t off = 0, piece = 1; off < kBytes;) {  // pieces of 1 B .. 192 KiB, two iovecs each
    size_t n = piece < kBytes - off ? piece : kBytes - off;
    struct iovec v[2] = {{data + off, n / 2}, {data + off + n / 2, n - n / 2}};
    ssize_t w = rwritev(s, v, 2);
    REQUIRE(w > 0, "rwritev: %s", strerror(errno));
    off += (size_t)w;
    piece = piece > (1 << 17) ? 1 : piece * 3 + 1;
  }
  REQUIRE(rshutdown(s, SHUT_WR) == 0, "rshutdown: %s", strerror(errno));
  char b;
  REQUIRE(rsend(s, &b, 1, 0) == -1 && errno == EPIPE, "rsend after SHUT_WR: errno %d", errno);
  uint64_t reply[2];
  read_all(s, reply, sizeof reply);
  REQUIRE(reply[0] == kBytes && reply[1] == sum, "server saw %llu bytes, sum %llu (sent %zu, sum %llu)",
          (unsigned long long)reply[0], (unsigned long long)reply[1], kBytes, (unsigned long long)sum);
  free(data);
}

// A stream: non-blocking reads say EAGAIN, rpoll reports an ordinary pipe
// among rsockets, 3 MB in gathered pieces arrive intact, and after SHUT_WR the
// peer still answers; then the end of the stream and POLLHUP.
static void case_stream(void) {
  pid_t pid = start_server(stream_server);
  int s = connect_to_port();
  char b[4];
  REQUIRE(rrecv(s, b, sizeof b, MSG_DONTWAIT) == -1 && errno == EAGAIN, "empty rrecv: errno %d", errno);
  int p[2];
  REQUIRE(pipe(p) == 0 && write(p[1], "x", 1) == 1, "pipe");
  struct pollfd pf[2] = {{.fd = s, .events = POLLIN}, {.fd = p[0], .events = POLLIN}};
  REQUIRE(rpoll(pf, 2, 5000) == 1 && pf[1].revents == POLLIN && pf[0].revents == 0, "rpoll: %d %d", pf[0].revents,
          pf[1].revents);
  send_and_check(s);
  double deadline = now_ms() + 5000;
  ssize_t r;
  while ((r = rrecv(s, b, sizeof b, MSG_DONTWAIT)) == -1 && errno == EAGAIN && now_ms() < deadline) usleep(1000);
  REQUIRE(r == 0, "end of stream: rrecv returned %zd (%s)", r, strerror(errno));
  // The FIN made the stream end (POLLIN); POLLHUP follows once the peer's
  // disconnect arrives (rpoll returns at once while POLLIN holds: poll again).
  deadline = now_ms() + 5000;
  do {
    pf[0].revents = 0;
    REQUIRE(rpoll(pf, 1, 100) >= 0, "rpoll: %s", strerror(errno));
    if (!(pf[0].revents & POLLHUP)) usleep(1000);
  } while (!(pf[0].revents & POLLHUP) && now_ms() < deadline);
  REQUIRE(pf[0].revents & POLLHUP, "no POLLHUP within 5 s of the peer's close");
  REQUIRE(rclose(s) == 0, "rclose");
  expect_child_ok(pid);
}

static int queue_option(int s, int name) {
  int v = -1;
  socklen_t len = sizeof v;
  REQUIRE(rgetsockopt(s, SOL_RDMA, name, &v, &len) == 0 && len == sizeof v, "rgetsockopt: %s", strerror(errno));
  return v;
}

// The smaller of 0xFFFE and the first device's max_qp_wr.
static int device_queue_limit(void) {
  struct ibv_context** devs = rdma_get_devices(NULL);
  REQUIRE(devs && devs[0], "rdma_get_devices: %s", strerror(errno));
  struct ibv_device_attr dev;
  REQUIRE(ibv_query_device(devs[0], &dev) == 0, "ibv_query_device");
  rdma_free_devices(devs);
  return dev.max_qp_wr < 0xFFFE ? dev.max_qp_wr : 0xFFFE;
}

// RDMA_SQSIZE, RDMA_RQSIZE and RDMA_INLINE as librdmacm takes them: reported
// as asked (at most 0xFFFE) before the connection and as fitted after (at
// least 16, at most the device's max_qp_wr). Both sides' queues at 16 (the
// server's receive queue is the client's credit) still carry the stream.
static void case_queues(void) {
  int s = rsocket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0, "rsocket: %s", strerror(errno));
  int sq = queue_option(s, RDMA_SQSIZE), rq = queue_option(s, RDMA_RQSIZE), inl = queue_option(s, RDMA_INLINE);
  REQUIRE(sq == 384 && rq == 384 && inl == 64, "defaults: sq %d, rq %d, inline %d", sq, rq, inl);
  int big = 100000, small = 4, none = 0;
  REQUIRE(rsetsockopt(s, SOL_RDMA, RDMA_RQSIZE, &big, sizeof big) == 0 &&
              rsetsockopt(s, SOL_RDMA, RDMA_SQSIZE, &small, sizeof small) == 0 &&
              rsetsockopt(s, SOL_RDMA, RDMA_INLINE, &none, sizeof none) == 0,
          "rsetsockopt: %s", strerror(errno));
  sq = queue_option(s, RDMA_SQSIZE), rq = queue_option(s, RDMA_RQSIZE), inl = queue_option(s, RDMA_INLINE);
  REQUIRE(sq == 4 && rq == 0xFFFE && inl == 0, "as asked: sq %d, rq %d, inline %d", sq, rq, inl);
  g_server_queue = 16;
  pid_t pid = start_server(stream_server);
  struct sockaddr_in a = loopback(atoi(g_port));
  REQUIRE(rconnect(s, (struct sockaddr*)&a, sizeof a) == 0, "rconnect: %s", strerror(errno));
  int max = device_queue_limit();
  sq = queue_option(s, RDMA_SQSIZE), rq = queue_option(s, RDMA_RQSIZE), inl = queue_option(s, RDMA_INLINE);
  REQUIRE(sq == 16 && rq == max && inl >= 24, "fitted: sq %d, rq %d (device %d), inline %d", sq, rq, max, inl);
  send_and_check(s);
  REQUIRE(rclose(s) == 0, "rclose");
  expect_child_ok(pid);
}

// The child maps a buffer for writing, says so, and after the client's "done"
// message (sent after its riowrite, so ordered behind it) checks the bytes.
static void iomap_server(int ready_fd) {
  int ls = listen_on_port();
  signal_peer(ready_fd);
  int s = raccept(ls, NULL, NULL);
  REQUIRE(s >= 0, "raccept: %s", strerror(errno));
  const size_t kLen = 300000;
  unsigned char* buf = calloc(1, kLen);
  REQUIRE(buf, "calloc");
  REQUIRE(riomap(s, buf, kLen, PROT_WRITE, 0, 4096) == 4096, "riomap: %s", strerror(errno));
  REQUIRE(rsend(s, "mapped", 6, 0) == 6, "rsend mapped");
  char done[4];
  read_all(s, done, sizeof done);
  REQUIRE(memcmp(done, "done", 4) == 0, "no done message");
  for (size_t i = 0; i < 200000; ++i)
    REQUIRE(buf[1000 + i] == pattern(i), "riowritten byte %zu is %u, expected %u", i, buf[1000 + i], pattern(i));
  REQUIRE(buf[999] == 0 && buf[201000] == 0, "riowrite wrote outside its range");
  REQUIRE(riounmap(s, buf, kLen) == 0, "riounmap: %s", strerror(errno));
  REQUIRE(rclose(s) == 0 && rclose(ls) == 0, "server rclose");
  free(buf);
  exit(0);
}

// riowrite lands in the peer's riomap'ed buffer at the offset it chose. As in
// librdmacm: the riowriter sets RDMA_IOMAPSIZE before it connects (the slots
// its peer may announce regions in); a side whose peer set none cannot
// riomap a region for writing (ENOMEM); riowrite to an offset the peer did
// not map writes nothing (0).
static void case_iomap(void) {
  pid_t pid = start_server(iomap_server);
  int s = rsocket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0, "rsocket: %s", strerror(errno));
  int slots = 4;
  REQUIRE(rsetsockopt(s, SOL_RDMA, RDMA_IOMAPSIZE, &slots, sizeof slots) == 0, "RDMA_IOMAPSIZE: %s", strerror(errno));
  struct sockaddr_in a = loopback(atoi(g_port));
  REQUIRE(rconnect(s, (struct sockaddr*)&a, sizeof a) == 0, "rconnect: %s", strerror(errno));
  char msg[6];
  read_all(s, msg, sizeof msg);  // the mapping's announcement came before this
  REQUIRE(memcmp(msg, "mapped", 6) == 0, "no mapped message");
  unsigned char* data = malloc(200000);
  REQUIRE(data, "malloc");
  for (size_t i = 0; i < 200000; ++i) data[i] = pattern(i);
  REQUIRE(riowrite(s, data, 10, 1 << 20, 0) == 0, "riowrite to an offset the peer did not map wrote something");
  REQUIRE(riomap(s, data, 100, PROT_WRITE, 0, 0) == -1 && errno == ENOMEM,
          "riomap for writing to a peer without RDMA_IOMAPSIZE: errno %d", errno);
  for (size_t off = 0; off < 200000;) {
    size_t w = riowrite(s, data + off, 200000 - off, (off_t)(4096 + 1000 + off), 0);
    REQUIRE(w != (size_t)-1 && w > 0, "riowrite: %s", strerror(errno));
    off += w;
  }
  REQUIRE(rsend(s, "done", 4, 0) == 4, "rsend done");
  char b;
  REQUIRE(rrecv(s, &b, 1, 0) == 0, "end of stream after the server closed");
  REQUIRE(rclose(s) == 0, "rclose");
  expect_child_ok(pid);
  free(data);
}

// librdmacm's connection data (rsocket.c's struct rs_conn_data), byte for byte.
struct conn_data {
  uint8_t version, flags;
  uint16_t credits_be;
  uint8_t reserved[3], target_iomap_size;
  uint64_t sgl_addr_be;
  uint32_t sgl_key_be, sgl_len_be;
  uint64_t buf_addr_be;
  uint32_t buf_key_be, buf_len_be;
};

// The child's rsocket must end the connection with EPROTO, not read out of
// its buffer, when its peer's message claims more than a buffer half.
static void hostile_server(int ready_fd) {
  int ls = listen_on_port();
  signal_peer(ready_fd);
  int s = raccept(ls, NULL, NULL);
  REQUIRE(s >= 0, "raccept: %s", strerror(errno));
  char b[16];
  ssize_t r = rrecv(s, b, sizeof b, 0);
  REQUIRE(r == -1 && errno == EPROTO, "rrecv after an oversized message: %zd (%s)", r, strerror(errno));
  REQUIRE(rclose(s) == 0 && rclose(ls) == 0, "server rclose");
  exit(0);
}

// A peer speaking raw verbs and rdma_cm connects with librdmacm's connection
// data, then RDMA-WRITEs an empty message whose immediate data says 64 KiB + 1.
static void case_hostile(void) {
  pid_t pid = start_server(hostile_server);
  struct async_client c;
  async_client_setup(&c, atoi(g_port));
  static uint8_t area[4096];
  struct ibv_mr* mr = ibv_reg_mr(c.pd, area, sizeof area, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  REQUIRE(mr, "ibv_reg_mr: %s", strerror(errno));
  struct conn_data mine = {.version = 1,
                           .credits_be = htobe16(16),
                           .sgl_addr_be = htobe64((uintptr_t)area),
                           .sgl_key_be = htobe32(mr->rkey),
                           .sgl_len_be = htobe32(2),
                           .buf_addr_be = htobe64((uintptr_t)area + 64),
                           .buf_key_be = htobe32(mr->rkey),
                           .buf_len_be = htobe32(2048)};
  _Static_assert(sizeof mine == 40, "librdmacm's connection data is 40 bytes");
  struct rdma_conn_param param = basic_param(&mine, sizeof mine);
  REQUIRE(rdma_connect(c.id, &param) == 0, "rdma_connect: %s", strerror(errno));
  struct rdma_cm_event* ev = expect_event(c.ch, RDMA_CM_EVENT_ESTABLISHED, 10000);
  struct conn_data theirs;
  REQUIRE(ev->param.conn.private_data_len >= sizeof theirs, "REP private data: %u bytes",
          ev->param.conn.private_data_len);
  memcpy(&theirs, ev->param.conn.private_data, sizeof theirs);
  rdma_ack_cm_event(ev);
  REQUIRE(theirs.version == 1 && be32toh(theirs.buf_len_be) == 65536, "the server's connection data");
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof wr);
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(65537);  // op 0 (data), length 64 KiB + 1
  wr.wr.rdma.remote_addr = be64toh(theirs.buf_addr_be);
  wr.wr.rdma.rkey = be32toh(theirs.buf_key_be);
  REQUIRE(ibv_post_send(c.id->qp, &wr, &bad) == 0, "ibv_post_send");
  struct ibv_wc wc;
  int n = 0;
  for (double end = now_ms() + 10000; n == 0 && now_ms() < end;) n = ibv_poll_cq(c.cq, 1, &wc);
  REQUIRE(n == 1 && wc.status == IBV_WC_SUCCESS, "the write's completion: %d, status %d", n, n ? (int)wc.status : -1);
  expect_child_ok(pid);
  ibv_dereg_mr(mr);
  async_client_teardown(&c);
}

int main(int argc, char** argv) {
  g_program = "rsocket_test";
  if (argc != 3) {
    fprintf(stderr,
            "usage: rsocket_test rsocket_errors|rsocket_stream|rsocket_iomap|rsocket_hostile|rsocket_queues PORT\n");
    return 2;
  }
  g_case = argv[1];
  snprintf(g_port, sizeof g_port, "%s", argv[2]);
  if (strcmp(g_case, "rsocket_errors") == 0)
    case_errors();
  else if (strcmp(g_case, "rsocket_stream") == 0)
    case_stream();
  else if (strcmp(g_case, "rsocket_iomap") == 0)
    case_iomap();
  else if (strcmp(g_case, "rsocket_hostile") == 0)
    case_hostile();
  else if (strcmp(g_case, "rsocket_queues") == 0)
    case_queues();
  else
    fail("unknown case");
  printf("rsocket_test %s: passed\n", g_case);
  return 0;
}
