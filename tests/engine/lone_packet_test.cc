// A lone packet through shared memory (requester.cc, send_lone_packet): the
// one WQE of a post, one packet long, on an RC QP whose packets go bare
// through shared memory, is written straight into the peer's ring. It must
// leave the same bytes on the wire and the same requester state as the
// requester's run, which sends it when the ring has no room for it in
// place (the fake transport's in_place_room 0), and fall back to that run
// whenever it cannot send.
#include <endian.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

// What one post left: its packet and what the requester, the timers and the
// counters say after it.
struct PostTrace {
  std::vector<uint8_t> bytes;  // BTH .. ICRC
  bool in_place = false;
  uint32_t psns = 0;  // req.psn moved on by
  uint32_t psn_end_ahead = 0;
  uint32_t wqe_first = 0, wqe_last = 0;  // relative to the PSN before the post
  bool started = false;
  uint32_t req_index_ahead = 0;
  bool retransmit_armed = false;
  bool rtt_active = false;
  uint32_t rtt_psn = 0;  // relative
  uint64_t tx_packets = 0, tx_bytes = 0;
  bool counted_sending = false;
  bool operator==(const PostTrace&) const = default;
};

class LonePacketTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    transport->memory_path = true;
    bring_up();
    ASSERT_EQ(qp->delivery.icrc(), TxBatch::Icrc::kOmit);
    a_mr = reg(a, IBV_ACCESS_LOCAL_WRITE);
    b_mr = reg(b, IBV_ACCESS_LOCAL_WRITE);
  }

  // Posts `wr` with `sges` when the ring takes `room` bytes in place, then
  // acknowledges it (the QP idle again for the next post).
  PostTrace post_traced(ibv_send_wr wr, std::vector<ibv_sge> sges, uint32_t room) {
    transport->in_place_room = room;
    uint32_t psn0 = qp->req.psn;
    uint32_t index0 = qp->req.index;
    uint64_t packets0 = engine->stats.tx_packets.load(), bytes0 = engine->stats.tx_bytes.load();
    post_send(wr, std::move(sges));
    PostTrace t;
    EXPECT_EQ(sent.size(), 1u);
    if (sent.size() != 1) return t;
    t.bytes = sent[0].bytes;
    t.in_place = sent[0].in_place;
    std::lock_guard lock(qp->mu);
    const core::SendWqe& w = qp->sq.at(index0);
    t.psns = uint32_t(wire::psn_diff(qp->req.psn, psn0));
    t.psn_end_ahead = uint32_t(wire::psn_diff(qp->req.psn_end, psn0));
    t.wqe_first = uint32_t(wire::psn_diff(w.first_psn, psn0));
    t.wqe_last = uint32_t(wire::psn_diff(w.last_psn, psn0));
    t.started = w.started;
    t.req_index_ahead = qp->req.index - index0;
    t.retransmit_armed = qp->timers.retransmit_armed;
    t.rtt_active = qp->timers.rtt.active;
    t.rtt_psn = uint32_t(wire::psn_diff(qp->timers.rtt.psn, psn0));
    t.tx_packets = engine->stats.tx_packets.load() - packets0;
    t.tx_bytes = engine->stats.tx_bytes.load() - bytes0;
    t.counted_sending = qp->req.counted_sending;
    return t;
  }

  void ack_all() {
    sent.clear();
    deliver(Craft{.opcode = kAck, .psn = wire::psn_add(qp->req.psn, wire::kPsnMask), .syndrome = 0x1F, .msn = 1});
    poll(*scq);
  }

  // The packet's PSN (BTH bytes 9..11) out of the comparison: two posts in a
  // row take consecutive PSNs.
  static std::vector<uint8_t> without_psn(std::vector<uint8_t> bytes) {
    if (bytes.size() >= 12) bytes[9] = bytes[10] = bytes[11] = 0;
    return bytes;
  }

  // Posts the same WR twice: through the requester's run, then as a lone
  // packet / Expect the same packet (but its PSN, one on) and the same state.
  void expect_same(const char* what, ibv_send_wr wr, const std::vector<ibv_sge>& sges) {
    SCOPED_TRACE(what);
    PostTrace run = post_traced(wr, sges, 0);
    ack_all();
    PostTrace lone = post_traced(wr, sges, 1 << 16);
    ack_all();
    EXPECT_FALSE(run.in_place) << "no room in place: the requester's run sends it";
    EXPECT_TRUE(lone.in_place);
    ASSERT_EQ(lone.bytes.size(), run.bytes.size());
    EXPECT_EQ(without_psn(lone.bytes), without_psn(run.bytes));
    ASSERT_GE(run.bytes.size(), 12u);
    uint32_t run_psn = wire::Bth(run.bytes.data()).psn(), lone_psn = wire::Bth(lone.bytes.data()).psn();
    EXPECT_EQ(lone_psn, wire::psn_add(run_psn, 1));
    run.in_place = lone.in_place;
    run.bytes = lone.bytes;
    EXPECT_EQ(lone, run);
    EXPECT_EQ(transport->abandoned, 0u);
  }

  static ibv_send_wr wr_of(ibv_wr_opcode op, unsigned flags = IBV_SEND_SIGNALED) {
    ibv_send_wr wr{};
    wr.wr_id = 7;
    wr.opcode = op;
    wr.send_flags = flags;
    wr.imm_data = htobe32(0xA1B2C3D4);
    wr.wr.rdma.remote_addr = 0xABC000;
    wr.wr.rdma.rkey = 0x1234;
    return wr;
  }

  std::vector<uint8_t> a = pattern(4096, 3), b = pattern(4096, 9);
  core::Mr* a_mr = nullptr;
  core::Mr* b_mr = nullptr;
};

// Each kind of lone packet, through the requester's run and then as a lone
// packet / Expect the same bytes and the same requester state each time.
TEST_F(LonePacketTest, WrittenAsTheRequestersRunWouldSendIt) {
  expect_same("SEND 64 B", wr_of(IBV_WR_SEND), {sge(a.data(), 64, a_mr)});
  expect_same("SEND 0 B", wr_of(IBV_WR_SEND), {});
  expect_same("SEND 1 B (pad 3)", wr_of(IBV_WR_SEND), {sge(a.data() + 5, 1, a_mr)});
  expect_same("SEND one MTU", wr_of(IBV_WR_SEND), {sge(a.data(), kMtu, a_mr)});
  expect_same("SEND from three pieces, one empty", wr_of(IBV_WR_SEND),
              {sge(a.data() + 100, 30, a_mr), sge(b.data(), 0, b_mr), sge(b.data() + 7, 71, b_mr)});
  expect_same("SEND unsignaled, solicited", wr_of(IBV_WR_SEND, IBV_SEND_SOLICITED), {sge(a.data(), 13, a_mr)});
  expect_same("SEND_WITH_IMM", wr_of(IBV_WR_SEND_WITH_IMM), {sge(b.data(), 22, b_mr)});
  ibv_send_wr inv = wr_of(IBV_WR_SEND_WITH_INV);
  inv.invalidate_rkey = 0x5566;
  expect_same("SEND_WITH_INV", inv, {sge(a.data(), 8, a_mr)});
  expect_same("RDMA_WRITE_WITH_IMM", wr_of(IBV_WR_RDMA_WRITE_WITH_IMM), {sge(a.data(), 64, a_mr)});
  ASSERT_EQ(qp->delivery.placement(), nullptr);  // (else a plain WRITE is placed)
  expect_same("RDMA_WRITE", wr_of(IBV_WR_RDMA_WRITE), {sge(b.data(), 40, b_mr)});
  expect_same("SEND inline", wr_of(IBV_WR_SEND, IBV_SEND_SIGNALED | IBV_SEND_INLINE), {sge(a.data(), 48, a_mr)});
}

// A lone SEND whose source page the application made unreadable after
// registering it / Expect it sent with the page's bytes, as the requester's
// run sends it (as a NIC reads pinned pages: core/mr_access.h).
TEST_F(LonePacketTest, UnreadableSourcePageIsReadAsTheRunReadsIt) {
  long page = sysconf(_SC_PAGESIZE);
  void* m = mmap(nullptr, size_t(page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* p = static_cast<uint8_t*>(m);
  for (long i = 0; i < page; ++i) p[i] = uint8_t(i * 13);
  auto r = engine->mrs.add(pd.get(), p, size_t(page), reinterpret_cast<uint64_t>(p), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(r.ok());
  mrs.push_back(*r);
  ASSERT_EQ(mprotect(m, size_t(page), PROT_NONE), 0);
  expect_same("SEND from a PROT_NONE page", wr_of(IBV_WR_SEND), {sge(p + 16, 64, *r)});
  ASSERT_EQ(mprotect(m, size_t(page), PROT_READ), 0);
  PostTrace t = post_traced(wr_of(IBV_WR_SEND), {sge(p + 16, 64, *r)}, 1 << 16);
  ASSERT_EQ(t.bytes.size(), 12u + 64 + 4);
  EXPECT_EQ(std::vector<uint8_t>(t.bytes.begin() + 12, t.bytes.begin() + 76), std::vector<uint8_t>(p + 16, p + 80));
  EXPECT_EQ(engine->mrs.remove(*r), 0);
  mrs.pop_back();
  munmap(m, size_t(page));
}

// A lone SEND whose L_Key does not check / Expect nothing written in the
// ring and the requester's answer: a local protection error, the QP in ERR.
TEST_F(LonePacketTest, KeyThatDoesNotCheckCompletesInError) {
  transport->in_place_room = 1 << 16;
  ibv_send_wr wr = wr_of(IBV_WR_SEND);
  post_send(wr, {ibv_sge{reinterpret_cast<uint64_t>(a.data()), 64, a_mr->ibmr.lkey + 1}});
  EXPECT_TRUE(sent.empty());
  EXPECT_EQ(transport->abandoned, 0u);
  EXPECT_FALSE(transport->slot_open_);
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
}

// A lone SEND larger than the ring's room in place / Expect it sent by the
// requester's run (through the batch), nothing left reserved.
TEST_F(LonePacketTest, FullRingLeavesItToTheRequestersRun) {
  transport->in_place_room = 40;
  post_send(wr_of(IBV_WR_SEND), {sge(a.data(), 64, a_mr)});
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_FALSE(sent[0].in_place);
  EXPECT_FALSE(transport->slot_open_);
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kSendOnly);
  EXPECT_EQ(tx[0].payload, std::vector<uint8_t>(a.begin(), a.begin() + 64));
}

// What is not a lone packet goes as before: a SEND longer than the MTU (two
// packets, the first without AckReq), a READ / Expect them from the batch.
TEST_F(LonePacketTest, LongerMessagesAndReadsAreNotLone) {
  transport->in_place_room = 1 << 16;
  post_send(wr_of(IBV_WR_SEND), {sge(a.data(), kMtu + 1, a_mr)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 2u);
  EXPECT_EQ(tx[0].opcode, kSendFirst);
  EXPECT_FALSE(tx[0].ack_req);
  EXPECT_EQ(tx[1].opcode, kSendLast);
  ibv_send_wr rd = wr_of(IBV_WR_RDMA_READ);
  post_send(rd, {sge(b.data(), 64, b_mr)});
  tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kReadRequest);
}

}  // namespace
}  // namespace uroce::engine::test
