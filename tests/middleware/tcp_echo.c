/* A plain TCP echo server and client (socket, bind, listen, accept, connect, send, recv,
 * poll, shutdown: no RDMA call), for running under librspreload, which turns its
 * sockets into rsockets (tests/middleware/CMakeLists.txt).
 *
 *   tcp_echo --server PORT                 echoes one connection's bytes until EOF
 *   tcp_echo --client HOST PORT BYTES      sends BYTES of a pattern (in chunks of 1 B to
 *                                          256 KiB, waiting in poll for writability and
 *                                          reading the echo as it comes), checks every
 *                                          byte of the echo, prints "tcp_echo: N bytes
 *                                          echoed and checked"
 *   --rsocket (either side)                fails unless the socket answers
 *                                          getsockopt(SOL_RDMA, RDMA_SQSIZE), which only
 *                                          an rsocket does: no silent kernel TCP
 * Exit status 0 on success, 1 on any error or mismatch (with a message).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int fail(const char* what) {
  fprintf(stderr, "tcp_echo: %s: %s\n", what, strerror(errno));
  exit(1);
}

static unsigned char pattern(size_t i) { return (unsigned char)(i * 131 + (i >> 9) * 7 + 3); }

static void check_rsocket(int fd, int want) {
  int v = 0;
  socklen_t len = sizeof v;
  int is_rsocket = getsockopt(fd, SOL_RDMA, RDMA_SQSIZE, &v, &len) == 0;
  if (want && !is_rsocket) {
    fprintf(stderr, "tcp_echo: the socket is a kernel TCP socket, not an rsocket\n");
    exit(1);
  }
}

static int serve(int port, int want_rsocket) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0) fail("socket");
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (bind(ls, (struct sockaddr*)&a, sizeof a) || listen(ls, 1)) fail("bind/listen");
  check_rsocket(ls, want_rsocket);
  int s = accept(ls, NULL, NULL);
  if (s < 0) fail("accept");
  check_rsocket(s, want_rsocket);
  static char buf[1 << 18];
  size_t total = 0;
  for (;;) {
    ssize_t n = recv(s, buf, sizeof buf, 0);
    if (n < 0) fail("recv");
    if (n == 0) break;
    for (ssize_t off = 0; off < n;) {
      ssize_t m = send(s, buf + off, (size_t)(n - off), 0);
      if (m < 0) fail("send");
      off += m;
    }
    total += (size_t)n;
  }
  printf("tcp_echo: server echoed %zu bytes\n", total);
  close(s);
  close(ls);
  return 0;
}

static int client(const char* host, int port, size_t bytes, int want_rsocket) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) fail("socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1) fail("inet_pton");
  if (connect(s, (struct sockaddr*)&a, sizeof a)) fail("connect");
  check_rsocket(s, want_rsocket);
  unsigned char* out = malloc(bytes);
  unsigned char* in = malloc(bytes);
  if (!out || !in) fail("malloc");
  for (size_t i = 0; i < bytes; ++i) out[i] = pattern(i);
  size_t sent = 0, got = 0, chunk = 1;
  while (got < bytes) {
    struct pollfd p = {.fd = s, .events = POLLIN | (sent < bytes ? POLLOUT : 0)};
    if (poll(&p, 1, 10000) <= 0) fail("poll (10 s without progress)");
    if ((p.revents & POLLOUT) && sent < bytes) {
      size_t n = chunk < bytes - sent ? chunk : bytes - sent;
      ssize_t m = send(s, out + sent, n, MSG_DONTWAIT);
      if (m < 0 && errno != EAGAIN) fail("send");
      if (m > 0) sent += (size_t)m;
      chunk = chunk >= (1 << 18) ? 1 : chunk * 4 + 1; /* 1, 5, 21, ... 256 KiB, again */
      if (sent == bytes && shutdown(s, SHUT_WR) != 0) fail("shutdown");
    }
    if (p.revents & (POLLIN | POLLHUP)) {
      ssize_t m = recv(s, in + got, bytes - got, MSG_DONTWAIT);
      if (m < 0 && errno != EAGAIN) fail("recv");
      if (m == 0) break;
      if (m > 0) got += (size_t)m;
    }
  }
  if (got != bytes) {
    fprintf(stderr, "tcp_echo: %zu of %zu bytes came back\n", got, bytes);
    return 1;
  }
  for (size_t i = 0; i < bytes; ++i) {
    if (in[i] != pattern(i)) {
      fprintf(stderr, "tcp_echo: byte %zu is %u, expected %u\n", i, in[i], pattern(i));
      return 1;
    }
  }
  printf("tcp_echo: %zu bytes echoed and checked\n", bytes);
  close(s);
  free(out);
  free(in);
  return 0;
}

int main(int argc, char** argv) {
  int want = argc > 1 && strcmp(argv[argc - 1], "--rsocket") == 0;
  if (want) --argc;
  if (argc == 3 && strcmp(argv[1], "--server") == 0) return serve(atoi(argv[2]), want);
  if (argc == 5 && strcmp(argv[1], "--client") == 0)
    return client(argv[2], atoi(argv[3]), strtoul(argv[4], 0, 10), want);
  fprintf(stderr, "usage: tcp_echo --server PORT [--rsocket] | --client HOST PORT BYTES [--rsocket]\n");
  return 2;
}
