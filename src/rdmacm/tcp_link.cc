#include "rdmacm/tcp_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace uroce::rdmacm {

TcpLink::TcpLink(int epoll_fd, int fd, uint64_t token, Phase p)
    : phase(p), epoll_fd_(epoll_fd), fd_(fd), token_(token) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  if (p == Phase::kConnecting) {
    ev.events |= EPOLLOUT;  // connect completion
    watching_output_ = true;
  }
  ev.data.u64 = token_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd_, &ev);
}

TcpLink::~TcpLink() {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd_, nullptr);
  if (!out_.empty() && !dead && phase == Phase::kOpen) {
    // The last message (a REJ, DREP, ...) did not fit in the socket buffer:
    // give it a moment, bounded, so that closing does not lose it.
    int flags = fcntl(fd_, F_GETFL);
    fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
    timeval tv{0, 100 * 1000};
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    size_t off = 0;
    while (off < out_.size()) {
      ssize_t n = ::send(fd_, out_.data() + off, out_.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += size_t(n);
    }
  }
  close(fd_);
}

void TcpLink::watch_output(bool on) {
  if (on == watching_output_) return;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0u);
  ev.data.u64 = token_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd_, &ev);
  watching_output_ = on;
}

int TcpLink::send(const Mad& mad) {
  if (dead) return ECONNRESET;
  if (out_.size() + mad.size() > kMaxQueuedOutput) {
    // The peer stopped reading: its CM cannot be following the protocol.
    // Shutting the socket down makes epoll report it, and the progress thread
    // handles the link as lost; nothing is queued any more meanwhile.
    dead = true;
    out_.clear();
    shutdown(fd_, SHUT_RDWR);
    return ENOBUFS;
  }
  out_.insert(out_.end(), mad.begin(), mad.end());
  if (phase == Phase::kConnecting) return 0;  // flushed once connected
  return flush();
}

int TcpLink::flush() {
  size_t off = 0;
  while (off < out_.size()) {
    ssize_t n = ::send(fd_, out_.data() + off, out_.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    out_.clear();
    watch_output(false);
    return n < 0 ? errno : EPIPE;
  }
  out_.erase(out_.begin(), out_.begin() + std::ptrdiff_t(off));
  watch_output(!out_.empty());
  return 0;
}

int TcpLink::receive(std::vector<DecodedMad>* out) {
  uint8_t buf[kReadBudget];
  ssize_t n;
  do {
    n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n == 0) return ECONNRESET;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : errno;
  // MADs that arrived before the peer closed are handed over by the calls
  // that precede the one that sees the end: a REJ or DREP followed by the
  // close is still processed.
  return in_.feed({buf, size_t(n)}, out) == MadFramer::Status::kOk ? 0 : EPROTO;
}

int TcpLink::connect_result() {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

void TcpLink::learn_addresses() {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  IpEndpoint ep;
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0 && endpoint_of(a, &ep)) local_ip = ep.ip;
  len = sizeof a;
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0 && endpoint_of(a, &ep)) peer_ip = ep.ip;
}

}  // namespace uroce::rdmacm
