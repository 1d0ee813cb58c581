#include "rdmacm/cm_devices.h"

#include <arpa/inet.h>
#include <ifaddrs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/device.h"
#include "core/log.h"

namespace uroce::rdmacm {

namespace {

// Opened devices, in device-list order; never freed (see the header).
std::vector<CmDevice*>& table() {
  static auto* t = new std::vector<CmDevice*>();
  return *t;
}

CmDevice* open_device(ibv_device* dev) {
  ibv_context* verbs = ibv_open_device(dev);
  if (!verbs) return nullptr;
  auto* d = new CmDevice();
  d->verbs = verbs;
  d->guid_be = ibv_get_device_guid(dev);
  ibv_device_attr attr{};
  ibv_port_attr port{};
  if (ibv_query_device(verbs, &attr) != 0 || ibv_query_port(verbs, 1, &port) != 0) {
    ibv_close_device(verbs);
    delete d;
    errno = ENODEV;
    return nullptr;
  }
  d->lid = port.lid;
  d->active_mtu = port.active_mtu;
  d->max_mtu = port.max_mtu;
  d->max_initiator_depth = uint8_t(std::min(attr.max_qp_init_rd_atom, 255));
  d->max_responder_resources = uint8_t(std::min(attr.max_qp_rd_atom, 255));
  d->max_qp_wr = attr.max_qp_wr;
  for (int i = 0; i < port.gid_tbl_len; ++i) {
    ibv_gid gid{};
    if (ibv_query_gid(verbs, 1, i, &gid) != 0) gid = ibv_gid{};
    d->gids.push_back(gid);
  }
  d->pd = ibv_alloc_pd(verbs);
  if (!d->pd) {
    int e = errno;
    ibv_close_device(verbs);
    delete d;
    errno = e;
    return nullptr;
  }
  LOG_INFO("rdma_cm: using device %s (LID/UDP port %u)", ibv_get_device_name(dev), d->lid);
  return d;
}

bool is_host_address(const transport::IpAddress& ip) {
  bool found = false;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  for (ifaddrs* a = list; a && !found; a = a->ifa_next) {
    IpEndpoint ep;
    if (a->ifa_addr && (a->ifa_addr->sa_family == AF_INET || a->ifa_addr->sa_family == AF_INET6) &&
        parse_sockaddr(a->ifa_addr, &ep) == 0)
      found = ep.ip.bytes == ip.bytes;
  }
  freeifaddrs(list);
  return found;
}

}  // namespace

core::Result<std::vector<CmDevice*>> cm_devices() {
  auto& t = table();
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return core::Result<std::vector<CmDevice*>>::error(errno ? errno : ENODEV);
  // Devices are opened in list order, so the table is a prefix of the list.
  for (int i = int(t.size()); i < n; ++i) {
    CmDevice* d = open_device(list[i]);
    if (!d) {
      int e = errno;
      ibv_free_device_list(list);
      return core::Result<std::vector<CmDevice*>>::error(e ? e : ENODEV);
    }
    t.push_back(d);
  }
  ibv_free_device_list(list);
  if (t.empty()) return core::Result<std::vector<CmDevice*>>::error(ENODEV);
  return t;
}

core::Result<DevicePort> device_for_ip(const transport::IpAddress& ip) {
  auto devs = cm_devices();
  if (!devs.ok()) return core::Result<DevicePort>::error(devs.err());
  const ibv_gid gid = core::ip_to_gid(ip.bytes);
  static constexpr ibv_gid kEmpty{};  // :: is no address, and what the tables' empty slots hold
  for (CmDevice* d : *devs) {
    for (size_t i = 0; i < d->gids.size() && std::memcmp(gid.raw, kEmpty.raw, 16) != 0; ++i)
      if (std::memcmp(d->gids[i].raw, gid.raw, 16) == 0) return DevicePort{d, uint8_t(i)};
  }
  // A host address missing from the GID tables was added after the devices
  // were opened: no RoCE device serves it.
  return core::Result<DevicePort>::error(is_host_address(ip) ? ENODEV : EADDRNOTAVAIL);
}

CmDevice* device_for_context(ibv_context* verbs) {
  for (CmDevice* d : table())
    if (d->verbs == verbs) return d;
  return nullptr;
}

}  // namespace uroce::rdmacm
