// Same-host jumbo packets (ShmTransport::send_jumbo, responder.cc's
// jumbo_span): one packet standing for several path-MTU packets, one PSN
// each. The responder takes it as those packets (length rules, ePSN, the
// ACK's PSN); nothing but an RC SEND/WRITE request may come as one; the
// requester sends large RC messages as jumbos where the transport takes them,
// with the PSNs of the MTU packets they replace, and retransmits them the same;
// the context counts the QPs that stream large WRITEs.
#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

class Jumbo : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    bring_up();
  }
  void ack(uint32_t psn, uint8_t syndrome = 0x1F) {
    deliver(Craft{.opcode = kAck, .psn = psn, .syndrome = syndrome, .msn = 1});
  }
};

// Receive a jumbo WRITE_FIRST of 4 MTUs and a jumbo WRITE_LAST of 2500 bytes
// (3 PSNs) / Expect the message written, one ACK for its last PSN (ePSN + 6),
// and the next request expected at ePSN + 7.
TEST_F(Jumbo, WriteTakesThePsnsOfItsMtuPackets) {
  std::vector<uint8_t> target(8 * kMtu, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  auto data = pattern(4 * kMtu + 2500, 5);
  auto va = reinterpret_cast<uint64_t>(target.data());
  std::vector<uint8_t> a(data.begin(), data.begin() + 4 * kMtu), b(data.begin() + 4 * kMtu, data.end());
  deliver({Craft{.opcode = kWriteFirst,
                 .psn = rq(0),
                 .ack_req = true,
                 .reth_va = va,
                 .reth_rkey = mr->ibmr.rkey,
                 .reth_len = uint32_t(data.size()),
                 .payload = a,
                 .jumbo = true},
           Craft{.opcode = kWriteLast, .psn = rq(4), .ack_req = true, .payload = b, .jumbo = true}});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kAck);
  EXPECT_EQ(tx[0].syndrome, wire::kAckNoCredit);
  EXPECT_EQ(tx[0].psn, rq(6));
  EXPECT_TRUE(std::equal(data.begin(), data.end(), target.begin()));
  EXPECT_EQ(target[data.size()], 0) << "nothing written past the message";

  std::vector<uint8_t> buf(64, 0);
  recv_buf(buf, 7);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(7), .ack_req = true, .payload = {1, 2}});
  tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].syndrome, wire::kAckNoCredit);
  EXPECT_EQ(tx[0].psn, rq(7));
  EXPECT_EQ(poll(*rcq).size(), 1u);
}

// Receive a jumbo SEND_ONLY of 3000 bytes / Expect one RECV completion of
// 3000 bytes and the ACK for PSN ePSN + 2 (3 MTU packets' worth).
TEST_F(Jumbo, SendOnlyCompletesOnce) {
  std::vector<uint8_t> buf(4 * kMtu, 0xEE);
  recv_buf(buf, 9);
  auto data = pattern(3000, 2);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = data, .jumbo = true});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].psn, rq(2));
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].byte_len, 3000u);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), buf.begin()));
  EXPECT_EQ(buf[3000], 0xEE);
}

// Receive a jumbo WRITE_FIRST whose payload is not a whole number of MTUs /
// Expect NAK invalid request (every packet but a message's last is a full
// MTU) and the QP in ERR, nothing written.
TEST_F(Jumbo, FirstOfPartMtusIsInvalidRequest) {
  std::vector<uint8_t> target(4 * kMtu, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  deliver(Craft{.opcode = kWriteFirst,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = reinterpret_cast<uint64_t>(target.data()),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 3 * kMtu,
                .payload = pattern(kMtu + 500, 1),
                .jumbo = true});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].syndrome, nak(1));
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
  EXPECT_EQ(target[0], 0);
}

// Receive jumbo packets that are not RC SEND/WRITE requests (an ACK, a READ
// request) / Expect them dropped and counted as malformed: nothing sent,
// nothing completed.
TEST_F(Jumbo, OnlyRcSendAndWriteRequestsMayBeJumbo) {
  uint64_t before = engine->stats.rx_malformed.load();
  deliver(Craft{.opcode = kAck, .psn = sq(0), .syndrome = 0x1F, .msn = 1, .jumbo = true});
  deliver(Craft{.opcode = kReadRequest, .psn = rq(0), .ack_req = true, .reth_len = 8, .jumbo = true});
  EXPECT_EQ(engine->stats.rx_malformed.load(), before + 2);
  EXPECT_TRUE(take().empty());
  EXPECT_TRUE(poll(*scq).empty());
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
}

// Receive the same WRITE without ICRC, but as an ordinary datagram (not from
// shared memory) / Expect it dropped for its ICRC: only the shared-memory
// path may leave the ICRC out.
TEST_F(Jumbo, NoIcrcOnlyThroughSharedMemory) {
  std::vector<uint8_t> target(4 * kMtu, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  Craft c{.opcode = kWriteOnly,
          .psn = rq(0),
          .ack_req = true,
          .reth_va = reinterpret_cast<uint64_t>(target.data()),
          .reth_rkey = mr->ibmr.rkey,
          .reth_len = 100,
          .payload = pattern(100, 1),
          .jumbo = true};
  auto bytes = build(c);
  transport::RxDatagram d;
  d.data = bytes.data();
  d.len = uint32_t(bytes.size());
  d.src = transport::Endpoint{kPeerIp, kPeerPort};
  d.dst_ip = local_ip;
  d.dst_port = kLocalPort;
  d.jumbo = false;
  uint64_t before = engine->stats.rx_bad_icrc.load();
  engine->process_burst(std::span(&d, 1), EngineContext::Turn::kProgress);
  EXPECT_EQ(engine->stats.rx_bad_icrc.load(), before + 1);
  EXPECT_TRUE(take().empty());
  EXPECT_EQ(target[0], 0);
}

// Receive a jumbo WRITE_ONLY (2 PSNs), then the same PSN again with other
// bytes / Expect the second acknowledged as a duplicate (ACK for ePSN - 1),
// not written.
TEST_F(Jumbo, DuplicateIsAckedNotReexecuted) {
  std::vector<uint8_t> target(4 * kMtu, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  auto first = pattern(kMtu + 10, 1), second = pattern(kMtu + 10, 77);
  Craft c{.opcode = kWriteOnly,
          .psn = rq(0),
          .ack_req = true,
          .reth_va = reinterpret_cast<uint64_t>(target.data()),
          .reth_rkey = mr->ibmr.rkey,
          .reth_len = kMtu + 10,
          .payload = first,
          .jumbo = true};
  deliver(c);
  EXPECT_EQ(take().at(0).psn, rq(1));
  c.payload = second;
  deliver(c);
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].syndrome, wire::kAckNoCredit);
  EXPECT_EQ(tx[0].psn, rq(1));
  EXPECT_TRUE(std::equal(first.begin(), first.end(), target.begin()));
}

// Post a 70000-byte WRITE with a transport that takes 16-MTU jumbos /
// Expect five jumbo packets at PSNs +0, +16, +32, +48, +64 (FIRST with the
// RETH, MIDDLEs, LAST of 4464 bytes), each asking for an ACK; the ACK of the
// last PSN (+68) completes it. A NAK sequence error at +32 resends from +32.
TEST_F(Jumbo, RequesterSendsLargeWritesAsJumbos) {
  transport->jumbo_payload = 16 * kMtu;
  redecide_delivery();
  std::vector<uint8_t> src = pattern(70000, 3);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.wr_id = 21;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = 0x900000;
  wr.wr.rdma.rkey = 0x1234;
  post_send(wr, {sge(src.data(), uint32_t(src.size()), mr)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 5u);
  const uint8_t opcodes[] = {kWriteFirst, kWriteMiddle, kWriteMiddle, kWriteMiddle, kWriteLast};
  std::vector<uint8_t> joined;
  for (unsigned i = 0; i < 5; ++i) {
    EXPECT_TRUE(tx[i].jumbo);
    EXPECT_EQ(tx[i].opcode, opcodes[i]);
    EXPECT_EQ(tx[i].psn, sq(16 * i));
    EXPECT_TRUE(tx[i].ack_req);
    EXPECT_EQ(tx[i].payload.size(), i < 4 ? 16 * kMtu : 70000 - 64 * kMtu);
    joined.insert(joined.end(), tx[i].payload.begin(), tx[i].payload.end());
  }
  EXPECT_EQ(tx[0].reth_va, 0x900000u);
  EXPECT_EQ(tx[0].reth_len, 70000u);
  EXPECT_EQ(joined, src);

  ack(sq(31));
  deliver(Craft{.opcode = kAck, .psn = sq(32), .syndrome = nak(0), .msn = 1});
  tx = take();
  ASSERT_EQ(tx.size(), 3u) << "go-back-N from the NAK's PSN";
  EXPECT_EQ(tx[0].psn, sq(32));
  EXPECT_EQ(tx[0].opcode, kWriteMiddle);
  EXPECT_TRUE(std::equal(tx[0].payload.begin(), tx[0].payload.end(), src.begin() + 32 * kMtu));
  EXPECT_EQ(tx[2].psn, sq(64));
  EXPECT_TRUE(poll(*scq).empty());

  ack(sq(68));
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 21u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
}

// Post a 1000-byte SEND with jumbos available / Expect an ordinary packet
// with its ICRC: small messages keep the batched MTU packets.
TEST_F(Jumbo, SmallMessagesStayMtuPackets) {
  transport->jumbo_payload = 16 * kMtu;
  redecide_delivery();
  std::vector<uint8_t> src = pattern(1000, 3);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  post_send(wr, {sge(src.data(), uint32_t(src.size()), mr)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_FALSE(tx[0].jumbo);
  EXPECT_EQ(tx[0].opcode, kSendOnly);
}

// Note large WRITEs of QPs 1, 2, 1 within a millisecond / Expect 1, 2, 2
// writers counted; 2 ms later QP 3 alone counts 1 (the others are stale).
// More than one makes WRITE streams placed rather than sent as jumbos.
TEST_F(Jumbo, RecentLargeWritersAreCountedPerQp) {
  Clock::time_point t0 = Clock::now();
  EXPECT_EQ(engine->note_large_write(1, t0), 1u);
  EXPECT_EQ(engine->note_large_write(2, t0 + std::chrono::microseconds(100)), 2u);
  EXPECT_EQ(engine->note_large_write(1, t0 + std::chrono::microseconds(500)), 2u);
  EXPECT_EQ(engine->note_large_write(3, t0 + std::chrono::milliseconds(3)), 1u);
  for (uint32_t qpn = 10; qpn < 10 + 2 * EngineContext::kTrackedWriters; ++qpn)
    EXPECT_LE(engine->note_large_write(qpn, t0 + std::chrono::milliseconds(4)), EngineContext::kTrackedWriters);
}

}  // namespace
}  // namespace uroce::engine::test
