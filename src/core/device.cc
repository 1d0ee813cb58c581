#include "core/device.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>

#include "core/config.h"
#include "core/container_of.h"

namespace uroce::core {

namespace {

unsigned interface_mtu(const char* ifname) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 1500;
  ifreq req{};
  std::strncpy(req.ifr_name, ifname, IFNAMSIZ - 1);
  unsigned mtu = 1500;
  if (ioctl(fd, SIOCGIFMTU, &req) == 0) mtu = unsigned(req.ifr_mtu);
  close(fd);
  return mtu;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

std::vector<HostAddress> host_ipv4_addresses() {
  std::vector<HostAddress> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
      if (!(a->ifa_flags & IFF_UP)) continue;
      HostAddress h;
      h.ip = ntohl(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
      h.ifname = a->ifa_name;
      h.loopback = (a->ifa_flags & IFF_LOOPBACK) || (h.ip >> 24) == 127;
      h.if_mtu = interface_mtu(a->ifa_name);
      h.gid = ipv4_to_gid(h.ip);
      h.ifindex = if_nametoindex(a->ifa_name);
      out.push_back(h);
    }
    freeifaddrs(list);
  }
  std::stable_partition(out.begin(), out.end(), [](const HostAddress& h) { return !h.loopback; });
  if (out.empty()) {
    HostAddress lo{0x7F000001, "lo", 65536, true};
    lo.gid = ipv4_to_gid(lo.ip);
    lo.ifindex = if_nametoindex("lo");
    out.push_back(lo);
  }
  return out;
}

namespace {

// The host's IPv6 addresses, routable ones first, loopback last. getifaddrs
// lists each interface's addresses as the kernel keeps them (global before
// link-local), which is also the order its RoCE GID table adds them in
// (roce_gid_mgmt.c: enum_netdev_ipv6_ips after the IPv4 ones).
std::vector<HostAddress> host_ipv6_addresses() {
  std::vector<HostAddress> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET6) continue;
    if (!(a->ifa_flags & IFF_UP)) continue;
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
    HostAddress h;
    std::memcpy(h.gid.raw, sin6->sin6_addr.s6_addr, 16);
    if (!gid_is_unicast_ip(h.gid)) continue;
    h.ipv6 = true;
    h.ifname = a->ifa_name;
    h.loopback = (a->ifa_flags & IFF_LOOPBACK) || IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr);
    h.if_mtu = interface_mtu(a->ifa_name);
    h.ifindex = if_nametoindex(a->ifa_name);
    out.push_back(h);
  }
  freeifaddrs(list);
  std::stable_partition(out.begin(), out.end(), [](const HostAddress& h) { return !h.loopback; });
  return out;
}

}  // namespace

std::vector<HostAddress> host_addresses() {
  std::vector<HostAddress> out = host_ipv4_addresses();
  std::vector<HostAddress> v6 = host_ipv6_addresses();
  out.insert(out.end(), v6.begin(), v6.end());
  return out;
}

uint32_t HostAddress::scope() const { return ipv6 && gid_is_link_local(gid) ? ifindex : 0; }

bool gid_is_link_local(const ibv_gid& gid) { return gid.raw[0] == 0xFE && (gid.raw[1] & 0xC0) == 0x80; }

bool gid_is_unicast_ip(const ibv_gid& gid) {
  uint32_t ip;
  if (gid_to_ipv4(gid, &ip)) return ip != 0 && (ip >> 28) != 0xE;
  static const ibv_gid kZero{};
  return std::memcmp(gid.raw, kZero.raw, 16) != 0 && gid.raw[0] != 0xFF;  // not ::, not multicast
}

ibv_gid ipv4_to_gid(uint32_t ip) {
  ibv_gid g{};
  g.raw[10] = 0xFF;
  g.raw[11] = 0xFF;
  uint32_t be = htonl(ip);
  std::memcpy(g.raw + 12, &be, 4);
  return g;
}

bool gid_to_ipv4(const ibv_gid& gid, uint32_t* ip) {
  static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  if (std::memcmp(gid.raw, kPrefix, 12) != 0) return false;
  uint32_t be;
  std::memcpy(&be, gid.raw + 12, 4);
  *ip = ntohl(be);
  return true;
}

Device::Device(const std::string& name, unsigned index) : ibdev{} {
  ibdev.node_type = IBV_NODE_CA;
  ibdev.transport_type = IBV_TRANSPORT_IB;
  std::snprintf(ibdev.name, sizeof ibdev.name, "%s", name.c_str());
  std::snprintf(ibdev.dev_name, sizeof ibdev.dev_name, "uverbs%u", index);
  std::snprintf(ibdev.dev_path, sizeof ibdev.dev_path, "/sys/class/infiniband_verbs/uverbs%u", index);
  std::snprintf(ibdev.ibdev_path, sizeof ibdev.ibdev_path, "/sys/class/infiniband/%s", name.c_str());
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  // Locally administered EUI-64 derived from the host and device names.
  guid = (fnv1a(std::string(host) + "/" + name) & 0x0000FFFFFFFFFFFFull) | 0x0200000000000000ull;
}

Device* Device::from(ibv_device* d) { return UROCE_CONTAINER_OF(d, Device, ibdev); }

std::span<Device* const> devices() {
  // Never destroyed, as the devices: threads that outlive main() (the CM's, an
  // engine's) still look devices up while the exiting thread runs destructors.
  static const auto* const list = new std::vector<Device*>{new Device(config().device_name, 0)};
  return *list;
}

}  // namespace uroce::core
