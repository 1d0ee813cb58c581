// The DREPs a process sent lately (rdmacm/recent_dreps.h): at exit, those of
// the last kKeepMs go once more, oldest first, to where they went.
#include "rdmacm/recent_dreps.h"

#include <gtest/gtest.h>

#include <vector>

namespace uroce::rdmacm {
namespace {

using Clock = RecentDreps::Clock;
using std::chrono::milliseconds;
const transport::IpAddress kLocal{0xC6336401u};  // 198.51.100.1
const transport::Endpoint kDrepPeer{transport::IpAddress{0xC6336402u}, 4791};

Mad drep(uint32_t local_comm_id) {
  DrepMessage d;
  d.local_comm_id = local_comm_id;
  d.remote_comm_id = 0x2D8AB069;
  return encode_mad(9, d);
}

std::vector<Mad> resent(RecentDreps& r, Clock::time_point now) {
  std::vector<Mad> out;
  r.resend(now, [&](const RecentDreps::Sent& s) {
    EXPECT_EQ(s.local_ip.bytes, kLocal.bytes);
    EXPECT_EQ(s.peer.port, kDrepPeer.port);
    out.push_back(s.mad);
  });
  return out;
}

TEST(RecentDreps, TheLastSecondsGoAgainOldestFirst) {
  RecentDreps r;
  const auto t0 = Clock::now();
  r.remember(kLocal, kDrepPeer, drep(1), t0);
  r.remember(kLocal, kDrepPeer, drep(2), t0 + milliseconds(100));
  EXPECT_EQ(resent(r, t0 + milliseconds(200)), (std::vector<Mad>{drep(1), drep(2)}));
}

TEST(RecentDreps, OlderThanTheKeepTimeIsForgotten) {
  RecentDreps r;
  const auto t0 = Clock::now();
  r.remember(kLocal, kDrepPeer, drep(1), t0);
  r.remember(kLocal, kDrepPeer, drep(2), t0 + milliseconds(1000));
  EXPECT_EQ(resent(r, t0 + milliseconds(RecentDreps::kKeepMs)), std::vector<Mad>{drep(2)});
  EXPECT_TRUE(resent(r, t0 + milliseconds(1000 + RecentDreps::kKeepMs)).empty());
  EXPECT_EQ(r.size(), 0u);
}

TEST(RecentDreps, BoundedTheOldestGoFirst) {
  RecentDreps r;
  const auto t0 = Clock::now();
  for (uint32_t i = 0; i < RecentDreps::kMax + 3; ++i) r.remember(kLocal, kDrepPeer, drep(i), t0);
  auto out = resent(r, t0);
  ASSERT_EQ(out.size(), RecentDreps::kMax);
  EXPECT_EQ(out.front(), drep(3));
}

}  // namespace
}  // namespace uroce::rdmacm
