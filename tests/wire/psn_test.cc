// 24-bit PSN arithmetic (roce-facts.md §4.1): increments mod 2^24, ordering by
// the sign of ((a - b) << 8), valid window ±2^23.
#include "wire/psn.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace uroce::wire {
namespace {

TEST(Psn, AddWrapsAt24Bits) {
  EXPECT_EQ(psn_add(0, 1), 1u);
  EXPECT_EQ(psn_add(0xFFFFFF, 1), 0u);
  EXPECT_EQ(psn_add(0xFFFFFE, 5), 3u);
  EXPECT_EQ(psn_add(0x123456, 0xFFFFFF),
            0x123455u);  // adding 2^24-1 is subtracting 1
  EXPECT_EQ(psn_add(0x800000, 0x800000), 0u);
  EXPECT_EQ(kPsnMask, 0xFFFFFFu);
}

TEST(Psn, DiffAcrossTheWrap) {
  EXPECT_EQ(psn_diff(5, 5), 0);
  EXPECT_EQ(psn_diff(6, 5), 1);
  EXPECT_EQ(psn_diff(5, 6), -1);
  // 0 comes right after 0xFFFFFF.
  EXPECT_EQ(psn_diff(0, 0xFFFFFF), 1);
  EXPECT_EQ(psn_diff(0xFFFFFF, 0), -1);
  EXPECT_EQ(psn_diff(2, 0xFFFFFE), 4);
  EXPECT_EQ(psn_diff(0xFFFFFE, 2), -4);
  EXPECT_TRUE(psn_after(0, 0xFFFFFF));
  EXPECT_TRUE(psn_before(0xFFFFFF, 0));
  EXPECT_FALSE(psn_before(7, 7));
  EXPECT_FALSE(psn_after(7, 7));
}

TEST(Psn, Window2To23) {
  for (uint32_t base : {0u, 1u, 0x7FFFFFu, 0x800000u, 0xFFFFFFu, 0xABCDEFu}) {
    SCOPED_TRACE(base);
    // Up to 2^23 - 1 ahead is "after", up to 2^23 behind is "before".
    EXPECT_EQ(psn_diff(psn_add(base, 0x7FFFFF), base), 0x7FFFFF);
    EXPECT_TRUE(psn_after(psn_add(base, 0x7FFFFF), base));
    EXPECT_EQ(psn_diff(base, psn_add(base, 0x7FFFFF)), -0x7FFFFF);
    // Exactly 2^23 apart: the sign bit of the 24-bit difference is set.
    EXPECT_EQ(psn_diff(psn_add(base, 0x800000), base), -0x800000);
    // Beyond 2^23 ahead reads as behind.
    EXPECT_TRUE(psn_before(psn_add(base, 0x800001), base));
    EXPECT_EQ(psn_diff(psn_add(base, 0x800001), base), -0x7FFFFF);
  }
}

TEST(Psn, IgnoresBitsAbove24) {
  EXPECT_EQ(psn_diff(0x01000005, 5), 0);
  EXPECT_EQ(psn_diff(0xFF000006, 5), 1);
}

static_assert(psn_diff(0, 0xFFFFFF) == 1, "constexpr");
static_assert(psn_add(0xFFFFFF, 2) == 1, "constexpr");

// Expect: a message takes ceil(length / MTU) PSNs, a zero-length one takes one.
TEST(Psn, PacketsForAMessage) {
  EXPECT_EQ(packets_for(0, 1024), 1u);
  EXPECT_EQ(packets_for(1, 1024), 1u);
  EXPECT_EQ(packets_for(1024, 1024), 1u);
  EXPECT_EQ(packets_for(1025, 1024), 2u);
  EXPECT_EQ(packets_for(4097, 1024), 5u);
  EXPECT_EQ(packets_for(1u << 31, 4096), 1u << 19);
}

}  // namespace
}  // namespace uroce::wire
