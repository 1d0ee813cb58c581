#include "rdmacm/neighbour.h"

#include <linux/neighbour.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "rdmacm/sockaddr_util.h"

namespace uroce::rdmacm::neighbour {

namespace {

constexpr uint16_t kDiscardPort = 9;  // RFC 863
constexpr size_t kReplyBytes = 8192;  // one answer: a route, a neighbour or a link (with its attributes)

// The address bytes of `ip` as its family carries them: 4 for IPv4, 16 for IPv6.
std::span<const uint8_t> address_bytes(const transport::IpAddress& ip) {
  return ip.is_v4() ? std::span<const uint8_t>(ip.bytes).subspan(12) : std::span<const uint8_t>(ip.bytes);
}

// An address of family `family` from an attribute's payload; false if the
// length does not fit the family.
bool address_from(int family, const uint8_t* p, size_t len, transport::IpAddress* out) {
  if (family == AF_INET && len == 4) {
    *out = transport::IpAddress(uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]);
    return true;
  }
  if (family == AF_INET6 && len == 16) {
    *out = transport::IpAddress::from_bytes(p);
    return true;
  }
  return false;
}

// Starts a request: the netlink header and the family header `Body`, zeroed.
template <typename Body>
Body* begin_request(std::vector<uint8_t>& out, uint16_t type, uint32_t seq) {
  out.clear();
  out.resize(NLMSG_SPACE(sizeof(Body)));
  auto* h = reinterpret_cast<nlmsghdr*>(out.data());
  h->nlmsg_len = uint32_t(NLMSG_LENGTH(sizeof(Body)));
  h->nlmsg_type = type;
  h->nlmsg_flags = NLM_F_REQUEST;
  h->nlmsg_seq = seq;
  return reinterpret_cast<Body*>(NLMSG_DATA(h));
}

void add_attr(std::vector<uint8_t>& out, uint16_t type, const void* data, size_t len) {
  const size_t at = NLMSG_ALIGN(out.size());
  out.resize(at + RTA_SPACE(len));
  rtattr a{};
  a.rta_len = uint16_t(RTA_LENGTH(len));
  a.rta_type = type;
  std::memcpy(out.data() + at, &a, sizeof a);
  std::memcpy(out.data() + at + RTA_LENGTH(0), data, len);
  reinterpret_cast<nlmsghdr*>(out.data())->nlmsg_len = uint32_t(out.size());
}

void add_address(std::vector<uint8_t>& out, uint16_t type, const transport::IpAddress& ip) {
  auto b = address_bytes(ip);
  add_attr(out, type, b.data(), b.size());
}

// Walks the messages of `msg` for the answer to `seq`: an NLMSG_ERROR's errno,
// or `on_answer(header)` for a message of type `type` (its result). EAGAIN if
// there is no answer to `seq`.
template <typename OnAnswer>
int find_answer(std::span<const uint8_t> msg, uint32_t seq, uint16_t type, OnAnswer on_answer) {
  size_t off = 0;
  while (msg.size() - off >= sizeof(nlmsghdr)) {
    nlmsghdr h;
    std::memcpy(&h, msg.data() + off, sizeof h);
    if (h.nlmsg_len < sizeof h || h.nlmsg_len > msg.size() - off) return EBADMSG;
    std::span<const uint8_t> body = msg.subspan(off + NLMSG_HDRLEN, h.nlmsg_len - NLMSG_HDRLEN);
    if (h.nlmsg_seq == seq) {
      if (h.nlmsg_type == NLMSG_ERROR) {
        nlmsgerr e;
        if (body.size() < sizeof e) return EBADMSG;
        std::memcpy(&e, body.data(), sizeof e);
        return e.error ? -e.error : EBADMSG;  // 0 would be an ACK, which a GET never asks for
      }
      if (h.nlmsg_type == type) return on_answer(body);
    }
    off += NLMSG_ALIGN(h.nlmsg_len);
  }
  return EAGAIN;
}

// Calls `on_attr(type, payload, len)` for each rtattr of `attrs`; false if one is malformed.
template <typename OnAttr>
bool for_each_attr(std::span<const uint8_t> attrs, OnAttr on_attr) {
  size_t off = 0;
  while (attrs.size() - off >= sizeof(rtattr)) {
    rtattr a;
    std::memcpy(&a, attrs.data() + off, sizeof a);
    if (a.rta_len < sizeof a || a.rta_len > attrs.size() - off) return false;
    on_attr(a.rta_type, attrs.data() + off + RTA_LENGTH(0), size_t(a.rta_len - RTA_LENGTH(0)));
    off += RTA_ALIGN(a.rta_len);
  }
  return true;
}

}  // namespace

NeighState classify_nud(uint16_t nud_state) {
  // The kernel's NUD_VALID (include/net/neighbour.h), not exported to userspace.
  constexpr uint16_t kValid = NUD_PERMANENT | NUD_NOARP | NUD_REACHABLE | NUD_PROBE | NUD_STALE | NUD_DELAY;
  if (nud_state & kValid) return NeighState::kValid;
  if (nud_state & NUD_INCOMPLETE) return NeighState::kIncomplete;
  if (nud_state & NUD_FAILED) return NeighState::kFailed;
  return NeighState::kNone;
}

bool needs_no_neighbour(unsigned if_flags) { return (if_flags & (IFF_LOOPBACK | IFF_NOARP)) != 0; }

void build_route_request(std::vector<uint8_t>& out, uint32_t seq, const transport::IpAddress& dst,
                         const transport::IpAddress& src) {
  auto* r = begin_request<rtmsg>(out, RTM_GETROUTE, seq);
  r->rtm_family = uint8_t(family_of(dst));
  r->rtm_dst_len = dst.is_v4() ? 32 : 128;
  if (!src.unspecified()) r->rtm_src_len = r->rtm_dst_len;
  // (Adding attributes may move `out`: r is not used after this.)
  add_address(out, RTA_DST, dst);
  if (!src.unspecified()) add_address(out, RTA_SRC, src);
  // A link-local destination is only meaningful on its interface.
  if (dst.link_local() && dst.scope) {
    const uint32_t oif = dst.scope;
    add_attr(out, RTA_OIF, &oif, sizeof oif);
  }
}

void build_neigh_request(std::vector<uint8_t>& out, uint32_t seq, const transport::IpAddress& addr, int ifindex) {
  auto* n = begin_request<ndmsg>(out, RTM_GETNEIGH, seq);
  n->ndm_family = uint8_t(family_of(addr));
  n->ndm_ifindex = ifindex;
  add_address(out, NDA_DST, addr);
}

void build_link_request(std::vector<uint8_t>& out, uint32_t seq, int ifindex) {
  auto* i = begin_request<ifinfomsg>(out, RTM_GETLINK, seq);
  i->ifi_family = AF_UNSPEC;
  i->ifi_index = ifindex;
}

int parse_route_reply(std::span<const uint8_t> msg, uint32_t seq, NextHop* out) {
  return find_answer(msg, seq, RTM_NEWROUTE, [out](std::span<const uint8_t> body) {
    rtmsg r;
    if (body.size() < sizeof r) return EBADMSG;
    std::memcpy(&r, body.data(), sizeof r);
    NextHop hop;
    hop.local = r.rtm_type == RTN_LOCAL;
    bool have_dst = false;
    bool ok = for_each_attr(body.subspan(NLMSG_ALIGN(sizeof r)), [&](uint16_t type, const uint8_t* p, size_t len) {
      if (type == RTA_OIF && len == sizeof(uint32_t)) {
        uint32_t oif;
        std::memcpy(&oif, p, sizeof oif);
        hop.ifindex = int(oif);
      } else if (type == RTA_DST && !hop.via_gateway) {
        have_dst = address_from(r.rtm_family, p, len, &hop.hop);
      } else if (type == RTA_GATEWAY) {
        hop.via_gateway = address_from(r.rtm_family, p, len, &hop.hop) || hop.via_gateway;
      } else if (type == RTA_VIA && len >= sizeof(rtvia)) {
        // An IPv4 route through an IPv6 next hop (RFC 5549): its neighbour is an NDP one.
        rtvia v;
        std::memcpy(&v, p, sizeof v);
        hop.via_gateway = address_from(v.rtvia_family, p + sizeof v, len - sizeof v, &hop.hop) || hop.via_gateway;
      }
    });
    if (!ok) return EBADMSG;
    // A route that leads nowhere (unreachable, prohibit, blackhole) comes back as an
    // NLMSG_ERROR from IPv4 but as a route of that type from IPv6.
    if (r.rtm_type == RTN_UNREACHABLE || r.rtm_type == RTN_BLACKHOLE) return ENETUNREACH;
    if (r.rtm_type == RTN_PROHIBIT) return EACCES;
    if (!hop.local && (!hop.ifindex || (!hop.via_gateway && !have_dst))) return EBADMSG;
    *out = hop;
    return 0;
  });
}

int parse_neigh_reply(std::span<const uint8_t> msg, uint32_t seq, NeighState* out) {
  int err = find_answer(msg, seq, RTM_NEWNEIGH, [out](std::span<const uint8_t> body) {
    ndmsg n;
    if (body.size() < sizeof n) return EBADMSG;
    std::memcpy(&n, body.data(), sizeof n);
    *out = classify_nud(n.ndm_state);
    return 0;
  });
  // No entry (the kernel's neigh_get: -ENOENT): resolution has not started.
  if (err == ENOENT) {
    *out = NeighState::kNone;
    return 0;
  }
  return err;
}

int parse_link_reply(std::span<const uint8_t> msg, uint32_t seq, unsigned* if_flags) {
  return find_answer(msg, seq, RTM_NEWLINK, [if_flags](std::span<const uint8_t> body) {
    ifinfomsg i;
    if (body.size() < sizeof i) return EBADMSG;
    std::memcpy(&i, body.data(), sizeof i);
    *if_flags = i.ifi_flags;
    return 0;
  });
}

// ---- the socket ----

RouteNetlink::~RouteNetlink() {
  if (fd_ >= 0) close(fd_);
}

int RouteNetlink::open() {
  if (fd_ >= 0) return 0;
  fd_ = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd_ < 0) return errno;
  request_.reserve(128);
  reply_.resize(kReplyBytes);
  return 0;
}

template <typename Parse>
int RouteNetlink::query(Parse parse) {
  if (int err = open()) return err;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(fd_, request_.data(), request_.size(), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0)
    return errno;
  // The kernel has answered by the time sendto returns (rtnetlink handles a
  // request in the sender's context), so a non-blocking receive finds it;
  // older answers (of a query whose receive failed) are skipped by their seq.
  for (;;) {
    ssize_t n = recv(fd_, reply_.data(), reply_.size(), MSG_DONTWAIT);
    if (n < 0) return errno == EINTR ? EAGAIN : errno;
    int err = parse(std::span<const uint8_t>(reply_.data(), size_t(n)));
    if (err != EAGAIN) return err;
  }
}

int RouteNetlink::route(const transport::IpAddress& dst, const transport::IpAddress& src, NextHop* out) {
  const uint32_t seq = ++seq_;
  build_route_request(request_, seq, dst, src);
  return query([&](std::span<const uint8_t> m) { return parse_route_reply(m, seq, out); });
}

int RouteNetlink::link_flags(int ifindex, unsigned* flags) {
  const uint32_t seq = ++seq_;
  build_link_request(request_, seq, ifindex);
  return query([&](std::span<const uint8_t> m) { return parse_link_reply(m, seq, flags); });
}

int RouteNetlink::neigh_state(const transport::IpAddress& addr, int ifindex, NeighState* out) {
  const uint32_t seq = ++seq_;
  build_neigh_request(request_, seq, addr, ifindex);
  return query([&](std::span<const uint8_t> m) { return parse_neigh_reply(m, seq, out); });
}

int trigger_resolution(const transport::IpAddress& dst, const transport::IpAddress& src) {
  int fd = socket(family_of(dst), SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  int err = 0;
  if (!src.unspecified()) {
    SockAddr s = make_sockaddr(src, 0);
    if (::bind(fd, &s.sa, s.len()) != 0) err = errno;
  }
  SockAddr d = make_sockaddr(dst, kDiscardPort);
  // The datagram waits on the unresolved neighbour (and goes out once it is
  // resolved) even after the socket is closed.
  if (!err && sendto(fd, nullptr, 0, 0, &d.sa, d.len()) < 0) err = errno;
  close(fd);
  return err;
}

}  // namespace uroce::rdmacm::neighbour
