// The passive side's memory of what it answered over QP1 (rdmacm/request_memory.h):
// a copy of a REQ that comes after its id was destroyed gets that answer again.
#include "rdmacm/request_memory.h"

#include <gtest/gtest.h>

namespace uroce::rdmacm {
namespace {

using Clock = RequestMemory::Clock;
constexpr uint32_t kPeerCommId = 0x02CF02A9;
const transport::IpAddress kPeer{0x7F000001u};

Mad consumer_rej() {
  RejMessage rej;
  rej.local_comm_id = 0x01BBDCD7;
  rej.remote_comm_id = kPeerCommId;
  rej.reason = uint16_t(RejReason::kConsumerDefined);
  return encode_mad(7, rej);
}

TEST(RequestMemory, ACopyOfARejectedRequestGetsTheRejAgain) {
  RequestMemory m;
  const auto t0 = Clock::now();
  m.remember(kPeerCommId, kPeer, consumer_rej(), t0);
  auto answer = m.find(kPeerCommId, kPeer, t0 + std::chrono::milliseconds(600));
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(*answer, consumer_rej());
}

TEST(RequestMemory, OnlyTheSamePeerAndCommunicationId) {
  RequestMemory m;
  const auto t0 = Clock::now();
  m.remember(kPeerCommId, kPeer, consumer_rej(), t0);
  EXPECT_FALSE(m.find(kPeerCommId + 1, kPeer, t0));
  EXPECT_FALSE(m.find(kPeerCommId, transport::IpAddress{0x7F000002u}, t0));
}

TEST(RequestMemory, ForgetsAfterTheKeepTime) {
  RequestMemory m;
  const auto t0 = Clock::now();
  m.remember(kPeerCommId, kPeer, consumer_rej(), t0);
  EXPECT_FALSE(m.find(kPeerCommId, kPeer, t0 + std::chrono::milliseconds(RequestMemory::kKeepMs)));
  EXPECT_EQ(m.size(), 0u);
}

TEST(RequestMemory, BoundedByForgettingTheOldest) {
  RequestMemory m;
  const auto t0 = Clock::now();
  for (uint32_t i = 0; i <= RequestMemory::kMax; ++i) m.remember(i + 1, kPeer, consumer_rej(), t0);
  EXPECT_EQ(m.size(), RequestMemory::kMax);
  EXPECT_FALSE(m.find(1, kPeer, t0));
  EXPECT_TRUE(m.find(RequestMemory::kMax + 1, kPeer, t0));
}

TEST(RequestMemory, StaleConnectionRejAsTheKernelsCm) {
  auto mad = decode_mad(stale_connection_rej(9, 0x01BBDCD7, kPeerCommId));
  ASSERT_TRUE(mad.has_value());
  EXPECT_EQ(mad->transaction_id, 9u);
  const auto& rej = std::get<RejMessage>(mad->message);
  EXPECT_EQ(rej.local_comm_id, 0x01BBDCD7u);
  EXPECT_EQ(rej.remote_comm_id, kPeerCommId);
  EXPECT_EQ(rej.message_rejected, RejectedMessage::kOther);
  EXPECT_EQ(rej.reason, uint16_t(RejReason::kStaleConnection));
}

}  // namespace
}  // namespace uroce::rdmacm
