// Responder protocol tests (roce-facts.md §2.3, §4.2, §4.3, §5.2): crafted
// request packets in, captured ACK/NAK/READ responses and receive completions
// out.
#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

class Responder : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    bring_up();
  }

  void expect_single_ack(uint8_t syndrome, uint32_t psn) {
    auto tx = take();
    ASSERT_EQ(tx.size(), 1u);
    EXPECT_EQ(tx[0].opcode, kAck);
    ASSERT_TRUE(tx[0].syndrome.has_value());
    EXPECT_EQ(*tx[0].syndrome, syndrome);
    EXPECT_EQ(tx[0].psn, psn);
    EXPECT_EQ(tx[0].dest_qp, kPeerQpn);
    EXPECT_FALSE(tx[0].ack_req);
    EXPECT_TRUE(tx[0].payload.empty());
  }
};

// Receive SEND_ONLY(ePSN, AckReq) with a receive posted / Expect the bytes in
// the buffer, a RECV completion and ACK(0x1F, PSN = request PSN, MSN 1).
TEST_F(Responder, SendOnlyWithReceive) {
  std::vector<uint8_t> buf(256, 0xEE);
  recv_buf(buf, 41);
  auto data = pattern(100, 3);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = data});

  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kAck);
  EXPECT_EQ(tx[0].syndrome, wire::kAckNoCredit);
  EXPECT_EQ(tx[0].psn, rq(0));
  EXPECT_EQ(tx[0].msn, 1u);
  EXPECT_EQ(tx[0].dest_qp, kPeerQpn);

  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 41u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 100u);
  EXPECT_EQ(wc[0].qp_num, qp->qp_num());
  EXPECT_FALSE(wc[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), buf.begin()));
  EXPECT_EQ(buf[100], 0xEE) << "nothing written past the message";
  EXPECT_TRUE(poll(*scq).empty());
}

// Receive SEND_ONLY(ePSN, AckReq) with a receive posted / Expect the ACK's
// bytes exactly: BTH (ACKNOWLEDGE, no SE, MigReq, pad or FECN/BECN, TVer 0,
// default P_Key, the peer's QP 0x000777, no AckReq, the request's PSN 1000),
// AETH (0x1F, MSN 1), then a correct ICRC.
TEST_F(Responder, AckBytesOnTheWire) {
  std::vector<uint8_t> buf(16, 0);
  recv_buf(buf, 1);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = {1}});
  ASSERT_EQ(sent.size(), 1u);
  const std::vector<uint8_t> golden = {
      0x11, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x07, 0x77, 0x00, 0x00, 0x03, 0xE8,  // BTH
      0x1F, 0x00, 0x00, 0x01,                                                  // AETH
  };
  EXPECT_EQ(without_icrc(sent[0]), golden);
  EXPECT_EQ(take().size(), 1u);  // parses, ICRC correct
}

// Receive SEND_ONLY_WITH_IMMEDIATE / Expect IBV_WC_WITH_IMM and imm_data
// unchanged.
TEST_F(Responder, SendOnlyWithImmediate) {
  std::vector<uint8_t> buf(64, 0);
  recv_buf(buf, 1);
  deliver(Craft{.opcode = kSendOnlyImm, .psn = rq(0), .ack_req = true, .imm = 0x44332211, .payload = {1, 2, 3}});
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].byte_len, 3u);
  EXPECT_TRUE(wc[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(wc[0].imm_data, 0x44332211u);
  expect_single_ack(0x1F, rq(0));
}

// Receive SEND_ONLY without AckReq / Expect the completion and no ACK (§4.3).
TEST_F(Responder, NoAckWithoutAckReq) {
  std::vector<uint8_t> buf(64, 0);
  recv_buf(buf, 1);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = false, .payload = {9}});
  EXPECT_EQ(poll(*rcq).size(), 1u);
  EXPECT_TRUE(take().empty());
}

// Receive SEND_ONLY with no receive posted / Expect RNR NAK
// (0x20|min_rnr_timer, request PSN) and no completion; after a receive is
// posted the same PSN is accepted.
TEST_F(Responder, SendWithoutReceiveIsRnrNak) {
  auto data = pattern(32, 1);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = data});
  expect_single_ack(rnr_nak(min_rnr_timer), rq(0));
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);

  std::vector<uint8_t> buf(64, 0);
  recv_buf(buf, 5);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = data});
  expect_single_ack(0x1F, rq(0));
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 5u);
  EXPECT_EQ(wc[0].byte_len, 32u);
}

// Receive RDMA_WRITE_ONLY to a valid R_Key (iova ≠ address) / Expect memory
// written at the right place, ACK, no receive completion.
TEST_F(Responder, WriteOnlyValidRkey) {
  std::vector<uint8_t> target(4096, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 0x7000000);
  auto data = pattern(333, 9);
  deliver(Craft{.opcode = kWriteOnly,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = 0x7000000 + 100,
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 333,
                .payload = data});
  expect_single_ack(0x1F, rq(0));
  EXPECT_TRUE(std::equal(data.begin(), data.end(), target.begin() + 100));
  EXPECT_EQ(target[99], 0);
  EXPECT_EQ(target[433], 0);
  EXPECT_TRUE(poll(*rcq).empty());
}

// Receive WRITE FIRST/MIDDLE/LAST / Expect the whole message written, one ACK.
TEST_F(Responder, WriteMultiPacket) {
  std::vector<uint8_t> target(4096, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  auto data = pattern(2 * kMtu + 10, 4);
  auto va = reinterpret_cast<uint64_t>(target.data());
  std::vector<uint8_t> a(data.begin(), data.begin() + kMtu), b(data.begin() + kMtu, data.begin() + 2 * kMtu),
      c(data.begin() + 2 * kMtu, data.end());
  deliver({Craft{.opcode = kWriteFirst,
                 .psn = rq(0),
                 .reth_va = va,
                 .reth_rkey = mr->ibmr.rkey,
                 .reth_len = uint32_t(data.size()),
                 .payload = a},
           Craft{.opcode = kWriteMiddle, .psn = rq(1), .payload = b},
           Craft{.opcode = kWriteLast, .psn = rq(2), .ack_req = true, .payload = c}});
  expect_single_ack(0x1F, rq(2));
  EXPECT_TRUE(std::equal(data.begin(), data.end(), target.begin()));
}

// Receive WRITE with an R_Key that names no MR / Expect NAK 0x62 (request PSN),
// the responder QP in ERR and the posted receive flushed.
TEST_F(Responder, WriteBadRkeyIsRemoteAccessNak) {
  std::vector<uint8_t> target(256, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  std::vector<uint8_t> rbuf(64, 0);
  recv_buf(rbuf, 77);
  deliver(Craft{.opcode = kWriteOnly,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = reinterpret_cast<uint64_t>(target.data()),
                .reth_rkey = mr->ibmr.rkey + 0x100,
                .reth_len = 16,
                .payload = pattern(16, 0)});
  expect_single_ack(nak(2), rq(0));
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
  EXPECT_EQ(target[0], 0);
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 77u);
  EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);

  // Incoming packets are dropped in ERR.
  deliver(Craft{.opcode = kSendOnly, .psn = rq(1), .ack_req = true, .payload = {1}});
  EXPECT_TRUE(take().empty());
}

// Receive WRITE reaching one byte past the MR / Expect NAK 0x62, nothing
// written.
TEST_F(Responder, WriteBeyondBoundsIsRemoteAccessNak) {
  std::vector<uint8_t> target(256, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  deliver(Craft{.opcode = kWriteOnly,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = reinterpret_cast<uint64_t>(target.data()) + 241,
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 16,
                .payload = pattern(16, 1)});
  expect_single_ack(nak(2), rq(0));
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
  for (uint8_t b : target) ASSERT_EQ(b, 0);
}

// Receive WRITE_FIRST whose RETH length runs past the MR / Expect NAK 0x62 at
// the first packet (the whole DMA range is checked, not just this packet).
TEST_F(Responder, WriteFirstWholeRangeChecked) {
  std::vector<uint8_t> target(2 * kMtu, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  deliver(Craft{.opcode = kWriteFirst,
                .psn = rq(0),
                .reth_va = reinterpret_cast<uint64_t>(target.data()),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 3 * kMtu,
                .payload = pattern(kMtu, 1)});
  expect_single_ack(nak(2), rq(0));
  for (uint8_t b : target) ASSERT_EQ(b, 0);
}

// Receive WRITE to an MR registered without REMOTE_WRITE / Expect NAK 0x62.
TEST_F(Responder, WriteToReadOnlyMrIsRemoteAccessNak) {
  std::vector<uint8_t> target(256, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  deliver(Craft{.opcode = kWriteOnly,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = reinterpret_cast<uint64_t>(target.data()),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 16,
                .payload = pattern(16, 1)});
  expect_single_ack(nak(2), rq(0));
  EXPECT_EQ(target[0], 0);
}

// Receive READ from an MR without REMOTE_READ / Expect NAK 0x62 and no response
// data.
TEST_F(Responder, ReadWithoutRemoteReadMrIsRemoteAccessNak) {
  std::vector<uint8_t> src(256, 1);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  deliver(Craft{.opcode = kReadRequest,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = reinterpret_cast<uint64_t>(src.data()),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 16});
  expect_single_ack(nak(2), rq(0));
}

// Receive an RDMA WRITE on a QP without IBV_ACCESS_REMOTE_WRITE / Expect NAK
// 0x61.
class ResponderNoRemoteWrite : public Responder {
 protected:
  void SetUp() override {
    qp_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
    Responder::SetUp();
  }
};
TEST_F(ResponderNoRemoteWrite, WriteIsInvalidRequestNak) {
  std::vector<uint8_t> target(256, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  deliver(Craft{.opcode = kWriteOnly,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = reinterpret_cast<uint64_t>(target.data()),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 16,
                .payload = pattern(16, 1)});
  expect_single_ack(nak(1), rq(0));
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
  EXPECT_EQ(target[0], 0);
}

// Receive a READ on a QP without IBV_ACCESS_REMOTE_READ / Expect NAK 0x61.
class ResponderNoRemoteRead : public Responder {
 protected:
  void SetUp() override {
    qp_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    Responder::SetUp();
  }
};
TEST_F(ResponderNoRemoteRead, ReadIsInvalidRequestNak) {
  std::vector<uint8_t> src(256, 1);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  deliver(Craft{.opcode = kReadRequest,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = reinterpret_cast<uint64_t>(src.data()),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 16});
  expect_single_ack(nak(1), rq(0));
}

// Receive a duplicate SEND (PSN before ePSN) / Expect ACK with PSN ePSN-1, no
// second completion, the second receive still posted.
TEST_F(Responder, DuplicateSendIsAckedNotReexecuted) {
  std::vector<uint8_t> b1(64, 0), b2(64, 0), b3(64, 0), b4(64, 0);
  recv_buf(b1, 1);
  recv_buf(b2, 2);
  recv_buf(b3, 3);
  recv_buf(b4, 4);
  for (uint32_t i = 0; i < 3; ++i)
    deliver(Craft{.opcode = kSendOnly, .psn = rq(i), .ack_req = true, .payload = pattern(8, uint8_t(i))});
  EXPECT_EQ(take().size(), 3u);
  EXPECT_EQ(poll(*rcq).size(), 3u);

  // Duplicate of the oldest: acknowledged with ePSN-1 = rq(2).
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = pattern(8, 0)});
  expect_single_ack(0x1F, rq(2));
  EXPECT_TRUE(poll(*rcq).empty());
  // Duplicate of the newest: same.
  deliver(Craft{.opcode = kSendOnly, .psn = rq(2), .ack_req = true, .payload = pattern(8, 2)});
  expect_single_ack(0x1F, rq(2));
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_EQ(b4[0], 0);
  // The next new SEND still lands in the fourth receive.
  deliver(Craft{.opcode = kSendOnly, .psn = rq(3), .ack_req = true, .payload = pattern(8, 3)});
  expect_single_ack(0x1F, rq(3));
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 4u);
  // Live counters (uroce stats): six packets in, six ACKs out, two duplicates.
  EXPECT_EQ(qp->counters->rcvd_pkts.load(), 6u);
  EXPECT_EQ(qp->counters->sent_pkts.load(), 6u);
  EXPECT_EQ(qp->counters->duplicate_request.load(), 2u);
  EXPECT_EQ(engine->stats.tx_packets.load(), 6u);
}

// Receive a duplicate WRITE / Expect ACK ePSN-1 and the memory not written
// again.
TEST_F(Responder, DuplicateWriteNotReexecuted) {
  std::vector<uint8_t> target(64, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  auto va = reinterpret_cast<uint64_t>(target.data());
  deliver(Craft{.opcode = kWriteOnly,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = va,
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 4,
                .payload = {1, 2, 3, 4}});
  expect_single_ack(0x1F, rq(0));
  target[0] = 0x55;  // the application changed it meanwhile
  deliver(Craft{.opcode = kWriteOnly,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = va,
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 4,
                .payload = {1, 2, 3, 4}});
  expect_single_ack(0x1F, rq(0));
  EXPECT_EQ(target[0], 0x55);
}

// Receive PSN ahead of ePSN / Expect exactly one NAK 0x60 carrying ePSN, then
// silence for further out-of-order packets; the ePSN packet is processed and a
// later gap gets a new NAK.
TEST_F(Responder, OutOfSequenceNakOnce) {
  std::vector<uint8_t> b1(64, 0), b2(64, 0);
  recv_buf(b1, 1);
  recv_buf(b2, 2);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(2), .ack_req = true, .payload = {1}});
  expect_single_ack(nak(0), rq(0));
  deliver(Craft{.opcode = kSendOnly, .psn = rq(3), .ack_req = true, .payload = {1}});
  deliver(Craft{.opcode = kSendOnly, .psn = rq(4), .ack_req = true, .payload = {1}});
  EXPECT_TRUE(take().empty()) << "only one NAK per gap";
  EXPECT_TRUE(poll(*rcq).empty());

  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = {7}});
  expect_single_ack(0x1F, rq(0));
  EXPECT_EQ(poll(*rcq).size(), 1u);
  EXPECT_EQ(b1[0], 7);

  deliver(Craft{.opcode = kSendOnly, .psn = rq(5), .ack_req = true, .payload = {1}});
  expect_single_ack(nak(0), rq(1));
  // Live counters: four packets past the ePSN, two sequence NAKs (one per gap).
  EXPECT_EQ(qp->counters->out_of_seq_request.load(), 4u);
  EXPECT_EQ(qp->counters->seq_naks_sent.load(), 2u);
}

// Receive an out-of-order packet and then the expected one in the same burst /
// Expect NAK then ACK, in that order.
TEST_F(Responder, NakAndAckOrderWithinBurst) {
  std::vector<uint8_t> b1(64, 0);
  recv_buf(b1, 1);
  deliver({Craft{.opcode = kSendOnly, .psn = rq(1), .ack_req = true, .payload = {1}},
           Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = {2}}});
  auto tx = take();
  ASSERT_EQ(tx.size(), 2u);
  EXPECT_EQ(tx[0].syndrome, nak(0));
  EXPECT_EQ(tx[0].psn, rq(0));
  EXPECT_EQ(tx[1].syndrome, 0x1F);
  EXPECT_EQ(tx[1].psn, rq(0));
}

// Receive READ of 2.5 MTU / Expect READ_RESPONSE FIRST/MIDDLE/LAST, path-MTU
// sized, consecutive PSNs from the request's, AETH on FIRST and LAST, the MR's
// bytes; then ePSN is past all response PSNs.
TEST_F(Responder, ReadRequestIsAnswered) {
  std::vector<uint8_t> src = pattern(8192, 5);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, 0x40000000);
  const uint32_t len = 2 * kMtu + 453;
  deliver(Craft{.opcode = kReadRequest,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = 0x40000000 + 64,
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = len});
  auto tx = take();
  ASSERT_EQ(tx.size(), 3u);
  const uint8_t ops[3] = {kReadRespFirst, kReadRespMiddle, kReadRespLast};
  const uint32_t sizes[3] = {kMtu, kMtu, 453};
  uint32_t off = 64;
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(tx[i].opcode, ops[i]);
    EXPECT_EQ(tx[i].psn, rq(uint32_t(i)));
    EXPECT_EQ(tx[i].dest_qp, kPeerQpn);
    ASSERT_EQ(tx[i].payload.size(), sizes[i]);
    EXPECT_TRUE(std::equal(tx[i].payload.begin(), tx[i].payload.end(), src.begin() + off));
    EXPECT_EQ(tx[i].syndrome.has_value(), i != 1);
    if (tx[i].syndrome) {
      EXPECT_EQ(*tx[i].syndrome, 0x1F);
    }
    off += sizes[i];
  }
  EXPECT_EQ(tx[2].pad, 3u);
  EXPECT_TRUE(poll(*rcq).empty());

  // The next request takes PSN rq(3).
  std::vector<uint8_t> b(16, 0);
  recv_buf(b, 9);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(3), .ack_req = true, .payload = {1}});
  expect_single_ack(0x1F, rq(3));
}

// Receive a READ that fits one packet / Expect one READ_RESPONSE_ONLY with
// AETH.
TEST_F(Responder, ReadOnlyResponse) {
  std::vector<uint8_t> src = pattern(100, 1);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  deliver(Craft{.opcode = kReadRequest,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = reinterpret_cast<uint64_t>(src.data()),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 100});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kReadRespOnly);
  EXPECT_EQ(tx[0].psn, rq(0));
  EXPECT_EQ(tx[0].syndrome, 0x1F);
  EXPECT_EQ(tx[0].payload, src);
}

// Receive the same READ again (PSN before ePSN) / Expect the responses replayed
// from the duplicate's PSN; a retry of the tail replays only the tail.
TEST_F(Responder, DuplicateReadIsReplayed) {
  std::vector<uint8_t> src = pattern(4096, 2);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  auto va = reinterpret_cast<uint64_t>(src.data());
  const uint32_t len = 2 * kMtu + 100;
  Craft read{.opcode = kReadRequest,
             .psn = rq(0),
             .ack_req = true,
             .reth_va = va,
             .reth_rkey = mr->ibmr.rkey,
             .reth_len = len};
  deliver(read);
  auto first = take();
  ASSERT_EQ(first.size(), 3u);

  deliver(read);
  auto again = take();
  ASSERT_EQ(again.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(again[i].opcode, first[i].opcode);
    EXPECT_EQ(again[i].psn, first[i].psn);
    EXPECT_EQ(again[i].payload, first[i].payload);
  }

  // Retry from the second response on (what a requester that got FIRST sends).
  deliver(Craft{.opcode = kReadRequest,
                .psn = rq(1),
                .ack_req = true,
                .reth_va = va + kMtu,
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = len - kMtu});
  auto tail = take();
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0].opcode, kReadRespFirst);
  EXPECT_EQ(tail[0].psn, rq(1));
  EXPECT_EQ(tail[0].payload, first[1].payload);
  EXPECT_EQ(tail[1].opcode, kReadRespLast);
  EXPECT_EQ(tail[1].psn, rq(2));
  EXPECT_EQ(tail[1].payload, first[2].payload);

  // A duplicate READ asking for more than the original range is dropped.
  deliver(Craft{.opcode = kReadRequest,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = va,
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = len + 1});
  EXPECT_TRUE(take().empty());
}

// Receive SEND larger than the posted receive buffer / Expect the receive to
// complete with IBV_WC_LOC_LEN_ERR and NAK 0x61 (class C, QP to ERR).
TEST_F(Responder, SendTooLongForReceiveBuffer) {
  std::vector<uint8_t> buf(64, 0);
  recv_buf(buf, 12);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = pattern(100, 1)});
  expect_single_ack(nak(1), rq(0));
  auto wc = poll(*rcq);
  ASSERT_GE(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 12u);
  EXPECT_EQ(wc[0].status, IBV_WC_LOC_LEN_ERR);
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
}

// Receive SEND FIRST/MIDDLE/LAST in one burst into a 2-SGE receive / Expect the
// message reassembled across the SGEs, one completion, one coalesced ACK.
TEST_F(Responder, MultiPacketSendReassembled) {
  std::vector<uint8_t> b1(1500, 0), b2(2000, 0);
  core::Mr* m1 = reg(b1, IBV_ACCESS_LOCAL_WRITE);
  core::Mr* m2 = reg(b2, IBV_ACCESS_LOCAL_WRITE);
  post_recv(33, {sge(b1.data(), 1500, m1), sge(b2.data(), 2000, m2)});
  auto data = pattern(2 * kMtu + 77, 8);
  std::vector<uint8_t> a(data.begin(), data.begin() + kMtu), b(data.begin() + kMtu, data.begin() + 2 * kMtu),
      c(data.begin() + 2 * kMtu, data.end());
  deliver({Craft{.opcode = kSendFirst, .psn = rq(0), .payload = a},
           Craft{.opcode = kSendMiddle, .psn = rq(1), .payload = b},
           Craft{.opcode = kSendLast, .psn = rq(2), .ack_req = true, .payload = c}});
  expect_single_ack(0x1F, rq(2));
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 33u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].byte_len, data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.begin() + 1500, b1.begin()));
  EXPECT_TRUE(std::equal(data.begin() + 1500, data.end(), b2.begin()));
}

// Receive SEND_FIRST and SEND_LAST over separate bursts with AckReq on both /
// Expect an ACK per burst and the completion only at LAST.
TEST_F(Responder, MultiPacketSendAcrossBursts) {
  std::vector<uint8_t> buf(4096, 0);
  recv_buf(buf, 1);
  deliver(Craft{.opcode = kSendFirst, .psn = rq(0), .ack_req = true, .payload = pattern(kMtu, 1)});
  expect_single_ack(0x1F, rq(0));
  EXPECT_TRUE(poll(*rcq).empty());
  deliver(Craft{.opcode = kSendLast, .psn = rq(1), .ack_req = true, .payload = pattern(10, 2)});
  expect_single_ack(0x1F, rq(1));
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].byte_len, kMtu + 10);
}

// Receive SEND_MIDDLE with no message in progress / Expect NAK 0x61
// (out-of-order FIRST/MIDDLE/LAST, §2.3).
TEST_F(Responder, MiddleWithoutFirstIsInvalidRequest) {
  std::vector<uint8_t> buf(4096, 0);
  recv_buf(buf, 1);
  deliver(Craft{.opcode = kSendMiddle, .psn = rq(0), .ack_req = true, .payload = pattern(kMtu, 1)});
  expect_single_ack(nak(1), rq(0));
}

// Receive SEND_FIRST shorter than the path MTU / Expect NAK 0x61 (§5.2 length
// rules).
TEST_F(Responder, ShortFirstPacketIsInvalidRequest) {
  std::vector<uint8_t> buf(4096, 0);
  recv_buf(buf, 1);
  deliver(Craft{.opcode = kSendFirst, .psn = rq(0), .ack_req = true, .payload = pattern(kMtu - 4, 1)});
  expect_single_ack(nak(1), rq(0));
}

// Receive a packet with a wrong ICRC / Expect it dropped and counted, no
// response.
TEST_F(Responder, BadIcrcIsDropped) {
  std::vector<uint8_t> buf(64, 0);
  recv_buf(buf, 1);
  uint64_t before = engine->stats.rx_bad_icrc.load();
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = {1, 2}, .corrupt_icrc = true});
  EXPECT_EQ(engine->stats.rx_bad_icrc.load(), before + 1);
  EXPECT_TRUE(take().empty());
  EXPECT_TRUE(poll(*rcq).empty());
}

// Receive a UC opcode on an RC QP, and a packet for an unknown QP / Expect both
// dropped silently and counted.
TEST_F(Responder, WrongServiceAndUnknownQpDropped) {
  std::vector<uint8_t> buf(64, 0);
  recv_buf(buf, 1);
  uint64_t ws = engine->stats.rx_wrong_service.load(), nq = engine->stats.rx_no_qp.load();
  deliver(Craft{.opcode = 0x24, .psn = rq(0), .ack_req = true, .payload = {1}});
  deliver(
      Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .dest_qp = qp->qp_num() ^ 0x800000, .payload = {1}});
  EXPECT_EQ(engine->stats.rx_wrong_service.load(), ws + 1);
  EXPECT_EQ(engine->stats.rx_no_qp.load(), nq + 1);
  EXPECT_TRUE(take().empty());
  EXPECT_TRUE(poll(*rcq).empty());
}

// Receive a CNP / Expect it accepted and ignored.
TEST_F(Responder, CnpIgnored) {
  deliver(Craft{.opcode = wire::kOpCnp, .psn = 0});
  EXPECT_TRUE(take().empty());
  EXPECT_EQ(engine->stats.rx_malformed.load(), 0u);
}

// ePSN near the wrap: SENDs at 0xFFFFFF and 0 / Expect both accepted in order,
// and a packet at 0xFFFFFE afterwards treated as a duplicate.
class ResponderWrap : public Responder {
 protected:
  void SetUp() override {
    rq_psn = 0xFFFFFF;
    Responder::SetUp();
  }
};
TEST_F(ResponderWrap, PsnWrapsAt24Bits) {
  std::vector<uint8_t> b1(16, 0), b2(16, 0);
  recv_buf(b1, 1);
  recv_buf(b2, 2);
  deliver(Craft{.opcode = kSendOnly, .psn = 0xFFFFFF, .ack_req = true, .payload = {1}});
  expect_single_ack(0x1F, 0xFFFFFF);
  deliver(Craft{.opcode = kSendOnly, .psn = 0, .ack_req = true, .payload = {2}});
  expect_single_ack(0x1F, 0);
  EXPECT_EQ(poll(*rcq).size(), 2u);
  deliver(Craft{.opcode = kSendOnly, .psn = 0xFFFFFE, .ack_req = true, .payload = {3}});
  expect_single_ack(0x1F, 0);  // duplicate: ePSN-1
  deliver(Craft{.opcode = kSendOnly, .psn = 2, .ack_req = true, .payload = {4}});
  expect_single_ack(nak(0), 1);
}

}  // namespace
}  // namespace uroce::engine::test
