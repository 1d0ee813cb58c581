// Whether an address is this host's: the same-host paths (shared-memory
// rings, direct placement) serve only peers at one of these.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/datagram.h"

namespace uroce::transport {

// The host's IPv4 addresses when it was taken (getifaddrs). IPv6 peers of
// this host are reached by packets, so no IPv6 address is local here.
class LocalAddresses {
 public:
  static LocalAddresses snapshot();
  // 127/8 or one of the host's IPv4 addresses.
  bool contains(const IpAddress& addr) const noexcept;

 private:
  std::vector<uint32_t> v4_;  // host order
};

}  // namespace uroce::transport
