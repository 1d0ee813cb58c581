// IP socket addresses as rdma_cm uses them: AF_INET and AF_INET6 (an
// IPv4-mapped AF_INET6 address is the IPv4 address, as uroce's GIDs write
// IPv4: ::ffff:a.b.c.d, design §3). The address itself is transport::IpAddress.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "transport/datagram.h"

namespace uroce::rdmacm {

// The socket address family of `ip`: AF_INET for IPv4, AF_INET6 otherwise.
inline int family_of(const transport::IpAddress& ip) { return ip.is_v4() ? AF_INET : AF_INET6; }

// An address and port, as a socket address of its own family: AF_INET for
// IPv4, AF_INET6 (with the scope) for IPv6.
union SockAddr {
  sockaddr sa;
  sockaddr_in in;
  sockaddr_in6 in6;
  socklen_t len() const { return sa.sa_family == AF_INET ? sizeof in : sizeof in6; }
};

inline SockAddr make_sockaddr(const transport::IpAddress& ip, uint16_t port) {
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
  transport::IpAddress ip;  // 0.0.0.0 or :: (unspecified()) = any
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
    *out = {transport::IpAddress::from_bytes(in6->sin6_addr.s6_addr, in6->sin6_scope_id), ntohs(in6->sin6_port)};
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
