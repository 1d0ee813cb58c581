// Which addresses the same-host paths treat as this host's.
#include "transport/local_addresses.h"

#include <gtest/gtest.h>

namespace uroce::transport {
namespace {

TEST(LocalAddresses, LoopbackIsLocalADocumentationAddressAndIpv6AreNot) {
  LocalAddresses local = LocalAddresses::snapshot();
  EXPECT_TRUE(local.contains(IpAddress(0x7F000001u)));   // 127.0.0.1
  EXPECT_TRUE(local.contains(IpAddress(0x7F050505u)));   // anywhere in 127/8
  EXPECT_FALSE(local.contains(IpAddress(0xCB007109u)));  // 203.0.113.9 (TEST-NET-3)
  uint8_t v6_loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  EXPECT_FALSE(local.contains(IpAddress::from_bytes(v6_loopback)));
}

TEST(LocalAddresses, AnEmptySnapshotStillHasLoopback) {
  LocalAddresses none;
  EXPECT_TRUE(none.contains(IpAddress(0x7F000001u)));
  EXPECT_FALSE(none.contains(IpAddress(0x0A000001u)));
}

}  // namespace
}  // namespace uroce::transport
