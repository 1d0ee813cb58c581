// Address resolution: the route's next hop and its neighbour (ARP/NDP) state,
// through rtnetlink, as the kernel's rdma_resolve_addr finds them for RoCE
// (drivers/infiniband/core/addr.c: route lookup; a local destination resolves
// at once; else the next hop's neighbour must become NUD_VALID, which a packet
// to the destination triggers).
//
// Two parts: the requests and the parsing of the kernel's answers are pure byte
// code (unit-tested with crafted messages, tests/rdmacm/neighbour_test.cc); a
// `RouteNetlink` socket asks the kernel. rtnetlink answers a GET request within
// the sendmsg call that carries it, so a query never waits for the network and
// may be made under the CM mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "transport/datagram.h"

namespace uroce::rdmacm::neighbour {

// Where the route to a destination leads.
struct NextHop {
  bool local = false;        // RTN_LOCAL: an address of this host (loopback included)
  int ifindex = 0;           // output interface
  transport::IpAddress hop;  // the neighbour to resolve: the gateway, or the destination itself
  bool via_gateway = false;
};

// A neighbour cache entry's state, as far as resolution cares.
enum class NeighState : uint8_t {
  kNone,        // no entry (or NUD_NONE): resolution has not started
  kIncomplete,  // NUD_INCOMPLETE: solicitations under way
  kFailed,      // NUD_FAILED: nobody answered them
  kValid,       // REACHABLE, STALE, DELAY, PROBE, PERMANENT or NOARP: the kernel's NUD_VALID
};

// The NUD_* state bits of an ndmsg as a NeighState.
NeighState classify_nud(uint16_t nud_state);

// Interface flags that make a neighbour unnecessary (IFF_LOOPBACK, IFF_NOARP):
// the kernel's addr_resolve_neigh resolves such an interface's routes at once.
bool needs_no_neighbour(unsigned if_flags);

// ---- requests (pure): each appends one netlink message to `out` ----
// RTM_GETROUTE for `dst` (RTA_DST), from `src` unless unspecified (RTA_SRC),
// out of `dst.scope` when it is a link-local address (RTA_OIF).
void build_route_request(std::vector<uint8_t>& out, uint32_t seq, const transport::IpAddress& dst,
                         const transport::IpAddress& src);
// RTM_GETNEIGH for `addr` on interface `ifindex` (a get, not a dump: Linux 4.20+).
void build_neigh_request(std::vector<uint8_t>& out, uint32_t seq, const transport::IpAddress& addr, int ifindex);
// RTM_GETLINK for interface `ifindex`.
void build_link_request(std::vector<uint8_t>& out, uint32_t seq, int ifindex);

// ---- answers (pure) ----
// Each parses what one recv() of the netlink socket returned and looks for the
// answer to request `seq`: 0 with the result filled in; the errno of an
// NLMSG_ERROR answer; EAGAIN if `msg` holds no answer to `seq` (a stale one,
// or none yet); EBADMSG if it is malformed.
[[nodiscard]] int parse_route_reply(std::span<const uint8_t> msg, uint32_t seq, NextHop* out);
[[nodiscard]] int parse_neigh_reply(std::span<const uint8_t> msg, uint32_t seq, NeighState* out);
[[nodiscard]] int parse_link_reply(std::span<const uint8_t> msg, uint32_t seq, unsigned* if_flags);

// A NETLINK_ROUTE socket, opened on first use (not thread-safe: the CM's
// callers hold its mutex).
class RouteNetlink {
 public:
  RouteNetlink() = default;
  RouteNetlink(const RouteNetlink&) = delete;
  RouteNetlink& operator=(const RouteNetlink&) = delete;
  ~RouteNetlink();

  // The route to `dst` (from `src`, or the kernel's choice): its next hop, or
  // whether it is local. An errno (ENETUNREACH, EHOSTUNREACH, ...) otherwise.
  [[nodiscard]] int route(const transport::IpAddress& dst, const transport::IpAddress& src, NextHop* out);
  // The flags of interface `ifindex`.
  [[nodiscard]] int link_flags(int ifindex, unsigned* flags);
  // The state of the neighbour `addr` on `ifindex` (no entry: kNone).
  [[nodiscard]] int neigh_state(const transport::IpAddress& addr, int ifindex, NeighState* out);

 private:
  // Sends the request in `request_` and receives the answer into `reply_`;
  // `parse` reads it (as the parse_* functions above).
  template <typename Parse>
  [[nodiscard]] int query(Parse parse);
  [[nodiscard]] int open();

  int fd_ = -1;
  uint32_t seq_ = 0;
  std::vector<uint8_t> request_;
  std::vector<uint8_t> reply_;
};

// Makes the kernel resolve the next hop towards `dst`: an empty UDP datagram
// to it (from `src` unless unspecified), as the kernel's neigh_event_send
// queues a packet on an unresolved neighbour. Sent to the discard port (9,
// RFC 863): whatever reaches the destination is dropped by design, not taken
// for a request by some service (the RoCE port would count a malformed packet
// at a NIC, the rdma_cm port may be any application's). Returns an errno.
[[nodiscard]] int trigger_resolution(const transport::IpAddress& dst, const transport::IpAddress& src);

}  // namespace uroce::rdmacm::neighbour
