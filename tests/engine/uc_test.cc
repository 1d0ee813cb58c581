// Unreliable Connected service (IBA 9.7.4.1 for UC, roce-facts.md §4): no ACKs,
// a PSN gap drops the rest of the message, nothing waits for acknowledgement.
#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

constexpr uint8_t kUc = 0x20;  // service bits of UC opcodes
constexpr uint8_t kWriteLastImm = 0x09;

class Uc : public EngineTest {
 protected:
  Uc() { qp_type = IBV_QPT_UC; }
  void SetUp() override {
    EngineTest::SetUp();
    bring_up();
  }

  // The i-th path-MTU piece of `data` (the last one may be short).
  static std::vector<uint8_t> part(const std::vector<uint8_t>& data, size_t i) {
    size_t begin = std::min(data.size(), i * kMtu), end = std::min(data.size(), (i + 1) * kMtu);
    return {data.begin() + long(begin), data.begin() + long(end)};
  }

  // A WRITE target registered for remote write.
  core::Mr* write_target(std::vector<uint8_t>& buf) {
    return reg(buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  }
  static uint64_t va(const std::vector<uint8_t>& buf, size_t off = 0) {
    return reinterpret_cast<uint64_t>(buf.data()) + off;
  }

  // Nothing was sent, the QP is still RTS and nothing completed on `cq`.
  void expect_silent_drop(core::Cq& cq) {
    EXPECT_TRUE(take().empty()) << "UC answers nothing (IBA 9.8.3: no ACK/NAK)";
    EXPECT_TRUE(poll(cq).empty());
    EXPECT_EQ(qp->state(), IBV_QPS_RTS);
  }

  // Receive UC SEND_ONLY(psn) with `data` / Expect it delivered into the
  // posted receive `wr_id` at offset 0 of `buf`.
  void expect_send_delivered(uint32_t psn, uint64_t wr_id, const std::vector<uint8_t>& buf) {
    auto data = pattern(48, uint8_t(psn));
    deliver(Craft{.opcode = kUc | kSendOnly, .psn = psn, .payload = data});
    auto wc = poll(*rcq);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].wr_id, wr_id);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[0].byte_len, data.size());
    EXPECT_TRUE(std::equal(data.begin(), data.end(), buf.begin()));
    EXPECT_TRUE(take().empty());
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

// --- requester ---------------------------------------------------------------

// Post a signaled UC SEND of 2 MTU + 300 bytes / Expect UC SEND_FIRST, MIDDLE,
// LAST (0x20-0x22) with consecutive PSNs from sq_psn, PMTU-sized FIRST/MIDDLE,
// AckReq never set (roce-facts §4.3), the WQE completed as soon as it is sent,
// and no retransmission however long no ACK comes (UC has no timer).
TEST_F(Uc, SendSegmentedByPathMtuCompletesWithoutAck) {
  auto src = pattern(2 * kMtu + 300, 3);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.wr_id = 21;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  post_send(wr, {sge(src.data(), uint32_t(src.size()), mr)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 3u);
  const uint8_t ops[3] = {kUc | kSendFirst, kUc | kSendMiddle, kUc | kSendLast};
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(tx[i].opcode, ops[i]);
    EXPECT_EQ(tx[i].psn, sq(uint32_t(i)));
    EXPECT_EQ(tx[i].dest_qp, kPeerQpn);
    EXPECT_FALSE(tx[i].ack_req);
    EXPECT_FALSE(tx[i].se);
    EXPECT_EQ(tx[i].payload, part(src, i));
  }
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 21u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(wc[0].qp_num, qp->qp_num());
  run_timers(Clock::now() + std::chrono::seconds(10));
  EXPECT_TRUE(take().empty()) << "UC never retransmits";
  EXPECT_TRUE(poll(*scq).empty());
}

// Post a solicited UC SEND_WITH_IMM of 10 bytes / Expect one SEND_ONLY_WITH_
// IMMEDIATE (0x25) carrying the immediate unchanged, SE set, pad 2, no AckReq.
TEST_F(Uc, SendWithImmediateAndSolicitedEvent) {
  auto src = pattern(10, 8);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED;
  wr.imm_data = 0xA1B2C3D4;
  post_send(wr, {sge(src.data(), uint32_t(src.size()), mr)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kUc | kSendOnlyImm);
  ASSERT_TRUE(tx[0].imm.has_value());
  EXPECT_EQ(*tx[0].imm, 0xA1B2C3D4u);
  EXPECT_TRUE(tx[0].se);
  EXPECT_FALSE(tx[0].ack_req);
  EXPECT_EQ(tx[0].pad, 2u);
  EXPECT_EQ(tx[0].payload, src);
  ASSERT_EQ(poll(*scq).size(), 1u);
}

// Post a UC RDMA WRITE_WITH_IMM of 2 MTU + 1 bytes / Expect RDMA_WRITE_FIRST
// (0x26) with RETH = (remote address, R_Key, whole length), MIDDLE (0x27)
// without RETH, LAST_WITH_IMMEDIATE (0x29) with the immediate; no AckReq; an
// RDMA_WRITE completion at once.
TEST_F(Uc, WriteWithImmediateSegmentedByPathMtu) {
  auto src = pattern(2 * kMtu + 1, 6);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.wr_id = 5;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = 0x01020304;
  wr.wr.rdma.remote_addr = 0x7700001000;
  wr.wr.rdma.rkey = 0x4321;
  post_send(wr, {sge(src.data(), uint32_t(src.size()), mr)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 3u);
  EXPECT_EQ(tx[0].opcode, kUc | kWriteFirst);
  ASSERT_TRUE(tx[0].reth_va.has_value());
  EXPECT_EQ(*tx[0].reth_va, 0x7700001000u);
  EXPECT_EQ(tx[0].reth_rkey, 0x4321u);
  EXPECT_EQ(tx[0].reth_len, src.size());
  EXPECT_FALSE(tx[0].imm.has_value());
  EXPECT_EQ(tx[1].opcode, kUc | kWriteMiddle);
  EXPECT_FALSE(tx[1].reth_va.has_value());
  EXPECT_EQ(tx[2].opcode, kUc | kWriteLastImm);
  ASSERT_TRUE(tx[2].imm.has_value());
  EXPECT_EQ(*tx[2].imm, 0x01020304u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(tx[i].psn, sq(uint32_t(i)));
    EXPECT_FALSE(tx[i].ack_req);
    EXPECT_EQ(tx[i].payload, part(src, i));
  }
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 5u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_WRITE);
}

// Post ATOMIC_CMP_AND_SWP and ATOMIC_FETCH_AND_ADD on a UC QP / Expect EINVAL
// for both and nothing queued (IBA 9.4: UC has no atomics; rdma-core rxe's
// validate_send_wr: no UC mask for them).
TEST_F(Uc, AtomicsAreRejectedAtPost) {
  std::vector<uint8_t> local(8, 0);
  core::Mr* mr = reg(local, IBV_ACCESS_LOCAL_WRITE);
  ibv_sge s = sge(local.data(), 8, mr);
  for (ibv_wr_opcode op : {IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD}) {
    ibv_send_wr wr{};
    wr.opcode = op;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.wr.atomic.remote_addr = 0x1000;
    wr.wr.atomic.rkey = 1;
    std::lock_guard lock(qp->mu);
    EXPECT_EQ(qp->enqueue_send(wr), EINVAL) << op;
  }
  EXPECT_EQ(qp->sq.posted, 0u);
}

// Post SEND_WITH_INV on a UC QP / Expect EINVAL at post and nothing queued:
// SEND_*_WITH_INVALIDATE opcodes exist for RC and XRC only (IBA 9.2 opcode
// table; roce-facts §1.2), as rdmavt's qpt_support for IB_WR_SEND_WITH_INV is
// RC only. (It was once accepted, and the packet left without its BTH: UC has
// no opcode for it.)
TEST_F(Uc, SendWithInvalidateIsRejected) {
  auto src = pattern(16, 1);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  ibv_sge s = sge(src.data(), 16, mr);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND_WITH_INV;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.invalidate_rkey = 0x1234;
  wr.sg_list = &s;
  wr.num_sge = 1;
  std::lock_guard lock(qp->mu);
  EXPECT_EQ(qp->enqueue_send(wr), EINVAL);
  EXPECT_EQ(qp->sq.posted, 0u);
}

// --- responder -----------------------------------------------------------------

// Receive UC RDMA_WRITE_ONLY to a valid R_Key (iova != address) / Expect the
// bytes written there, no receive WQE consumed, nothing sent; the next SEND
// (ePSN + 1) is delivered into the posted receive.
TEST_F(Uc, WriteOnlyWritesMemoryWithoutAck) {
  std::vector<uint8_t> target(1024, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 0x5000000);
  std::vector<uint8_t> rbuf(64, 0);
  recv_buf(rbuf, 9);
  auto data = pattern(200, 7);
  deliver(Craft{.opcode = kUc | kWriteOnly,
                .psn = rq(0),
                .reth_va = 0x5000000 + 8,
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 200,
                .payload = data});
  EXPECT_TRUE(take().empty());
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), target.begin() + 8));
  EXPECT_EQ(target[7], 0);
  EXPECT_EQ(target[208], 0);
  expect_send_delivered(rq(1), 9, rbuf);
}

// Receive UC RDMA_WRITE_FIRST, MIDDLE, LAST_WITH_IMMEDIATE / Expect the whole
// message written, then the receive WQE consumed: IBV_WC_RECV_RDMA_WITH_IMM,
// byte_len = the RETH length (roce-facts §5.2), the immediate, its buffer
// untouched; nothing sent.
TEST_F(Uc, WriteWithImmediateConsumesReceive) {
  std::vector<uint8_t> target(4096, 0);
  core::Mr* mr = write_target(target);
  std::vector<uint8_t> rbuf(32, 0xEE);
  recv_buf(rbuf, 44);
  auto data = pattern(2 * kMtu + 77, 12);
  deliver({Craft{.opcode = kUc | kWriteFirst,
                 .psn = rq(0),
                 .reth_va = va(target, 100),
                 .reth_rkey = mr->ibmr.rkey,
                 .reth_len = uint32_t(data.size()),
                 .payload = part(data, 0)},
           Craft{.opcode = kUc | kWriteMiddle, .psn = rq(1), .payload = part(data, 1)},
           Craft{.opcode = kUc | kWriteLastImm, .psn = rq(2), .imm = 0x55667788, .payload = part(data, 2)}});
  EXPECT_TRUE(take().empty());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), target.begin() + 100));
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 44u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(wc[0].byte_len, data.size());
  EXPECT_TRUE(wc[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(wc[0].imm_data, 0x55667788u);
  EXPECT_EQ(wc[0].qp_num, qp->qp_num());
  for (uint8_t b : rbuf) EXPECT_EQ(b, 0xEE);
}

// Receive UC RDMA_WRITE_FIRST, (MIDDLE lost), LAST_WITH_IMMEDIATE, then a new
// WRITE (FIRST, LAST_WITH_IMMEDIATE) after a further gap / Expect the broken
// message's LAST neither written nor completed (IBA 9.8.3: the rest of the
// message is dropped, no NAK), and the next message, resynchronized on its
// FIRST, written whole and completed into the receive the first one left.
TEST_F(Uc, WriteGapDropsRestOfMessage) {
  std::vector<uint8_t> target(4 * kMtu, 0), other(2 * kMtu, 0);
  core::Mr* mr = write_target(target);
  core::Mr* mo = write_target(other);
  std::vector<uint8_t> rbuf(16, 0);
  recv_buf(rbuf, 31);
  auto data = pattern(3 * kMtu, 1);
  deliver({Craft{.opcode = kUc | kWriteFirst,
                 .psn = rq(0),
                 .reth_va = va(target),
                 .reth_rkey = mr->ibmr.rkey,
                 .reth_len = uint32_t(data.size()),
                 .payload = part(data, 0)},
           Craft{.opcode = kUc | kWriteLastImm, .psn = rq(2), .imm = 1, .payload = part(data, 2)}});
  expect_silent_drop(*rcq);
  EXPECT_TRUE(std::equal(data.begin(), data.begin() + kMtu, target.begin())) << "FIRST was placed";
  for (size_t i = kMtu; i < target.size(); ++i) ASSERT_EQ(target[i], 0) << i;

  auto next = pattern(kMtu + 9, 2);
  deliver({Craft{.opcode = kUc | kWriteFirst,
                 .psn = rq(5),
                 .reth_va = va(other),
                 .reth_rkey = mo->ibmr.rkey,
                 .reth_len = uint32_t(next.size()),
                 .payload = part(next, 0)},
           Craft{.opcode = kUc | kWriteLastImm, .psn = rq(6), .imm = 2, .payload = part(next, 1)}});
  EXPECT_TRUE(std::equal(next.begin(), next.end(), other.begin()));
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 31u);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(wc[0].byte_len, next.size());
  EXPECT_EQ(wc[0].imm_data, 2u);
  EXPECT_TRUE(take().empty());
}

// Receive UC RDMA_WRITE_ONLY_WITH_IMMEDIATE with no receive posted / Expect it
// dropped silently (only RC answers RNR: rxe's RESPST_ERR_RNR, UD/UC class D),
// counted, memory untouched; after a receive is posted the next one completes.
TEST_F(Uc, WriteWithImmediateWithoutReceiveIsDropped) {
  std::vector<uint8_t> target(256, 0);
  core::Mr* mr = write_target(target);
  uint64_t before = engine->stats.rx_no_recv_wqe.load();
  Craft c{.opcode = kUc | kWriteOnlyImm,
          .psn = rq(0),
          .reth_va = va(target),
          .reth_rkey = mr->ibmr.rkey,
          .reth_len = 16,
          .imm = 7,
          .payload = pattern(16, 1)};
  deliver(c);
  expect_silent_drop(*rcq);
  EXPECT_EQ(engine->stats.rx_no_recv_wqe.load(), before + 1);
  for (uint8_t b : target) ASSERT_EQ(b, 0);

  std::vector<uint8_t> rbuf(16, 0);
  recv_buf(rbuf, 3);
  c.psn = rq(1);
  deliver(c);
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 3u);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(wc[0].imm_data, 7u);
  EXPECT_EQ(target[0], pattern(16, 1)[0]);
}

// Receive UC RDMA_WRITE_FIRST with an R_Key that names no MR, then its MIDDLE
// and LAST / Expect the whole message dropped silently: no NAK, memory
// untouched, the QP still RTS and its posted receive not flushed (UC, no SRQ:
// rxe's RESPST_ERR_RKEY_VIOLATION class E); the next SEND is delivered.
TEST_F(Uc, WriteWithBadRkeyIsDroppedSilently) {
  std::vector<uint8_t> target(4096, 0);
  core::Mr* mr = write_target(target);
  std::vector<uint8_t> rbuf(64, 0);
  recv_buf(rbuf, 8);
  auto data = pattern(2 * kMtu + 5, 2);
  deliver({Craft{.opcode = kUc | kWriteFirst,
                 .psn = rq(0),
                 .reth_va = va(target),
                 .reth_rkey = mr->ibmr.rkey + 0x100,
                 .reth_len = uint32_t(data.size()),
                 .payload = part(data, 0)},
           Craft{.opcode = kUc | kWriteMiddle, .psn = rq(1), .payload = part(data, 1)},
           Craft{.opcode = kUc | kWriteLast, .psn = rq(2), .payload = part(data, 2)}});
  expect_silent_drop(*rcq);
  for (uint8_t b : target) ASSERT_EQ(b, 0);
  expect_send_delivered(rq(3), 8, rbuf);
}

// Receive UC RDMA_WRITE_ONLY reaching one byte past its MR / Expect it dropped
// silently (no NAK, QP RTS) and nothing written, not even the part in bounds.
TEST_F(Uc, WriteBeyondRegionIsDroppedSilently) {
  std::vector<uint8_t> target(256, 0);
  core::Mr* mr = write_target(target);
  deliver(Craft{.opcode = kUc | kWriteOnly,
                .psn = rq(0),
                .reth_va = va(target, 241),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 16,
                .payload = pattern(16, 1)});
  expect_silent_drop(*rcq);
  for (uint8_t b : target) ASSERT_EQ(b, 0);
}

// Receive UC SEND_ONLY one byte longer than the posted receive / Expect it
// dropped without a completion or NAK (UC, no SRQ: rxe's RESPST_ERR_LENGTH,
// class D), the buffer untouched and the WQE kept for the next message.
TEST_F(Uc, SendLargerThanReceiveIsDropped) {
  std::vector<uint8_t> rbuf(64, 0xEE);
  recv_buf(rbuf, 6);
  deliver(Craft{.opcode = kUc | kSendOnly, .psn = rq(0), .payload = pattern(65, 1)});
  expect_silent_drop(*rcq);
  for (uint8_t b : rbuf) ASSERT_EQ(b, 0xEE);
  expect_send_delivered(rq(1), 6, rbuf);
}

// Receive UC SEND_FIRST that fits the posted receive and a SEND_LAST that
// overflows it / Expect the message dropped at LAST without a completion or
// NAK, and the next message delivered into the same WQE from its start.
TEST_F(Uc, SendOverflowingReceiveMidwayIsDropped) {
  std::vector<uint8_t> rbuf(kMtu + 64, 0);
  recv_buf(rbuf, 7);
  auto big = pattern(kMtu + 65, 4);
  deliver({Craft{.opcode = kUc | kSendFirst, .psn = rq(0), .payload = part(big, 0)},
           Craft{.opcode = kUc | kSendLast, .psn = rq(1), .payload = part(big, 1)}});
  expect_silent_drop(*rcq);
  expect_send_delivered(rq(2), 7, rbuf);
}

// Receive a UC SEND of MTU + 500 bytes into a receive of three SGEs (100 and
// 1000 bytes of one MR, 2000 of another) / Expect the bytes scattered in SGE
// order across both packets, byte_len the message length, the rest untouched.
TEST_F(Uc, SendScattersAcrossSges) {
  std::vector<uint8_t> a(1100, 0xEE), b(2000, 0xEE);
  core::Mr* ma = reg(a, IBV_ACCESS_LOCAL_WRITE);
  core::Mr* mb = reg(b, IBV_ACCESS_LOCAL_WRITE);
  post_recv(12, {sge(a.data(), 100, ma), sge(a.data() + 100, 1000, ma), sge(b.data(), 2000, mb)});
  auto data = pattern(kMtu + 500, 9);
  deliver({Craft{.opcode = kUc | kSendFirst, .psn = rq(0), .payload = part(data, 0)},
           Craft{.opcode = kUc | kSendLast, .psn = rq(1), .payload = part(data, 1)}});
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 12u);
  EXPECT_EQ(wc[0].byte_len, kMtu + 500);
  EXPECT_TRUE(std::equal(data.begin(), data.begin() + 1100, a.begin()));
  const size_t rest = data.size() - 1100;
  EXPECT_TRUE(std::equal(data.begin() + 1100, data.end(), b.begin()));
  EXPECT_EQ(b[rest], 0xEE);
  EXPECT_TRUE(take().empty());
}

// Receive a UC SEND (FIRST, LAST), then its LAST again (an old PSN) / Expect
// the repeat dropped: no second completion, nothing sent. Then SEND_ONLY with
// the old FIRST's PSN / Expect it taken as a new message (UC keeps no
// duplicate window: any FIRST/ONLY starts a message, rxe's check_psn for UC).
TEST_F(Uc, OldPsnMiddleOfMessageIsDropped) {
  std::vector<uint8_t> rbuf(4096, 0);
  recv_buf(rbuf, 1);
  recv_buf(rbuf, 2);
  auto data = pattern(kMtu + 10, 3);
  deliver({Craft{.opcode = kUc | kSendFirst, .psn = rq(0), .payload = part(data, 0)},
           Craft{.opcode = kUc | kSendLast, .psn = rq(1), .payload = part(data, 1)}});
  ASSERT_EQ(poll(*rcq).size(), 1u);
  deliver(Craft{.opcode = kUc | kSendLast, .psn = rq(1), .payload = part(data, 1)});
  expect_silent_drop(*rcq);
  expect_send_delivered(rq(0), 2, rbuf);
}

// Receive UC SEND_MIDDLE and SEND_LAST at ePSN with no FIRST before them /
// Expect them dropped silently, the QP still RTS (on RC: NAK invalid request;
// UC: rxe's RESPST_ERR_MISSING_OPCODE_FIRST, class D1E), and the next
// SEND_ONLY delivered.
TEST_F(Uc, MiddleWithoutFirstIsDropped) {
  std::vector<uint8_t> rbuf(4096, 0);
  recv_buf(rbuf, 4);
  deliver({Craft{.opcode = kUc | kSendMiddle, .psn = rq(0), .payload = pattern(kMtu, 1)},
           Craft{.opcode = kUc | kSendLast, .psn = rq(1), .payload = pattern(10, 1)}});
  expect_silent_drop(*rcq);
  expect_send_delivered(rq(2), 4, rbuf);
}

// Receive UC SEND_ONLY with no receive posted / Expect it dropped silently and
// counted: no RNR NAK (only RC answers RNR), the QP RTS; once a receive is
// posted the next message (not the lost one) is delivered.
TEST_F(Uc, SendWithoutReceiveIsDroppedNotRnrNaked) {
  uint64_t before = engine->stats.rx_no_recv_wqe.load();
  deliver(Craft{.opcode = kUc | kSendOnly, .psn = rq(0), .payload = pattern(20, 1)});
  expect_silent_drop(*rcq);
  EXPECT_EQ(engine->stats.rx_no_recv_wqe.load(), before + 1);
  std::vector<uint8_t> rbuf(64, 0);
  recv_buf(rbuf, 5);
  expect_send_delivered(rq(1), 5, rbuf);
}

// Receive an RC SEND_ONLY and a UD SEND_ONLY addressed to the UC QP / Expect
// both dropped and counted as the wrong service (rxe: the opcode's service
// must match the QP type), the posted receive kept.
TEST_F(Uc, OtherServicesOpcodesAreDropped) {
  std::vector<uint8_t> rbuf(64, 0);
  recv_buf(rbuf, 2);
  uint64_t before = engine->stats.rx_wrong_service.load();
  deliver({Craft{.opcode = kSendOnly, .psn = rq(0), .payload = pattern(8, 1)},
           Craft{.opcode = 0x64, .psn = rq(0), .deth_qkey = 1, .deth_src_qp = 5, .payload = pattern(8, 1)}});
  expect_silent_drop(*rcq);
  EXPECT_EQ(engine->stats.rx_wrong_service.load(), before + 2);
  expect_send_delivered(rq(0), 2, rbuf);
}

// A UC QP whose access flags do not permit remote writes.
class UcNoRemoteWrite : public Uc {
 protected:
  UcNoRemoteWrite() { qp_access = IBV_ACCESS_LOCAL_WRITE; }
};

// Receive UC RDMA_WRITE_ONLY on a QP without IBV_ACCESS_REMOTE_WRITE / Expect
// it dropped silently: nothing written, nothing sent, the QP still RTS and the
// next SEND delivered (rxe's check_op_valid, IB_QPT_UC: drop_msg, RESPST_EXIT;
// IBA 9.8.3: UC has no NAK, and its opcode table has no ACKNOWLEDGE).
// (It was once a NAK with opcode 0x31, not a UC opcode, and the QP in ERR.)
TEST_F(UcNoRemoteWrite, WriteIsDroppedSilently) {
  std::vector<uint8_t> target(64, 0);
  core::Mr* mr = write_target(target);
  std::vector<uint8_t> rbuf(64, 0);
  recv_buf(rbuf, 3);
  deliver(Craft{.opcode = kUc | kWriteOnly,
                .psn = rq(0),
                .reth_va = va(target),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 16,
                .payload = pattern(16, 1)});
  EXPECT_TRUE(sent.empty()) << "UC sends no NAK";
  sent.clear();
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
  EXPECT_TRUE(poll(*rcq).empty()) << "the posted receive is not flushed";
  for (uint8_t b : target) ASSERT_EQ(b, 0);
  expect_send_delivered(rq(1), 3, rbuf);
}

// UC QPs whose PSNs start just below the 24-bit wrap.
class UcPsnWrap : public Uc {
 protected:
  UcPsnWrap() {
    rq_psn = 0xFFFFFF;
    sq_psn = 0xFFFFFE;
  }
};

// Receive UC SEND_FIRST (PSN 0xFFFFFF), SEND_LAST (PSN 0) / Expect the
// message delivered across the wrap (roce-facts §4.1: PSNs are modulo 2^24).
TEST_F(UcPsnWrap, ReceiveAcrossPsnWrap) {
  std::vector<uint8_t> rbuf(4096, 0);
  recv_buf(rbuf, 1);
  auto data = pattern(kMtu + 3, 5);
  deliver({Craft{.opcode = kUc | kSendFirst, .psn = 0xFFFFFF, .payload = part(data, 0)},
           Craft{.opcode = kUc | kSendLast, .psn = 0, .payload = part(data, 1)}});
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].byte_len, kMtu + 3);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), rbuf.begin()));
  EXPECT_TRUE(take().empty());
}

// Post a UC WRITE of 3 MTU from sq_psn 0xFFFFFE / Expect PSNs 0xFFFFFE,
// 0xFFFFFF, 0 (roce-facts §4.1).
TEST_F(UcPsnWrap, SendAcrossPsnWrap) {
  auto src = pattern(3 * kMtu, 1);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = 0x1000;
  wr.wr.rdma.rkey = 9;
  post_send(wr, {sge(src.data(), uint32_t(src.size()), mr)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 3u);
  EXPECT_EQ(tx[0].psn, 0xFFFFFEu);
  EXPECT_EQ(tx[1].psn, 0xFFFFFFu);
  EXPECT_EQ(tx[2].psn, 0u);
  EXPECT_TRUE(poll(*scq).empty()) << "unsignaled";
}

}  // namespace
}  // namespace uroce::engine::test
