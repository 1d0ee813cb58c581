// Congestion notification (engine/ecn.h, RoCEv2 annex A17.9): a packet that
// arrives marked Congestion Experienced is answered with a CNP to the QP that
// sent it, at most one per kCnpInterval; a CNP for a sending RC QP halves its
// congestion window once per window and resends nothing.
#include "engine/ecn.h"

#include <thread>

#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

constexpr uint8_t kCnp = 0x81;

class Ecn : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    bring_up();
  }
  uint64_t stat(const std::atomic<uint64_t>& c) const { return c.load(); }
};

// Receive SEND_ONLY marked CE with a receive posted / Expect a CNP, then the ACK,
// the CNP to the peer QP with the bytes of a ConnectX CNP (roce-facts.md §3.2
// V1: opcode 0x81, BECN, P_Key 0xFFFF, PSN 0, 16 zero bytes); the SEND
// completes as any other.
TEST_F(Ecn, MarkedPacketIsAnsweredWithACnp) {
  std::vector<uint8_t> buf(256);
  recv_buf(buf, 1);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = pattern(64, 1), .ce = true});
  ASSERT_EQ(sent.size(), 2u);
  std::vector<uint8_t> cnp;
  for (const Sent& s : sent)
    if (s.bytes[0] == kCnp) cnp = without_icrc(s);
  const std::vector<uint8_t> expected = {
      0x81, 0x00, 0xFF, 0xFF, 0x40, 0x00, 0x07, 0x77, 0, 0, 0, 0, 0, 0,
      0,    0,    0,    0,    0,    0,    0,    0,    0, 0, 0, 0, 0, 0};  // DestQP kPeerQpn 0x000777
  EXPECT_EQ(cnp, expected);
  auto tx = take();  // addressed to the peer, ICRC correct
  ASSERT_EQ(tx.size(), 2u);
  EXPECT_EQ(tx[0].opcode, kCnp);  // at once; the ACK at the burst's end
  EXPECT_EQ(tx[1].opcode, kAck);
  EXPECT_EQ(poll(*rcq).size(), 1u);
  EXPECT_EQ(stat(engine->stats.rx_ecn_ce), 1u);
  EXPECT_EQ(stat(engine->stats.tx_cnps), 1u);
}

// Receive a burst of 8 WRITE packets, all marked CE / Expect one CNP (the
// burst's packets arrived at one instant, and one CNP goes per kCnpInterval),
// 8 marks counted; after kCnpInterval another marked packet / Expect a second
// CNP.
TEST_F(Ecn, OneCnpPerIntervalForABurstOfMarks) {
  std::vector<uint8_t> dst(8 * kMtu);
  core::Mr* mr = reg(dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  std::vector<Craft> burst;
  for (uint32_t i = 0; i < 8; ++i) {
    uint8_t op = i == 0 ? kWriteFirst : i == 7 ? kWriteLast : kWriteMiddle;
    Craft c{.opcode = op, .psn = rq(i), .payload = pattern(kMtu, uint8_t(i)), .ce = true};
    if (i == 0) {
      c.reth_va = reinterpret_cast<uintptr_t>(dst.data());
      c.reth_rkey = mr->ibmr.rkey;
      c.reth_len = uint32_t(dst.size());
    }
    burst.push_back(c);
  }
  deliver(burst);
  auto count_cnps = [&] {
    unsigned n = 0;
    for (const Pkt& p : take()) n += p.opcode == kCnp;
    return n;
  };
  EXPECT_EQ(count_cnps(), 1u);
  EXPECT_EQ(stat(engine->stats.rx_ecn_ce), 8u);
  std::this_thread::sleep_for(kCnpInterval + std::chrono::microseconds(100));
  deliver(Craft{.opcode = kWriteOnly,
                .psn = rq(8),
                .reth_va = reinterpret_cast<uintptr_t>(dst.data()),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 4,
                .payload = {1, 2, 3, 4},
                .ce = true});
  EXPECT_EQ(count_cnps(), 1u);
  EXPECT_EQ(stat(engine->stats.tx_cnps), 2u);
}

// An unmarked packet / Expect no CNP.
TEST_F(Ecn, UnmarkedPacketGetsNoCnp) {
  std::vector<uint8_t> buf(256);
  recv_buf(buf, 1);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = pattern(64, 1)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kAck);
  EXPECT_EQ(stat(engine->stats.rx_ecn_ce), 0u);
}

// Post a 2 MiB SEND (the initial window goes out), ACK part of it so the window
// grows, then a CNP / Expect the window halved to half of what was in flight,
// nothing resent; a second CNP at once / Expect no second cut (one per window).
TEST_F(Ecn, CnpHalvesTheWindowOncePerWindowAndResendsNothing) {
  std::vector<uint8_t> big(2 << 20, 3);
  core::Mr* big_mr = reg(big, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  post_send(wr, {sge(big.data(), uint32_t(big.size()), big_mr)});
  EXPECT_EQ(take().size(), kInitialCwnd);
  deliver(Craft{.opcode = kAck, .psn = sq(99), .syndrome = wire::kAckNoCredit, .msn = 1});
  EXPECT_EQ(take().size(), 200u);  // 100 acknowledged: cwnd 228, 228 in flight
  ASSERT_EQ(qp->comp.cwnd, 228u);
  deliver(Craft{.opcode = kCnp, .psn = 0, .dest_qp = qp->qp_num()});
  EXPECT_EQ(qp->comp.cwnd, 114u);
  EXPECT_TRUE(take().empty());
  deliver(Craft{.opcode = kCnp, .psn = 0, .dest_qp = qp->qp_num()});
  EXPECT_EQ(qp->comp.cwnd, 114u);
  EXPECT_EQ(stat(engine->stats.rx_cnps), 2u);
  EXPECT_EQ(qp->comp.retry_left, retry_cnt);  // not a loss: no retry used
}

// A CNP from another address, and one for a QP that does not exist / Expect
// the window unchanged, counted as bad path and no QP.
TEST_F(Ecn, CnpFromElsewhereOrForNoQpIsDropped) {
  uint32_t cwnd = qp->comp.cwnd;
  deliver(Craft{.opcode = kCnp, .psn = 0, .dest_qp = qp->qp_num(), .src_ip = 0x7F000002});
  deliver(Craft{.opcode = kCnp, .psn = 0, .dest_qp = 0xABCDE});
  EXPECT_EQ(qp->comp.cwnd, cwnd);
  EXPECT_EQ(stat(engine->stats.rx_bad_path), 1u);
  EXPECT_EQ(stat(engine->stats.rx_no_qp), 1u);
  EXPECT_EQ(stat(engine->stats.rx_cnps), 0u);
}

}  // namespace
}  // namespace uroce::engine::test
