// Binding and address/route resolution.
//
// RoCE resolves an IP address to a GID (the address of the local interface
// that routes to it: IPv4-mapped, or IPv6) and needs no SA. As the kernel's
// rdma_resolve_addr for RoCE, resolution waits for the route's next hop to
// have a valid neighbour entry (ARP/NDP, neighbour.h): silence until the
// timeout is ADDR_ERROR with -ETIMEDOUT. A destination with no route at all
// fails rdma_resolve_addr itself (ENETUNREACH), as the kernel's route lookup
// (rdma_resolve_ip) does. Route resolution has nothing to ask; the peer's
// port (uroce's LID) comes with its REP.
//
// A bound id holds its rdma_cm port as a UDP socket at its address and port:
// the host's engines pass the REQs and SIDR_REQs for that port there
// (cm_gsi.cc), and two ids of the host cannot hold one port.
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/config.h"
#include "core/context.h"
#include "core/device.h"
#include "core/log.h"
#include "rdmacm/cm_service.h"
#include "rdmacm/sockaddr_util.h"
#include "wire/headers.h"

namespace uroce::rdmacm {

namespace {

constexpr int kDefaultResolveTimeoutMs = 2000;

// The source address the kernel's routing picks for `dst` (IPv4 or IPv6; a
// link-local one with its interface).
int route_source(const transport::IpAddress& dst, transport::IpAddress* src) {
  int fd = socket(family_of(dst), SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  SockAddr d = make_sockaddr(dst, wire::kRoceV2Port);  // any port: a UDP connect() only picks the route
  int err = 0;
  if (::connect(fd, &d.sa, d.len()) != 0) {
    err = errno;
  } else {
    sockaddr_storage s{};
    socklen_t len = sizeof s;
    IpEndpoint ep;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&s), &len) != 0) {
      err = errno;
    } else if (endpoint_of(s, &ep)) {
      *src = ep.ip;
    } else {
      err = EAFNOSUPPORT;
    }
  }
  close(fd);
  return err;
}

// The path MTU for traffic from `src_ip`: as rxe, the largest IB MTU that fits
// the interface MTU minus 80 header bytes, at most the device's maximum.
// Loopback traffic thus gets 4096, while a routable address gets what its
// interface carries; UROCE_MTU (the port's active MTU) wins when set.
ibv_mtu path_mtu_for(const transport::IpAddress& src_ip, const CmDevice& dev) {
  unsigned if_mtu = 0;
  const ibv_gid gid = core::ip_to_gid(src_ip.bytes);
  for (const core::HostAddress& h : core::host_addresses())
    if (std::memcmp(h.gid.raw, gid.raw, 16) == 0) if_mtu = h.if_mtu;
  ibv_mtu mtu = if_mtu ? core::mtu_enum_for_bytes(if_mtu > 80 ? if_mtu - 80 : 256) : dev.active_mtu;
  if (core::config().mtu_override) mtu = dev.active_mtu;
  return mtu > dev.max_mtu ? dev.max_mtu : mtu;
}

}  // namespace

int CmService::attach_device(CmId* id, const transport::IpAddress& ip) {
  auto dp = device_for_ip(ip);
  if (!dp.ok()) return dp.err();
  id->port = *dp;
  id->abi.verbs = dp->device->verbs;
  if (!id->abi.pd) id->abi.pd = dp->device->pd;
  id->abi.port_num = 1;
  return 0;
}

void CmService::set_route_addresses(CmId* id) {
  rdma_addr& a = id->abi.route.addr;
  std::memset(&a.src_storage, 0, sizeof a.src_storage);
  std::memset(&a.dst_storage, 0, sizeof a.dst_storage);
  SockAddr src = make_sockaddr(id->src_ip, id->src_port);
  std::memcpy(&a.src_storage, &src, src.len());
  if (!id->dst_ip.unspecified() || id->dst_port) {
    SockAddr dst = make_sockaddr(id->dst_ip, id->dst_port);
    std::memcpy(&a.dst_storage, &dst, dst.len());
  }
  rdma_ib_addr& ib = a.addr.ibaddr;
  ib.sgid = !id->src_ip.unspecified() ? core::ip_to_gid(id->src_ip.bytes) : ibv_gid{};
  ib.dgid = !id->dst_ip.unspecified() ? core::ip_to_gid(id->dst_ip.bytes) : ibv_gid{};
  ib.pkey = htons(0xFFFF);
}

void CmService::fill_path_record(CmId* id) {
  if (!id->abi.route.path_rec) {
    id->abi.route.path_rec = static_cast<ibv_sa_path_rec*>(calloc(1, sizeof(ibv_sa_path_rec)));
    if (!id->abi.route.path_rec) return;
  }
  ibv_sa_path_rec& p = *id->abi.route.path_rec;
  std::memset(&p, 0, sizeof p);
  p.sgid = core::ip_to_gid(id->src_ip.bytes);
  p.dgid = core::ip_to_gid(id->dst_ip.bytes);
  p.slid = htons(id->port.device ? id->port.device->lid : 0);
  p.dlid = htons(id->conn.remote_lid);
  p.hop_limit = kHopLimit;
  p.traffic_class = id->tos.value_or(0);
  p.reversible = 1;
  p.numb_path = 1;
  p.pkey = htons(0xFFFF);
  p.mtu_selector = 2;  // exactly
  p.mtu = id->conn.path_mtu;
  p.rate_selector = 2;
  p.packet_life_time_selector = 2;
  p.packet_life_time = 16;  // the kernel CM's RoCE packet lifetime
  id->abi.route.num_paths = 1;
}

int CmService::open_bound_socket(CmId* id, const transport::IpAddress& ip, uint16_t port) {
  int fd = socket(family_of(ip), SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  // The IPv6 wildcard takes IPv4 peers too, unless RDMA_OPTION_ID_AFONLY.
  int v6only = id->afonly || !ip.unspecified();
  if (!ip.is_v4()) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
  SockAddr a = make_sockaddr(ip, port);
  if (::bind(fd, &a.sa, a.len()) != 0) {
    int err = errno;
    close(fd);
    return err;
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  IpEndpoint ep;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0 && endpoint_of(bound, &ep)) port = ep.port;
  const uint64_t token = next_token_++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = token;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    int err = errno;
    close(fd);
    return err;
  }
  close_port_socket(id);
  id->sock = fd;
  id->sock_token = token;
  id->src_port = port;
  port_ids_[token] = id;
  ensure_thread();
  return 0;
}

void CmService::close_port_socket(CmId* id) {
  if (id->sock < 0) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, id->sock, nullptr);
  close(id->sock);
  id->sock = -1;
  port_ids_.erase(id->sock_token);
}

int CmService::bind(CmId* id, const sockaddr* addr) {
  if (id->state != CmState::kIdle || id->bound) return EINVAL;
  IpEndpoint ep;
  if (int err = parse_sockaddr(addr, &ep)) return err;
  // As the kernel's rdma_bind_addr (cma_any_addr: zero *or loopback*), a loopback
  // address attaches no device: the id's verbs stays NULL until a connection
  // request or rdma_resolve_addr picks one. libfabric's verbs provider relies on
  // it: it binds "localhost" and, finding no device, offers the device's own
  // addresses instead, which the peers of other hosts can reach.
  if (!ep.ip.unspecified() && !ep.ip.loopback()) {
    if (int err = attach_device(id, ep.ip)) return err;
  }
  if (int err = open_bound_socket(id, ep.ip, ep.port)) return err;
  id->bound = true;
  id->src_ip = ep.ip;
  set_route_addresses(id);
  return 0;
}

int CmService::resolve_addr(CmId* id, const sockaddr* src, const sockaddr* dst, int timeout_ms) {
  if (id->state != CmState::kIdle) return EINVAL;
  IpEndpoint d;
  if (int err = parse_sockaddr(dst, &d)) return err;
  if (d.ip.unspecified()) return EADDRNOTAVAIL;
  if (!id->bound) {
    if (src) {
      if (int err = bind(id, src)) return err;
    }
  }
  // A bound address must be of the destination's IP version (a wildcard
  // takes either), as the kernel's rdma_resolve_addr.
  if (!id->src_ip.unspecified() && id->src_ip.is_v4() != d.ip.is_v4()) return EINVAL;
  transport::IpAddress src_ip = id->src_ip;
  if (src_ip.unspecified()) {
    // No route: rdma_resolve_addr fails at once (the kernel's rdma_resolve_ip).
    if (int err = route_source(d.ip, &src_ip)) return err;
  }
  neighbour::NextHop hop;
  if (!d.ip.multicast()) {
    if (int err = netlink_.route(d.ip, id->src_ip, &hop)) return err;
  }
  id->dst_ip = d.ip;
  id->dst_port = d.port;
  id->resolve_timeout_ms = timeout_ms > 0 ? timeout_ms : kDefaultResolveTimeoutMs;
  id->state = CmState::kAddrQuery;
  int err = 0;
  if (!id->port.device) err = attach_device(id, src_ip);
  if (!err && !id->bound) {
    err = open_bound_socket(id, src_ip, 0);
    if (!err) id->bound = true;
  }
  if (err) {
    finish_resolve(id, err);
    return 0;
  }
  id->src_ip = src_ip;
  id->conn.path_mtu = path_mtu_for(src_ip, *id->port.device);
  set_route_addresses(id);
  if (d.ip.multicast()) {
    finish_resolve(id, 0);  // a group has no neighbour to wait for
  } else {
    wait_for_neighbour(id, hop);
  }
  return 0;
}

int CmService::resolve_route(CmId* id, int /*timeout_ms*/) {
  if (id->state != CmState::kAddrResolved) return EINVAL;
  // RoCE has no SA to ask: the path is the resolved addresses' (fill_path_record).
  id->state = CmState::kRouteQuery;
  finish_resolve(id, 0);
  return 0;
}

void CmService::wait_for_neighbour(CmId* id, const neighbour::NextHop& hop) {
  unsigned if_flags = 0;
  // An error here only costs the shortcut: the neighbour table still answers.
  if (hop.local || (netlink_.link_flags(hop.ifindex, &if_flags) == 0 && neighbour::needs_no_neighbour(if_flags))) {
    finish_resolve(id, 0);
    return;
  }
  id->resolve_hop = hop.hop;
  id->resolve_ifindex = hop.ifindex;
  id->resolve_deadline = Clock::now() + std::chrono::milliseconds(id->resolve_timeout_ms);
  id->resolve_poll_ms = kNeighbourFirstPollMs;
  poll_neighbour(id);
}

void CmService::poll_neighbour(CmId* id) {
  if (id->state != CmState::kAddrQuery) return;
  neighbour::NeighState state = neighbour::NeighState::kNone;
  int err = netlink_.neigh_state(id->resolve_hop, id->resolve_ifindex, &state);
  if (err && err != EAGAIN) {
    // The kernel would not answer (before Linux 4.20 RTM_GETNEIGH cannot get
    // one entry): resolve as before there was a neighbour to wait for.
    LOG_WARN("rdma_cm: id %llu: neighbour lookup failed (%s); resolving without it", (unsigned long long)id->serial,
             strerror(err));
    finish_resolve(id, 0);
    return;
  }
  if (state == neighbour::NeighState::kValid) {
    finish_resolve(id, 0);
    return;
  }
  const auto now = Clock::now();
  if (now >= id->resolve_deadline) {
    finish_resolve(id, ETIMEDOUT);
    return;
  }
  // As the kernel's neigh_event_send at each retry: start the solicitations
  // if they have not started, or again after they failed (while INCOMPLETE,
  // they are under way).
  if (state == neighbour::NeighState::kNone || state == neighbour::NeighState::kFailed)
    (void)neighbour::trigger_resolution(id->dst_ip, id->src_ip);
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(id->resolve_deadline - now).count();
  arm_timer(id, TimerKind::kNeighbour, int(std::min<int64_t>(id->resolve_poll_ms, left)));
  id->resolve_poll_ms = std::min(id->resolve_poll_ms * 2, kNeighbourMaxPollMs);
}

void CmService::finish_resolve(CmId* id, int err) {
  cancel_timer(id);
  if (id->state == CmState::kAddrQuery) {
    id->state = err ? CmState::kIdle : CmState::kAddrResolved;
    queue_event(id, err ? RDMA_CM_EVENT_ADDR_ERROR : RDMA_CM_EVENT_ADDR_RESOLVED, -err);
  } else if (id->state == CmState::kRouteQuery) {
    id->state = err ? CmState::kAddrResolved : CmState::kRouteResolved;
    if (!err) fill_path_record(id);
    queue_event(id, err ? RDMA_CM_EVENT_ROUTE_ERROR : RDMA_CM_EVENT_ROUTE_RESOLVED, -err);
  }
}

}  // namespace uroce::rdmacm
