// The framing of a CM connection (rdmacm/mad_framer.h) and the rate limiting
// of what peers make the CM log (rdmacm/log_limiter.h). The fuzz target
// tests/fuzz/cm_framing_fuzz.cc checks the framer against arbitrary streams.
#include "rdmacm/mad_framer.h"

#include <gtest/gtest.h>

#include <vector>

#include "rdmacm/log_limiter.h"

namespace uroce::rdmacm {
namespace {

std::vector<uint8_t> stream_of(std::initializer_list<Mad> mads) {
  std::vector<uint8_t> s;
  for (const Mad& m : mads) s.insert(s.end(), m.begin(), m.end());
  return s;
}

Mad rtu(uint32_t id) {
  RtuMessage m;
  m.local_comm_id = id;
  return encode_mad(id, m);
}

uint32_t rtu_id(const DecodedMad& m) { return std::get<RtuMessage>(m.message).local_comm_id; }

TEST(MadFramer, ByteByByteGivesEveryMadOnce) {
  const auto s = stream_of({rtu(1), rtu(2), rtu(3)});
  MadFramer f;
  std::vector<DecodedMad> out;
  for (uint8_t b : s) {
    ASSERT_EQ(f.feed({&b, 1}, &out), MadFramer::Status::kOk);
    ASSERT_LT(f.buffered(), kMadSize);
  }
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(rtu_id(out[0]), 1u);
  EXPECT_EQ(rtu_id(out[2]), 3u);
  EXPECT_EQ(f.buffered(), 0u);
}

TEST(MadFramer, KeepsOnlyTheIncompleteMad) {
  const auto s = stream_of({rtu(1), rtu(2)});
  MadFramer f;
  std::vector<DecodedMad> out;
  EXPECT_EQ(f.feed(std::span(s).first(kMadSize + 100), &out), MadFramer::Status::kOk);
  EXPECT_EQ(out.size(), 1u);
  EXPECT_EQ(f.buffered(), 100u);
  EXPECT_EQ(f.feed(std::span(s).subspan(kMadSize + 100), &out), MadFramer::Status::kOk);
  EXPECT_EQ(out.size(), 2u);
  EXPECT_EQ(f.buffered(), 0u);
}

TEST(MadFramer, StopsForGoodAtAMalformedMad) {
  Mad junk = rtu(2);
  junk[1] = 0x81;  // not the CM's management class
  const auto s = stream_of({rtu(1), junk, rtu(3)});
  MadFramer f;
  std::vector<DecodedMad> out;
  EXPECT_EQ(f.feed(s, &out), MadFramer::Status::kMalformed);
  ASSERT_EQ(out.size(), 1u);  // what came before is kept
  EXPECT_EQ(rtu_id(out[0]), 1u);
  const auto more = stream_of({rtu(4)});
  EXPECT_EQ(f.feed(more, &out), MadFramer::Status::kMalformed);
  EXPECT_EQ(out.size(), 1u);
}

TEST(MadFramer, UnsupportedAttributeIsMalformed) {
  Mad mra = rtu(1);
  mra[17] = 0x11;  // MRA: uroce never sends it
  MadFramer f;
  std::vector<DecodedMad> out;
  EXPECT_EQ(f.feed(mra, &out), MadFramer::Status::kMalformed);
  EXPECT_TRUE(out.empty());
}

TEST(LogLimiter, BurstThenCountsWhatItDrops) {
  using Clock = LogLimiter::Clock;
  LogLimiter l;
  const Clock::time_point t0{std::chrono::seconds(100)};
  uint64_t dropped = 99;
  for (int i = 0; i < LogLimiter::kBurst; ++i) {
    ASSERT_TRUE(l.allow(t0, &dropped));
    EXPECT_EQ(dropped, 0u);
  }
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(l.allow(t0 + std::chrono::milliseconds(500), &dropped));
  ASSERT_TRUE(l.allow(t0 + LogLimiter::kWindow, &dropped));
  EXPECT_EQ(dropped, 1000u);  // reported with the first line of the next window
  ASSERT_TRUE(l.allow(t0 + LogLimiter::kWindow, &dropped));
  EXPECT_EQ(dropped, 0u);
}

}  // namespace
}  // namespace uroce::rdmacm
