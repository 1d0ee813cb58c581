// IPv4 socket addresses as rdma_cm uses them. uroce's GIDs are IPv4-mapped
// (design §3), so an AF_INET6 address is accepted only as the wildcard (::)
// or as an IPv4-mapped address (::ffff:a.b.c.d).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace uroce::rdmacm {

struct Ipv4Endpoint {
  uint32_t ip = 0;  // host order; 0 = any
  uint16_t port = 0;
};

// 0, EINVAL (null), or EAFNOSUPPORT (other families, non-mapped IPv6).
[[nodiscard]] inline int parse_sockaddr(const sockaddr* sa, Ipv4Endpoint* out) {
  if (!sa) return EINVAL;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    *out = {ntohl(in->sin_addr.s_addr), ntohs(in->sin_port)};
    return 0;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    if (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr)) {
      *out = {0, ntohs(in6->sin6_port)};
      return 0;
    }
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      uint32_t be;
      std::memcpy(&be, in6->sin6_addr.s6_addr + 12, 4);
      *out = {ntohl(be), ntohs(in6->sin6_port)};
      return 0;
    }
  }
  return EAFNOSUPPORT;
}

inline sockaddr_in make_sockaddr(uint32_t ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(ip);
  a.sin_port = htons(port);
  return a;
}

// The length librdmacm gives an address (ucma_addrlen): 0 if unsupported.
inline socklen_t sockaddr_len(const sockaddr* sa) {
  if (!sa) return 0;
  if (sa->sa_family == AF_INET) return sizeof(sockaddr_in);
  if (sa->sa_family == AF_INET6) return sizeof(sockaddr_in6);
  return 0;
}

}  // namespace uroce::rdmacm
