#include "noncontig_control.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

namespace noncontig {

namespace {

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool wait_fd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  int rc;
  do rc = poll(&p, 1, timeout_ms);
  while (rc < 0 && errno == EINTR);
  return rc > 0;
}

}  // namespace

int control_listen(uint16_t port, int timeout_ms) {
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0) {
    std::fprintf(stderr, "noncontig: socket: %s\n", std::strerror(errno));
    return -1;
  }
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) || listen(lfd, 1)) {
    std::fprintf(stderr, "noncontig: listen on TCP port %u: %s\n", port, std::strerror(errno));
    close(lfd);
    return -1;
  }
  if (!wait_fd(lfd, POLLIN, timeout_ms)) {
    std::fprintf(stderr, "noncontig: no client on TCP port %u within %d ms\n", port, timeout_ms);
    close(lfd);
    return -1;
  }
  int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) std::fprintf(stderr, "noncontig: accept: %s\n", std::strerror(errno));
  close(lfd);
  if (fd >= 0) set_nodelay(fd);
  return fd;
}

int control_connect(const char* host, uint16_t port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host, service.c_str(), &hints, &res); rc != 0) {
    std::fprintf(stderr, "noncontig: %s: %s\n", host, gai_strerror(rc));
    return -1;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int fd = -1;
  for (;;) {  // the server may not listen yet: retry until the deadline
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) break;
    int err = errno;
    if (fd >= 0) close(fd);
    fd = -1;
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "noncontig: connect to %s:%u: %s\n", host, port, std::strerror(err));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  freeaddrinfo(res);
  if (fd >= 0) set_nodelay(fd);
  return fd;
}

bool control_send(int fd, const void* p, size_t len) {
  auto* b = static_cast<const char*>(p);
  while (len > 0) {
    ssize_t n = send(fd, b, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::fprintf(stderr, "noncontig: control send: %s\n", std::strerror(errno));
      return false;
    }
    b += n;
    len -= size_t(n);
  }
  return true;
}

bool control_recv(int fd, void* p, size_t len, int timeout_ms) {
  auto* b = static_cast<char*>(p);
  while (len > 0) {
    if (!wait_fd(fd, POLLIN, timeout_ms)) {
      std::fprintf(stderr, "noncontig: control connection silent for %d ms\n", timeout_ms);
      return false;
    }
    ssize_t n = recv(fd, b, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::fprintf(stderr, "noncontig: control connection: %s\n", n == 0 ? "closed by the peer" : std::strerror(errno));
      return false;
    }
    b += n;
    len -= size_t(n);
  }
  return true;
}

}  // namespace noncontig
