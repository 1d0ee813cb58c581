// A QP's Delivery (engine/delivery.h): decided when the QP goes to RTR from
// how the transport reaches the peer, and again when a same-host peer goes
// away (the transport no longer takes a jumbo to it as local, or a local ACK
// timeout); the requester follows it. Through shared memory an RC ACK is a
// word on the peer requester's board when its transport takes one.
#include "engine/ack_board.h"
#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

class DeliveryTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    bring_up();
  }
  // RESET, then connected again (RTR decides the delivery anew).
  void reconnect() {
    {
      std::lock_guard lock(qp->mu);
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_RESET;
      ASSERT_EQ(qp->modify(a, IBV_QP_STATE), 0);
    }
    bring_up();
  }
  void post_write(std::vector<uint8_t>& src, core::Mr* mr) {
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = 0x900000;
    wr.wr.rdma.rkey = 0x1234;
    post_send(wr, {sge(src.data(), uint32_t(src.size()), mr)});
  }
};

// Connected over a socket; the peer then becomes reachable through shared
// memory with jumbos, and the QP connects again / Expect a socket's delivery
// first (the transport's later answers change nothing by themselves), then
// the same-host one with its jumbo limit, its window of 512 and no coalescing.
TEST_F(DeliveryTest, DecidedWhenTheQpGoesToRtr) {
  EXPECT_EQ(qp->delivery.path(), DeliveryPath::kSocket);
  EXPECT_EQ(qp->delivery.window_psns(), Delivery::kSocketWindowPsns);
  EXPECT_EQ(qp->delivery.coalesce_from(), Delivery::kCoalescePackets);
  transport->memory_path = true;
  transport->jumbo_payload = 16 * kMtu;
  EXPECT_EQ(qp->delivery.path(), DeliveryPath::kSocket);
  EXPECT_EQ(qp->delivery.jumbo_limit(), 0u);

  reconnect();
  EXPECT_EQ(qp->delivery.path(), DeliveryPath::kSharedMemory);
  EXPECT_EQ(qp->delivery.jumbo_limit(), 16 * kMtu);
  EXPECT_EQ(qp->delivery.window_psns(), Delivery::kWindowPsns);
  EXPECT_FALSE(qp->delivery.congestion_controlled());
  EXPECT_EQ(qp->delivery.coalesce_from(), 0u);
}

// An RC QP connected through shared memory (bare packets) to a peer whose
// board takes words; a SEND request / Expect its ACK as a word in the
// requester's cell (its PSN, MSN 1, this QP's number) and no ACK packet,
// the receive completion released. The board refused / Expect the
// ACKNOWLEDGE packet as before.
TEST_F(DeliveryTest, SameHostAckIsAWordOnTheBoard) {
  transport->memory_path = true;
  transport->board_open = true;
  reconnect();
  std::vector<uint8_t> buf(64, 0);
  recv_buf(buf, 1);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = {1, 2, 3}, .bare = true});
  EXPECT_TRUE(take().empty());
  ASSERT_EQ(transport->board.size(), 1u);
  EXPECT_EQ(transport->board[0].cell, board_cell(kPeerQpn));
  EXPECT_EQ(transport->board[0].dst, qp->path.dst);
  auto ack = board_ack(transport->board[0].word, qp->qp_num());
  ASSERT_TRUE(ack.has_value());
  EXPECT_EQ(ack->psn, rq(0));
  EXPECT_EQ(ack->msn, 1u);
  EXPECT_EQ(poll(*rcq).size(), 1u);

  transport->board_open = false;
  recv_buf(buf, 2);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(1), .ack_req = true, .payload = {4}, .bare = true});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kAck);
  EXPECT_EQ(tx[0].psn, rq(1));
  EXPECT_EQ(poll(*rcq).size(), 1u);
}

// Connected to a same-host peer that takes jumbos; the peer goes away (the
// transport takes nothing through memory any more); post a 70000-byte WRITE /
// Expect it sent whole as 69 MTU packets at consecutive PSNs (the refused
// jumbo's place taken by the first of them), and the delivery decided again:
// through a socket, no jumbos.
TEST_F(DeliveryTest, PeerGoneMidwayIsDecidedAgain) {
  transport->memory_path = true;
  transport->jumbo_payload = 16 * kMtu;
  reconnect();
  ASSERT_EQ(qp->delivery.jumbo_limit(), 16 * kMtu);
  transport->memory_path = false;
  transport->jumbo_payload = 0;

  std::vector<uint8_t> src = pattern(70000, 3);
  post_write(src, reg(src, IBV_ACCESS_LOCAL_WRITE));
  auto tx = take();
  ASSERT_EQ(tx.size(), 69u);
  for (unsigned i = 0; i < tx.size(); ++i) {
    EXPECT_FALSE(tx[i].jumbo);
    EXPECT_EQ(tx[i].psn, sq(i));
  }
  EXPECT_EQ(qp->delivery.path(), DeliveryPath::kSocket);
  EXPECT_EQ(qp->delivery.jumbo_limit(), 0u);
}

// Connected through shared memory; the peer goes away; the local ACK timer
// of a SEND in flight expires / Expect the delivery decided again (a socket's)
// and the SEND resent.
TEST_F(DeliveryTest, LocalAckTimeoutDecidesAgain) {
  transport->memory_path = true;
  reconnect();
  ASSERT_TRUE(qp->delivery.through_memory());
  std::vector<uint8_t> src = pattern(100, 4);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  post_send(wr, {sge(src.data(), uint32_t(src.size()), mr)});
  ASSERT_EQ(take().size(), 1u);
  transport->memory_path = false;
  EXPECT_TRUE(qp->delivery.through_memory()) << "nothing noticed yet";
  run_timers(Clock::now() + std::chrono::seconds(10));
  EXPECT_FALSE(qp->delivery.through_memory());
  auto tx = take();
  ASSERT_GE(tx.size(), 1u);
  EXPECT_EQ(tx[0].psn, sq(0));
}

// Connected through shared memory; post a SEND, then receive a SEND / Expect
// both the request and the ACK sent bare (no ICRC, the datagram marked so);
// over a socket, with its ICRC.
TEST_F(DeliveryTest, PacketsThroughSharedMemoryGoBare) {
  transport->memory_path = true;
  reconnect();
  EXPECT_EQ(qp->delivery.icrc(), TxBatch::Icrc::kOmit);
  std::vector<uint8_t> src = pattern(64, 5), dst(64);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  recv_buf(dst, 9);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  post_send(wr, {sge(src.data(), 64, mr)});
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = pattern(64, 6), .bare = true});
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_TRUE(sent[0].bare);
  EXPECT_TRUE(sent[1].bare);
  auto tx = take();  // (checks the ICRC's room is zero)
  EXPECT_EQ(tx[0].opcode, kSendOnly);
  EXPECT_EQ(tx[1].opcode, kAck);
  EXPECT_EQ(dst, pattern(64, 6));

  transport->memory_path = false;
  reconnect();
  EXPECT_EQ(qp->delivery.icrc(), TxBatch::Icrc::kCompute);
  post_send(wr, {sge(src.data(), 64, mr)});
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_FALSE(sent[0].bare);
  take();  // (checks the ICRC)
}

// Receive bare packets (no ICRC) that no QP's Delivery sends bare: a UD SEND,
// one for QP1 / Expect both dropped and counted as malformed; a bare RC
// packet with a wrong ICRC is taken (nothing checks it).
TEST_F(DeliveryTest, OnlyRcAndUcPacketsMayComeBare) {
  uint64_t before = engine->stats.rx_malformed.load();
  deliver(Craft{.opcode = 0x64, .psn = rq(0), .dest_qp = 5, .deth_qkey = 1, .payload = pattern(8, 1), .bare = true});
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .dest_qp = 1, .payload = pattern(8, 1), .bare = true});
  EXPECT_EQ(engine->stats.rx_malformed.load(), before + 2);

  std::vector<uint8_t> dst(16);
  recv_buf(dst, 3);
  uint64_t bad_icrc = engine->stats.rx_bad_icrc.load();
  deliver(Craft{.opcode = kSendOnly,
                .psn = rq(0),
                .ack_req = true,
                .payload = pattern(16, 2),
                .corrupt_icrc = true,
                .bare = true});
  EXPECT_EQ(engine->stats.rx_bad_icrc.load(), bad_icrc);
  EXPECT_EQ(dst, pattern(16, 2));
  EXPECT_EQ(poll(*rcq).size(), 1u);
}

// Through shared memory, receive a SEND in an application's turn / Expect the
// ACK sent at the burst's end, before the completion is visible (it does not
// wait for the application's reply, as through a socket).
TEST_F(DeliveryTest, AckThroughSharedMemoryLeavesAtTheBurstsEnd) {
  transport->memory_path = true;
  reconnect();
  std::vector<uint8_t> dst(16);
  recv_buf(dst, 4);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = pattern(16, 3), .bare = true},
          EngineContext::Turn::kApplication);
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kAck);
  EXPECT_EQ(poll(*rcq).size(), 1u);

  transport->memory_path = false;
  reconnect();
  recv_buf(dst, 5);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = pattern(16, 4)},
          EngineContext::Turn::kApplication);
  EXPECT_TRUE(take().empty());  // through a socket it waits for the reply
  EXPECT_EQ(poll(*rcq).size(), 1u);
}

}  // namespace
}  // namespace uroce::engine::test
