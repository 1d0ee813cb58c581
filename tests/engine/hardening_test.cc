// Hardening protocol tests: who is heard, which responses count,
// READ responses in slices, the MR lifetime rule, ACK before completion,
// tombstone bounds and unguessable QP numbers. Crafted packets in, captured
// packets and completions out.
#include <sys/mman.h>

#include <set>

#include "core/mr_access.h"
#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

class Hardening : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    bring_up();
  }

  // Posts a signaled SEND of `len` bytes of `src`.
  void send(uint64_t wr_id, std::vector<uint8_t>& src, core::Mr* mr, uint32_t len) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    post_send(wr, {sge(src.data(), len, mr)});
  }

  // Posts a SEND of `len` bytes of `src` / Expects one burst: the ACK of PSN
  // `acked` and the SEND (the ACK rides with the reply) — the ACK first if
  // `ack_first`, else behind the SEND, closing its GSO message if `one_message`.
  void expect_reply_carries_ack(uint64_t wr_id, std::vector<uint8_t>& src, core::Mr* mr, uint32_t acked, bool ack_first,
                                bool one_message = false, uint32_t len = 8) {
    int bursts = 0;
    transport->on_send = [&](size_t) { ++bursts; };
    send(wr_id, src, mr, len);
    transport->on_send = nullptr;
    EXPECT_EQ(bursts, 1);
    ASSERT_EQ(sent.size(), 2u);
    EXPECT_EQ(sent[0].message == sent[1].message, one_message);
    if (one_message) {
      EXPECT_EQ(sent[1].ip_id, 1u);  // its ICRC checked with it (take)
    }
    auto tx = take();
    ASSERT_EQ(tx.size(), 2u);
    const Pkt& ack = ack_first ? tx[0] : tx[1];
    const Pkt& reply = ack_first ? tx[1] : tx[0];
    EXPECT_EQ(ack.opcode, kAck);
    EXPECT_EQ(ack.psn, acked);
    EXPECT_EQ(reply.opcode, kSendOnly);
  }

  // Receives SEND_ONLY(AckReq) number `n` in an application thread's turn
  // and takes its completion (its ACK is left for the reply).
  void receive_in_application_turn(std::vector<uint8_t>& buf, uint32_t n = 0) {
    (void)recv_buf(buf, 11 + n);
    deliver(Craft{.opcode = kSendOnly, .psn = rq(n), .ack_req = true, .payload = {1}},
            EngineContext::Turn::kApplication);
    EXPECT_TRUE(take().empty());
    ASSERT_EQ(poll(*rcq).size(), 1u);
  }

  // Sends the pending READ response slices until the streams end; returns
  // what was sent so far plus those (slices counted in `slices`).
  std::vector<Pkt> drain_reads(unsigned* slices = nullptr) {
    std::vector<Pkt> all = take();
    bool more_pending = true;
    while (more_pending) {
      more_pending = engine->send_reads();
      auto more = take();
      all.insert(all.end(), more.begin(), more.end());
      if (slices) ++*slices;
    }
    return all;
  }
};

// --- only the connected peer is heard ------------------------------------------

// Receive a WRITE with the right PSN and R_Key from an address the QP was not
// connected to / Expect nothing written, no ACK, counted bad_path; the peer's
// own WRITE with that PSN then lands and is acknowledged.
TEST_F(Hardening, WriteFromUnconnectedAddressIsDropped) {
  std::vector<uint8_t> dst(64, 0);
  core::Mr* mr = reg(dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  auto va = reinterpret_cast<uint64_t>(dst.data());
  uint64_t before = engine->stats.rx_bad_path.load();
  deliver(Craft{.opcode = kWriteOnly,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = va,
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 4,
                .payload = {6, 6, 6, 6},
                .src_ip = 0x7F000002});
  EXPECT_EQ(engine->stats.rx_bad_path.load(), before + 1);
  EXPECT_TRUE(take().empty());
  EXPECT_EQ(dst[0], 0);

  deliver(Craft{.opcode = kWriteOnly,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = va,
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 4,
                .payload = {1, 2, 3, 4}});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kAck);
  EXPECT_EQ(tx[0].psn, rq(0));
  EXPECT_EQ(dst[0], 1);
}

// Receive a SEND from the peer's address but another UDP source port / Expect
// it delivered: the source port is flow entropy in RoCEv2.
TEST_F(Hardening, OtherSourcePortIsHeard) {
  std::vector<uint8_t> buf(16, 0);
  recv_buf(buf, 3);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = {9}, .src_port = 50123});
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(buf[0], 9);
}

// Receive an ACK from an unconnected address / Expect it ignored (bad_path):
// the SEND stays outstanding until the peer's ACK.
TEST_F(Hardening, AckFromUnconnectedAddressIsDropped) {
  std::vector<uint8_t> src = pattern(64, 1);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  send(1, src, mr, 64);
  take();
  deliver(Craft{.opcode = kAck, .psn = sq(0), .msn = 1, .src_ip = 0x0A000009});
  EXPECT_TRUE(poll(*scq).empty());
  deliver(Craft{.opcode = kAck, .psn = sq(0), .msn = 1});
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
}

// --- ghosts: responses for PSNs that are not outstanding ----------------------------

// Receive an ACK for a PSN far ahead of anything sent / Expect a ghost: no
// completion, the QP in RTS, and the real ACK still completes the SEND.
TEST_F(Hardening, AckFarAheadIsGhost) {
  std::vector<uint8_t> src = pattern(64, 1);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  send(1, src, mr, 64);
  take();
  uint64_t ghosts = engine->stats.rx_ghost.load();
  deliver(Craft{.opcode = kAck, .psn = sq(5000), .msn = 9});
  EXPECT_EQ(engine->stats.rx_ghost.load(), ghosts + 1);
  EXPECT_TRUE(poll(*scq).empty());
  // A second SEND goes out as usual (nothing was taken as acknowledged).
  send(2, src, mr, 64);
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].psn, sq(1));
  deliver(Craft{.opcode = kAck, .psn = sq(1), .msn = 2});
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
}

// Receive NAKs (invalid request, remote access, sequence error, RNR) whose PSN
// is not outstanding / Expect ghosts: the QP stays in RTS, nothing completes.
TEST_F(Hardening, NakOutsideTheWindowIsGhost) {
  std::vector<uint8_t> src = pattern(64, 1);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  send(1, src, mr, 64);
  take();
  uint64_t ghosts = engine->stats.rx_ghost.load();
  for (uint8_t syndrome : {nak(1), nak(2), nak(0), rnr_nak(3)}) {
    deliver(Craft{.opcode = kAck, .psn = sq(77), .syndrome = syndrome});
    deliver(Craft{.opcode = kAck, .psn = sq(0) - 9, .syndrome = syndrome});
  }
  EXPECT_EQ(engine->stats.rx_ghost.load(), ghosts + 8);
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
  EXPECT_TRUE(poll(*scq).empty());
  EXPECT_TRUE(take().empty());  // no go-back-N either
}

// Receive a NAK invalid request for the outstanding PSN / Expect it acted on
// (the window check does not hide real NAKs).
TEST_F(Hardening, NakForOutstandingPsnIsHonoured) {
  std::vector<uint8_t> src = pattern(64, 1);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  send(1, src, mr, 64);
  take();
  deliver(Craft{.opcode = kAck, .psn = sq(0), .syndrome = nak(1)});
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
}

// Receive READ responses and an atomic ACK with no READ/atomic outstanding /
// Expect ghosts, local memory untouched.
TEST_F(Hardening, ResponsesWithNothingOutstandingAreGhosts) {
  uint64_t ghosts = engine->stats.rx_ghost.load();
  deliver(Craft{.opcode = kReadRespOnly, .psn = sq(0), .payload = pattern(16, 3)});
  deliver(Craft{.opcode = kReadRespFirst, .psn = sq(3), .payload = pattern(kMtu, 3)});
  deliver(Craft{.opcode = kAtomicAck, .psn = sq(0), .atomic_orig = 42});
  EXPECT_EQ(engine->stats.rx_ghost.load(), ghosts + 3);
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
  EXPECT_TRUE(poll(*scq).empty());
}

// --- READ responses in slices ---------------------------------------------------

// Receive a READ of 300 MTUs / Expect the responses in order, complete and
// correct, produced in several slices (one batch each, not in one go).
TEST_F(Hardening, LargeReadIsSentInSlices) {
  const uint32_t len = 300 * kMtu;
  std::vector<uint8_t> src = pattern(len, 4);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  deliver(Craft{.opcode = kReadRequest,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = reinterpret_cast<uint64_t>(src.data()),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = len});
  unsigned slices = 1;
  auto tx = drain_reads(&slices);
  ASSERT_EQ(tx.size(), 300u);
  EXPECT_GE(slices, 300u / TxBatch::kMaxPackets);
  for (uint32_t i = 0; i < 300; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(tx[i].psn, rq(i));
    EXPECT_EQ(tx[i].opcode, i == 0 ? kReadRespFirst : i == 299 ? kReadRespLast : kReadRespMiddle);
    ASSERT_EQ(tx[i].payload.size(), kMtu);
    EXPECT_TRUE(std::equal(tx[i].payload.begin(), tx[i].payload.end(), src.begin() + i * kMtu));
  }
}

// Receive two READs in one burst / Expect the second's responses only after
// the first's, each stream in PSN order.
TEST_F(Hardening, ReadStreamsKeepRequestOrder) {
  std::vector<uint8_t> src = pattern(40 * kMtu, 6);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  auto va = reinterpret_cast<uint64_t>(src.data());
  deliver({Craft{.opcode = kReadRequest,
                 .psn = rq(0),
                 .ack_req = true,
                 .reth_va = va,
                 .reth_rkey = mr->ibmr.rkey,
                 .reth_len = 20 * kMtu},
           Craft{.opcode = kReadRequest,
                 .psn = rq(20),
                 .ack_req = true,
                 .reth_va = va + 20 * kMtu,
                 .reth_rkey = mr->ibmr.rkey,
                 .reth_len = 20 * kMtu}});
  std::vector<Pkt> all = drain_reads();
  ASSERT_EQ(all.size(), 40u);
  for (uint32_t i = 0; i < 40; ++i) {
    EXPECT_EQ(all[i].psn, rq(i));
    EXPECT_TRUE(std::equal(all[i].payload.begin(), all[i].payload.end(), src.begin() + i * kMtu));
  }
}

// Receive a READ, send its first slice, deregister the MR / Expect no byte of
// the region afterwards: the rest of the stream is a NAK remote access error.
TEST_F(Hardening, NoByteReadAfterDeregistration) {
  const uint32_t len = 200 * kMtu;
  std::vector<uint8_t> src = pattern(len, 8);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  deliver(Craft{.opcode = kReadRequest,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = reinterpret_cast<uint64_t>(src.data()),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = len});
  auto first = take();
  ASSERT_FALSE(first.empty());
  ASSERT_LT(first.size(), 200u);
  ASSERT_EQ(engine->mrs.remove(mr), 0);
  mrs.clear();
  std::fill(src.begin(), src.end(), 0xEE);  // the application reuses its memory
  engine->send_reads();
  auto rest = take();
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(rest[0].opcode, kAck);
  EXPECT_EQ(rest[0].syndrome, nak(2));
  EXPECT_EQ(rest[0].psn, rq(uint32_t(first.size())));
  EXPECT_FALSE(engine->send_reads());
}

// Add payload from a buffer, change the buffer, flush / Expect the bytes as
// they were when added: packets hold copies, never pointers into memory.
TEST_F(Hardening, BatchedPacketsHoldCopies) {
  std::vector<uint8_t> buf = pattern(512, 9), original = buf;
  TxBatch tx;
  tx.use(transport);
  uint8_t* h = tx.begin_packet(transport::Endpoint{kPeerIp, kPeerPort}, local_ip, 12);
  wire::Bth(h).fill(kSendOnly, false, 0, 0xFFFF, kPeerQpn, false, 1);
  ASSERT_TRUE(tx.add_payload(buf.data(), 512));
  tx.end_packet(wire::Ipv4Flow{local_ip, kPeerIp, kLocalPort, kPeerPort});
  std::fill(buf.begin(), buf.end(), 0);
  tx.flush();
  auto p = take();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].payload, original);
}

// --- payload referenced in registered memory (TxBatch::ReferenceScope) --------------

// Through shared memory: add 2 KiB from a registered region inside a
// ReferenceScope / Expect the packet still pending within the scope (gathered
// from header, region, pad and ICRC), and handed to the transport when the
// scope ends, not at a later flush.
TEST_F(Hardening, ReferencedPayloadLeavesWhenTheScopeEnds) {
  transport->memory_path = true;
  std::vector<uint8_t> buf = pattern(2048, 3);
  core::Mr* mr = reg(buf, IBV_ACCESS_LOCAL_WRITE);
  TxBatch tx;
  tx.use(transport);
  {
    TxBatch::ReferenceScope scope(tx);
    uint8_t* h = tx.begin_packet(transport::Endpoint{kPeerIp, kPeerPort}, local_ip, 12);
    wire::Bth(h).fill(kSendOnly, false, 0, 0xFFFF, kPeerQpn, false, 1);
    ASSERT_TRUE(tx.add_payload_from(*mr, buf.data(), 2048));
    tx.end_packet(wire::Ipv4Flow{local_ip, kPeerIp, kLocalPort, kPeerPort});
    EXPECT_TRUE(tx.references_memory());
    EXPECT_TRUE(sent.empty());
  }
  EXPECT_EQ(tx.pending(), 0u);
  EXPECT_FALSE(tx.references_memory());
  auto p = take();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].payload, buf);
  EXPECT_EQ(p[0].pieces, 3u);  // header | the region | (no pad) ICRC
}

// The same outside a scope, and from an on-demand region inside one / Expect
// copies: the buffer changed before the flush does not change the packets.
TEST_F(Hardening, PayloadIsCopiedOutsideAScopeAndFromOnDemandRegions) {
  std::vector<uint8_t> plain = pattern(2048, 4), odp = pattern(2048, 5);
  const std::vector<uint8_t> plain_then = plain, odp_then = odp;
  core::Mr* plain_mr = reg(plain, IBV_ACCESS_LOCAL_WRITE);
  core::Mr* odp_mr = reg(odp, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
  TxBatch tx;
  tx.use(transport);
  auto add = [&](core::Mr* mr, std::vector<uint8_t>& buf) {
    uint8_t* h = tx.begin_packet(transport::Endpoint{kPeerIp, kPeerPort}, local_ip, 12);
    wire::Bth(h).fill(kSendOnly, false, 0, 0xFFFF, kPeerQpn, false, 1);
    ASSERT_TRUE(tx.add_payload_from(*mr, buf.data(), 2048));
    tx.end_packet(wire::Ipv4Flow{local_ip, kPeerIp, kLocalPort, kPeerPort});
  };
  add(plain_mr, plain);
  {
    TxBatch::ReferenceScope scope(tx);
    add(odp_mr, odp);
    EXPECT_FALSE(tx.references_memory());
  }
  std::fill(plain.begin(), plain.end(), 0);
  std::fill(odp.begin(), odp.end(), 0);
  tx.flush();
  auto p = take();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].payload, plain_then);
  EXPECT_EQ(p[1].payload, odp_then);
  EXPECT_EQ(p[0].pieces, 1u);
  EXPECT_EQ(p[1].pieces, 1u);
}

// Through shared memory: one packet from pieces that alternate 1 KiB and 1
// byte of a registered region, inside a scope / Expect the packet within
// kMaxPacketPieces buffers (once only two are left, the large pieces are
// copied too), its payload in order and its ICRC correct (take()).
TEST_F(Hardening, ReferencedPiecesNeverOutgrowAPacket) {
  transport->memory_path = true;
  std::vector<uint8_t> src = pattern(8 * 1025, 6);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  TxBatch tx;
  tx.use(transport);
  {
    TxBatch::ReferenceScope scope(tx);
    uint8_t* h = tx.begin_packet(transport::Endpoint{kPeerIp, kPeerPort}, local_ip, 12);
    wire::Bth(h).fill(kSendOnly, false, wire::pad_for(uint32_t(src.size())), 0xFFFF, kPeerQpn, false, 1);
    for (size_t off = 0; off < src.size(); off += 1025) {
      ASSERT_TRUE(tx.add_payload_from(*mr, src.data() + off, 1024));
      ASSERT_TRUE(tx.add_payload_from(*mr, src.data() + off + 1024, 1));
    }
    tx.end_packet(wire::Ipv4Flow{local_ip, kPeerIp, kLocalPort, kPeerPort});
  }
  auto p = take();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].payload, src);
  EXPECT_EQ(p[0].pieces, 7u);  // header, then 3 x (a region's KiB, the arena again)
}

// Through shared memory: post a SEND of 3 MTUs / Expect each packet gathered
// from its header, the sender's region and its ICRC, and the payload in order.
TEST_F(Hardening, SendPayloadIsReferencedInTheRegion) {
  transport->memory_path = true;
  redecide_delivery();
  std::vector<uint8_t> src = pattern(3 * kMtu, 7);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  send(1, src, mr, uint32_t(src.size()));
  auto p = take();
  ASSERT_EQ(p.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p[i].pieces, 3u);
    EXPECT_TRUE(std::equal(p[i].payload.begin(), p[i].payload.end(), src.begin() + i * kMtu));
  }
}

// Through a socket, with GSO: post a SEND of 3 MTUs / Expect its packets
// copied one after the other into one buffer: one GSO message gathered from
// that buffer alone (the kernel's copy costs per buffer), the payload in order.
TEST_F(Hardening, SendPayloadIsCopiedIntoOneBufferThroughASocket) {
  transport->gso_segments = 64;
  std::vector<uint8_t> src = pattern(3 * kMtu, 7);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  send(1, src, mr, uint32_t(src.size()));
  ASSERT_EQ(sent.size(), 3u);
  for (unsigned i = 0; i < 3; ++i) {
    EXPECT_EQ(sent[i].message, sent[0].message);
    EXPECT_EQ(sent[i].pieces, 1u);
  }
  auto p = take();
  for (uint32_t i = 0; i < 3; ++i)
    EXPECT_TRUE(std::equal(p[i].payload.begin(), p[i].payload.end(), src.begin() + i * kMtu));
}

// --- on-demand paging: memory that vanished ---------------------------------------

class HardeningOdp : public Hardening {
 protected:
  void TearDown() override {
    Hardening::TearDown();
    if (region) munmap(region, kRegion);
  }
  // An ODP MR over a fresh mapping, then the mapping removed.
  core::Mr* vanished_odp_mr(unsigned access) {
    region = static_cast<uint8_t*>(mmap(nullptr, kRegion, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(region, MAP_FAILED);
    auto r =
        engine->mrs.add(pd.get(), region, kRegion, reinterpret_cast<uint64_t>(region), access | IBV_ACCESS_ON_DEMAND);
    EXPECT_TRUE(r.ok());
    mrs.push_back(*r);
    EXPECT_EQ(munmap(region, kRegion), 0);
    region = nullptr;
    return *r;
  }
  static constexpr size_t kRegion = 1 << 16;
  uint8_t* region = nullptr;
};

// Receive a WRITE into an ODP MR whose memory the application unmapped /
// Expect NAK remote access error (no signal), the QP in ERR.
TEST_F(HardeningOdp, WriteToUnmappedOdpIsRemoteAccessError) {
  core::Mr* mr = vanished_odp_mr(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  deliver(Craft{.opcode = kWriteOnly,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = mr->iova + 128,
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 4,
                .payload = {1, 2, 3, 4}});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].syndrome, nak(2));
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
}

// Receive a READ of an unmapped ODP MR / Expect NAK remote access error.
TEST_F(HardeningOdp, ReadOfUnmappedOdpIsRemoteAccessError) {
  core::Mr* mr = vanished_odp_mr(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  deliver(Craft{.opcode = kReadRequest,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = mr->iova,
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 3000});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kAck);
  EXPECT_EQ(tx[0].syndrome, nak(2));
}

class HardeningAtomic : public EngineTest {
 protected:
  HardeningAtomic() { qp_access |= IBV_ACCESS_REMOTE_ATOMIC; }
  void SetUp() override {
    EngineTest::SetUp();
    bring_up();
  }
};

// Receive a FETCH_ADD, then a COMPARE_SWAP, on an ODP MR / Expect both
// executed and answered (IBV_ODP_SUPPORT_ATOMIC, as mlx5 reports it; pyverbs'
// test_odp_rc_atomic_*).
TEST_F(HardeningAtomic, AtomicOnOdpIsExecuted) {
  if (!core::kOdpAtomics) GTEST_SKIP() << "atomics on ODP regions need the guarded instructions (x86-64)";
  std::vector<uint64_t> mem(8, 0);
  auto r = engine->mrs.add(pd.get(), mem.data(), mem.size() * 8, reinterpret_cast<uint64_t>(mem.data()),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ON_DEMAND);
  ASSERT_TRUE(r.ok());
  mrs.push_back(*r);
  const uint64_t va = reinterpret_cast<uint64_t>(&mem[1]);
  deliver(Craft{.opcode = kFetchAdd,
                .psn = rq(0),
                .ack_req = true,
                .atomic_va = va,
                .atomic_rkey = (*r)->ibmr.rkey,
                .swap_add = 5});
  deliver(Craft{.opcode = kCompareSwap,
                .psn = rq(1),
                .ack_req = true,
                .atomic_va = va,
                .atomic_rkey = (*r)->ibmr.rkey,
                .swap_add = 9,
                .compare = 5});
  auto tx = take();
  ASSERT_EQ(tx.size(), 2u);
  EXPECT_EQ(tx[0].opcode, kAtomicAck);
  EXPECT_EQ(tx[0].atomic_orig, 0u);
  EXPECT_EQ(tx[1].opcode, kAtomicAck);
  EXPECT_EQ(tx[1].atomic_orig, 5u);
  EXPECT_EQ(mem[1], 9u);
}

class HardeningOdpAtomic : public HardeningOdp {
 protected:
  HardeningOdpAtomic() { qp_access |= IBV_ACCESS_REMOTE_ATOMIC; }
};

// Receive an atomic on an ODP MR whose memory the application unmapped /
// Expect NAK remote access error (no signal), the QP in ERR.
TEST_F(HardeningOdpAtomic, AtomicOnUnmappedOdpIsRemoteAccessError) {
  core::Mr* mr = vanished_odp_mr(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  deliver(Craft{.opcode = kFetchAdd,
                .psn = rq(0),
                .ack_req = true,
                .atomic_va = mr->iova + 64,
                .atomic_rkey = mr->ibmr.rkey,
                .swap_add = 1});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].syndrome, nak(2));
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
}

// Receive a SEND into a receive buffer of a live ODP MR / Expect it delivered
// (the safe copy path works for mapped memory).
TEST_F(Hardening, SendIntoOdpBufferIsDelivered) {
  std::vector<uint8_t> buf(32, 0);
  auto r = engine->mrs.add(pd.get(), buf.data(), buf.size(), reinterpret_cast<uint64_t>(buf.data()),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
  ASSERT_TRUE(r.ok());
  mrs.push_back(*r);
  post_recv(5, {sge(buf.data(), 32, *r)});
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = {7, 8, 9}});
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(buf[2], 9);
}

// --- ACK before completion ----------------------------------------------------------

// Receive SEND_ONLY(AckReq) / Expect the ACK handed to the transport while the
// receive CQ is still empty, and the completion visible once the burst ends.
TEST_F(Hardening, AckLeavesBeforeReceiveCompletion) {
  std::vector<uint8_t> buf(16, 0);
  recv_buf(buf, 11);
  int sends = 0;
  bool visible_at_send = true;
  transport->on_send = [&](size_t) {
    ++sends;
    visible_at_send = !rcq->empty();
  };
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = {1}});
  transport->on_send = nullptr;
  EXPECT_EQ(sends, 1);
  EXPECT_FALSE(visible_at_send);
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kAck);
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 11u);
}

// Receive SEND_ONLY(AckReq) in an application thread's turn (it polls its CQ)
// / Expect the completion at once and no ACK yet; then the application's
// reply on the QP / Expect the ACK first (it covers a receive: ACK before
// completion) and the reply after it, in one burst.
TEST_F(Hardening, ApplicationTurnAckRidesWithTheReply) {
  std::vector<uint8_t> buf(16, 0);
  recv_buf(buf, 11);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = {1}}, EngineContext::Turn::kApplication);
  EXPECT_TRUE(take().empty());
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 11u);

  std::vector<uint8_t> src(8, 7);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  expect_reply_carries_ack(1, src, mr, rq(0), /*ack_first=*/true);

  // The next turn finds nothing left to acknowledge.
  engine->flush_deferred_acks();
  EXPECT_TRUE(take().empty());
}

// Receive SEND_ONLY(AckReq) in an application thread's turn, over a socket
// with GSO / Expect the reply first and the ACK behind it, closing the
// reply's GSO message: the peer's kernel hands both to one receive, whose
// burst completes the peer's SEND before the reply (next test) — one
// datagram per message instead of two.
TEST_F(Hardening, ApplicationTurnAckOfSendClosesTheReplyOverGso) {
  transport->gso_segments = 64;
  std::vector<uint8_t> buf(16, 0);
  receive_in_application_turn(buf);
  std::vector<uint8_t> src(8, 7);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  expect_reply_carries_ack(1, src, mr, rq(0), /*ack_first=*/false, /*one_message=*/true);
}

// The same where the ACK could not join the reply's GSO message / Expect the
// ACK first when the reply (zero-length) is shorter than the ACK, and when the
// transport takes no GSO; through shared memory (each packet a record of its
// own) the ACK does not wait for the reply: it left at the burst's end, before
// the completion was visible, and the reply goes alone.
TEST_F(Hardening, AckOfSendGoesFirstWhereItCannotCloseTheReply) {
  std::vector<uint8_t> src(8, 7);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  std::vector<uint8_t> b0(16), b1(16), b2(16);
  transport->gso_segments = 64;
  transport->memory_path = true;
  redecide_delivery();
  (void)recv_buf(b0, 11);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = {1}, .bare = true},
          EngineContext::Turn::kApplication);
  auto acks = take();
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].opcode, kAck);
  EXPECT_EQ(acks[0].psn, rq(0));
  ASSERT_EQ(poll(*rcq).size(), 1u);
  send(1, src, mr, 8);
  auto reply = take();
  ASSERT_EQ(reply.size(), 1u);
  EXPECT_EQ(reply[0].opcode, kSendOnly);

  transport->memory_path = false;
  redecide_delivery();
  receive_in_application_turn(b1, 1);
  // (the shorter reply joins the ACK's message)
  expect_reply_carries_ack(2, src, mr, rq(1), /*ack_first=*/true, /*one_message=*/true, /*len=*/0);

  transport->gso_segments = 1;
  receive_in_application_turn(b2, 2);
  expect_reply_carries_ack(3, src, mr, rq(2), /*ack_first=*/true);
}

// One CQ for both queues (as ack_order_test's). Post a SEND; then receive in
// one burst (a GSO message of the peer) its reply SEND and the ACK of ours
// behind it / Expect our SEND's completion on the CQ before the reply's.
class HardeningOneCq : public Hardening {
 protected:
  HardeningOneCq() { one_cq = true; }
};

TEST_F(HardeningOneCq, AckBehindTheReplyCompletesTheSendFirst) {
  std::vector<uint8_t> src(8, 7), buf(16, 0);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  (void)recv_buf(buf, 20);
  send(10, src, mr, 8);
  take();
  for (auto turn : {EngineContext::Turn::kApplication, EngineContext::Turn::kProgress}) {
    SCOPED_TRACE(turn == EngineContext::Turn::kApplication ? "application turn" : "progress turn");
    uint32_t n = turn == EngineContext::Turn::kApplication ? 0 : 1;
    if (n == 1) {
      (void)recv_buf(buf, 21);
      send(11, src, mr, 8);
      take();
    }
    deliver({Craft{.opcode = kSendOnly, .psn = rq(n), .ack_req = true, .payload = {5}, .gso_index = 0},
             Craft{.opcode = kAck, .psn = sq(n), .msn = n + 1, .ip_id = 1, .gso_index = 1}},
            turn);
    auto wc = poll(*scq);
    ASSERT_EQ(wc.size(), 2u);
    EXPECT_EQ(wc[0].opcode, IBV_WC_SEND);
    EXPECT_EQ(wc[0].wr_id, 10u + n);
    EXPECT_EQ(wc[1].opcode, IBV_WC_RECV);
    EXPECT_EQ(wc[1].wr_id, 20u + n);
    take();
  }
}

// Receive WRITE_ONLY with immediate (AckReq) in an application thread's turn /
// Expect its receive completion at once and no ACK yet; then the reply / Expect
// the ACK first (it covers a receive) and the reply after it, in one burst.
TEST_F(Hardening, ApplicationTurnAckOfWriteWithImmediatePrecedesTheReply) {
  std::vector<uint8_t> dst(8, 0), rbuf(8, 0);
  core::Mr* dmr = reg(dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  recv_buf(rbuf, 12);
  deliver(Craft{.opcode = kWriteOnlyImm,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = reinterpret_cast<uint64_t>(dst.data()),
                .reth_rkey = dmr->ibmr.rkey,
                .reth_len = 4,
                .imm = 0x01020304,
                .payload = {1, 2, 3, 4}},
          EngineContext::Turn::kApplication);
  EXPECT_TRUE(take().empty());
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);

  std::vector<uint8_t> src(8, 7);
  core::Mr* mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  expect_reply_carries_ack(1, src, mr, rq(0), /*ack_first=*/true);
}

// The application posted a SEND, acknowledged (its send queue is idle); then
// receive WRITE_ONLY(AckReq) in the progress thread's turn / Expect the data
// written and no ACK yet (the application answers on this QP); then its reply
// / Expect the reply and the ACK behind it, in one burst (no receive was
// completed, and the peer's poll for its WRITE's completion then takes the
// reply with the ACK).
TEST_F(Hardening, PingPongWriteAckRidesWithTheReply) {
  std::vector<uint8_t> src = pattern(8, 1), dst(8, 0);
  core::Mr* smr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  core::Mr* dmr = reg(dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  send(1, src, smr, 8);
  take();
  deliver(Craft{.opcode = kAck, .psn = sq(0), .msn = 1});
  ASSERT_EQ(poll(*scq).size(), 1u);
  deliver(Craft{.opcode = kWriteOnly,
                .psn = rq(0),
                .ack_req = true,
                .reth_va = reinterpret_cast<uint64_t>(dst.data()),
                .reth_rkey = dmr->ibmr.rkey,
                .reth_len = 4,
                .payload = {1, 2, 3, 4}});
  EXPECT_TRUE(take().empty());
  EXPECT_EQ(dst[3], 4);
  expect_reply_carries_ack(2, src, smr, rq(0), /*ack_first=*/false);
}

// Receive WRITEs in the progress thread's turn on a QP whose application has
// not posted since the previous one / Expect each ACK at once. Then a ping-pong
// whose application does not answer / Expect the ACK from the next turn. Then a
// SEND in a ping-pong / Expect its ACK at once (a receive completion is held:
// ACK before completion).
TEST_F(Hardening, ProgressTurnAckWaitsOnlyForAnExpectedReply) {
  std::vector<uint8_t> src = pattern(8, 1), dst(8, 0), rbuf(16, 0);
  core::Mr* smr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  core::Mr* dmr = reg(dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  auto write = [&](uint32_t n) {
    deliver(Craft{.opcode = kWriteOnly,
                  .psn = rq(n),
                  .ack_req = true,
                  .reth_va = reinterpret_cast<uint64_t>(dst.data()),
                  .reth_rkey = dmr->ibmr.rkey,
                  .reth_len = 4,
                  .payload = {1, 2, 3, 4}});
  };
  auto acks_for = [&](uint32_t n) {
    auto tx = take();
    return tx.size() == 1 && tx[0].opcode == kAck && tx[0].psn == rq(n);
  };
  write(0);
  EXPECT_TRUE(acks_for(0));
  write(1);
  EXPECT_TRUE(acks_for(1));

  send(1, src, smr, 8);
  take();
  deliver(Craft{.opcode = kAck, .psn = sq(0), .msn = 1});
  write(2);
  EXPECT_TRUE(take().empty());
  engine->flush_deferred_acks();  // what the progress thread's next turn does first
  EXPECT_TRUE(acks_for(2));

  send(2, src, smr, 8);
  take();
  deliver(Craft{.opcode = kAck, .psn = sq(1), .msn = 2});
  recv_buf(rbuf, 7);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(3), .ack_req = true, .payload = {9}});
  EXPECT_TRUE(acks_for(3));
  EXPECT_EQ(poll(*rcq).size(), 1u);
}

// Receive two SENDs in an application's turn and no reply follows / Expect
// one ACK covering both at the start of the next turn.
TEST_F(Hardening, ApplicationTurnAckGoesWithTheNextTurn) {
  std::vector<uint8_t> a(16, 0), b(16, 0);
  recv_buf(a, 1);
  recv_buf(b, 2);
  deliver({Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = {1}},
           Craft{.opcode = kSendOnly, .psn = rq(1), .ack_req = true, .payload = {2}}},
          EngineContext::Turn::kApplication);
  EXPECT_TRUE(take().empty());
  EXPECT_EQ(poll(*rcq).size(), 2u);
  engine->flush_deferred_acks();
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kAck);
  EXPECT_EQ(tx[0].psn, rq(1));
}

// Receive SEND_ONLY in an application's turn, then the QP is destroyed with
// no further post or poll / Expect the ACK sent on the way out.
TEST_F(Hardening, DeferredAckLeavesWithTheDestroyedQp) {
  std::vector<uint8_t> buf(16, 0);
  recv_buf(buf, 1);
  deliver(Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = {1}}, EngineContext::Turn::kApplication);
  EXPECT_TRUE(take().empty());
  engine->unregister_qp(qp);
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kAck);
  EXPECT_EQ(tx[0].psn, rq(0));
  engine->register_qp(qp);  // for TearDown
}

// --- tombstones and QP numbers ---------------------------------------------------

// Destroy connected QPs / Expect their tombstones bounded in count and gone
// once their peers have been quiet long enough.
TEST_F(Hardening, TombstonesAreBoundedAndExpire) {
  const uint32_t own = qp->qp_num();
  for (int i = 0; i < 1100; ++i) {
    std::lock_guard lock(qp->mu);
    qp->ibqp.qp_base.qp_num = 0x100000 + uint32_t(i);
    engine->add_tombstone(*qp);
  }
  EXPECT_LE(engine->tombstone_count(), 1024u);
  EXPECT_GT(engine->tombstone_count(), 0u);
  {
    std::lock_guard lock(qp->mu);
    qp->ibqp.qp_base.qp_num = own;
  }
  run_timers(Clock::now() + std::chrono::seconds(2));
  EXPECT_EQ(engine->tombstone_count(), 0u);
}

// Receive SEND_ONLY(ePSN), destroy the QP, then receive the SEND again (as
// the peer retransmits when that ACK is lost) / Expect the tombstone's ACK,
// bytes exactly: BTH (RC ACKNOWLEDGE, no SE, MigReq, pad or FECN/BECN, TVer 0,
// default P_Key, the peer's QP 0x000777, no AckReq, PSN ePSN - 1 = 1000),
// AETH (0x1F, the MSN the QP had, 1), then a correct ICRC.
TEST_F(Hardening, TombstoneAcksARetransmission) {
  std::vector<uint8_t> buf(16, 0);
  recv_buf(buf, 1);
  Craft send{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = {1}};
  deliver(send);
  ASSERT_EQ(take().size(), 1u);
  engine->retire_qp(qp);  // as ibv_destroy_qp
  deliver(send);
  ASSERT_EQ(sent.size(), 1u);
  const std::vector<uint8_t> golden = {
      0x11, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x07, 0x77, 0x00, 0x00, 0x03, 0xE8,  // BTH
      0x1F, 0x00, 0x00, 0x01,                                                  // AETH
  };
  EXPECT_EQ(without_icrc(sent[0]), golden);
  EXPECT_EQ(take().size(), 1u);  // parses, ICRC correct
  engine->register_qp(qp);       // for TearDown
}

// Destroy a connected QP (timeout 14: 67 ms) whose path was clean / Expect its tombstone
// to stop a close's wait after kQuiet (30 ms). Destroy one whose path lost packets (it
// resent) / Expect it to wait for the peer's resend at its backed-off local ACK timer,
// four timeouts (268 ms): a close that stopped after 30 ms left a peer whose last ACK
// was lost resending into a dead port (ibv_rc_pingpong with retry_cnt 7: forever).
TEST_F(Hardening, TombstoneWaitsLongerOnALossyPath) {
  using std::chrono::milliseconds;
  engine->retire_qp(qp);  // as ibv_destroy_qp
  auto retired = Clock::now();
  EXPECT_FALSE(engine->tombstones_quiet(retired));
  EXPECT_TRUE(engine->tombstones_quiet(retired + Tombstones::kQuiet + milliseconds(1)));
  engine->register_qp(qp);
  qp->counters->retransmits.store(1);
  engine->retire_qp(qp);
  retired = Clock::now();
  EXPECT_FALSE(engine->tombstones_quiet(retired + milliseconds(250)));
  EXPECT_TRUE(engine->tombstones_quiet(retired + milliseconds(280)));
  engine->register_qp(qp);  // for TearDown
}

// Allocate QP numbers / Expect valid 24-bit numbers other than 0 and 1, that
// do not follow each other (a blind sender cannot walk them).
TEST_F(Hardening, QpNumbersAreNotSequential) {
  std::set<uint32_t> seen;
  unsigned consecutive = 0;
  uint32_t prev = engine->allocate_qp_num();
  for (int i = 0; i < 100; ++i) {
    uint32_t n = engine->allocate_qp_num();
    EXPECT_GE(n, 2u);
    EXPECT_LE(n, 0xFFFFFFu);
    consecutive += n == prev + 1;
    seen.insert(n);
    prev = n;
  }
  EXPECT_LT(consecutive, 50u);
  EXPECT_GT(seen.size(), 90u);
}

}  // namespace
}  // namespace uroce::engine::test
