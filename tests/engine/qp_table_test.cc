// The QP table's numbering: QP numbers behind a host slot or of 24 bits,
// never 0 or 1, never drawn twice while reserved; XRC SRQ numbers.
#include "engine/qp_table.h"

#include <gtest/gtest.h>

#include <set>

namespace uroce::engine {
namespace {

TEST(QpTable, NumbersCarryTheSlotAndAreNeverDrawnTwiceWhileReserved) {
  QpTable table(nullptr);
  std::set<uint32_t> seen;
  for (int i = 0; i < 2000; ++i) {
    uint32_t n = table.allocate_num(5);
    EXPECT_EQ(n >> 16, 5u);
    EXPECT_TRUE(seen.insert(n).second) << "drawn twice: " << n;
  }
}

TEST(QpTable, WithoutASlotNumbersHave24BitsAndSkipQp0AndQp1) {
  QpTable table(nullptr);
  for (int i = 0; i < 2000; ++i) {
    uint32_t n = table.allocate_num(-1);
    EXPECT_LE(n, 0xFFFFFFu);
    EXPECT_GE(n, 2u);
  }
}

TEST(QpTable, XrcSrqNumbersNameThePortAndTheirIndex) {
  QpTable table(nullptr);
  int a = 0, b = 0;  // stand-ins: the table stores and returns the pointers only
  auto* srq_a = reinterpret_cast<core::Srq*>(&a);
  auto* srq_b = reinterpret_cast<core::Srq*>(&b);
  uint32_t na = table.register_xrc_srq(srq_a, 0x1234);
  uint32_t nb = table.register_xrc_srq(srq_b, 0x1234);
  EXPECT_EQ(na, 0x123400u);
  EXPECT_EQ(nb, 0x123401u);
  EXPECT_EQ(table.find_xrc_srq(na, 0x1234), srq_a);
  EXPECT_EQ(table.find_xrc_srq(nb, 0x1234), srq_b);
  EXPECT_EQ(table.find_xrc_srq(na, 0x1235), nullptr);  // another context's port
  table.unregister_xrc_srq(srq_a);
  EXPECT_EQ(table.find_xrc_srq(na, 0x1234), nullptr);
  EXPECT_EQ(table.register_xrc_srq(srq_a, 0x1234), na);  // the freed index is reused
}

TEST(QpTable, AnEmptyTableHasNoQpAndNoGroupMembers) {
  QpTable table(nullptr);
  EXPECT_EQ(table.mcast_members(transport::IpAddress(0xE0000101u)), nullptr);
  EXPECT_EQ(table.find(1234), nullptr);
}

}  // namespace
}  // namespace uroce::engine
