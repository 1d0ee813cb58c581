// The rsocket(7) entry points of librdmacm (see rsocket.h for what an RSocket
// is). An rsocket's number is its event channel's fd; the table maps numbers
// to sockets under table_mu, and every call on a socket holds its mutex
// (RSocket::send/recv/shutdown expect it held and keep it held on return).
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <rdma/rsocket.h>
#include <sys/select.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "rsockets/rsocket.h"
#include "verbs/export.h"

using uroce::rsockets::RSocket;
using uroce::verbs::abi_guard;

namespace {

std::mutex table_mu;
std::unordered_map<int, std::shared_ptr<RSocket>>& table() {
  static auto* t = new std::unordered_map<int, std::shared_ptr<RSocket>>();  // never freed: used at exit
  return *t;
}

std::shared_ptr<RSocket> lookup(int s) {
  std::lock_guard lock(table_mu);
  auto it = table().find(s);
  return it == table().end() ? nullptr : it->second;
}

void insert(const std::shared_ptr<RSocket>& rs) {
  std::lock_guard lock(table_mu);
  table()[rs->fd()] = rs;
}

int fail(int err) {
  errno = err;
  return -1;
}

// Runs f(rs) with the socket's mutex held; EBADF if s is not an rsocket.
template <class R, class F>
R with_socket(int s, F&& f) {
  return abi_guard<R>(R(-1), [&]() -> R {
    std::shared_ptr<RSocket> rs = lookup(s);
    if (!rs) {
      errno = EBADF;
      return R(-1);
    }
    std::lock_guard lock(rs->mutex());
    return f(*rs);
  });
}

ssize_t result(ssize_t n) {
  if (n >= 0) return n;
  errno = int(-n);
  return -1;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void say_datagrams_unsupported() {
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    std::fprintf(stderr, "uroce: rsocket: datagram rsockets (SOCK_DGRAM) are not implemented by uroce (ENOSYS)\n");
}

}  // namespace

namespace {

// The options rsockets know: accepted and reported back. Only SO_RCVBUF,
// SO_SNDBUF and the SOL_RDMA ones change what a connection does (rsocket.h;
// keepalive and Nagle have no meaning on an RC connection).
bool known_option(int level, int name) {
  switch (level) {
    case SOL_SOCKET:
      return name == SO_REUSEADDR || name == SO_KEEPALIVE || name == SO_SNDBUF || name == SO_RCVBUF ||
             name == SO_LINGER || name == SO_OOBINLINE || name == SO_ERROR;
    case IPPROTO_TCP:
      return name == TCP_NODELAY || name == TCP_MAXSEG || name == TCP_KEEPIDLE;
    case IPPROTO_IPV6:
      return name == IPV6_V6ONLY;
    case SOL_RDMA:
      return name == RDMA_SQSIZE || name == RDMA_RQSIZE || name == RDMA_INLINE || name == RDMA_IOMAPSIZE ||
             name == RDMA_ROUTE;
    default:
      return false;
  }
}

}  // namespace

UROCE_API int rsocket(int domain, int type, int protocol) {
  return abi_guard<int>(-1, [&] {
    if (domain != AF_INET && domain != AF_INET6) return fail(ENOTSUP);
    if (type == SOCK_DGRAM && (!protocol || protocol == IPPROTO_UDP)) {
      say_datagrams_unsupported();
      return fail(ENOSYS);
    }
    // As librdmacm: exactly SOCK_STREAM (flags such as SOCK_CLOEXEC are refused,
    // which is how uroce's own sockets stay kernel sockets under librspreload).
    if (type != SOCK_STREAM || (protocol && protocol != IPPROTO_TCP)) return fail(ENOTSUP);
    std::shared_ptr<RSocket> rs = RSocket::create();
    if (!rs) return -1;
    insert(rs);
    return rs->fd();
  });
}

UROCE_API int rbind(int s, const sockaddr* addr, socklen_t) {
  return with_socket<int>(s, [&](RSocket& rs) {
    if (!addr) return fail(EINVAL);
    int err = rs.bind(addr);
    return err ? fail(err) : 0;
  });
}

UROCE_API int rlisten(int s, int backlog) {
  return with_socket<int>(s, [&](RSocket& rs) {
    int err = rs.listen(backlog);
    return err ? fail(err) : 0;
  });
}

UROCE_API int rconnect(int s, const sockaddr* addr, socklen_t) {
  return with_socket<int>(s, [&](RSocket& rs) {
    if (!addr) return fail(EINVAL);
    int err = rs.connect(addr);
    if (err) rs.pending_error = err;
    return err ? fail(err) : 0;
  });
}

UROCE_API int raccept(int s, sockaddr* addr, socklen_t* addrlen) {
  return abi_guard<int>(-1, [&] {
    std::shared_ptr<RSocket> rs = lookup(s);
    if (!rs) return fail(EBADF);
    for (;;) {
      std::shared_ptr<RSocket> child;
      int err;
      bool nonblocking;
      {
        std::lock_guard lock(rs->mutex());
        err = rs->accept(&child, addr, addrlen);
        nonblocking = rs->nonblocking;
      }
      if (!err) {
        insert(child);
        return child->fd();
      }
      if (err != EAGAIN || nonblocking) return fail(err);
      pollfd p{s, POLLIN, 0};
      if (::poll(&p, 1, -1) < 0 && errno == EINTR) return fail(EINTR);
    }
  });
}

UROCE_API int rshutdown(int s, int how) {
  return with_socket<int>(s, [&](RSocket& rs) {
    if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return fail(EINVAL);
    int err = rs.shutdown(how);
    return err ? fail(err) : 0;
  });
}

UROCE_API int rclose(int s) {
  return abi_guard<int>(-1, [&] {
    std::shared_ptr<RSocket> rs;
    {
      std::lock_guard lock(table_mu);
      auto it = table().find(s);
      if (it == table().end()) return fail(EBADF);
      rs = std::move(it->second);
      table().erase(it);
    }
    {
      std::lock_guard lock(rs->mutex());
      (void)rs->shutdown(SHUT_RDWR);
    }
    return 0;  // the last reference frees the connection
  });
}

UROCE_API ssize_t rsend(int s, const void* buf, size_t len, int flags) {
  return with_socket<ssize_t>(s, [&](RSocket& rs) {
    return result(rs.send(static_cast<const uint8_t*>(buf), len, rs.nonblocking || (flags & MSG_DONTWAIT)));
  });
}

UROCE_API ssize_t rsendto(int s, const void* buf, size_t len, int flags, const sockaddr*, socklen_t) {
  return rsend(s, buf, len, flags);  // connected: the address is ignored, as TCP does
}

UROCE_API ssize_t rwrite(int s, const void* buf, size_t count) { return rsend(s, buf, count, 0); }

UROCE_API ssize_t rsendmsg(int s, const msghdr* msg, int flags) {
  if (!msg) return fail(EINVAL);
  ssize_t total = 0;
  for (size_t i = 0; i < msg->msg_iovlen; ++i) {
    const iovec& v = msg->msg_iov[i];
    if (v.iov_len == 0) continue;
    ssize_t n = rsend(s, v.iov_base, v.iov_len, flags);
    if (n < 0) return total > 0 ? total : -1;
    total += n;
    if (size_t(n) < v.iov_len) break;
  }
  return total;
}

UROCE_API ssize_t rwritev(int s, const iovec* iov, int iovcnt) {
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(iov);
  m.msg_iovlen = size_t(std::max(iovcnt, 0));
  return rsendmsg(s, &m, 0);
}

UROCE_API ssize_t rrecv(int s, void* buf, size_t len, int flags) {
  return with_socket<ssize_t>(s, [&](RSocket& rs) {
    return result(rs.recv(static_cast<uint8_t*>(buf), len, rs.nonblocking || (flags & MSG_DONTWAIT), flags & MSG_PEEK,
                          flags & MSG_WAITALL));
  });
}

UROCE_API ssize_t rread(int s, void* buf, size_t count) { return rrecv(s, buf, count, 0); }

UROCE_API ssize_t rrecvfrom(int s, void* buf, size_t len, int flags, sockaddr* src, socklen_t* srclen) {
  ssize_t n = rrecv(s, buf, len, flags);
  if (n >= 0 && src && srclen && rgetpeername(s, src, srclen) != 0) return -1;
  return n;
}

UROCE_API ssize_t rrecvmsg(int s, msghdr* msg, int flags) {
  if (!msg) return fail(EINVAL);
  ssize_t total = 0;
  for (size_t i = 0; i < msg->msg_iovlen; ++i) {
    const iovec& v = msg->msg_iov[i];
    if (v.iov_len == 0) continue;
    // After the first bytes, take only what is already there.
    ssize_t n = rrecv(s, v.iov_base, v.iov_len, total > 0 ? (flags | MSG_DONTWAIT) : flags);
    if (n < 0) {
      if (total > 0) break;
      return -1;
    }
    total += n;
    if (size_t(n) < v.iov_len) break;
  }
  msg->msg_controllen = 0;
  msg->msg_flags = 0;
  return total;
}

UROCE_API ssize_t rreadv(int s, const iovec* iov, int iovcnt) {
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(iov);
  m.msg_iovlen = size_t(std::max(iovcnt, 0));
  return rrecvmsg(s, &m, 0);
}

// Polls rsockets and ordinary descriptors together: readiness of the rsockets
// is computed, the others are polled with a zero timeout; if nothing is ready,
// everything waits in one poll(2) on the ordinary descriptors plus each
// rsocket's event channel and completion channel (the CQ armed first).
UROCE_API int rpoll(pollfd* fds, nfds_t nfds, int timeout) {
  return abi_guard<int>(-1, [&] {
    if (nfds > 0 && !fds) return fail(EFAULT);
    std::vector<std::shared_ptr<RSocket>> socks(nfds);
    for (nfds_t i = 0; i < nfds; ++i) socks[i] = fds[i].fd >= 0 ? lookup(fds[i].fd) : nullptr;
    const int64_t deadline = timeout > 0 ? now_ms() + timeout : 0;
    for (;;) {
      int ready = 0;
      std::vector<pollfd> plain;
      for (nfds_t i = 0; i < nfds; ++i) {
        fds[i].revents = 0;
        if (socks[i]) {
          std::lock_guard lock(socks[i]->mutex());
          fds[i].revents = socks[i]->ready_events(fds[i].events);
        } else {
          plain.push_back(fds[i]);
        }
      }
      if (!plain.empty() && ::poll(plain.data(), plain.size(), 0) < 0) return -1;
      for (nfds_t i = 0, j = 0; i < nfds; ++i) {
        if (!socks[i]) fds[i].revents = plain[j++].revents;
        if (fds[i].revents) ++ready;
      }
      int left = timeout < 0 ? -1 : timeout == 0 ? 0 : int(std::max<int64_t>(deadline - now_ms(), 0));
      if (ready || left == 0) return ready;

      std::vector<pollfd> waits = plain;
      bool ready_now = false;
      for (nfds_t i = 0; i < nfds; ++i) {
        if (!socks[i]) continue;
        std::lock_guard lock(socks[i]->mutex());
        socks[i]->wait_fds(&waits);
        ready_now = ready_now || socks[i]->ready_events(fds[i].events);  // arrived before the arm
      }
      if (!ready_now && ::poll(waits.data(), waits.size(), left) < 0) return -1;  // EINTR included
      for (nfds_t i = 0; i < nfds; ++i) {
        if (!socks[i]) continue;
        std::lock_guard lock(socks[i]->mutex());
        socks[i]->drain_channel();
      }
    }
  });
}

UROCE_API int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  return abi_guard<int>(-1, [&] {
    std::vector<pollfd> p;
    for (int fd = 0; fd < nfds; ++fd) {
      short events = 0;
      if (readfds && FD_ISSET(fd, readfds)) events |= POLLIN;
      if (writefds && FD_ISSET(fd, writefds)) events |= POLLOUT;
      if (exceptfds && FD_ISSET(fd, exceptfds)) events |= POLLPRI;
      if (events) p.push_back({fd, events, 0});
    }
    int ms = timeout ? int(timeout->tv_sec * 1000 + timeout->tv_usec / 1000) : -1;
    int n = rpoll(p.data(), p.size(), ms);
    if (n < 0) return -1;
    if (readfds) FD_ZERO(readfds);
    if (writefds) FD_ZERO(writefds);
    if (exceptfds) FD_ZERO(exceptfds);
    int count = 0;
    for (const pollfd& q : p) {
      if (readfds && (q.revents & (POLLIN | POLLHUP | POLLERR))) {
        FD_SET(q.fd, readfds);
        ++count;
      }
      if (writefds && (q.revents & (POLLOUT | POLLERR))) {
        FD_SET(q.fd, writefds);
        ++count;
      }
      if (exceptfds && (q.revents & POLLPRI)) {
        FD_SET(q.fd, exceptfds);
        ++count;
      }
    }
    return count;
  });
}

UROCE_API int rgetpeername(int s, sockaddr* addr, socklen_t* addrlen) {
  return with_socket<int>(s, [&](RSocket& rs) {
    if (!addrlen || (!addr && *addrlen)) return fail(EFAULT);  // (NULL, 0): the length only
    uroce::rsockets::copy_address(rdma_get_peer_addr(rs.id()), addr, addrlen);
    return 0;
  });
}

UROCE_API int rgetsockname(int s, sockaddr* addr, socklen_t* addrlen) {
  return with_socket<int>(s, [&](RSocket& rs) {
    if (!addrlen || (!addr && *addrlen)) return fail(EFAULT);  // (NULL, 0): the length only
    uroce::rsockets::copy_address(rdma_get_local_addr(rs.id()), addr, addrlen);
    return 0;
  });
}

UROCE_API int rsetsockopt(int s, int level, int name, const void* value, socklen_t len) {
  return with_socket<int>(s, [&](RSocket& rs) {
    if (!known_option(level, name) || (level == SOL_SOCKET && name == SO_ERROR)) return fail(ENOPROTOOPT);
    if (!value && len) return fail(EFAULT);
    std::erase_if(rs.options, [&](const RSocket::Option& o) { return o.level == level && o.name == name; });
    const auto* v = static_cast<const uint8_t*>(value);
    rs.options.push_back({level, name, std::vector<uint8_t>(v, v + len)});
    return 0;
  });
}

UROCE_API int rgetsockopt(int s, int level, int name, void* value, socklen_t* len) {
  return with_socket<int>(s, [&](RSocket& rs) {
    if (!value || !len) return fail(EFAULT);
    if (!known_option(level, name)) return fail(ENOPROTOOPT);
    if (level == SOL_SOCKET && name == SO_ERROR) {
      int err = rs.pending_error;
      rs.pending_error = 0;
      std::memcpy(value, &err, std::min<socklen_t>(*len, sizeof err));
      *len = sizeof err;
      return 0;
    }
    if (level == SOL_RDMA && (name == RDMA_SQSIZE || name == RDMA_RQSIZE || name == RDMA_INLINE)) {
      int v = int(rs.queue_option(name));
      std::memcpy(value, &v, std::min<socklen_t>(*len, sizeof v));
      *len = sizeof v;
      return 0;
    }
    for (const RSocket::Option& o : rs.options) {
      if (o.level == level && o.name == name) {
        std::memcpy(value, o.value.data(), std::min<size_t>(*len, o.value.size()));
        *len = socklen_t(o.value.size());
        return 0;
      }
    }
    int zero = 0;  // never set: off / 0
    std::memcpy(value, &zero, std::min<socklen_t>(*len, sizeof zero));
    *len = sizeof zero;
    return 0;
  });
}

UROCE_API int rfcntl(int s, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  long arg = cmd == F_SETFL ? va_arg(ap, long) : 0;
  va_end(ap);
  return with_socket<int>(s, [&](RSocket& rs) {
    switch (cmd) {
      case F_GETFL:
        return O_RDWR | (rs.nonblocking ? O_NONBLOCK : 0);
      case F_SETFL:
        rs.nonblocking = (arg & O_NONBLOCK) != 0;
        return 0;
      default:
        return fail(ENOTSUP);
    }
  });
}

UROCE_API off_t riomap(int s, void* buf, size_t len, int prot, int flags, off_t offset) {
  return with_socket<off_t>(s, [&](RSocket& rs) -> off_t {
    if (!buf || !len || flags) return fail(EINVAL);
    int64_t out = 0;
    int err = rs.iomap(buf, len, prot, offset, &out);
    return err ? fail(err) : off_t(out);
  });
}

UROCE_API int riounmap(int s, void* buf, size_t len) {
  return with_socket<int>(s, [&](RSocket& rs) {
    int err = rs.iounmap(buf, len);
    return err ? fail(err) : 0;
  });
}

UROCE_API size_t riowrite(int s, const void* buf, size_t count, off_t offset, int flags) {
  return with_socket<size_t>(s, [&](RSocket& rs) -> size_t {
    ssize_t n =
        rs.iowrite(static_cast<const uint8_t*>(buf), count, uint64_t(offset), rs.nonblocking || (flags & MSG_DONTWAIT));
    if (n >= 0) return size_t(n);
    errno = int(-n);
    return size_t(-1);
  });
}
