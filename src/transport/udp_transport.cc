#include "transport/udp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace uroce::transport {

namespace {

constexpr size_t kMaxBurst = 64;

void set_buffer(int fd, int force_opt, int opt, int bytes) {
  // SO_*BUFFORCE works for root and ignores rmem_max; fall back to the capped option.
  if (setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof bytes) != 0)
    (void)setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof bytes);
}

int bind_port(int fd, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(port);
  return bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
}

}  // namespace

std::unique_ptr<UdpTransport> UdpTransport::open(const UdpConfig& cfg) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return nullptr;
  int on = 1;
  // Destination address of received packets (needed for the ICRC) and
  // per-packet source address on send.
  setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &on, sizeof on);
  // DF set: with an unconnected socket the kernel then sends IP ID 0 (design §4).
  int pmtu = IP_PMTUDISC_DO;
  setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  set_buffer(fd, SO_RCVBUFFORCE, SO_RCVBUF, cfg.socket_buffer_bytes);
  set_buffer(fd, SO_SNDBUFFORCE, SO_SNDBUF, cfg.socket_buffer_bytes);

  uint16_t port = 0;
  if (cfg.preferred_port != 0 && bind_port(fd, cfg.preferred_port) == 0) {
    port = cfg.preferred_port;
  } else {
    // Let the kernel pick an ephemeral port, retrying until it lies below max_port
    // (ephemeral ports usually start at 32768, and the range must exclude 0xC000+).
    for (uint32_t candidate = 20000 + (uint32_t(getpid()) * 7919u) % 10000, tries = 0; tries < 20000;
         ++tries, candidate = candidate >= cfg.max_port ? 1024 : candidate + 1) {
      if (bind_port(fd, uint16_t(candidate)) == 0) {
        port = uint16_t(candidate);
        break;
      }
    }
  }
  if (port == 0) {
    int e = errno;
    close(fd);
    errno = e ? e : EADDRINUSE;
    return nullptr;
  }
  int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return nullptr;
  }
  return std::unique_ptr<UdpTransport>(new UdpTransport(fd, wake_fd, port, cfg));
}

UdpTransport::UdpTransport(int fd, int wake_fd, uint16_t port, const UdpConfig& cfg)
    : fd_(fd),
      wake_fd_(wake_fd),
      port_(port),
      max_datagram_(cfg.max_datagram),
      rx_buffers_(kMaxBurst * cfg.max_datagram) {}

UdpTransport::~UdpTransport() {
  close(fd_);
  close(wake_fd_);
}

size_t UdpTransport::send_burst(std::span<TxDatagram> burst) noexcept {
  constexpr size_t kCmsgSpace = CMSG_SPACE(sizeof(in_pktinfo));
  size_t done = 0;
  while (done < burst.size()) {
    size_t n = std::min(kMaxBurst, burst.size() - done);
    mmsghdr msgs[kMaxBurst];
    sockaddr_in addrs[kMaxBurst];
    alignas(cmsghdr) uint8_t control[kMaxBurst][kCmsgSpace];
    for (size_t i = 0; i < n; ++i) {
      TxDatagram& d = burst[done + i];
      addrs[i] = sockaddr_in{};
      addrs[i].sin_family = AF_INET;
      addrs[i].sin_addr.s_addr = htonl(d.dst.ip);
      addrs[i].sin_port = htons(d.dst.port);
      msghdr& h = msgs[i].msg_hdr;
      h = msghdr{};
      h.msg_name = &addrs[i];
      h.msg_namelen = sizeof(sockaddr_in);
      h.msg_iov = d.iov;
      h.msg_iovlen = d.iovcnt;
      if (d.src_ip != 0) {
        std::memset(control[i], 0, kCmsgSpace);
        h.msg_control = control[i];
        h.msg_controllen = kCmsgSpace;
        cmsghdr* c = CMSG_FIRSTHDR(&h);
        c->cmsg_level = IPPROTO_IP;
        c->cmsg_type = IP_PKTINFO;
        c->cmsg_len = CMSG_LEN(sizeof(in_pktinfo));
        in_pktinfo info{};
        info.ipi_spec_dst.s_addr = htonl(d.src_ip);
        std::memcpy(CMSG_DATA(c), &info, sizeof info);
      }
    }
    int sent = sendmmsg(fd_, msgs, unsigned(n), 0);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == ENOBUFS) {
        // Socket buffer full: wait briefly for room rather than dropping.
        pollfd p{fd_, POLLOUT, 0};
        if (poll(&p, 1, 10) > 0) continue;
      }
      // Unsendable datagram (e.g. unreachable): skip it, as a network would drop it.
      sent = 1;
    }
    done += size_t(sent);
  }
  return done;
}

size_t UdpTransport::recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept {
  size_t want = std::min(out.size(), kMaxBurst);
  mmsghdr msgs[kMaxBurst];
  iovec iovs[kMaxBurst];
  sockaddr_in addrs[kMaxBurst];
  constexpr size_t kCmsgSpace = CMSG_SPACE(sizeof(in_pktinfo));
  alignas(cmsghdr) uint8_t control[kMaxBurst][kCmsgSpace];
  for (;;) {
    for (size_t i = 0; i < want; ++i) {
      iovs[i].iov_base = rx_buffers_.data() + i * max_datagram_;
      iovs[i].iov_len = max_datagram_;
      msghdr& h = msgs[i].msg_hdr;
      h = msghdr{};
      h.msg_name = &addrs[i];
      h.msg_namelen = sizeof(sockaddr_in);
      h.msg_iov = &iovs[i];
      h.msg_iovlen = 1;
      h.msg_control = control[i];
      h.msg_controllen = kCmsgSpace;
    }
    int got = recvmmsg(fd_, msgs, unsigned(want), MSG_DONTWAIT, nullptr);
    if (got > 0) {
      for (int i = 0; i < got; ++i) {
        RxDatagram& d = out[size_t(i)];
        const msghdr& h = msgs[i].msg_hdr;
        d.data = static_cast<uint8_t*>(iovs[i].iov_base);
        d.len = msgs[i].msg_len;
        d.truncated = h.msg_flags & MSG_TRUNC;
        d.src.ip = ntohl(addrs[i].sin_addr.s_addr);
        d.src.port = ntohs(addrs[i].sin_port);
        d.dst_ip = 0;
        for (cmsghdr* c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(const_cast<msghdr*>(&h), c)) {
          if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
            in_pktinfo info;
            std::memcpy(&info, CMSG_DATA(c), sizeof info);
            d.dst_ip = ntohl(info.ipi_addr.s_addr);
          }
        }
      }
      return size_t(got);
    }
    if (got < 0 && errno != EAGAIN && errno != EINTR) return 0;
    if (timeout_ms == 0) return 0;
    pollfd p[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int r = poll(p, 2, timeout_ms);
    if (r <= 0) return 0;
    if (p[1].revents & POLLIN) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof v);
      return 0;
    }
    timeout_ms = 0;  // data is ready: one more non-blocking try
  }
}

void UdpTransport::wake() noexcept {
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
}

}  // namespace uroce::transport
