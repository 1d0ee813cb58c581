// The uroce devices (ibv_get_device_list) and the host addresses that become
// their GIDs (design §3).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace uroce::core {

// One address of this host, IPv4 or IPv6, and the interface it sits on.
struct HostAddress {
  uint32_t ip = 0;  // an IPv4 address, host byte order; 0 for an IPv6 one
  std::string ifname;
  unsigned if_mtu = 1500;
  bool loopback = false;
  ibv_gid gid{};         // the address as a RoCEv2 GID (IPv4-mapped, or the IPv6 address)
  unsigned ifindex = 0;  // of `ifname`
  bool ipv6 = false;

  // The interface a packet from or to it must use: that of a link-local
  // IPv6 address (fe80::/10, which names no interface by itself), else 0.
  uint32_t scope() const;
};

// The host's IPv4 addresses, routable ones first, loopback last.
std::vector<HostAddress> host_ipv4_addresses();

// The host's addresses in GID table order: the IPv4 ones as above, then the
// IPv6 ones, routable ones first (per interface as the kernel lists them:
// global before link-local), loopback (::1) last. IPv4 keeps GID index 0.
std::vector<HostAddress> host_addresses();

// RoCEv2 GID of an IPv4 address: ::ffff:a.b.c.d (roce-facts §5.4).
ibv_gid ipv4_to_gid(uint32_t ip);
// RoCEv2 GID of an IP address in its 16-byte form (IPv4-mapped, or IPv6;
// network byte order, as in sin6_addr): the same bytes. The engine and the CM
// pass an address's bytes (`core::ip_to_gid(ip.bytes)`).
inline ibv_gid ip_to_gid(std::span<const uint8_t, 16> ip) {
  ibv_gid g;
  std::memcpy(g.raw, ip.data(), 16);
  return g;
}
// Returns true and the address if the GID is IPv4-mapped.
bool gid_to_ipv4(const ibv_gid& gid, uint32_t* ip);
// Whether a GID can be a unicast IP address: IPv4-mapped other than 0.0.0.0
// and multicast, or IPv6 other than :: and multicast (ff00::/8).
bool gid_is_unicast_ip(const ibv_gid& gid);
// Whether the GID is a link-local IPv6 address (fe80::/10).
bool gid_is_link_local(const ibv_gid& gid);

class Device {
 public:
  explicit Device(const std::string& name, unsigned index);

  ibv_device ibdev;   // ABI object handed to the application
  uint64_t guid = 0;  // host byte order

  static Device* from(ibv_device* d);
};

// The process-wide device list (built once).
std::span<Device* const> devices();

}  // namespace uroce::core
