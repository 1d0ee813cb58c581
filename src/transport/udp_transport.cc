#include "transport/udp_transport.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/sanitizers.h"
#include "transport/step_probe.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

#ifdef UROCE_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace uroce::transport {

namespace {

// ThreadSanitizer sees the order a datagram makes between its sender and its
// receiver only through libc's sendmmsg/recvmmsg, which it intercepts; uroce
// makes the system calls itself (recv_into), so it tells it. One object for
// the process: a datagram may go from one of its contexts to another (a
// program's two QPs, rc_stress), and a WRITE's target must be seen written by
// the application before the post that sent it, not at the same time.
[[maybe_unused]] char tsan_datagrams;
inline void tsan_sent() {
#ifdef UROCE_TSAN
  __tsan_release(&tsan_datagrams);
#endif
}
inline void tsan_received() {
#ifdef UROCE_TSAN
  __tsan_acquire(&tsan_datagrams);
#endif
}

constexpr size_t kMaxBurst = 64;        // datagrams (or GSO messages) per sendmmsg / recvmmsg
constexpr size_t kGroMessages = 32;     // recvmmsg buffers with GRO: 64 KiB each
constexpr uint32_t kGroBuffer = 65536;  // a whole GRO batch
constexpr size_t kPktinfoSpace = std::max(CMSG_SPACE(sizeof(in_pktinfo)), CMSG_SPACE(sizeof(in6_pktinfo)));
constexpr size_t kTxControl = kPktinfoSpace + CMSG_SPACE(sizeof(uint16_t));
constexpr size_t kRxControl = kPktinfoSpace + 2 * CMSG_SPACE(sizeof(int));  // + UDP_GRO, IP_TOS/IPV6_TCLASS

// A datagram's peer address, either family.
union SockAddr {
  sockaddr_in v4;
  sockaddr_in6 v6;
};

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

int bind_port6(int fd, uint16_t port) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_any;
  a.sin6_port = htons(port);
  return bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
}

// Whether the kernel takes UDP_SEGMENT (Linux 4.18) and UDP_GRO (5.0).
bool probe_gso(int fd) {
  int zero = 0;
  return setsockopt(fd, IPPROTO_UDP, UDP_SEGMENT, &zero, sizeof zero) == 0;
}
bool enable_gro(int fd) {
  int on = 1;
  return setsockopt(fd, IPPROTO_UDP, UDP_GRO, &on, sizeof on) == 0;
}

// The source address of an IPv6 datagram (and, for a link-local one, its
// interface) as a control message.
size_t put_ipv6_source(cmsghdr* c, const IpAddress& src) {
  c->cmsg_level = IPPROTO_IPV6;
  c->cmsg_type = IPV6_PKTINFO;
  c->cmsg_len = CMSG_LEN(sizeof(in6_pktinfo));
  in6_pktinfo info{};
  std::memcpy(&info.ipi6_addr, src.bytes.data(), 16);
  info.ipi6_ifindex = src.scope;
  std::memcpy(CMSG_DATA(c), &info, sizeof info);
  return CMSG_SPACE(sizeof(in6_pktinfo));
}

// Fills `h` to send `d`, with its control messages in `control`.
void fill_header(msghdr& h, SockAddr& addr, uint8_t* control, const TxDatagram& d) {
  bool v4 = d.dst.ip.is_v4();
  h = msghdr{};
  if (v4) {
    addr.v4 = sockaddr_in{};
    addr.v4.sin_family = AF_INET;
    addr.v4.sin_addr.s_addr = htonl(d.dst.ip.v4());
    addr.v4.sin_port = htons(d.dst.port);
    h.msg_namelen = sizeof(sockaddr_in);
  } else {
    addr.v6 = sockaddr_in6{};
    addr.v6.sin6_family = AF_INET6;
    std::memcpy(&addr.v6.sin6_addr, d.dst.ip.bytes.data(), 16);
    addr.v6.sin6_port = htons(d.dst.port);
    addr.v6.sin6_scope_id = d.dst.ip.scope;
    h.msg_namelen = sizeof(sockaddr_in6);
  }
  h.msg_name = &addr;
  h.msg_iov = const_cast<iovec*>(d.iov);
  h.msg_iovlen = d.iovcnt;
  if (d.src_ip.unspecified() && d.segment_size == 0) return;
  std::memset(control, 0, kTxControl);
  h.msg_control = control;
  h.msg_controllen = kTxControl;
  size_t used = 0;
  cmsghdr* c = CMSG_FIRSTHDR(&h);
  if (!d.src_ip.unspecified() && !v4) {
    used += put_ipv6_source(c, d.src_ip);
    c = CMSG_NXTHDR(&h, c);
  } else if (!d.src_ip.unspecified()) {
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(in_pktinfo));
    in_pktinfo info{};
    info.ipi_spec_dst.s_addr = htonl(d.src_ip.v4());
    std::memcpy(CMSG_DATA(c), &info, sizeof info);
    used += CMSG_SPACE(sizeof(in_pktinfo));
    c = CMSG_NXTHDR(&h, c);
  }
  if (d.segment_size != 0) {
    c->cmsg_level = IPPROTO_UDP;
    c->cmsg_type = UDP_SEGMENT;
    c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    uint16_t seg = d.segment_size;
    std::memcpy(CMSG_DATA(c), &seg, sizeof seg);
    used += CMSG_SPACE(sizeof(uint16_t));
  }
  h.msg_controllen = used;
}

}  // namespace

namespace {

// The socket options each IP family names its own way.
struct FamilyOptions {
  int domain;        // AF_INET, AF_INET6
  int level;         // IPPROTO_IP, IPPROTO_IPV6
  int pktinfo;       // reports a received datagram's destination address
  int mtu_discover;  // the path MTU discovery mode...
  int pmtudisc_do;   // ...that forbids fragmentation by the sender
  int tos;           // the traffic class of what is sent (IP_TOS, IPV6_TCLASS)...
  int recv_tos;      // ...and of what is received, as a control message
};
constexpr FamilyOptions kIpv4Options{AF_INET,        IPPROTO_IP, IP_PKTINFO, IP_MTU_DISCOVER,
                                     IP_PMTUDISC_DO, IP_TOS,     IP_RECVTOS};
constexpr FamilyOptions kIpv6Options{AF_INET6,         IPPROTO_IPV6, IPV6_RECVPKTINFO, IPV6_MTU_DISCOVER,
                                     IPV6_PMTUDISC_DO, IPV6_TCLASS,  IPV6_RECVTCLASS};
constexpr int kEct0 = 0x02;     // ECN field: ECN-capable transport (RFC 3168)
constexpr int kEcnMask = 0x03;  // the ECN field of the TOS / traffic class byte
constexpr int kEcnCe = 0x03;    // Congestion Experienced

// A nonblocking UDP socket of family `f` with the options every socket of a
// transport needs, and UDP_GRO when `gro`. An IPv6 socket is for IPv6 peers
// only (IPV6_V6ONLY: IPv4 keeps its own socket).
int open_socket(const FamilyOptions& f, const UdpConfig& cfg, bool gro) {
  int fd = socket(f.domain, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  int on = 1;
  if (f.domain == AF_INET6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on);
    // RoCE senders may leave the UDP checksum 0 (rxe does), which IPv6 UDP
    // otherwise drops (RFC 6936 lets a tunnel protocol take it): the ICRC
    // covers the datagram.
    setsockopt(fd, IPPROTO_UDP, UDP_NO_CHECK6_RX, &on, sizeof on);
    // Flow label 0, as rxe sends (the kernel would choose one per socket):
    // the label is masked from the ICRC, and a GRH's flow label is not carried.
    int off = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_AUTOFLOWLABEL, &off, sizeof off);
  }
  if (gro) (void)enable_gro(fd);
  // Destination address of received packets (the ICRC covers it); IPv4's
  // IP_PKTINFO also lets a send choose its source address.
  setsockopt(fd, f.level, f.pktinfo, &on, sizeof on);
  // No fragmentation by the sender (DF set on IPv4): a too-large packet is
  // refused. With DF an unconnected IPv4 socket sends IP ID 0 (design §4).
  int pmtu = f.pmtudisc_do;
  setsockopt(fd, f.level, f.mtu_discover, &pmtu, sizeof pmtu);
  // ECT(0) on everything sent, and the received ECN field reported: a queue
  // that would drop may mark instead, and the receiver answers with a CNP.
  if (cfg.ecn) {
    int ect = kEct0;
    setsockopt(fd, f.level, f.tos, &ect, sizeof ect);
    setsockopt(fd, f.level, f.recv_tos, &on, sizeof on);
  }
  set_buffer(fd, SO_RCVBUFFORCE, SO_RCVBUF, cfg.socket_buffer_bytes);
  set_buffer(fd, SO_SNDBUFFORCE, SO_SNDBUF, cfg.socket_buffer_bytes);
  return fd;
}

// Binds the private port: the preferred one, else the first free one below
// max_port from a per-process starting point (the kernel's ephemeral ports
// usually start at 32768, and the range must exclude 0xC000 and up).
uint16_t bind_private(int fd, const UdpConfig& cfg) {
  if (cfg.preferred_port != 0 && cfg.preferred_port != cfg.host_port && bind_port(fd, cfg.preferred_port) == 0)
    return cfg.preferred_port;
  for (uint32_t candidate = 20000 + (uint32_t(getpid()) * 7919u) % 10000, tries = 0; tries < 20000;
       ++tries, candidate = candidate >= cfg.max_port ? 1024 : candidate + 1) {
    if (candidate != cfg.host_port && bind_port(fd, uint16_t(candidate)) == 0) return uint16_t(candidate);
  }
  return 0;
}

// The host socket: `port` shared with SO_REUSEPORT (the kernel lets only
// sockets of the same user join, and spreads datagrams among them by flow).
// -1 when another program holds the port alone.
int open_host_socket(const UdpConfig& cfg, bool gro) {
  if (cfg.host_port == 0) return -1;
  int fd = open_socket(kIpv4Options, cfg, gro);
  if (fd < 0) return -1;
  int on = 1;
  // Multicast only for the groups this socket joined (not every group any
  // socket of the host joined: IP_MULTICAST_ALL's default).
  int off = 0;
  setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &off, sizeof off);
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on) != 0 || bind_port(fd, cfg.host_port) != 0) {
    std::fprintf(stderr, "uroce: UDP port %u is held by another program: QPs here are reachable by LID only (%s)\n",
                 cfg.host_port, std::strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

// The IPv6 socket on `port` (the private port, or the host's shared with
// SO_REUSEPORT); -1 when there is none (cfg.ipv6 off, or the host has no
// IPv6).
int open_ipv6_on(const UdpConfig& cfg, uint16_t port, bool shared, bool gro) {
  if (!cfg.ipv6) return -1;
  int fd = open_socket(kIpv6Options, cfg, gro);
  if (fd < 0) return -1;
  int on = 1;
  if (shared) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
  if (bind_port6(fd, port) != 0) {
    std::fprintf(stderr, "uroce: UDP port %u is held by another program for IPv6: no IPv6 there (%s)\n", port,
                 std::strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

namespace {
// The interfaces that are up and take multicast and have an IPv4 address
// (each once), as indexes.
std::vector<int> multicast_interfaces() {
  std::vector<int> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET ||
        (a->ifa_flags & (IFF_UP | IFF_MULTICAST)) != (IFF_UP | IFF_MULTICAST))
      continue;
    int index = int(if_nametoindex(a->ifa_name));
    if (index > 0 && std::find(out.begin(), out.end(), index) == out.end()) out.push_back(index);
  }
  freeifaddrs(list);
  return out;
}
}  // namespace

int UdpTransport::set_group(uint32_t group, bool join) noexcept {
  if (host_fd_ < 0) return ENODEV;
  // On every interface that takes multicast: the device has all of the host's
  // addresses, and a NIC (or rxe) joins on its own netdev, not where a route to
  // the group points (a host or namespace need have none). Without such an
  // interface, where that route points.
  ip_mreqn m{};
  m.imr_multiaddr.s_addr = htonl(group);
  int op = join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP;
  int err = 0;
  bool any = false;
  try {
    for (int index : multicast_interfaces()) {
      m.imr_ifindex = index;
      if (setsockopt(host_fd_, IPPROTO_IP, op, &m, sizeof m) == 0 || (join && errno == EADDRINUSE))
        any = true;
      else
        err = errno;
    }
  } catch (...) {
    err = ENOMEM;
  }
  if (any) return 0;
  m.imr_ifindex = 0;  // by route
  if (setsockopt(host_fd_, IPPROTO_IP, op, &m, sizeof m) == 0) return 0;
  return err ? err : errno;
}

std::unique_ptr<UdpTransport> UdpTransport::open(const UdpConfig& cfg) {
  int fd = open_socket(kIpv4Options, cfg, false);
  if (fd < 0) return nullptr;
  // Whether the kernel takes UDP_SEGMENT and UDP_GRO; the other sockets
  // follow this one (same kernel), and GRO sizes the receive buffers.
  bool gso = cfg.gso && probe_gso(fd);
  bool gro = cfg.gso && enable_gro(fd);
  uint16_t port = bind_private(fd, cfg);
  int wake_fd = port ? eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK) : -1;
  if (wake_fd < 0) {
    int e = port ? errno : (errno ? errno : EADDRINUSE);
    close(fd);
    errno = e;
    return nullptr;
  }
  int host_fd = open_host_socket(cfg, gro);
  auto t = std::unique_ptr<UdpTransport>(new UdpTransport(fd, host_fd, wake_fd, port, cfg, gso, gro));
  t->fd6_ = open_ipv6_on(cfg, port, false, gro);
  if (t->fd6_ >= 0 && host_fd >= 0) t->host_fd6_ = open_ipv6_on(cfg, cfg.host_port, true, gro);
  return t;
}

struct UdpTransport::RxSlot {
  iovec iov;
  SockAddr addr;
  alignas(cmsghdr) uint8_t control[kRxControl];
};

UdpTransport::UdpTransport(int fd, int host_fd, int wake_fd, uint16_t port, const UdpConfig& cfg, bool gso, bool gro)
    : fd_(fd),
      wake_fd_(wake_fd),
      port_(port),
      rx_buffer_size_(gro ? kGroBuffer : cfg.max_datagram),
      max_datagram_(cfg.max_datagram),
      gso_(gso),
      gro_(gro),
      host_fd_(host_fd),
      host_port_(cfg.host_port),
      rx_buffers_((gro ? kGroMessages : kMaxBurst) * rx_buffer_size_),
      rx_messages_(gro ? kGroMessages : kMaxBurst),
      rx_headers_(new mmsghdr[rx_messages_.size()]),
      rx_slots_(new RxSlot[rx_messages_.size()]) {
  for (size_t i = 0; i < rx_messages_.size(); ++i) {
    RxSlot& slot = rx_slots_[i];
    slot.iov = iovec{rx_buffers_.data() + i * rx_buffer_size_, rx_buffer_size_};
    msghdr& h = rx_headers_[i].msg_hdr;
    h = msghdr{};
    h.msg_name = &slot.addr;
    h.msg_namelen = sizeof slot.addr;
    h.msg_iov = &slot.iov;
    h.msg_iovlen = 1;
    h.msg_control = slot.control;
    h.msg_controllen = sizeof slot.control;
  }
}

UdpTransport::~UdpTransport() {
  close(fd_);
  if (host_fd_ >= 0) close(host_fd_);
  if (fd6_ >= 0) close(fd6_);
  if (host_fd6_ >= 0) close(host_fd6_);
  close(wake_fd_);
}

size_t UdpTransport::send_burst(std::span<TxDatagram> burst) noexcept {
  size_t done = 0;
  while (done < burst.size()) done += send_some(burst.subspan(done, std::min(kMaxBurst, burst.size() - done)));
  return done;
}

// One sendmmsg of up to kMaxBurst datagrams of one address family (the
// first one's); returns how many are done with (sent, or dropped as a
// network would drop them).
size_t UdpTransport::send_some(std::span<TxDatagram> burst) noexcept {
  mmsghdr msgs[kMaxBurst];
  SockAddr addrs[kMaxBurst];
  alignas(cmsghdr) uint8_t control[kMaxBurst][kTxControl];
  bool v4 = burst[0].dst.ip.is_v4();
  size_t n = 1;
  while (n < burst.size() && burst[n].dst.ip.is_v4() == v4) ++n;
  int fd = fd_;
  if (!v4) {
    if (fd6_ < 0) return n;  // no IPv6 here: lost, as on a network without a route
    if (!ipv6_used_.load(std::memory_order_relaxed)) ipv6_used_.store(true, std::memory_order_relaxed);
    fd = fd6_;
  }
  burst = burst.first(n);
  for (size_t i = 0; i < burst.size(); ++i) fill_header(msgs[i].msg_hdr, addrs[i], control[i], burst[i]);
  tsan_sent();
  step_probe::stamp(step_probe::Step::kPublished);
  for (;;) {
    int sent = int(syscall(SYS_sendmmsg, fd, msgs, unsigned(burst.size()), 0));  // as recv_into's
    if (sent > 0) return size_t(sent);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == ENOBUFS) {
      // Socket buffer full: wait briefly for room rather than dropping.
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, 10) > 0) continue;
      return 1;
    }
    if (burst[0].segment_size != 0) {
      // The message is refused as GSO: sent segment by segment instead. When
      // the device cannot do it at all (EIO: no checksum offload), no more
      // GSO from this socket; other errors (a segment larger than the path's
      // MTU) concern this path only.
      if ((errno == EIO || errno == EOPNOTSUPP) && gso_.exchange(false))
        std::fprintf(stderr, "uroce: UDP GSO refused (%s); sending one datagram per packet\n", std::strerror(errno));
      send_split(burst[0]);
      return 1;
    }
    return 1;  // unsendable datagram (e.g. unreachable): skipped, as a network would drop it
  }
}

// Sends the GSO message `d` as one datagram per segment.
void UdpTransport::send_split(const TxDatagram& d) noexcept {
  constexpr size_t kMaxPieces = kMaxGsoSegments * kMaxPacketPieces;
  iovec pieces[kMaxPieces];
  TxDatagram segs[kMaxGsoSegments];
  size_t npieces = 0, nsegs = 0;
  uint32_t in_segment = 0;
  for (unsigned i = 0; i < d.iovcnt; ++i) {
    auto* base = static_cast<uint8_t*>(d.iov[i].iov_base);
    size_t left = d.iov[i].iov_len;
    while (left > 0) {
      if (in_segment == 0) {
        if (nsegs == kMaxGsoSegments) return;  // malformed message: the rest is dropped
        segs[nsegs] = TxDatagram{d.dst, d.src_ip, 0, 0, pieces + npieces};
        ++nsegs;
      }
      if (npieces == kMaxPieces) return;
      size_t n = std::min<size_t>(left, d.segment_size - in_segment);
      pieces[npieces++] = iovec{base, n};
      ++segs[nsegs - 1].iovcnt;
      base += n;
      left -= n;
      in_segment = uint32_t((in_segment + n) % d.segment_size);
    }
  }
  std::span<TxDatagram> rest(segs, nsegs);
  while (!rest.empty()) rest = rest.subspan(send_some(rest));
}

size_t UdpTransport::take_received(std::span<RxDatagram> out) noexcept {
  size_t n = 0;
  while (n < out.size() && rx_next_ < rx_count_) {
    RxMessage& m = rx_messages_[rx_next_];
    uint32_t len = std::min(m.segment, m.len - m.offset);
    RxDatagram& d = out[n++];
    d.data = m.data + m.offset;
    d.len = len;
    d.src = m.src;
    d.dst_ip = m.dst_ip;
    d.dst_port = m.dst_port;
    d.truncated = m.truncated || len > max_datagram_;
    d.ce = m.ce;      // (GRO merges no datagrams whose TOS differ)
    d.jumbo = false;  // (the slot may have held one of the same-host path's)
    d.bare = false;
    d.gso_index = uint8_t(std::min<uint32_t>(m.offset / m.segment, 255));
    m.offset += len;
    if (m.offset >= m.len) ++rx_next_;
  }
  return n;
}

size_t UdpTransport::recv_into(int fd, uint16_t port, size_t first, size_t want) noexcept {
  mmsghdr* msgs = &rx_headers_[first];
  // The system call itself: glibc's recvmmsg is a cancellation point, which
  // costs two calls around every receive (~2 % of a ping-pong's time).
  long r = syscall(SYS_recvmmsg, fd, msgs, unsigned(want), MSG_DONTWAIT, nullptr);
  int got = r > 0 ? int(r) : 0;
  if (got) {
    tsan_received();
    step_probe::stamp(step_probe::Step::kTaken);
  }
  for (int i = 0; i < got; ++i) {
    RxMessage& m = rx_messages_[first + size_t(i)];
    msghdr& h = msgs[i].msg_hdr;
    const RxSlot& slot = rx_slots_[first + size_t(i)];
    m.data = static_cast<uint8_t*>(slot.iov.iov_base);
    m.len = msgs[i].msg_len;
    m.segment = 0;
    m.offset = 0;
    m.truncated = h.msg_flags & MSG_TRUNC;
    if (slot.addr.v4.sin_family == AF_INET6) {
      const sockaddr_in6& a = slot.addr.v6;
      m.src.ip = IpAddress::from_bytes(a.sin6_addr.s6_addr, a.sin6_scope_id);
      m.src.port = ntohs(a.sin6_port);
    } else {
      m.src.ip = ntohl(slot.addr.v4.sin_addr.s_addr);
      m.src.port = ntohs(slot.addr.v4.sin_port);
    }
    m.dst_ip = 0;
    m.dst_port = port;
    m.ce = false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c)) {
      if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
        in_pktinfo info;
        std::memcpy(&info, CMSG_DATA(c), sizeof info);
        m.dst_ip = ntohl(info.ipi_addr.s_addr);
      } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
        in6_pktinfo info;
        std::memcpy(&info, CMSG_DATA(c), sizeof info);
        m.dst_ip = IpAddress::from_bytes(info.ipi6_addr.s6_addr, uint32_t(info.ipi6_ifindex));
      } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) {
        m.ce = (*CMSG_DATA(c) & kEcnMask) == kEcnCe;  // one byte
      } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS) {
        int tclass;
        std::memcpy(&tclass, CMSG_DATA(c), sizeof tclass);
        m.ce = (tclass & kEcnMask) == kEcnCe;
      } else if (c->cmsg_level == IPPROTO_UDP && c->cmsg_type == UDP_GRO) {
        int seg;
        std::memcpy(&seg, CMSG_DATA(c), sizeof seg);
        if (seg > 0) m.segment = uint32_t(seg);
      }
    }
    // Not coalesced (or empty): the whole datagram is one segment.
    if (m.segment == 0 || m.segment > m.len) m.segment = std::max<uint32_t>(m.len, 1);
    // What the kernel wrote back, ready for the next receive into this slot.
    h.msg_namelen = sizeof slot.addr;
    h.msg_controllen = sizeof slot.control;
  }
  return size_t(got);
}

bool UdpTransport::read_host_socket() noexcept {
  if (host_fd_ < 0) return false;
  // Also every kHostEvery-th receive and after kHostMaxGap whatever the flag
  // says: a receiver that never waits here (always busy, or a transport above
  // that waits on other things first) must not leave the host socket unread.
  // (Counting alone is not enough: under load one receive can take
  // milliseconds, and 4791 datagrams then waited seconds.)
  constexpr unsigned kHostEvery = 16;
  constexpr auto kHostMaxGap = std::chrono::microseconds(200);
  auto now = std::chrono::steady_clock::now();
  bool due = ++host_countdown_ >= kHostEvery || now - host_read_at_ >= kHostMaxGap;
  bool ready = host_ready_.load(std::memory_order_relaxed) && host_ready_.exchange(false, std::memory_order_acq_rel);
  if (due || host_hot_ > 0 || ready) {
    host_countdown_ = 0;
    host_read_at_ = now;
    return true;
  }
  return false;
}

size_t UdpTransport::recv_burst(std::span<RxDatagram> out, int timeout_ms) noexcept {
  if (rx_next_ < rx_count_) return take_received(out);
  // How long the host socket is read on every receive after it last delivered.
  constexpr unsigned kHostHot = 64;
  size_t want = rx_messages_.size();
  for (;;) {
    size_t got = recv_into(fd_, port_, 0, want);
    bool host_due = got < want && read_host_socket();
    if (host_due) {
      size_t host = recv_into(host_fd_, host_port_, got, want - got);
      host_hot_ = host ? kHostHot : host_hot_ - (host_hot_ > 0);
      if (host == want - got) host_ready_.store(true, std::memory_order_relaxed);  // may have more
      got += host;
    }
    if (fd6_ >= 0 && got < want) got = recv_ipv6(got, want, host_due);
    if (got > 0) {
      rx_count_ = got;
      rx_next_ = 0;
      rx_more_ = got == want;
      return take_received(out);
    }
    rx_more_ = false;
    if (timeout_ms == 0) return 0;
    wait(timeout_ms);
    timeout_ms = 0;  // data ready, woken or timed out: one more non-blocking try
  }
}

size_t UdpTransport::recv_ipv6(size_t got, size_t want, bool host_due) noexcept {
  constexpr unsigned kIdleSweepEvery = 16;  // of the host socket's rounds, while IPv6 is unused
  bool used = ipv6_used_.load(std::memory_order_relaxed);
  bool sweep = host_due && (used || ++ipv6_sweep_ % kIdleSweepEvery == 0);
  auto take = [](std::atomic<bool>& flag) {
    return flag.load(std::memory_order_relaxed) && flag.exchange(false, std::memory_order_acq_rel);
  };
  if (used || sweep || take(ipv6_ready_)) {
    size_t n = recv_into(fd6_, port_, got, want - got);
    if (n > 0 && !used) ipv6_used_.store(true, std::memory_order_relaxed);
    if (n == want - got) ipv6_ready_.store(true, std::memory_order_relaxed);  // may have more
    got += n;
  }
  if (host_fd6_ >= 0 && got < want && (sweep || take(host6_ready_))) {
    size_t n = recv_into(host_fd6_, host_port_, got, want - got);
    if (n > 0) host6_ready_.store(true, std::memory_order_relaxed);  // read it again next time
    got += n;
  }
  return got;
}

void UdpTransport::wait(int timeout_ms) noexcept {
  pollfd p[5];
  watched(p);
  if (poll(p, 5, timeout_ms) > 0) (void)note_ready(p);
}

namespace {
timespec micros(int us) { return timespec{us / 1000000, (us % 1000000) * 1000L}; }
}  // namespace

void UdpTransport::nap(int timeout_us) noexcept {
  pollfd p = {wake_fd_, POLLIN, 0};
  timespec t = micros(timeout_us);
  if (ppoll(&p, 1, &t, nullptr) > 0) consume_wake();
}

bool UdpTransport::nap_or_readable(int timeout_us) noexcept {
  pollfd p[5];
  watched(p);
  timespec t = micros(timeout_us);
  if (ppoll(p, 5, &t, nullptr) <= 0) return false;
  bool woken = p[1].revents & POLLIN;
  return note_ready(p) && !woken;  // a wake-up ends the nap whatever else
}

// The wake-up eventfd and the sockets, as wait and nap_or_readable watch them
// (fd -1: ignored by poll).
void UdpTransport::watched(pollfd (&p)[5]) const noexcept {
  p[0] = {fd_, POLLIN, 0};
  p[1] = {wake_fd_, POLLIN, 0};
  p[2] = {host_fd_, POLLIN, 0};
  p[3] = {fd6_, POLLIN, 0};
  p[4] = {host_fd6_, POLLIN, 0};
}

// After a poll of watched(): consumes a wake-up, notes the sockets a receiver
// reads only when told (host, IPv6), and says whether any socket is readable.
bool UdpTransport::note_ready(const pollfd (&p)[5]) noexcept {
  if (p[1].revents & POLLIN) consume_wake();
  if (p[2].revents & POLLIN) host_ready_.store(true, std::memory_order_release);
  if (p[3].revents & POLLIN) ipv6_ready_.store(true, std::memory_order_release);
  if (p[4].revents & POLLIN) host6_ready_.store(true, std::memory_order_release);
  return (p[0].revents | p[2].revents | p[3].revents | p[4].revents) & POLLIN;
}

void UdpTransport::consume_wake() noexcept {
  uint64_t v;
  (void)!read(wake_fd_, &v, sizeof v);
}

void UdpTransport::wake() noexcept {
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
}

}  // namespace uroce::transport
