// Address resolution over QP1 (rdmacm/neighbour.h): the rtnetlink requests it
// sends and its reading of the kernel's answers, with crafted messages (the
// layouts of <linux/rtnetlink.h>, as `ip route get` / `ip neigh get` see them).
#include "rdmacm/neighbour.h"

#include <gtest/gtest.h>
#include <linux/neighbour.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstring>
#include <vector>

namespace uroce::rdmacm::neighbour {
namespace {

transport::IpAddress v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return transport::IpAddress(uint32_t(a) << 24 | uint32_t(b) << 16 | uint32_t(c) << 8 | d);
}

transport::IpAddress v6(std::initializer_list<uint8_t> bytes, uint32_t scope = 0) {
  uint8_t b[16] = {};
  size_t i = 0;
  for (uint8_t x : bytes) b[i++] = x;
  return transport::IpAddress::from_bytes(b, scope);
}

const transport::IpAddress kFe80_1 = v6({0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 7);

// A kernel answer under construction: a netlink header, the family header, attributes.
class Message {
 public:
  template <typename Body>
  Message(uint16_t type, uint32_t seq, const Body& body) {
    bytes_.resize(NLMSG_HDRLEN);
    append(&body, sizeof body);
    header()->nlmsg_type = type;
    header()->nlmsg_seq = seq;
    header()->nlmsg_len = uint32_t(bytes_.size());
  }
  Message& attr(uint16_t type, const void* data, size_t len) {
    rtattr a{};
    a.rta_len = uint16_t(RTA_LENGTH(len));
    a.rta_type = type;
    append(&a, sizeof a);
    append(data, len);
    header()->nlmsg_len = uint32_t(bytes_.size());
    return *this;
  }
  Message& u32(uint16_t type, uint32_t v) { return attr(type, &v, sizeof v); }
  Message& address(uint16_t type, const transport::IpAddress& ip) {
    return ip.is_v4() ? attr(type, ip.bytes.data() + 12, 4) : attr(type, ip.bytes.data(), 16);
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  nlmsghdr* header() { return reinterpret_cast<nlmsghdr*>(bytes_.data()); }
  void append(const void* p, size_t len) {
    const size_t at = bytes_.size();
    bytes_.resize(NLMSG_ALIGN(at + len));
    std::memcpy(bytes_.data() + at, p, len);
  }
  std::vector<uint8_t> bytes_;
};

rtmsg route_body(int family, uint8_t type) {
  rtmsg r{};
  r.rtm_family = uint8_t(family);
  r.rtm_dst_len = family == AF_INET ? 32 : 128;
  r.rtm_type = type;
  return r;
}

Message error_answer(uint32_t seq, int err) {
  nlmsgerr e{};
  e.error = -err;
  return Message(NLMSG_ERROR, seq, e);
}

Message neigh_answer(uint32_t seq, uint16_t nud) {
  ndmsg n{};
  n.ndm_family = AF_INET;
  n.ndm_ifindex = 4;
  n.ndm_state = nud;
  return Message(RTM_NEWNEIGH, seq, n);
}

// The attributes of a request, by type (payload bytes).
std::vector<std::pair<uint16_t, std::vector<uint8_t>>> attrs_of(const std::vector<uint8_t>& req, size_t body) {
  std::vector<std::pair<uint16_t, std::vector<uint8_t>>> out;
  size_t off = NLMSG_HDRLEN + NLMSG_ALIGN(body);
  while (off + sizeof(rtattr) <= req.size()) {
    rtattr a;
    std::memcpy(&a, req.data() + off, sizeof a);
    const uint8_t* p = req.data() + off + RTA_LENGTH(0);
    out.emplace_back(a.rta_type, std::vector<uint8_t>(p, p + a.rta_len - RTA_LENGTH(0)));
    off += RTA_ALIGN(a.rta_len);
  }
  return out;
}

TEST(NeighbourRequests, RouteOfAnIpv4Destination) {
  std::vector<uint8_t> req;
  build_route_request(req, 41, v4(198, 51, 100, 77), transport::IpAddress{});
  nlmsghdr h;
  std::memcpy(&h, req.data(), sizeof h);
  EXPECT_EQ(h.nlmsg_type, RTM_GETROUTE);
  EXPECT_EQ(h.nlmsg_flags, NLM_F_REQUEST);
  EXPECT_EQ(h.nlmsg_seq, 41u);
  EXPECT_EQ(h.nlmsg_len, req.size());
  rtmsg r;
  std::memcpy(&r, req.data() + NLMSG_HDRLEN, sizeof r);
  EXPECT_EQ(r.rtm_family, AF_INET);
  EXPECT_EQ(r.rtm_dst_len, 32);
  EXPECT_EQ(r.rtm_src_len, 0);
  auto attrs = attrs_of(req, sizeof r);
  ASSERT_EQ(attrs.size(), 1u);  // no source, no interface
  EXPECT_EQ(attrs[0].first, RTA_DST);
  EXPECT_EQ(attrs[0].second, (std::vector<uint8_t>{198, 51, 100, 77}));
}

TEST(NeighbourRequests, RouteOfALinkLocalDestinationNamesItsInterface) {
  std::vector<uint8_t> req;
  const auto src = v6({0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}, 7);
  build_route_request(req, 1, kFe80_1, src);
  rtmsg r;
  std::memcpy(&r, req.data() + NLMSG_HDRLEN, sizeof r);
  EXPECT_EQ(r.rtm_family, AF_INET6);
  EXPECT_EQ(r.rtm_dst_len, 128);
  EXPECT_EQ(r.rtm_src_len, 128);
  auto attrs = attrs_of(req, sizeof r);
  ASSERT_EQ(attrs.size(), 3u);
  EXPECT_EQ(attrs[0].first, RTA_DST);
  EXPECT_EQ(attrs[0].second.size(), 16u);
  EXPECT_EQ(attrs[1].first, RTA_SRC);
  EXPECT_EQ(attrs[2].first, RTA_OIF);
  uint32_t oif;
  std::memcpy(&oif, attrs[2].second.data(), 4);
  EXPECT_EQ(oif, 7u);
}

TEST(NeighbourRequests, NeighbourOnItsInterface) {
  std::vector<uint8_t> req;
  build_neigh_request(req, 9, v4(192, 0, 2, 1), 4);
  ndmsg n;
  std::memcpy(&n, req.data() + NLMSG_HDRLEN, sizeof n);
  EXPECT_EQ(reinterpret_cast<nlmsghdr*>(req.data())->nlmsg_type, RTM_GETNEIGH);
  EXPECT_EQ(n.ndm_family, AF_INET);
  EXPECT_EQ(n.ndm_ifindex, 4);
  EXPECT_EQ(n.ndm_state, 0);  // the kernel's neigh_get refuses anything else in the header
  auto attrs = attrs_of(req, sizeof n);
  ASSERT_EQ(attrs.size(), 1u);
  EXPECT_EQ(attrs[0].first, NDA_DST);
  EXPECT_EQ(attrs[0].second, (std::vector<uint8_t>{192, 0, 2, 1}));
}

TEST(NeighbourRoute, ThroughAGatewayTheGatewayIsTheHop) {
  Message m(RTM_NEWROUTE, 5, route_body(AF_INET, RTN_UNICAST));
  m.u32(RTA_TABLE, RT_TABLE_MAIN).address(RTA_DST, v4(198, 51, 100, 77)).u32(RTA_OIF, 4);
  m.address(RTA_PREFSRC, v4(192, 0, 2, 2)).address(RTA_GATEWAY, v4(192, 0, 2, 1));
  NextHop hop;
  ASSERT_EQ(parse_route_reply(m.bytes(), 5, &hop), 0);
  EXPECT_FALSE(hop.local);
  EXPECT_TRUE(hop.via_gateway);
  EXPECT_EQ(hop.ifindex, 4);
  EXPECT_EQ(hop.hop, v4(192, 0, 2, 1));
}

TEST(NeighbourRoute, OnLinkTheDestinationIsTheHop) {
  Message m(RTM_NEWROUTE, 5, route_body(AF_INET6, RTN_UNICAST));
  m.address(RTA_DST, kFe80_1).u32(RTA_OIF, 7);
  NextHop hop;
  ASSERT_EQ(parse_route_reply(m.bytes(), 5, &hop), 0);
  EXPECT_FALSE(hop.via_gateway);
  EXPECT_EQ(hop.ifindex, 7);
  EXPECT_EQ(hop.hop.bytes, kFe80_1.bytes);
}

TEST(NeighbourRoute, AnIpv4RouteThroughAnIpv6NextHop) {
  Message m(RTM_NEWROUTE, 5, route_body(AF_INET, RTN_UNICAST));
  uint8_t via[2 + 16] = {};
  const uint16_t family = AF_INET6;
  std::memcpy(via, &family, 2);
  std::memcpy(via + 2, kFe80_1.bytes.data(), 16);
  m.address(RTA_DST, v4(198, 51, 100, 77)).u32(RTA_OIF, 4).attr(RTA_VIA, via, sizeof via);
  NextHop hop;
  ASSERT_EQ(parse_route_reply(m.bytes(), 5, &hop), 0);
  EXPECT_TRUE(hop.via_gateway);
  EXPECT_FALSE(hop.hop.is_v4());
  EXPECT_EQ(hop.hop.bytes, kFe80_1.bytes);
}

TEST(NeighbourRoute, OwnAddressIsLocal) {
  Message m(RTM_NEWROUTE, 2, route_body(AF_INET, RTN_LOCAL));
  m.address(RTA_DST, v4(192, 0, 2, 2)).u32(RTA_OIF, 1);
  NextHop hop;
  ASSERT_EQ(parse_route_reply(m.bytes(), 2, &hop), 0);
  EXPECT_TRUE(hop.local);
}

TEST(NeighbourRoute, ErrorsAndRoutesToNowhere) {
  NextHop hop;
  EXPECT_EQ(parse_route_reply(error_answer(3, ENETUNREACH).bytes(), 3, &hop), ENETUNREACH);
  // IPv6 answers with a route of type unreachable instead.
  Message unreachable(RTM_NEWROUTE, 3, route_body(AF_INET6, RTN_UNREACHABLE));
  unreachable.u32(RTA_OIF, 1);
  EXPECT_EQ(parse_route_reply(unreachable.bytes(), 3, &hop), ENETUNREACH);
  Message prohibit(RTM_NEWROUTE, 3, route_body(AF_INET, RTN_PROHIBIT));
  EXPECT_EQ(parse_route_reply(prohibit.bytes(), 3, &hop), EACCES);
}

TEST(NeighbourRoute, AnotherQuerysAnswerIsSkipped) {
  Message stale(RTM_NEWROUTE, 4, route_body(AF_INET, RTN_LOCAL));
  NextHop hop;
  EXPECT_EQ(parse_route_reply(stale.bytes(), 5, &hop), EAGAIN);
  // Two answers in one read: the second is ours.
  Message ours(RTM_NEWROUTE, 5, route_body(AF_INET, RTN_UNICAST));
  ours.address(RTA_DST, v4(10, 0, 0, 9)).u32(RTA_OIF, 3);
  std::vector<uint8_t> both = stale.bytes();
  both.insert(both.end(), ours.bytes().begin(), ours.bytes().end());
  ASSERT_EQ(parse_route_reply(both, 5, &hop), 0);
  EXPECT_EQ(hop.hop, v4(10, 0, 0, 9));
}

TEST(NeighbourRoute, MalformedAnswers) {
  NextHop hop;
  Message m(RTM_NEWROUTE, 5, route_body(AF_INET, RTN_UNICAST));
  m.address(RTA_DST, v4(10, 0, 0, 9)).u32(RTA_OIF, 3);
  std::vector<uint8_t> cut = m.bytes();
  cut.resize(cut.size() - 2);  // the header's length now overruns the read
  EXPECT_EQ(parse_route_reply(cut, 5, &hop), EBADMSG);
  // An attribute whose length overruns the message.
  std::vector<uint8_t> bad = m.bytes();
  bad[NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(rtmsg))] = 0xF0;
  EXPECT_EQ(parse_route_reply(bad, 5, &hop), EBADMSG);
  // A unicast route with no interface.
  Message no_oif(RTM_NEWROUTE, 5, route_body(AF_INET, RTN_UNICAST));
  no_oif.address(RTA_DST, v4(10, 0, 0, 9));
  EXPECT_EQ(parse_route_reply(no_oif.bytes(), 5, &hop), EBADMSG);
  EXPECT_EQ(parse_route_reply({}, 5, &hop), EAGAIN);
}

TEST(NeighbourState, ValidAsTheKernelsNudValid) {
  for (uint16_t nud : {NUD_REACHABLE, NUD_STALE, NUD_DELAY, NUD_PROBE, NUD_PERMANENT, NUD_NOARP}) {
    NeighState s = NeighState::kNone;
    ASSERT_EQ(parse_neigh_reply(neigh_answer(8, nud).bytes(), 8, &s), 0);
    EXPECT_EQ(s, NeighState::kValid) << "NUD " << nud;
  }
  NeighState s = NeighState::kValid;
  ASSERT_EQ(parse_neigh_reply(neigh_answer(8, NUD_INCOMPLETE).bytes(), 8, &s), 0);
  EXPECT_EQ(s, NeighState::kIncomplete);
  ASSERT_EQ(parse_neigh_reply(neigh_answer(8, NUD_FAILED).bytes(), 8, &s), 0);
  EXPECT_EQ(s, NeighState::kFailed);
  ASSERT_EQ(parse_neigh_reply(neigh_answer(8, NUD_NONE).bytes(), 8, &s), 0);
  EXPECT_EQ(s, NeighState::kNone);
}

TEST(NeighbourState, NoEntryIsNotStarted) {
  NeighState s = NeighState::kValid;
  ASSERT_EQ(parse_neigh_reply(error_answer(8, ENOENT).bytes(), 8, &s), 0);
  EXPECT_EQ(s, NeighState::kNone);
  // Any other error is the kernel's refusal (an old kernel: EINVAL).
  EXPECT_EQ(parse_neigh_reply(error_answer(8, EINVAL).bytes(), 8, &s), EINVAL);
}

TEST(NeighbourLink, LoopbackAndNoArpInterfacesNeedNoNeighbour) {
  ifinfomsg i{};
  i.ifi_index = 1;
  i.ifi_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
  unsigned flags = 0;
  ASSERT_EQ(parse_link_reply(Message(RTM_NEWLINK, 6, i).bytes(), 6, &flags), 0);
  EXPECT_TRUE(needs_no_neighbour(flags));
  EXPECT_TRUE(needs_no_neighbour(IFF_UP | IFF_NOARP | IFF_POINTOPOINT));                   // a tunnel
  EXPECT_FALSE(needs_no_neighbour(IFF_UP | IFF_BROADCAST | IFF_MULTICAST | IFF_RUNNING));  // Ethernet
}

}  // namespace
}  // namespace uroce::rdmacm::neighbour
