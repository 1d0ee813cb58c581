#include "transport/local_addresses.h"

#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>

namespace uroce::transport {

LocalAddresses LocalAddresses::snapshot() {
  LocalAddresses out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next)
    if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET)
      out.v4_.push_back(ntohl(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr));
  freeifaddrs(list);
  return out;
}

bool LocalAddresses::contains(const IpAddress& addr) const noexcept {
  if (!addr.is_v4()) return false;
  uint32_t ip = addr.v4();
  return (ip >> 24) == 127 || std::find(v4_.begin(), v4_.end(), ip) != v4_.end();
}

}  // namespace uroce::transport
