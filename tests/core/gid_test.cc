// The GID table (IPv4-mapped GIDs first, then the host's IPv6 addresses), the
// address checks of AHs and QP address vectors, and the GRH area of a UD
// receive over IPv6 that ibv_init_ah_from_wc reads back.
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <array>
#include <cstring>
#include <memory>

#include "core/ah.h"
#include "core/context.h"
#include "core/device.h"
#include "core/limits.h"

namespace uroce::core {
namespace {

ibv_gid gid6(std::initializer_list<uint8_t> head, uint8_t last) {
  ibv_gid g{};
  size_t i = 0;
  for (uint8_t b : head) g.raw[i++] = b;
  g.raw[15] = last;
  return g;
}

const ibv_gid kLoopback6 = gid6({}, 1);

// An address's 16 bytes are its GID: IPv4-mapped ones as ipv4_to_gid makes
// them, IPv6 ones unchanged (the engine's and the CM's one conversion).
TEST(IpToGid, SameBytes) {
  const std::array<uint8_t, 16> v4{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 1, 2, 3};
  const ibv_gid g4 = ip_to_gid(v4), want4 = ipv4_to_gid(0x0A010203);
  EXPECT_EQ(std::memcmp(g4.raw, want4.raw, 16), 0);
  std::array<uint8_t, 16> v6;
  std::memcpy(v6.data(), kLoopback6.raw, 16);
  const ibv_gid g6 = ip_to_gid(v6);
  EXPECT_EQ(std::memcmp(g6.raw, kLoopback6.raw, 16), 0);
}

class GidTest : public ::testing::Test {
 protected:
  void SetUp() override { ctx = std::make_unique<Context>(devices()[0]); }
  // Index of the first IPv6 GID, or -1.
  int first_ipv6() const {
    for (size_t i = 0; i < ctx->gid_count(); ++i)
      if (ctx->addresses()[i].ipv6) return int(i);
    return -1;
  }
  std::unique_ptr<Context> ctx;
};

// Expect IPv4 GIDs first (index 0 is an IPv4-mapped one, as every test and
// README example relies on), then IPv6 ones, each ibv_query_gid equal to its
// address, IPv6 loopback (::1) after the routable IPv6 addresses, and a
// link-local one scoped to its interface.
TEST_F(GidTest, TableOrder) {
  ASSERT_GE(ctx->gid_count(), 1u);
  uint32_t ip;
  ibv_gid g;
  ASSERT_EQ(ctx->query_gid(1, 0, &g), 0);
  EXPECT_TRUE(gid_to_ipv4(g, &ip));
  bool seen_v6 = false, seen_v6_loopback = false;
  for (size_t i = 0; i < ctx->gid_count(); ++i) {
    const HostAddress& a = ctx->addresses()[i];
    ASSERT_EQ(ctx->query_gid(1, int(i), &g), 0);
    EXPECT_EQ(std::memcmp(g.raw, a.gid.raw, 16), 0) << i;
    EXPECT_EQ(a.ipv6, !gid_to_ipv4(g, &ip)) << i;
    if (a.ipv6) {
      seen_v6 = true;
      EXPECT_EQ(ctx->gid_ip(unsigned(i), &ip), false) << i;
      EXPECT_FALSE(seen_v6_loopback && !a.loopback) << "routable IPv6 GID " << i << " after ::1";
      seen_v6_loopback |= a.loopback;
      EXPECT_EQ(a.scope(), gid_is_link_local(a.gid) ? a.ifindex : 0u) << i;
      if (gid_is_link_local(a.gid)) {
        EXPECT_NE(a.ifindex, 0u) << i;
      }
    } else {
      EXPECT_FALSE(seen_v6) << "IPv4 GID " << i << " after an IPv6 one";
      EXPECT_TRUE(ctx->is_host_address(a.gid)) << i;
    }
  }
  EXPECT_TRUE(ctx->is_host_address(kLoopback6));
  EXPECT_FALSE(ctx->is_host_address(gid6({0x20, 0x01, 0x0d, 0xb8}, 9)));  // documentation prefix
}

// Expect a table of kGidTableLen slots, as a NIC's: the addresses first, then empty slots
// (ENODATA), then nothing (EINVAL). rdma-core's test_query_gid_ex_bad_flow needs an empty
// slot below gid_tbl_len.
TEST_F(GidTest, EmptySlotsAfterTheAddresses) {
  ibv_port_attr pa;
  ASSERT_EQ(ctx->query_port(1, &pa), 0);
  ASSERT_LT(ctx->gid_count(), size_t(kGidTableLen)) << "more addresses than slots";
  EXPECT_EQ(pa.gid_tbl_len, int(kGidTableLen));
  ibv_gid g;
  EXPECT_EQ(ctx->query_gid(1, int(ctx->gid_count()) - 1, &g), 0);
  EXPECT_EQ(ctx->query_gid(1, int(ctx->gid_count()), &g), ENODATA);
  EXPECT_EQ(ctx->query_gid(1, pa.gid_tbl_len - 1, &g), ENODATA);
  EXPECT_EQ(ctx->query_gid(1, pa.gid_tbl_len, &g), EINVAL);
  EXPECT_EQ(ctx->query_gid(1, -1, &g), EINVAL);
  EXPECT_EQ(ctx->query_gid(2, 0, &g), EINVAL);
}

// Expect an address vector's GIDs to be IP addresses of one version: IPv4 ->
// IPv4 (an IPv4 multicast group too) and IPv6 -> unicast IPv6 pass; mixed
// versions, :: and IPv6 multicast do not.
TEST_F(GidTest, PairsOfOneIpVersion) {
  EXPECT_TRUE(gid_pair_valid(*ctx, 0, ipv4_to_gid(0x7F000001)));
  EXPECT_TRUE(gid_pair_valid(*ctx, 0, ipv4_to_gid(0xE0000001)));
  EXPECT_FALSE(gid_pair_valid(*ctx, 0, kLoopback6));
  EXPECT_FALSE(gid_pair_valid(*ctx, uint8_t(ctx->gid_count()), ipv4_to_gid(0x7F000001)));
  int v6 = first_ipv6();
  if (v6 < 0) GTEST_SKIP() << "no IPv6 address on this host";
  EXPECT_TRUE(gid_pair_valid(*ctx, uint8_t(v6), kLoopback6));
  EXPECT_TRUE(gid_pair_valid(*ctx, uint8_t(v6), gid6({0xFE, 0x80}, 7)));
  EXPECT_FALSE(gid_pair_valid(*ctx, uint8_t(v6), ipv4_to_gid(0x7F000001)));
  EXPECT_FALSE(gid_pair_valid(*ctx, uint8_t(v6), ibv_gid{}));
  EXPECT_FALSE(gid_pair_valid(*ctx, uint8_t(v6), gid6({0xFF, 0x02}, 1)));

  ibv_ah_attr attr{};
  attr.port_num = 1;
  attr.is_global = 1;
  attr.grh.sgid_index = uint8_t(v6);
  attr.grh.dgid = kLoopback6;
  attr.dlid = 0;
  Ah ah;
  EXPECT_EQ(resolve_ah(*ctx, attr, &ah), 0);
  EXPECT_EQ(ah.dst_port, roce_udp_port(0));
  attr.grh.dgid = ipv4_to_gid(0x7F000001);
  EXPECT_EQ(resolve_ah(*ctx, attr, &ah), EINVAL);
}

// A UD receive over IPv6 / Expect the GRH area to hold the 40-byte IPv6
// header (version 6, payload length, UDP, the addresses) and
// ibv_init_ah_from_wc's attributes to answer the sender from the GID the
// packet was addressed to, with its traffic class and flow label.
TEST_F(GidTest, Ipv6GrhAnswersTheSender) {
  int v6 = first_ipv6();
  if (v6 < 0) GTEST_SKIP() << "no IPv6 address on this host";
  const ibv_gid local = ctx->addresses()[size_t(v6)].gid;
  const ibv_gid peer = gid6({0xFD, 0x10}, 2);
  uint8_t grh[kGrhSize];
  build_ipv6_grh(peer.raw, local.raw, 100, grh);
  EXPECT_EQ(grh[0], 0x60);
  EXPECT_EQ(grh[4] << 8 | grh[5], 108);
  EXPECT_EQ(grh[6], IPPROTO_UDP);
  EXPECT_EQ(std::memcmp(grh + 8, peer.raw, 16), 0);
  EXPECT_EQ(std::memcmp(grh + 24, local.raw, 16), 0);

  grh[0] = 0x6A;  // traffic class 0xA5, flow label 0x12345
  grh[1] = 0x51;
  grh[2] = 0x23;
  grh[3] = 0x45;
  ibv_wc wc{};
  wc.wc_flags = IBV_WC_GRH;
  wc.slid = 5000;
  wc.sl = 0x9;
  ibv_ah_attr attr{};
  ASSERT_EQ(ah_attr_from_wc(*ctx, 1, wc, reinterpret_cast<const ibv_grh*>(grh), &attr), 0);
  EXPECT_EQ(attr.is_global, 1);
  EXPECT_EQ(std::memcmp(attr.grh.dgid.raw, peer.raw, 16), 0);
  EXPECT_EQ(attr.grh.sgid_index, v6);
  EXPECT_EQ(attr.grh.traffic_class, 0xA5);
  EXPECT_EQ(attr.grh.flow_label, 0x12345u);
  EXPECT_EQ(attr.dlid, 5000);
  EXPECT_EQ(attr.sl, 0x9);

  // Addressed to none of our GIDs: EINVAL, as for IPv4.
  build_ipv6_grh(local.raw, peer.raw, 100, grh);
  EXPECT_EQ(ah_attr_from_wc(*ctx, 1, wc, reinterpret_cast<const ibv_grh*>(grh), &attr), EINVAL);
}

// The IPv4 GRH area still reads back as before (20 zero bytes, then IPv4).
TEST_F(GidTest, Ipv4GrhAnswersTheSender) {
  uint32_t local;
  ASSERT_TRUE(ctx->gid_ip(0, &local));
  uint8_t grh[kGrhSize];
  build_ipv4_grh(0x0A000009, local, 64, grh);
  ibv_wc wc{};
  wc.wc_flags = IBV_WC_GRH;
  ibv_ah_attr attr{};
  ASSERT_EQ(ah_attr_from_wc(*ctx, 1, wc, reinterpret_cast<const ibv_grh*>(grh), &attr), 0);
  uint32_t ip;
  ASSERT_TRUE(gid_to_ipv4(attr.grh.dgid, &ip));
  EXPECT_EQ(ip, 0x0A000009u);
  EXPECT_EQ(attr.grh.sgid_index, 0);
}

}  // namespace
}  // namespace uroce::core
