// IP socket addresses as rdma_cm uses them: AF_INET and AF_INET6 (an
// IPv4-mapped AF_INET6 address is the IPv4 address, as uroce's GIDs write
// IPv4: ::ffff:a.b.c.d, design §3).
#pragma once

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace uroce::rdmacm {

// An IP address: IPv6, or IPv4 as an IPv4-mapped IPv6 address (the form of
// a RoCEv2 GID), network byte order, with the interface (scope) of a
// link-local IPv6 address. The default is IPv4 0.0.0.0, and an IPv4 address
// (host byte order) converts implicitly, so IPv4 code reads as it did with
// 32-bit addresses.
struct IpAddr {
  std::array<uint8_t, 16> bytes{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0, 0, 0};
  uint32_t scope = 0;

  constexpr IpAddr() = default;
  constexpr IpAddr(uint32_t ipv4) noexcept {  // NOLINT(google-explicit-constructor): see above
    bytes[12] = uint8_t(ipv4 >> 24);
    bytes[13] = uint8_t(ipv4 >> 16);
    bytes[14] = uint8_t(ipv4 >> 8);
    bytes[15] = uint8_t(ipv4);
  }
  static IpAddr from_gid(const ibv_gid& gid, uint32_t scope = 0) {
    IpAddr a;
    std::memcpy(a.bytes.data(), gid.raw, 16);
    a.scope = a.link_local() ? scope : 0;
    return a;
  }
  static IpAddr any6() {
    IpAddr a;
    a.bytes.fill(0);
    return a;
  }

  bool is_v4() const {
    static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    return std::memcmp(bytes.data(), kMapped, 12) == 0;
  }
  uint32_t v4() const {  // host byte order (meaningful when is_v4())
    return uint32_t(bytes[12]) << 24 | uint32_t(bytes[13]) << 16 | uint32_t(bytes[14]) << 8 | bytes[15];
  }
  bool link_local() const { return bytes[0] == 0xFE && (bytes[1] & 0xC0) == 0x80; }
  // 0.0.0.0 or ::, the wildcard.
  bool any() const { return is_v4() ? v4() == 0 : *this == any6(); }
  // 127/8 or ::1.
  bool loopback() const {
    static const uint8_t kLoopback6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    return is_v4() ? (v4() >> 24) == IN_LOOPBACKNET : std::memcmp(bytes.data(), kLoopback6, 16) == 0;
  }
  bool multicast() const { return is_v4() ? IN_MULTICAST(v4()) : bytes[0] == 0xFF; }
  ibv_gid gid() const {
    ibv_gid g;
    std::memcpy(g.raw, bytes.data(), 16);
    return g;
  }
  int family() const { return is_v4() ? AF_INET : AF_INET6; }
  friend bool operator==(const IpAddr&, const IpAddr&) = default;
};

// An address and port, as a socket address of its own family: AF_INET for
// IPv4, AF_INET6 (with the scope) for IPv6.
union SockAddr {
  sockaddr sa;
  sockaddr_in in;
  sockaddr_in6 in6;
  socklen_t len() const { return sa.sa_family == AF_INET ? sizeof in : sizeof in6; }
};

inline SockAddr make_sockaddr(const IpAddr& ip, uint16_t port) {
  SockAddr a{};
  if (ip.is_v4()) {
    a.in.sin_family = AF_INET;
    a.in.sin_addr.s_addr = htonl(ip.v4());
    a.in.sin_port = htons(port);
  } else {
    a.in6.sin6_family = AF_INET6;
    std::memcpy(a.in6.sin6_addr.s6_addr, ip.bytes.data(), 16);
    a.in6.sin6_port = htons(port);
    a.in6.sin6_scope_id = ip.scope;
  }
  return a;
}

struct IpEndpoint {
  IpAddr ip;  // 0.0.0.0 or :: = any
  uint16_t port = 0;
};

// 0, EINVAL (null), or EAFNOSUPPORT (other families). An IPv4-mapped IPv6
// address is the IPv4 address; :: stays the IPv6 wildcard.
[[nodiscard]] inline int parse_sockaddr(const sockaddr* sa, IpEndpoint* out) {
  if (!sa) return EINVAL;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    *out = {ntohl(in->sin_addr.s_addr), ntohs(in->sin_port)};
    return 0;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    IpAddr a;
    std::memcpy(a.bytes.data(), in6->sin6_addr.s6_addr, 16);
    a.scope = a.link_local() ? in6->sin6_scope_id : 0;
    *out = {a, ntohs(in6->sin6_port)};
    return 0;
  }
  return EAFNOSUPPORT;
}

// The address and port of a socket address of either family (e.g. from
// getsockname); false for another family.
inline bool endpoint_of(const sockaddr_storage& ss, IpEndpoint* out) {
  return parse_sockaddr(reinterpret_cast<const sockaddr*>(&ss), out) == 0;
}

// The length librdmacm gives an address (ucma_addrlen): 0 if unsupported.
inline socklen_t sockaddr_len(const sockaddr* sa) {
  if (!sa) return 0;
  if (sa->sa_family == AF_INET) return sizeof(sockaddr_in);
  if (sa->sa_family == AF_INET6) return sizeof(sockaddr_in6);
  return 0;
}

}  // namespace uroce::rdmacm
