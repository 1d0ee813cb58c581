// UDP GSO on send and GRO on receive (transport/datagram.h, engine/tx_batch.h,
// wire/icrc.h): which packets the engine groups into one GSO message, the IP
// identification each segment's ICRC is computed with, and the receive check
// of segments of a GRO batch.
#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

class Gso : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    transport->gso_segments = transport::kMaxGsoSegments;
    bring_up();
    src = pattern(64 * kMtu, 5);
    src_mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  }

  void write(uint64_t wr_id, uint32_t len) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = 0xABC000;
    wr.wr.rdma.rkey = 0x1234;
    post_send(wr, {sge(src.data(), len, src_mr)});
  }

  std::vector<uint8_t> src;
  core::Mr* src_mr = nullptr;
};

// The GSO rules every message sent must keep: segments numbered 0.. as IP
// IDs, all of the message's segment size but the last, which may be shorter.
void expect_gso_rules(const std::vector<Sent>& raw) {
  for (size_t i = 0; i < raw.size(); ++i) {
    bool first = i == 0 || raw[i].message != raw[i - 1].message;
    bool last = i + 1 == raw.size() || raw[i + 1].message != raw[i].message;
    EXPECT_EQ(raw[i].ip_id, first ? 0 : raw[i - 1].ip_id + 1) << "packet " << i;
    if (raw[i].segment_size == 0) {
      EXPECT_TRUE(first && last) << "packet " << i;
    } else if (last) {
      EXPECT_LE(raw[i].bytes.size(), raw[i].segment_size) << "packet " << i;
    } else {
      EXPECT_EQ(raw[i].bytes.size(), raw[i].segment_size) << "packet " << i;
    }
  }
}

// Post a WRITE of 20 MTU + 100 bytes / Expect two GSO messages: WRITE_FIRST
// (longer by its RETH) with the first MIDDLE, which ends that message, then the
// other MIDDLE packets and the shorter LAST; each segment's ICRC computed with
// its place in the message as IP identification (take() checks every ICRC).
TEST_F(Gso, WriteGoesInTwoMessagesOfEqualSegments) {
  write(1, 20 * kMtu + 100);
  std::vector<Sent> raw = sent;
  auto tx = take();
  ASSERT_EQ(tx.size(), 21u);
  EXPECT_EQ(tx[0].opcode, kWriteFirst);
  EXPECT_EQ(tx[20].opcode, kWriteLast);
  expect_gso_rules(raw);
  EXPECT_EQ(raw[1].message, raw[0].message);
  EXPECT_EQ(raw[2].message, raw[0].message + 1);
  EXPECT_EQ(raw[20].message, raw[2].message);
  EXPECT_EQ(raw[20].ip_id, 18u);
}

// Post a WRITE of 63 MTU / Expect no message over 64 KiB: the middle packets
// (1024 + 12 + 4 bytes) go 63 to a message at most (65,268 bytes).
TEST_F(Gso, MessagesStayUnder64KiB) {
  write(1, 63 * kMtu);
  std::vector<Sent> raw = sent;
  take();
  expect_gso_rules(raw);
  std::map<unsigned, size_t> bytes;
  std::map<unsigned, size_t> count;
  for (const Sent& s : raw) {
    bytes[s.message] += s.bytes.size();
    ++count[s.message];
  }
  for (auto& [m, b] : bytes) {
    EXPECT_LE(b, transport::kMaxGsoBytes) << "message " << m;
    EXPECT_LE(count[m], transport::kMaxGsoSegments) << "message " << m;
  }
}

// A transport without GSO / Expect every packet sent alone with IP ID 0.
TEST_F(Gso, WithoutGsoEveryPacketIsAlone) {
  transport->gso_segments = 1;
  write(1, 8 * kMtu);
  std::vector<Sent> raw = sent;
  take();
  ASSERT_EQ(raw.size(), 8u);
  for (const Sent& s : raw) {
    EXPECT_EQ(s.segment_size, 0u);
    EXPECT_EQ(s.ip_id, 0u);
  }
}

// Receive a GRO batch of three SEND packets (segments 0..2, ICRCs computed
// with IP IDs 0..2) whose middle one is corrupted / Expect only that one
// dropped and counted bad_icrc; FIRST accepted, LAST out of sequence (NAK).
TEST_F(Gso, CorruptSegmentOfGroBatchDropsOnlyIt) {
  std::vector<uint8_t> buf(4 * kMtu, 0);
  recv_buf(buf, 7);
  uint64_t bad = engine->stats.rx_bad_icrc.load();
  deliver({Craft{.opcode = kSendFirst, .psn = rq(0), .payload = pattern(kMtu, 1), .ip_id = 0, .gso_index = 0},
           Craft{.opcode = kSendMiddle,
                 .psn = rq(1),
                 .payload = pattern(kMtu, 2),
                 .corrupt_icrc = true,
                 .ip_id = 1,
                 .gso_index = 1},
           Craft{.opcode = kSendLast,
                 .psn = rq(2),
                 .ack_req = true,
                 .payload = pattern(kMtu, 3),
                 .ip_id = 2,
                 .gso_index = 2}});
  EXPECT_EQ(engine->stats.rx_bad_icrc.load(), bad + 1);
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kAck);
  EXPECT_EQ(tx[0].syndrome, nak(uint8_t(wire::NakCode::kPsnSeqError)));
  EXPECT_EQ(tx[0].psn, rq(1));
  EXPECT_TRUE(poll(*rcq).empty());
}

// Receive segments of a GSO message that was split on the way (each arrives
// alone: GRO index 0, ICRC computed with IP IDs 0..2) / Expect all accepted
// and the message received whole.
TEST_F(Gso, SegmentsSplitOnTheWayAreAccepted) {
  std::vector<uint8_t> buf(4 * kMtu, 0);
  recv_buf(buf, 7);
  uint64_t bad = engine->stats.rx_bad_icrc.load();
  deliver({Craft{.opcode = kSendFirst, .psn = rq(0), .payload = pattern(kMtu, 1), .ip_id = 0},
           Craft{.opcode = kSendMiddle, .psn = rq(1), .payload = pattern(kMtu, 2), .ip_id = 1},
           Craft{.opcode = kSendLast, .psn = rq(2), .ack_req = true, .payload = pattern(10, 3), .ip_id = 2}});
  EXPECT_EQ(engine->stats.rx_bad_icrc.load(), bad);
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].byte_len, 2 * kMtu + 10);
}

// Receive a packet whose ICRC was computed with IP ID 64 (no GSO message has
// a 65th segment) / Expect it dropped as bad_icrc.
TEST_F(Gso, IdentificationBeyondGsoIsBadIcrc) {
  std::vector<uint8_t> buf(kMtu, 0);
  recv_buf(buf, 7);
  uint64_t bad = engine->stats.rx_bad_icrc.load();
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = pattern(100, 1), .ip_id = 64});
  EXPECT_EQ(engine->stats.rx_bad_icrc.load(), bad + 1);
  EXPECT_TRUE(poll(*rcq).empty());
}

}  // namespace
}  // namespace uroce::engine::test
