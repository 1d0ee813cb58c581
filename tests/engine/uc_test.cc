// Unreliable Connected service (IBA 9.7.4.1 for UC, roce-facts.md §4): no ACKs,
// a PSN gap drops the rest of the message, nothing waits for acknowledgement.
#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

constexpr uint8_t kUc = 0x20;  // service bits of UC opcodes

class Uc : public EngineTest {
 protected:
  Uc() { qp_type = IBV_QPT_UC; }
  void SetUp() override {
    EngineTest::SetUp();
    bring_up();
  }
};

// Receive UC SEND_FIRST, SEND_LAST (AckReq clear, as UC sends it) / Expect the
// message delivered, a RECV completion, and nothing transmitted.
TEST_F(Uc, SendDeliveredWithoutAck) {
  std::vector<uint8_t> buf(4096, 0);
  core::Mr* mr = reg(buf, IBV_ACCESS_LOCAL_WRITE);
  post_recv(7, {sge(buf.data(), uint32_t(buf.size()), mr)});
  auto data = pattern(kMtu + 10, 2);
  deliver({Craft{.opcode = kUc | kSendFirst, .psn = rq(0), .payload = {data.begin(), data.begin() + kMtu}},
           Craft{.opcode = kUc | kSendLast, .psn = rq(1), .payload = {data.begin() + kMtu, data.end()}}});
  EXPECT_TRUE(take().empty());
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 7u);
  EXPECT_EQ(wc[0].byte_len, kMtu + 10);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), buf.begin()));
}

// Receive SEND_FIRST, (MIDDLE lost), LAST, then a new SEND_ONLY / Expect the
// broken message dropped without a completion or NAK, and the next message
// delivered into the same receive WQE.
TEST_F(Uc, GapDropsRestOfMessage) {
  std::vector<uint8_t> buf(4096, 0);
  core::Mr* mr = reg(buf, IBV_ACCESS_LOCAL_WRITE);
  post_recv(1, {sge(buf.data(), uint32_t(buf.size()), mr)});
  auto data = pattern(3 * kMtu, 5);
  auto part = [&](int i) { return std::vector<uint8_t>(data.begin() + i * kMtu, data.begin() + (i + 1) * kMtu); };
  deliver({Craft{.opcode = kUc | kSendFirst, .psn = rq(0), .payload = part(0)},
           Craft{.opcode = kUc | kSendLast, .psn = rq(2), .payload = part(2)}});
  EXPECT_TRUE(take().empty());
  EXPECT_TRUE(poll(*rcq).empty());
  auto next = pattern(100, 9);
  deliver(Craft{.opcode = kUc | kSendOnly, .psn = rq(3), .payload = next});
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].byte_len, 100u);
  EXPECT_TRUE(std::equal(next.begin(), next.end(), buf.begin()));
  EXPECT_TRUE(take().empty());
}

// Post more UC WRITEs than the RC window (128 PSNs) holds / Expect every packet
// sent at once without AckReq, and the WQEs completed as soon as they are sent.
TEST_F(Uc, SenderNeedsNoAcknowledgement) {
  std::vector<uint8_t> src(4 * kMtu, 1);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = 0x1000;
  wr.wr.rdma.rkey = 0x5;
  for (uint64_t i = 0; i < 40; ++i) {
    wr.wr_id = i;
    post_send(wr, {sge(src.data(), uint32_t(src.size()), mr)});
    auto wc = poll(*scq);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].wr_id, i);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  }
  auto tx = take();
  ASSERT_EQ(tx.size(), 160u);
  for (size_t i = 0; i < tx.size(); ++i) {
    EXPECT_EQ(tx[i].psn, sq(uint32_t(i)));
    EXPECT_FALSE(tx[i].ack_req);
    EXPECT_EQ(tx[i].opcode & 0xE0, kUc);
  }
}

// Post RDMA READ on a UC QP / Expect EINVAL (UC has no READ, IBA 9.4).
TEST_F(Uc, ReadIsRejectedAtPost) {
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_READ;
  std::lock_guard lock(qp->mu);
  EXPECT_EQ(qp->enqueue_send(wr), EINVAL);
}

}  // namespace
}  // namespace uroce::engine::test
