// The uroce devices (ibv_get_device_list) and the host addresses that become
// their GIDs (design §3).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace uroce::core {

// One IPv4 address of this host, and the interface it sits on.
struct HostAddress {
  uint32_t ip = 0;  // host byte order
  std::string ifname;
  unsigned if_mtu = 1500;
  bool loopback = false;
};

// The host's IPv4 addresses, routable ones first, loopback last.
std::vector<HostAddress> host_ipv4_addresses();

// RoCEv2 GID of an IPv4 address: ::ffff:a.b.c.d (roce-facts §5.4).
ibv_gid ipv4_to_gid(uint32_t ip);
// Returns true and the address if the GID is IPv4-mapped.
bool gid_to_ipv4(const ibv_gid& gid, uint32_t* ip);

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
