// Requester and completer protocol tests (roce-facts.md §2.3, §2.4, §4.1,
// §4.3, §4.4, §5.2): work requests in, captured request packets out; crafted
// ACK/NAK/READ responses in, send completions and retransmissions out.
#include <thread>

#include "engine/ack_board.h"
#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

class Requester : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    bring_up();
    src = pattern(16384, 11);
    src_mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  }

  // Posts a signaled SEND of `len` bytes from src + off.
  void send(uint64_t wr_id, uint32_t len, uint32_t off = 0, ibv_wr_opcode op = IBV_WR_SEND) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = 0xABC000;
    wr.wr.rdma.rkey = 0x1234;
    post_send(wr, {sge(src.data() + off, len, src_mr)});
  }

  void ack(uint32_t psn, uint8_t syndrome = 0x1F) {
    deliver(Craft{.opcode = kAck, .psn = psn, .syndrome = syndrome, .msn = 1});
  }

  // Posts a signaled RDMA READ of `len` bytes from remote `va` (rkey 0x33)
  // into `buf`, registered as `mr`.
  void post_read(uint64_t wr_id, uint64_t va, uint8_t* buf, uint32_t len, core::Mr* mr) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = va;
    wr.wr.rdma.rkey = 0x33;
    post_send(wr, {sge(buf, len, mr)});
  }

  std::vector<uint8_t> src;
  core::Mr* src_mr = nullptr;
};

// Post a SEND of 2 MTU + 453 bytes / Expect SEND_FIRST, SEND_MIDDLE, SEND_LAST
// with consecutive PSNs from sq_psn, AckReq only on LAST, PMTU-sized
// FIRST/MIDDLE, pad 3 on LAST and the source bytes; then ACK(LAST PSN) / Expect
// one SUCCESS completion.
TEST_F(Requester, SendSegmentedByPathMtuThenAcked) {
  const uint32_t len = 2 * kMtu + 453;
  send(7, len);
  auto tx = take();
  ASSERT_EQ(tx.size(), 3u);
  const uint8_t ops[3] = {kSendFirst, kSendMiddle, kSendLast};
  const uint32_t sizes[3] = {kMtu, kMtu, 453};
  uint32_t off = 0;
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(tx[i].opcode, ops[i]);
    EXPECT_EQ(tx[i].psn, sq(uint32_t(i)));
    EXPECT_EQ(tx[i].dest_qp, kPeerQpn);
    EXPECT_EQ(tx[i].ack_req, i == 2);
    EXPECT_FALSE(tx[i].se);
    ASSERT_EQ(tx[i].payload.size(), sizes[i]);
    EXPECT_TRUE(std::equal(tx[i].payload.begin(), tx[i].payload.end(), src.begin() + off));
    off += sizes[i];
  }
  EXPECT_EQ(tx[0].pad, 0u);
  EXPECT_EQ(tx[2].pad, 3u);
  EXPECT_TRUE(poll(*scq).empty());
  // Live counters: the three packets in the QP's entry and, once the burst
  // is over, in the port's totals (added once a burst).
  EXPECT_EQ(qp->counters->sent_pkts.load(), 3u);
  EXPECT_EQ(engine->stats.tx_packets.load(), 3u);
  EXPECT_EQ(engine->stats.tx_bytes.load(), qp->counters->sent_bytes.load());

  ack(sq(1));  // partial: not yet complete
  EXPECT_TRUE(poll(*scq).empty());
  ack(sq(2));
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 7u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(wc[0].qp_num, qp->qp_num());
  EXPECT_TRUE(take().empty()) << "nothing to send after the ACK";
}

// Post 20 one-packet SENDs / Expect the first 16 sent as they are posted (fewer
// than 16 packets unacknowledged) and the last four kept (the QP streams);
// then ACK the first / Expect the four sent in one burst, in order; then,
// with everything acknowledged, post one more / Expect it sent at once.
TEST_F(Requester, PostsToAStreamingQpGoWithTheNextAck) {
  int bursts = 0;
  transport->on_send = [&](size_t) { ++bursts; };
  for (uint32_t i = 0; i < 20; ++i) send(i, 64);
  auto tx = take();
  ASSERT_EQ(tx.size(), 16u);
  EXPECT_EQ(bursts, 16);
  for (uint32_t i = 0; i < 16; ++i) EXPECT_EQ(tx[i].psn, sq(i));

  bursts = 0;
  ack(sq(0));
  tx = take();
  ASSERT_EQ(tx.size(), 4u);
  EXPECT_EQ(bursts, 1);
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(tx[i].opcode, kSendOnly);
    EXPECT_EQ(tx[i].psn, sq(16 + i));
  }
  ASSERT_EQ(poll(*scq).size(), 1u);

  ack(sq(19));
  EXPECT_EQ(poll(*scq).size(), 19u);
  EXPECT_TRUE(take().empty());
  send(20, 64);
  tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].psn, sq(20));
  transport->on_send = nullptr;
}

// Post 20 one-packet SENDs (the last four kept: the QP streams) and let no ACK
// come / Expect the local ACK timeout (67 ms) to resend the oldest alone, with
// AckReq (the window restarts from one packet, completer.cc collapse_window).
// The peer was only late: it answers with an ACK of all 16 / Expect the four
// kept posts sent, nothing sent twice more.
TEST_F(Requester, PostsKeptForAnAckGoWhenTheTimersResendIsAnswered) {
  auto t0 = Clock::now();
  for (uint32_t i = 0; i < 20; ++i) send(i, 64);
  ASSERT_EQ(take().size(), 16u);
  run_timers(t0 + std::chrono::milliseconds(100));
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].psn, sq(0));
  EXPECT_TRUE(tx[0].ack_req);
  ack(sq(15));
  tx = take();
  ASSERT_EQ(tx.size(), 4u);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(tx[i].psn, sq(16 + i));
  EXPECT_EQ(poll(*scq).size(), 16u);
}

// Post 8 one-packet SENDs, all lost / Expect the local ACK timeout to resend
// the oldest alone; each ACK then opens the window by the packets it
// acknowledges (slow start: 1, 2, 4 packets, then the last one), none sent
// twice.
TEST_F(Requester, LocalAckTimeoutRestartsFromOnePacket) {
  auto t0 = Clock::now();
  for (uint32_t i = 0; i < 8; ++i) send(i, 64);
  ASSERT_EQ(take().size(), 8u);
  run_timers(t0 + std::chrono::milliseconds(100));
  const std::vector<std::vector<uint32_t>> rounds = {{0}, {1, 2}, {3, 4, 5, 6}, {7}};
  for (size_t r = 0; r < rounds.size(); ++r) {
    SCOPED_TRACE(r);
    auto tx = take();
    ASSERT_EQ(tx.size(), rounds[r].size());
    for (size_t i = 0; i < tx.size(); ++i) EXPECT_EQ(tx[i].psn, sq(rounds[r][i]));
    EXPECT_TRUE(tx.back().ack_req);
    ack(tx.back().psn);
  }
  EXPECT_EQ(poll(*scq).size(), 8u);
  EXPECT_TRUE(take().empty());
}

// A 200-packet SEND (the window sends 128) and no ACK until the local ACK
// timeout re-sends the first packet alone; then an ACK of the first 60: the
// originals were only late (it acknowledges packets never re-sent) / Expect
// the window back (128) and the requester going on after the newest packet
// it sent: sq(128) on, nothing before it sent a third time.
TEST_F(Requester, SpuriousLocalAckTimeoutIsUndone) {
  std::vector<uint8_t> big(200 * kMtu, 3);
  core::Mr* big_mr = reg(big, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  auto t0 = Clock::now();
  post_send(wr, {sge(big.data(), uint32_t(big.size()), big_mr)});
  ASSERT_EQ(take().size(), kInitialCwnd);
  run_timers(t0 + std::chrono::milliseconds(100));
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].psn, sq(0));
  EXPECT_EQ(qp->comp.cwnd, kLossWindow);
  ack(sq(59));
  EXPECT_EQ(qp->comp.cwnd, kInitialCwnd);
  tx = take();
  ASSERT_EQ(tx.size(), 60u);
  for (uint32_t i = 0; i < 60; ++i) EXPECT_EQ(tx[i].psn, sq(128 + i)) << i;
}

// Three one-packet READs, unanswered until the local ACK timeout re-sends the
// first alone / Expect its response to re-send nothing more (it may answer the
// original: the requester holds), then the second READ's response (its
// original was only late) / Expect the timeout undone: the third READ is not
// re-sent either, and all three complete from the originals' responses.
TEST_F(Requester, SpuriousLocalAckTimeoutOnReadsIsUndone) {
  std::vector<uint8_t> dst(3 * 13, 0);
  core::Mr* m = reg(dst, IBV_ACCESS_LOCAL_WRITE);
  auto t0 = Clock::now();
  for (uint32_t i = 0; i < 3; ++i) post_read(i, 0x9000000 + 13 * i, dst.data() + 13 * i, 13, m);
  ASSERT_EQ(take().size(), 3u);
  run_timers(t0 + std::chrono::milliseconds(100));
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kReadRequest);
  EXPECT_EQ(tx[0].psn, sq(0));
  for (uint32_t i = 0; i < 3; ++i) {
    deliver(Craft{.opcode = kReadRespOnly, .psn = sq(i), .msn = i + 1, .payload = pattern(13, uint8_t(i))});
    EXPECT_TRUE(take().empty()) << "re-sent after the response to READ " << i;
  }
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS);
}

// Two one-packet READs whose requests were lost: the local ACK timeout re-sends
// the first alone, and its response comes / Expect nothing more until the next
// timeout, which re-sends the second (the first's response could not tell
// whether the second's request had arrived).
TEST_F(Requester, LocalAckTimeoutReSendsOneReadAtATime) {
  std::vector<uint8_t> dst(2 * 13, 0);
  core::Mr* m = reg(dst, IBV_ACCESS_LOCAL_WRITE);
  auto t0 = Clock::now();
  for (uint32_t i = 0; i < 2; ++i) post_read(i, 0x9000000 + 13 * i, dst.data() + 13 * i, 13, m);
  ASSERT_EQ(take().size(), 2u);
  run_timers(t0 + std::chrono::milliseconds(100));
  ASSERT_EQ(take().size(), 1u);
  deliver(Craft{.opcode = kReadRespOnly, .psn = sq(0), .msn = 1, .payload = pattern(13, 0)});
  EXPECT_TRUE(take().empty());
  run_timers(Clock::now() + std::chrono::seconds(1));
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kReadRequest);
  EXPECT_EQ(tx[0].psn, sq(1));
  deliver(Craft{.opcode = kReadRespOnly, .psn = sq(1), .msn = 2, .payload = pattern(13, 1)});
  EXPECT_EQ(poll(*scq).size(), 2u);
}

// Through shared memory (no congestion window): a 3-packet SEND, no ACK /
// Expect the local ACK timeout's resend of its first packet to ask for an ACK
// (a responder answers a duplicate FIRST or MIDDLE only when asked, and the
// requester holds after it: without AckReq both sides waited for ever).
TEST_F(Requester, LocalAckTimeoutResendAsksForAnAck) {
  transport->memory_path = true;
  redecide_delivery();
  auto t0 = Clock::now();
  send(1, 3 * kMtu);
  ASSERT_EQ(take().size(), 3u);
  run_timers(t0 + std::chrono::milliseconds(100));
  auto re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].psn, sq(0));
  EXPECT_TRUE(re[0].ack_req);
}

// A READ unanswered until the local ACK timeout re-sends it, then its response
// / Expect the hold over (nothing is outstanding): a new SEND goes at once.
TEST_F(Requester, HoldAfterATimeoutEndsWithNothingOutstanding) {
  std::vector<uint8_t> dst(13, 0);
  core::Mr* m = reg(dst, IBV_ACCESS_LOCAL_WRITE);
  auto t0 = Clock::now();
  post_read(1, 0x9000000, dst.data(), 13, m);
  ASSERT_EQ(take().size(), 1u);
  run_timers(t0 + std::chrono::milliseconds(100));
  ASSERT_EQ(take().size(), 1u);
  deliver(Craft{.opcode = kReadRespOnly, .psn = sq(0), .msn = 1, .payload = pattern(13, 0)});
  ASSERT_EQ(poll(*scq).size(), 1u);
  send(2, 10);
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].psn, sq(1));
}

// A SEND, no ACK: probes, then the local ACK timeout's resend / Expect no
// probe after it until the next timeout (the peer is slow or gone: a probe
// would be one more duplicate in its backlog).
TEST_F(Requester, NoProbeAfterALocalAckTimeout) {
  auto t0 = Clock::now();
  send(1, 10);
  take();
  run_timers(t0 + std::chrono::milliseconds(100));
  take();  // probes before the timeout, and the timeout's resend
  for (int ms = 2; ms <= 64; ms *= 2) {
    run_timers(Clock::now() + std::chrono::milliseconds(ms));
    EXPECT_TRUE(take().empty()) << "probed " << ms << " ms after the timeout";
  }
  run_timers(Clock::now() + std::chrono::seconds(1));
  auto re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].psn, sq(0));
}

// Post SEND_WITH_IMM (solicited) of 5 bytes / Expect one
// SEND_ONLY_WITH_IMMEDIATE with SE, AckReq, ImmDt and pad 3.
TEST_F(Requester, SendOnlyWithImmediateAndSolicited) {
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED;
  wr.imm_data = 0xA1B2C3D4;
  post_send(wr, {sge(src.data(), 5, src_mr)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kSendOnlyImm);
  EXPECT_TRUE(tx[0].se);
  EXPECT_TRUE(tx[0].ack_req);
  ASSERT_TRUE(tx[0].imm.has_value());
  EXPECT_EQ(*tx[0].imm, 0xA1B2C3D4u);
  EXPECT_EQ(tx[0].pad, 3u);
  EXPECT_EQ(tx[0].payload.size(), 5u);
}

// Post a zero-length SEND / Expect one SEND_ONLY with empty payload.
TEST_F(Requester, ZeroLengthSend) {
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  post_send(wr, {});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kSendOnly);
  EXPECT_TRUE(tx[0].payload.empty());
  EXPECT_EQ(tx[0].pad, 0u);
}

// Post an RDMA WRITE of 2 MTU / Expect WRITE_FIRST with RETH (va, rkey, whole
// length) then WRITE_LAST without RETH; ACK / Expect an RDMA_WRITE completion.
TEST_F(Requester, WriteCarriesRethOnFirstOnly) {
  send(3, 2 * kMtu, 0, IBV_WR_RDMA_WRITE);
  auto tx = take();
  ASSERT_EQ(tx.size(), 2u);
  EXPECT_EQ(tx[0].opcode, kWriteFirst);
  ASSERT_TRUE(tx[0].reth_va.has_value());
  EXPECT_EQ(*tx[0].reth_va, 0xABC000u);
  EXPECT_EQ(tx[0].reth_rkey, 0x1234u);
  EXPECT_EQ(tx[0].reth_len, 2 * kMtu);
  EXPECT_FALSE(tx[0].ack_req);
  EXPECT_EQ(tx[1].opcode, kWriteLast);
  EXPECT_FALSE(tx[1].reth_va.has_value());
  EXPECT_TRUE(tx[1].ack_req);
  EXPECT_EQ(tx[1].psn, sq(1));
  ack(sq(1));
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
}

// Post three SENDs, ACK only the second / Expect the first two completed in
// order (an ACK acknowledges every earlier PSN).
TEST_F(Requester, AckIsCumulative) {
  send(1, 10);
  send(2, 10);
  send(3, 10);
  EXPECT_EQ(take().size(), 3u);
  ack(sq(1));
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[1].wr_id, 2u);
  ack(sq(2));
  wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 3u);
}

// Post a SEND; ACK it 3 ms later / Expect the round trip sampled from the
// post to the ACK: srtt at least 3 ms (and not from some older time: under a
// second). Then a second SEND, ACKed at once / Expect srtt = 7/8 of the first
// sample + 1/8 of the new one, so smaller than the first.
TEST_F(Requester, RoundTripIsTimedFromThePostToItsAck) {
  send(1, 10);
  ASSERT_EQ(take().size(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  ack(sq(0));
  Clock::duration first = qp->timers.srtt;
  EXPECT_GE(first, std::chrono::milliseconds(3));
  EXPECT_LT(first, std::chrono::seconds(1));
  send(2, 10);
  ASSERT_EQ(take().size(), 1u);
  ack(sq(1));
  EXPECT_LT(qp->timers.srtt, first);
  EXPECT_GE(qp->timers.srtt, first * 7 / 8);
  EXPECT_EQ(poll(*scq).size(), 2u);
}

// Post an unsignaled SEND then a signaled one; ACK both / Expect only the
// signaled completion.
TEST_F(Requester, UnsignaledSendHasNoCompletion) {
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.opcode = IBV_WR_SEND;
  post_send(wr, {sge(src.data(), 4, src_mr)});
  send(2, 4);
  take();
  ack(sq(1));
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 2u);
}

// Post two SENDs; receive NAK 0x62 for the first / Expect IBV_WC_REM_ACCESS_ERR
// for it, IBV_WC_WR_FLUSH_ERR for the second, the QP in ERR.
TEST_F(Requester, RemoteAccessNakFailsAndFlushes) {
  send(1, 100);
  send(2, 100);
  EXPECT_EQ(take().size(), 2u);
  ack(sq(0), nak(2));
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
  EXPECT_TRUE(take().empty());
}

// Receive NAK 0x61 / 0x63 / Expect REM_INV_REQ_ERR / REM_OP_ERR (§2.3 table).
TEST_F(Requester, InvalidRequestNak) {
  send(1, 8);
  take();
  ack(sq(0), nak(1));
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
}
TEST_F(Requester, RemoteOperationalNak) {
  send(1, 8);
  take();
  ack(sq(0), nak(3));
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_OP_ERR);
}

// Post two SENDs; receive NAK 0x62 naming the second / Expect the first
// completed successfully (implicitly acknowledged), the second REM_ACCESS_ERR.
TEST_F(Requester, NakImplicitlyAcksEarlierPsns) {
  send(1, 8);
  send(2, 8);
  take();
  ack(sq(1), nak(2));
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[1].status, IBV_WC_REM_ACCESS_ERR);
}

// Post three SENDs; receive NAK 0x60 (PSN sequence error) for the second /
// Expect the first completed, and go-back-N: the second and third resent with
// their PSNs and bytes; then ACK / Expect the rest completed.
TEST_F(Requester, SequenceNakGoBackN) {
  send(1, 100, 0);
  send(2, 200, 100);
  send(3, 300, 300);
  auto orig = take();
  ASSERT_EQ(orig.size(), 3u);
  ack(sq(1), nak(0));
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  auto re = take();
  ASSERT_EQ(re.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(re[i].opcode, kSendOnly);
    EXPECT_EQ(re[i].psn, sq(uint32_t(i + 1)));
    EXPECT_EQ(re[i].payload, orig[i + 1].payload);
    EXPECT_TRUE(re[i].ack_req);
  }
  ack(sq(2));
  wc = poll(*scq);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[1].wr_id, 3u);
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
}

// Post one 3-packet SEND; receive NAK 0x60 for its second packet / Expect
// SEND_MIDDLE and SEND_LAST resent (resume inside the message).
TEST_F(Requester, SequenceNakInsideMessage) {
  send(1, 2 * kMtu + 8);
  auto orig = take();
  ASSERT_EQ(orig.size(), 3u);
  ack(sq(1), nak(0));
  auto re = take();
  ASSERT_EQ(re.size(), 2u);
  EXPECT_EQ(re[0].opcode, kSendMiddle);
  EXPECT_EQ(re[0].psn, sq(1));
  EXPECT_EQ(re[0].payload, orig[1].payload);
  EXPECT_EQ(re[1].opcode, kSendLast);
  EXPECT_EQ(re[1].psn, sq(2));
  EXPECT_EQ(re[1].payload, orig[2].payload);
  EXPECT_TRUE(poll(*scq).empty());
}

// Timing note: run_timers(t) compares `t` with deadlines the engine set from
// the real clock when it armed them. Tests pass either a time before the
// deadline that matters, or a "now" just past it and before the deadlines
// armed during the same call (tail-loss probe: 2 ms), as the progress thread
// would; a far-future `t` would also fire timers armed within the same call.

// Receive RNR NAK (timer code 0 = 655.36 ms) / Expect no retransmission before
// the timer — neither by the local ACK timeout (67 ms) nor by a tail-loss
// probe — and none for WRs posted during the wait.
TEST_F(Requester, RnrNakStopsSendingUntilTimer) {
  auto t0 = Clock::now();
  send(1, 64);
  ASSERT_EQ(take().size(), 1u);
  ack(sq(0), rnr_nak(0));
  EXPECT_TRUE(take().empty());
  EXPECT_TRUE(poll(*scq).empty());
  run_timers(t0 + std::chrono::milliseconds(3));
  run_timers(t0 + std::chrono::milliseconds(500));
  EXPECT_TRUE(take().empty());
  send(2, 64);
  EXPECT_TRUE(take().empty()) << "posting during the RNR wait sends nothing";
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
}

// Receive RNR NAK (code 0) on a QP without ACK timer / Expect, once the 655 ms
// have passed, the NAKed PSN resent and then the WR posted during the wait.
class RequesterNoAckTimer : public Requester {
 protected:
  void SetUp() override {
    timeout = 0;  // no local ACK timer, no probes
    Requester::SetUp();
  }
};
TEST_F(RequesterNoAckTimer, RnrNakRetransmitsAfterTimer) {
  send(1, 64);
  auto orig = take();
  ASSERT_EQ(orig.size(), 1u);
  auto t_nak = Clock::now();
  ack(sq(0), rnr_nak(0));
  send(2, 64);
  run_timers(t_nak + std::chrono::milliseconds(600));
  EXPECT_TRUE(take().empty());
  run_timers(Clock::now() + std::chrono::milliseconds(700));
  auto re = take();
  ASSERT_EQ(re.size(), 2u);
  EXPECT_EQ(re[0].opcode, kSendOnly);
  EXPECT_EQ(re[0].psn, sq(0));
  EXPECT_EQ(re[0].payload, orig[0].payload);
  EXPECT_EQ(re[1].psn, sq(1));
  ack(sq(1));
  EXPECT_EQ(poll(*scq).size(), 2u);
}

// Receive an RNR NAK with timer code 14 (1.28 ms) / Expect nothing 1 ms after
// it, the NAKed packet resent 1.5 ms after it (the wait comes from the
// syndrome, §2.4).
TEST_F(Requester, RnrNakTimerFromSyndrome) {
  send(1, 64);
  take();
  auto t_before = Clock::now();
  ack(sq(0), rnr_nak(14));
  run_timers(t_before + std::chrono::microseconds(1000));
  EXPECT_TRUE(take().empty());
  run_timers(Clock::now() + std::chrono::microseconds(1500));
  auto re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].psn, sq(0));
}

// Receive rnr_retry+1 RNR NAKs / Expect rnr_retry resends, then
// IBV_WC_RNR_RETRY_EXC_ERR and the QP in ERR.
TEST_F(Requester, RnrRetryExhausted) {
  send(1, 64);
  take();
  for (int i = 0; i < rnr_retry; ++i) {
    ack(sq(0), rnr_nak(1));  // 0.01 ms
    run_timers(Clock::now() + std::chrono::milliseconds(1));
    auto re = take();
    ASSERT_EQ(re.size(), 1u) << "retry " << i;
    EXPECT_TRUE(poll(*scq).empty());
  }
  ack(sq(0), rnr_nak(1));
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
}

// Nothing acknowledged for 2 ms / Expect a tail-loss probe (go-back-N resend)
// that does not use up retry_cnt: retry_cnt timeouts later the QP is still in
// RTS.
TEST_F(Requester, TailLossProbeDoesNotUseRetryBudget) {
  auto t_before = Clock::now();
  send(1, 10);
  auto t_after = Clock::now();
  take();
  run_timers(t_before + std::chrono::microseconds(1500));
  EXPECT_TRUE(take().empty());
  run_timers(t_after + std::chrono::milliseconds(3));
  auto re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].psn, sq(0));
  for (int i = 0; i < retry_cnt; ++i) run_timers(Clock::now() + std::chrono::seconds(1));
  EXPECT_EQ(take().size(), size_t(retry_cnt));
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
  EXPECT_TRUE(poll(*scq).empty());
}

// A tail-loss probe, then an ACK of the SEND and a second ACK of the same
// PSN (the responder's answer to the probe's duplicate) / Expect the next
// SEND's first probe to wait twice kFirstProbeInterval: the probe was
// spurious, the peer's ACKs are late rather than lost.
TEST_F(Requester, SpuriousProbeDoublesTheProbeFloor) {
  send(1, 10);
  take();
  run_timers(Clock::now() + kFirstProbeInterval + std::chrono::microseconds(500));
  ASSERT_EQ(take().size(), 1u);
  ack(sq(0));
  ack(sq(0));  // the duplicate's answer
  ASSERT_EQ(poll(*scq).size(), 1u);
  auto t_before = Clock::now();
  send(2, 10);
  auto t_after = Clock::now();
  take();
  run_timers(t_before + 2 * kFirstProbeInterval - std::chrono::microseconds(500));
  EXPECT_TRUE(take().empty()) << "probed before the raised floor";
  run_timers(t_after + 2 * kFirstProbeInterval + std::chrono::microseconds(500));
  auto re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].psn, sq(1));
}

// A spurious probe (floor 2 x kFirstProbeInterval), then two SENDs whose
// probes are each answered by one ACK (needed: losses) / Expect the fourth
// SEND probed after kFirstProbeInterval again: the second needed probe's
// resend judged the first one needed and halved the floor (a network that
// duplicates an ACK now and then must not raise it for good).
TEST_F(Requester, NeededProbeLowersARaisedFloor) {
  auto probe_after = [&](uint64_t wr_id, Clock::duration wait, int acks) {
    send(wr_id, 10);
    auto t_after = Clock::now();
    take();
    run_timers(t_after + wait + std::chrono::microseconds(500));
    auto re = take();
    for (int i = 0; i < acks; ++i) ack(sq(uint32_t(wr_id - 1)));
    poll(*scq);
    return re.size();
  };
  EXPECT_EQ(probe_after(1, kFirstProbeInterval, 2), 1u);  // spurious: floor x2
  EXPECT_EQ(probe_after(2, 2 * kFirstProbeInterval, 1), 1u);
  EXPECT_EQ(probe_after(3, 2 * kFirstProbeInterval, 1), 1u);  // judges probe 2 needed: floor / 2
  EXPECT_EQ(probe_after(4, kFirstProbeInterval, 1), 1u);
}

// A tail-loss probe answered by one ACK (the SEND's last packet, or its ACK,
// was lost: the probe was needed) / Expect the next SEND probed after
// kFirstProbeInterval again.
TEST_F(Requester, NeededProbeKeepsTheProbeFloor) {
  send(1, 10);
  take();
  run_timers(Clock::now() + kFirstProbeInterval + std::chrono::microseconds(500));
  ASSERT_EQ(take().size(), 1u);
  ack(sq(0));
  ASSERT_EQ(poll(*scq).size(), 1u);
  send(2, 10);
  auto t_after = Clock::now();
  take();
  run_timers(t_after + kFirstProbeInterval + std::chrono::microseconds(500));
  auto re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].psn, sq(1));
}

// Local ACK timeout 18 (1.07 s): room for probes after long round trips.
class RequesterSlowAcks : public Requester {
 protected:
  void SetUp() override {
    timeout = 18;
    Requester::SetUp();
  }
};

// A first SEND acknowledged at least 10 ms after it left (a round trip of
// 10 ms or more, as when ACKs queue behind a deep socket buffer), then a
// second SEND with no ACK / Expect no probe within 29 ms (a fixed 2 ms probe
// would resend data that is only late), and one after three round trips.
TEST_F(RequesterSlowAcks, FirstProbeWaitsForThreeRoundTrips) {
  auto t0 = Clock::now();
  send(1, 10);
  take();
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ack(sq(0));
  auto rtt_bound = Clock::now() - t0;  // the sample is at most this, however late ack() ran
  ASSERT_EQ(poll(*scq).size(), 1u);
  auto t_before = Clock::now();
  send(2, 10);
  auto t_after = Clock::now();
  take();
  run_timers(t_after + std::chrono::milliseconds(3));
  EXPECT_TRUE(take().empty()) << "probed before the round trip had passed";
  run_timers(t_before + std::chrono::milliseconds(29));
  EXPECT_TRUE(take().empty()) << "probed before 3 round trips";
  run_timers(t_after + 3 * rtt_bound + std::chrono::milliseconds(5));
  auto re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].psn, sq(1));
}

// A 10-packet SEND, not answered / Expect the first probe to resend only its
// newest packet (PSN 9), the second only the oldest (PSN 0), each with
// AckReq, and a SEND posted after them to go on at PSN 10: a probe never
// resends a window (a peer whose ACKs are late would get it all twice).
TEST_F(RequesterSlowAcks, ProbesResendOnePacketNewestThenOldest) {
  auto t0 = Clock::now();
  send(1, 10 * kMtu);
  ASSERT_EQ(take().size(), 10u);
  run_timers(t0 + std::chrono::milliseconds(3));
  auto re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].psn, sq(9));
  EXPECT_TRUE(re[0].ack_req);
  run_timers(Clock::now() + std::chrono::milliseconds(10));
  re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].psn, sq(0));
  EXPECT_EQ(re[0].opcode, kSendFirst);
  EXPECT_TRUE(re[0].ack_req);
  send(2, 10);
  re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].psn, sq(10));
}

// A SEND, then a READ, neither answered, local ACK timeout 1.07 s / Expect no
// probe in the first 500 ms (a responder executes a re-sent READ again: a
// slow one was livelocked by probes), then at the local ACK timeout the SEND
// resent (alone: the window restarts from one packet); its ACK / Expect the
// READ request resent unchanged.
TEST_F(RequesterSlowAcks, NoProbeWhileAReadIsOutstanding) {
  std::vector<uint8_t> dst(3000, 0);
  core::Mr* m = reg(dst, IBV_ACCESS_LOCAL_WRITE);
  auto t0 = Clock::now();
  send(1, 10);
  ibv_send_wr wr{};
  wr.wr_id = 2;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.wr.rdma.remote_addr = 0x9000000;
  wr.wr.rdma.rkey = 0x5151;
  post_send(wr, {sge(dst.data(), 3000, m)});
  auto orig = take();
  ASSERT_EQ(orig.size(), 2u);
  for (int ms = 2; ms <= 500; ms *= 2) {
    run_timers(t0 + std::chrono::milliseconds(ms));
    EXPECT_TRUE(take().empty()) << "probed at " << ms << " ms";
  }
  run_timers(Clock::now() + std::chrono::milliseconds(1100));
  auto re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].psn, sq(0));
  ack(sq(0));
  re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].opcode, kReadRequest);
  EXPECT_EQ(re[0].psn, sq(1));
  EXPECT_EQ(re[0].reth_len, 3000u);
}

// Same-host ACK words (ack_board.h): a SEND, a READ, a SEND; the word
// acknowledging the last SEND is read before the READ's response has come
// (it is still in the ring behind the word) / Expect the first SEND complete,
// nothing resent (an ACK packet passing the READ would rewind: its responses
// lost), the QP marked to read its word again; then the READ's response /
// Expect the READ complete, and the word read again completes the last SEND.
TEST_F(Requester, BoardAckWaitsForTheReadItPasses) {
  std::vector<uint8_t> dst(64, 0);
  core::Mr* m = reg(dst, IBV_ACCESS_LOCAL_WRITE);
  send(1, 10);
  post_read(2, 0x9000000, dst.data(), 13, m);
  send(3, 10);
  ASSERT_EQ(take().size(), 3u);
  {
    std::lock_guard ql(qp->mu);
    completer_receive_board(*qp, BoardAck{sq(2), 2}, TxBatch::local());
    TxBatch::local().flush();
    EXPECT_TRUE(qp->board.behind_read);
  }
  EXPECT_TRUE(take().empty());
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  deliver(Craft{.opcode = kReadRespOnly, .psn = sq(1), .msn = 2, .payload = pattern(13, 1)});
  wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 2u);
  {
    std::lock_guard ql(qp->mu);
    completer_receive_board(*qp, BoardAck{sq(2), 2}, TxBatch::local());
    EXPECT_FALSE(qp->board.behind_read);
  }
  wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 3u);
  EXPECT_TRUE(take().empty());
}

// The word's encoding (ack_board.h): PSN and MSN back as written; a word of
// another responder QP (its low 15 bits), or a cell never written, is none.
TEST(BoardWord, CarriesPsnAndMsnOfItsResponderOnly) {
  uint64_t w = board_word(BoardAck{0xABCDEF, 0x123456}, 0x05A1B2);
  auto a = board_ack(w, 0x05A1B2);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->psn, 0xABCDEFu);
  EXPECT_EQ(a->msn, 0x123456u);
  EXPECT_FALSE(board_ack(w, 0x05A1B3).has_value());
  EXPECT_FALSE(board_ack(0, 0).has_value());
  EXPECT_EQ(board_cell(0x05A1B2), 0xA1B2u);
}

// A SEND acknowledged at least 40 ms after it left (srtt 40 ms, rttvar 20:
// a round-trip timeout of 120 ms at least), then a SEND with no ACK, local
// ACK timeout 67 ms / Expect nothing resent at 100 ms (past the QP's
// timeout, which is a minimum: the peer is slower than it), the resend by
// 4 x 67 ms (the most the timer waits).
TEST_F(Requester, LocalAckTimerWaitsForASlowPeerUpToFourTimes) {
  send(1, 10);
  take();
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  ack(sq(0));
  ASSERT_EQ(poll(*scq).size(), 1u);
  send(2, 10);
  auto t_after = Clock::now();
  ASSERT_EQ(take().size(), 1u);
  run_timers(t_after + std::chrono::milliseconds(100));
  EXPECT_TRUE(take().empty()) << "resent before the measured round trip's timeout";
  run_timers(t_after + 4 * std::chrono::microseconds(67109) + std::chrono::milliseconds(1));
  auto re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].psn, sq(1));
}

// No ACK arrives / Expect nothing resent before the timer, the oldest
// outstanding packet resent after each local ACK timeout (alone, with AckReq:
// the window restarts from one packet), retry_cnt such resends, then
// IBV_WC_RETRY_EXC_ERR for the WR, FLUSH_ERR for the next and the QP in ERR.
TEST_F(Requester, LocalAckTimeoutRetransmitsThenRetryExceeded) {
  auto t0 = Clock::now();
  send(1, 2 * kMtu);
  send(2, 10);
  auto orig = take();
  ASSERT_EQ(orig.size(), 3u);
  run_timers(t0);
  EXPECT_TRUE(take().empty());
  for (int i = 0; i < retry_cnt; ++i) {
    run_timers(Clock::now() + std::chrono::seconds(1));
    auto re = take();
    ASSERT_EQ(re.size(), 1u) << "retry " << i;
    EXPECT_EQ(re[0].psn, orig[0].psn);
    EXPECT_EQ(re[0].opcode, orig[0].opcode);
    EXPECT_EQ(re[0].payload, orig[0].payload);
    EXPECT_TRUE(re[0].ack_req);
    EXPECT_TRUE(poll(*scq).empty());
  }
  run_timers(Clock::now() + std::chrono::seconds(1));
  EXPECT_TRUE(take().empty());
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
}

// A timeout resend followed by an ACK / Expect the retry budget restored by the
// forward progress (the next WR gets retry_cnt resends again).
TEST_F(Requester, ProgressRestoresRetryBudget) {
  send(1, 10);
  take();
  for (int i = 0; i < retry_cnt; ++i) run_timers(Clock::now() + std::chrono::seconds(1));
  EXPECT_EQ(take().size(), size_t(retry_cnt));
  ack(sq(0));
  ASSERT_EQ(poll(*scq).size(), 1u);
  send(2, 10);
  take();
  for (int i = 0; i < retry_cnt; ++i) run_timers(Clock::now() + std::chrono::seconds(1));
  EXPECT_EQ(take().size(), size_t(retry_cnt));
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
  EXPECT_TRUE(poll(*scq).empty());
}

// Post an RDMA READ of 2 MTU + 452 into a 3-entry SGE list / Expect one
// READ_REQUEST with RETH (va, rkey, length) and AckReq; receive READ_RESPONSE
// FIRST/MIDDLE/LAST / Expect the data scattered over the SGEs and an RDMA_READ
// completion with byte_len; the next request takes the PSN after the responses.
TEST_F(Requester, ReadScattersResponses) {
  std::vector<uint8_t> d1(1000, 0), d2(1500, 0), d3(600, 0);
  core::Mr* m1 = reg(d1, IBV_ACCESS_LOCAL_WRITE);
  core::Mr* m2 = reg(d2, IBV_ACCESS_LOCAL_WRITE);
  core::Mr* m3 = reg(d3, IBV_ACCESS_LOCAL_WRITE);
  const uint32_t len = 2 * kMtu + 452;  // 2500 bytes: 1000 + 1000 + 500 over the three SGEs
  ibv_send_wr wr{};
  wr.wr_id = 21;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = 0x9000000;
  wr.wr.rdma.rkey = 0x5151;
  post_send(wr, {sge(d1.data(), 1000, m1), sge(d2.data(), 1000, m2), sge(d3.data(), len - 2000, m3)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kReadRequest);
  EXPECT_EQ(tx[0].psn, sq(0));
  EXPECT_TRUE(tx[0].ack_req);
  ASSERT_TRUE(tx[0].reth_va.has_value());
  EXPECT_EQ(*tx[0].reth_va, 0x9000000u);
  EXPECT_EQ(tx[0].reth_rkey, 0x5151u);
  EXPECT_EQ(tx[0].reth_len, len);
  EXPECT_TRUE(tx[0].payload.empty());

  auto data = pattern(len, 42);
  std::vector<uint8_t> a(data.begin(), data.begin() + kMtu), b(data.begin() + kMtu, data.begin() + 2 * kMtu),
      c(data.begin() + 2 * kMtu, data.end());
  deliver(Craft{.opcode = kReadRespFirst, .psn = sq(0), .msn = 1, .payload = a});
  deliver(Craft{.opcode = kReadRespMiddle, .psn = sq(1), .payload = b});
  EXPECT_TRUE(poll(*scq).empty());
  deliver(Craft{.opcode = kReadRespLast, .psn = sq(2), .msn = 1, .payload = c});
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 21u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wc[0].byte_len, len);
  EXPECT_TRUE(std::equal(data.begin(), data.begin() + 1000, d1.begin()));
  EXPECT_TRUE(std::equal(data.begin() + 1000, data.begin() + 2000, d2.begin()));
  EXPECT_TRUE(std::equal(data.begin() + 2000, data.end(), d3.begin()));
  EXPECT_EQ(d2[1000], 0) << "nothing beyond the SGE length";
  EXPECT_EQ(d3[len - 2000], 0);

  send(22, 4);
  auto next = take();
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].psn, sq(3));
}

// Receive READ_RESPONSE_ONLY for a small READ / Expect completion and data.
TEST_F(Requester, ReadResponseOnly) {
  std::vector<uint8_t> d(64, 0);
  core::Mr* m = reg(d, IBV_ACCESS_LOCAL_WRITE);
  post_read(5, 0x1000, d.data(), 13, m);
  ASSERT_EQ(take().size(), 1u);
  auto data = pattern(13, 1);
  deliver(Craft{.opcode = kReadRespOnly, .psn = sq(0), .msn = 1, .payload = data});
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].byte_len, 13u);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), d.begin()));
}

// Lose READ_RESPONSE_MIDDLE (LAST arrives after FIRST) / Expect the READ
// re-requested from the first missing response: RETH va/len advanced by one
// MTU, PSN sq(1).
TEST_F(Requester, ReadResponseGapReRequests) {
  std::vector<uint8_t> d(4096, 0);
  core::Mr* m = reg(d, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.wr_id = 5;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = 0x100000;
  wr.wr.rdma.rkey = 0x22;
  const uint32_t len = 2 * kMtu + 100;
  post_send(wr, {sge(d.data(), len, m)});
  take();
  auto data = pattern(len, 3);
  deliver(Craft{.opcode = kReadRespFirst, .psn = sq(0), .payload = {data.begin(), data.begin() + kMtu}});
  deliver(Craft{.opcode = kReadRespLast, .psn = sq(2), .payload = {data.begin() + 2 * kMtu, data.end()}});
  auto re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].opcode, kReadRequest);
  EXPECT_EQ(re[0].psn, sq(1));
  EXPECT_EQ(*re[0].reth_va, 0x100000u + kMtu);
  EXPECT_EQ(re[0].reth_len, len - kMtu);
  EXPECT_TRUE(poll(*scq).empty());
  // The re-requested responses complete the READ.
  deliver(Craft{.opcode = kReadRespFirst, .psn = sq(1), .payload = {data.begin() + kMtu, data.begin() + 2 * kMtu}});
  deliver(Craft{.opcode = kReadRespLast, .psn = sq(2), .payload = {data.begin() + 2 * kMtu, data.end()}});
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), d.begin()));
}

// Thirty-one other QPs of the context are sending: the QP's share of the
// window is 32 PSNs (1024 / 32).
class RequesterShare32 : public Requester {
 protected:
  void SetUp() override {
    Requester::SetUp();
    core::QpCaps caps{64, 64, 4, 4, 64};
    for (int i = 0; i < 31; ++i) {
      others_.push_back(std::make_unique<EngineQp>(engine, pd.get(), scq.get(), rcq.get(), IBV_QPT_RC, caps, false,
                                                   engine->allocate_qp_num(), nullptr));
      std::lock_guard lock(others_.back()->mu);
      engine->count_sender(*others_.back(), true);
    }
  }
  void TearDown() override {
    for (auto& o : others_) {
      std::lock_guard lock(o->mu);
      engine->count_sender(*o, false);
    }
    others_.clear();
    Requester::TearDown();
  }
  // Response k of a READ of `data`: its k-th MTU.
  static std::vector<uint8_t> read_piece(const std::vector<uint8_t>& data, uint32_t k) {
    auto from = data.begin() + long(k) * kMtu;
    return std::vector<uint8_t>(from, std::min(from + kMtu, data.end()));
  }
  // Delivers responses [from, to) of a READ of `data` at PSNs sq(k): FIRST at
  // `from` if `starts`, LAST at to - 1 if `ends`, MIDDLEs otherwise.
  void respond_read(const std::vector<uint8_t>& data, uint32_t from, uint32_t to, uint32_t msn = 1, bool starts = true,
                    bool ends = true) {
    for (uint32_t k = from; k < to; ++k) {
      uint8_t op = starts && k == from ? kReadRespFirst : ends && k == to - 1 ? kReadRespLast : kReadRespMiddle;
      deliver(Craft{.opcode = op, .psn = sq(k), .msn = msn, .payload = read_piece(data, k)});
    }
  }
  std::vector<std::unique_ptr<EngineQp>> others_;
};

// Thirty-one other QPs of the context are sending (a share of 32 PSNs each);
// post a READ of 40 MTUs + 100 bytes (41 responses) / Expect a READ request
// for the share, 32 MTUs. Receive its 32 responses (FIRST, MIDDLEs, LAST) /
// Expect the next part requested: PSN sq(32), va and length advanced by 32
// MTUs, and no completion yet. Receive its responses / Expect the READ
// complete with all of its data.
TEST_F(RequesterShare32, ReadLargerThanTheShareIsRequestedInParts) {
  const uint32_t len = 40 * kMtu + 100;
  std::vector<uint8_t> d(len + 64, 0);
  post_read(9, 0x200000, d.data(), len, reg(d, IBV_ACCESS_LOCAL_WRITE));
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kReadRequest);
  EXPECT_EQ(tx[0].psn, sq(0));
  EXPECT_EQ(*tx[0].reth_va, 0x200000u);
  EXPECT_EQ(tx[0].reth_len, 32 * kMtu);

  auto data = pattern(len, 9);
  respond_read(data, 0, 32);
  EXPECT_TRUE(poll(*scq).empty());
  tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kReadRequest);
  EXPECT_EQ(tx[0].psn, sq(32));
  EXPECT_EQ(*tx[0].reth_va, 0x200000u + 32 * kMtu);
  EXPECT_EQ(tx[0].reth_len, 8 * kMtu + 100);

  respond_read(data, 32, 41, 2);
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 9u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].byte_len, len);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), d.begin()));
  EXPECT_EQ(d[len], 0);
}

// The same READ in parts of 32; lose its second response / Expect the
// re-request to ask from the lost one to the end of the first part only
// (PSN sq(1), va + 1 MTU, 31 MTUs): the responder replays only a range
// inside a request it remembers, and a re-request reaching into the next
// part was dropped there, for ever (fault.rc_stress.read_parts hung).
TEST_F(RequesterShare32, ReadReRequestStaysInsideItsPart) {
  const uint32_t len = 40 * kMtu + 100;
  std::vector<uint8_t> d(len, 0);
  post_read(0, 0x200000, d.data(), len, reg(d, IBV_ACCESS_LOCAL_WRITE));
  ASSERT_EQ(take().size(), 1u);
  auto data = pattern(len, 9);
  deliver(Craft{.opcode = kReadRespFirst, .psn = sq(0), .msn = 1, .payload = read_piece(data, 0)});
  deliver(Craft{.opcode = kReadRespMiddle, .psn = sq(2), .payload = read_piece(data, 2)});
  auto re = take();
  ASSERT_EQ(re.size(), 1u);
  EXPECT_EQ(re[0].opcode, kReadRequest);
  EXPECT_EQ(re[0].psn, sq(1));
  EXPECT_EQ(*re[0].reth_va, 0x200000u + kMtu);
  EXPECT_EQ(re[0].reth_len, 31 * kMtu);
}

// One READ credit (max_rd_atomic 1), and the share of 32 PSNs.
class RequesterOneReadCredit : public RequesterShare32 {
 protected:
  RequesterOneReadCredit() { max_rd_atomic = 1; }
};

// Post a READ of 40 MTUs + 100 (two parts) and a READ of one MTU / Expect the
// first part's request alone: each part is a READ request on the wire, which
// max_rd_atomic bounds. Receive twenty responses and post a SEND / Expect
// nothing sent, though the window has room. Receive the rest of the part /
// Expect the second part (its LAST gave the credit back), still not the other
// READ. Receive the second part / Expect the first READ complete and the
// other READ requested, and the SEND.
TEST_F(RequesterOneReadCredit, EachPartOfAReadTakesACredit) {
  const uint32_t len = 40 * kMtu + 100;
  std::vector<uint8_t> d(len + kMtu, 0);
  core::Mr* m = reg(d, IBV_ACCESS_LOCAL_WRITE);
  post_read(1, 0x200000, d.data(), len, m);
  post_read(2, 0x400000, d.data() + len, kMtu, m);
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].reth_len, 32 * kMtu);

  auto data = pattern(len, 5);
  // Twenty responses in (12 in flight: a post runs the requester, the QP no
  // longer streams), the window has room for the second part (9 packets),
  // but its request would be the second on the wire: nothing goes (the SEND
  // waits behind the READ).
  respond_read(data, 0, 20, 1, true, false);
  send(3, 4);
  EXPECT_TRUE(take().empty());
  respond_read(data, 20, 32, 1, false, true);
  tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].psn, sq(32));
  EXPECT_EQ(*tx[0].reth_va, 0x200000u + 32 * kMtu);
  respond_read(data, 32, 41);
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  tx = take();
  ASSERT_EQ(tx.size(), 2u);  // the other READ, then the SEND behind it
  EXPECT_EQ(tx[0].opcode, kReadRequest);
  EXPECT_EQ(tx[0].psn, sq(41));
  EXPECT_EQ(*tx[0].reth_va, 0x400000u);
  EXPECT_EQ(tx[1].psn, sq(42));
}

// A READ's response LAST shorter than the MTU while more of the READ is
// left / Expect IBV_WC_BAD_RESP_ERR: only a READ's last response may be
// short (a part ends at a multiple of the MTU).
TEST_F(Requester, ShortReadResponseBeforeTheEndIsABadResponse) {
  std::vector<uint8_t> d(4 * kMtu, 0);
  core::Mr* m = reg(d, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.wr_id = 4;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = 0x1000;
  wr.wr.rdma.rkey = 0x22;
  post_send(wr, {sge(d.data(), 3 * kMtu, m)});
  ASSERT_EQ(take().size(), 1u);
  deliver(Craft{.opcode = kReadRespFirst, .psn = sq(0), .msn = 1, .payload = pattern(kMtu, 1)});
  deliver(Craft{.opcode = kReadRespLast, .psn = sq(1), .msn = 1, .payload = pattern(100, 2)});
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_BAD_RESP_ERR);
}

// sq_psn near the wrap: a 3-packet SEND from 0xFFFFFE / Expect PSNs 0xFFFFFE,
// 0xFFFFFF, 0 and completion on ACK(0).
class RequesterWrap : public Requester {
 protected:
  void SetUp() override {
    sq_psn = 0xFFFFFE;
    Requester::SetUp();
  }
};
TEST_F(RequesterWrap, PsnWrapsAt24Bits) {
  send(1, 2 * kMtu + 1);
  auto tx = take();
  ASSERT_EQ(tx.size(), 3u);
  EXPECT_EQ(tx[0].psn, 0xFFFFFEu);
  EXPECT_EQ(tx[1].psn, 0xFFFFFFu);
  EXPECT_EQ(tx[2].psn, 0u);
  ack(0xFFFFFF);
  EXPECT_TRUE(poll(*scq).empty());
  ack(0);
  EXPECT_EQ(poll(*scq).size(), 1u);
}

// A WR whose SGE names an invalid lkey / Expect IBV_WC_LOC_PROT_ERR, nothing
// sent.
TEST_F(Requester, BadLkeyIsLocalProtectionError) {
  ibv_send_wr wr{};
  wr.wr_id = 9;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_sge bad{reinterpret_cast<uint64_t>(src.data()), 16, src_mr->ibmr.lkey + 0x100};
  post_send(wr, {bad});
  EXPECT_TRUE(take().empty());
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 9u);
  EXPECT_EQ(wc[0].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
}

// Inline SEND / Expect the bytes copied at post time (buffer may change
// afterwards).
TEST_F(Requester, InlineSendCopiesAtPost) {
  std::vector<uint8_t> inl = pattern(40, 77);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
  ibv_sge s{reinterpret_cast<uint64_t>(inl.data()), 40, 0};
  post_send(wr, {s});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].payload, inl);
}

// Post a 2 MiB SEND (2048 packets) on one QP / Expect `window` packets, no
// more until an ACK. Then a second QP of the context streams too / Expect the
// two to share the window: the first, acknowledged, sends up to half of it.
// (The QPs' congestion windows are opened fully, as after slow start: the
// share is what is tested here; CongestionWindow below tests cwnd.)
class RequesterWindow : public Requester {
 protected:
  static void open_cwnd(EngineQp* q) { q->comp.cwnd = q->comp.ssthresh = kMaxCwnd; }

  void expect_shared_window(uint32_t window) {
    open_cwnd(qp);
    std::vector<uint8_t> big(2 << 20, 3);
    core::Mr* big_mr = reg(big, IBV_ACCESS_LOCAL_WRITE);
    ibv_send_wr wr{};
    wr.wr_id = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    post_send(wr, {sge(big.data(), uint32_t(big.size()), big_mr)});
    EXPECT_EQ(take().size(), window);
    EXPECT_EQ(engine->senders(), 1u);

    // A second QP, connected like the first, starts a stream of its own.
    core::QpCaps caps{64, 64, 4, 4, 64};
    EngineQp* first = qp;
    qp = new EngineQp(engine, pd.get(), scq.get(), rcq.get(), IBV_QPT_RC, caps, false, engine->allocate_qp_num(),
                      nullptr);
    engine->register_qp(qp);
    bring_up();
    open_cwnd(qp);
    post_send(wr, {sge(big.data(), uint32_t(big.size()), big_mr)});
    EXPECT_EQ(take().size(), window / 2);  // shared by two senders
    EXPECT_EQ(engine->senders(), 2u);
    engine->unregister_qp(qp);
    delete qp;
    qp = first;
    EXPECT_EQ(engine->senders(), 1u);

    // Acknowledge the first QP's first 100 packets: it may have the whole
    // window in flight again (it is the only sender left), so it sends 100 more.
    ack(wire::psn_add(sq_psn, 99));
    EXPECT_EQ(take().size(), 100u);
  }
};

// Through a socket / Expect a window of 1024 PSNs.
TEST_F(RequesterWindow, QpsStreamingAtOnceShareTheWindow) { expect_shared_window(1024); }

// Through shared memory / Expect 512: 1024 MTU packets could fill the
// sender's ring.
TEST_F(RequesterWindow, QpsStreamingThroughMemoryShareASmallerWindow) {
  transport->memory_path = true;
  redecide_delivery();
  expect_shared_window(512);
}

// QP A streams a 2 MiB SEND alone (the whole window, 1024 packets); QP B
// then streams one too (its share, 512). Receive one burst with an ACK for
// each: A's of 520 packets (504 left in flight, its share 512) and B's of 8 /
// Expect the 16 packets the two ACKs release in one send (one system call),
// A's first: the stream's run in the burst leaves its packets for the
// burst's end.
TEST_F(RequesterWindow, AcksOfOneBurstReleaseOneSend) {
  std::vector<uint8_t> big(2 << 20, 3);
  core::Mr* big_mr = reg(big, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  open_cwnd(qp);
  post_send(wr, {sge(big.data(), uint32_t(big.size()), big_mr)});
  EXPECT_EQ(take().size(), 1024u);
  core::QpCaps caps{64, 64, 4, 4, 64};
  EngineQp* a = qp;
  auto b = std::make_unique<EngineQp>(engine, pd.get(), scq.get(), rcq.get(), IBV_QPT_RC, caps, false,
                                      engine->allocate_qp_num(), nullptr);
  qp = b.get();
  engine->register_qp(qp);
  bring_up();
  open_cwnd(qp);
  post_send(wr, {sge(big.data(), uint32_t(big.size()), big_mr)});
  EXPECT_EQ(take().size(), 512u);
  qp = a;

  unsigned sends = 0;
  transport->on_send = [&](size_t) { ++sends; };
  deliver({Craft{.opcode = kAck, .psn = wire::psn_add(sq_psn, 519), .syndrome = 0x1F, .msn = 1},
           Craft{.opcode = kAck, .psn = wire::psn_add(sq_psn, 7), .dest_qp = b->qp_num(), .syndrome = 0x1F, .msn = 1}});
  transport->on_send = nullptr;
  auto tx = take();
  ASSERT_EQ(tx.size(), 16u);
  EXPECT_EQ(sends, 1u);
  for (size_t i = 0; i < tx.size(); ++i)
    EXPECT_EQ(tx[i].psn, wire::psn_add(sq_psn, i < 8 ? 1024 + i : 512 + i - 8)) << i;
  engine->unregister_qp(b.get());
}

// Post a 2 MiB SEND on a new QP through a socket / Expect rxe's window, 128
// packets. ACK the first 100 / Expect the window grown by them (slow start:
// 228), so 200 more. NAK (sequence error) at 150 / Expect the window at half
// of what was in flight (328 - 150 = 178: 89; not half the 278 the window
// had grown to, which slow start overshot by the time the NAK came), and 89
// packets resent from 150. The same NAK again / Expect no second halving.
// A NAK at 160 (a resent packet lost in turn) / Expect half again: 44 from 160.
TEST_F(Requester, CongestionWindowStartsAtRxesGrowsAndHalvesOnLoss) {
  std::vector<uint8_t> big(2 << 20, 3);
  core::Mr* big_mr = reg(big, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  post_send(wr, {sge(big.data(), uint32_t(big.size()), big_mr)});
  EXPECT_EQ(take().size(), kInitialCwnd);
  ack(sq(99));
  auto tx = take();
  ASSERT_EQ(tx.size(), 200u);
  EXPECT_EQ(tx.front().psn, sq(128));
  ack(sq(150), nak(0));
  tx = take();
  ASSERT_EQ(tx.size(), 89u);
  EXPECT_EQ(tx.front().psn, sq(150));
  EXPECT_EQ(qp->comp.cwnd, 89u);
  ack(sq(150), nak(0));
  tx = take();
  ASSERT_EQ(tx.size(), 89u);
  EXPECT_EQ(qp->comp.cwnd, 89u);
  ack(sq(160), nak(0));
  tx = take();
  ASSERT_EQ(tx.size(), 44u);
  EXPECT_EQ(tx.front().psn, sq(160));
  EXPECT_EQ(qp->comp.cwnd, 44u);
}

// Through shared memory / Expect no congestion window: the whole 512.
TEST_F(Requester, NoCongestionWindowThroughMemory) {
  transport->memory_path = true;
  redecide_delivery();
  std::vector<uint8_t> big(2 << 20, 3);
  core::Mr* big_mr = reg(big, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  post_send(wr, {sge(big.data(), uint32_t(big.size()), big_mr)});
  EXPECT_EQ(take().size(), 512u);
}

// Thirty-one other QPs of the context are sending; post a 1 MiB SEND / Expect
// the QP's share of the window, 32 packets, with AckReq on every 16th (half
// the share), so that an ACK is on its way before the share is full. (Every
// 64th would leave the share full without one, waiting for a tail-loss probe.)
TEST_F(RequesterShare32, ShareOfTheWindowAsksForAnAckEveryHalfShare) {
  std::vector<uint8_t> big(1 << 20, 3);
  core::Mr* big_mr = reg(big, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  post_send(wr, {sge(big.data(), uint32_t(big.size()), big_mr)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 32u);  // 1024 shared by 32 senders
  for (size_t i = 0; i < tx.size(); ++i) EXPECT_EQ(tx[i].ack_req, i % 16 == 15) << i;
}

}  // namespace
}  // namespace uroce::engine::test
