// Unreliable Datagram service (roce-facts.md §2.5, §5.3): crafted UD SEND_ONLY
// packets in, receive completions (GRH area, src_qp, slid) out, no ACKs.
#include <cstring>

#include "core/ah.h"
#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

constexpr uint8_t kUdSendOnly = 0x64, kUdSendOnlyImm = 0x65;
constexpr uint32_t kSenderQpn = 0x000ABC;

class Ud : public EngineTest {
 protected:
  Ud() { qp_type = IBV_QPT_UD; }
  void SetUp() override {
    EngineTest::SetUp();
    bring_up();
    buf.assign(40 + 256, 0xEE);
    mr = reg(buf, IBV_ACCESS_LOCAL_WRITE);
    post_recv(3, {sge(buf.data(), uint32_t(buf.size()), mr)});
  }

  // An address handle to the peer (kPeerIp, UDP port kPeerPort) from GID 0.
  core::Ah* peer_ah() {
    ibv_ah_attr a{};
    a.is_global = 1;
    a.grh.dgid = core::ipv4_to_gid(kPeerIp);
    a.grh.sgid_index = 0;
    a.grh.hop_limit = 64;
    a.dlid = kPeerPort;
    a.port_num = 1;
    auto ah = std::make_unique<core::Ah>();
    EXPECT_EQ(core::resolve_ah(*engine, a, ah.get()), 0);
    ahs.push_back(std::move(ah));
    return ahs.back().get();
  }

  // A UD work request to QP `remote_qpn` through `ah` with Q_Key `qkey`.
  static ibv_send_wr ud_wr(core::Ah* ah, uint32_t remote_qpn, uint32_t qkey, ibv_wr_opcode op = IBV_WR_SEND) {
    ibv_send_wr wr{};
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = &ah->ibah;
    wr.wr.ud.remote_qpn = remote_qpn;
    wr.wr.ud.remote_qkey = qkey;
    return wr;
  }

  // enqueue_send's answer to `wr` with one SGE of `len` bytes of `src`.
  int try_post(ibv_send_wr wr, std::vector<uint8_t>& src, uint32_t len) {
    core::Mr* m = reg(src, IBV_ACCESS_LOCAL_WRITE);
    ibv_sge s = sge(src.data(), len, m);
    wr.sg_list = &s;
    wr.num_sge = 1;
    std::lock_guard lock(qp->mu);
    int rc = qp->enqueue_send(wr);
    if (rc == 0) requester_post(*qp);
    return rc;
  }

  Craft send(uint32_t qkey, std::vector<uint8_t> payload) {
    return Craft{.opcode = kUdSendOnly,
                 .psn = 77,  // UD has no sequence: any PSN is accepted
                 .deth_qkey = qkey,
                 .deth_src_qp = kSenderQpn,
                 .payload = std::move(payload)};
  }

  std::vector<uint8_t> buf;
  core::Mr* mr = nullptr;
  std::vector<std::unique_ptr<core::Ah>> ahs;
};

// Receive UD SEND_ONLY with the QP's Q_Key / Expect the 40-byte GRH area (20
// zero bytes, then the IPv4 header: version 4, UDP, addresses of the datagram),
// the payload after it, byte_len 40 + payload, src_qp from DETH, slid = the
// sender's UDP port, IBV_WC_GRH, sl = the RoCE packet type as mlx5 reports it
// (0x8 UDP | 0x2 IPv4: UCX reads it to find the GID in the GRH area), and nothing
// transmitted.
TEST_F(Ud, SendDeliversGrhAndPayload) {
  auto data = pattern(100, 4);
  deliver(send(kQkey, data));
  EXPECT_TRUE(take().empty());
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 3u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].byte_len, 140u);
  EXPECT_EQ(wc[0].src_qp, kSenderQpn);
  EXPECT_EQ(wc[0].slid, kPeerPort);
  EXPECT_TRUE(wc[0].wc_flags & IBV_WC_GRH);
  EXPECT_EQ(wc[0].sl, 0xA);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(buf[size_t(i)], 0) << i;
  const uint8_t* ip = buf.data() + 20;
  EXPECT_EQ(ip[0], 0x45);
  EXPECT_EQ(ip[9], 17);
  EXPECT_EQ(wire::load_be32(ip + 12), kPeerIp);
  EXPECT_EQ(wire::load_be32(ip + 16), local_ip);
  // Total length: IP 20 + UDP 8 + BTH 12 + DETH 8 + payload 100 + ICRC 4.
  EXPECT_EQ(wire::load_be16(ip + 2), 20u + 8 + 12 + 8 + 100 + 4);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), buf.begin() + 40));
  EXPECT_EQ(buf[140], 0xEE);  // nothing past the message
}

// Receive UD SEND_ONLY with another Q_Key / Expect it dropped silently and
// counted as a Q_Key violation; the receive WQE stays posted for the next one.
TEST_F(Ud, WrongQkeyIsDroppedAndCounted) {
  uint64_t before = engine->stats.rx_qkey_violations.load();
  deliver(send(kQkey + 1, pattern(16, 1)));
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_TRUE(take().empty());
  EXPECT_EQ(engine->stats.rx_qkey_violations.load(), before + 1);
  deliver(send(kQkey, pattern(16, 2)));
  EXPECT_EQ(poll(*rcq).size(), 1u);
}

// Receive UD SEND_ONLY_WITH_IMMEDIATE too long for the buffer once the GRH area
// is counted / Expect it dropped (UD: no NAK), the WQE kept for a message that fits.
TEST_F(Ud, MessageLongerThanBufferIsDropped) {
  Craft c = send(kQkey, pattern(257, 3));
  c.opcode = kUdSendOnlyImm;
  deliver(c);
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_TRUE(take().empty());
  deliver(send(kQkey, pattern(256, 5)));
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].byte_len, 296u);
}

// --- responder -----------------------------------------------------------------

// Receive UD SEND_ONLY_WITH_IMMEDIATE / Expect a RECV completion with
// IBV_WC_GRH | IBV_WC_WITH_IMM, imm_data unchanged, byte_len 40 + payload,
// the QP's number; nothing transmitted.
TEST_F(Ud, SendWithImmediate) {
  Craft c = send(kQkey, pattern(33, 1));
  c.opcode = kUdSendOnlyImm;
  c.imm = 0xDEADBEEF;
  deliver(c);
  EXPECT_TRUE(take().empty());
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 40u + 33);
  EXPECT_EQ(wc[0].wc_flags, unsigned(IBV_WC_GRH | IBV_WC_WITH_IMM));
  EXPECT_EQ(wc[0].imm_data, 0xDEADBEEFu);
  EXPECT_EQ(wc[0].qp_num, qp->qp_num());
  EXPECT_EQ(wc[0].src_qp, kSenderQpn);
}

// Receive two UD datagrams with one receive posted / Expect the first
// delivered and the second dropped silently and counted (UD has no RNR NAK:
// rxe's RESPST_ERR_RNR, UD/UC class D); a later datagram takes the next
// receive posted, not the lost one.
TEST_F(Ud, DatagramWithoutReceiveIsDropped) {
  uint64_t before = engine->stats.rx_no_recv_wqe.load();
  deliver({send(kQkey, pattern(10, 1)), send(kQkey, pattern(11, 2))});
  EXPECT_TRUE(take().empty());
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].byte_len, 50u);
  EXPECT_EQ(engine->stats.rx_no_recv_wqe.load(), before + 1);
  post_recv(4, {sge(buf.data(), uint32_t(buf.size()), mr)});
  deliver(send(kQkey, pattern(12, 3)));
  wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 4u);
  EXPECT_EQ(wc[0].byte_len, 52u);
}

// Receive UD datagrams with PSNs out of any order (77, 3, 0xFFFFFF, 3 again)
// / Expect every one delivered in arrival order: UD checks no PSN (roce-facts
// §4.2).
TEST_F(Ud, AnyPsnIsAccepted) {
  for (uint64_t id = 10; id < 13; ++id) post_recv(id, {sge(buf.data(), uint32_t(buf.size()), mr)});
  std::vector<Craft> burst;
  for (uint32_t psn : {77u, 3u, 0xFFFFFFu, 3u}) {
    Craft c = send(kQkey, pattern(4 + burst.size(), 1));
    c.psn = psn;
    burst.push_back(c);
  }
  deliver(burst);
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(wc[i].byte_len, 40u + 4 + i) << i;
  EXPECT_EQ(wc[0].wr_id, 3u);
  EXPECT_EQ(wc[3].wr_id, 12u);
}

// Receive a UD datagram into a receive of two SGEs, 40 bytes for the GRH area
// and one for the payload (as IPoIB-style receivers post) / Expect the GRH
// area in the first and the payload at the start of the second.
TEST_F(Ud, GrhAreaInItsOwnSge) {
  std::vector<uint8_t> grh(40, 0xEE), data_buf(128, 0xEE);
  core::Mr* gm = reg(grh, IBV_ACCESS_LOCAL_WRITE);
  core::Mr* dm = reg(data_buf, IBV_ACCESS_LOCAL_WRITE);
  // Use up the fixture's receive first.
  deliver(send(kQkey, pattern(1, 0)));
  ASSERT_EQ(poll(*rcq).size(), 1u);
  post_recv(6, {sge(grh.data(), 40, gm), sge(data_buf.data(), 128, dm)});
  auto data = pattern(100, 5);
  deliver(send(kQkey, data));
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 6u);
  EXPECT_EQ(wc[0].byte_len, 140u);
  EXPECT_EQ(grh[20], 0x45);
  EXPECT_EQ(wire::load_be32(grh.data() + 32), kPeerIp);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), data_buf.begin()));
  EXPECT_EQ(data_buf[100], 0xEE);
}

// Receive a UD datagram from another host and UDP port than the fixture's
// peer / Expect it delivered (UD is not connected: no path check, rxe's
// check_addr is RC/UC only) with slid = that port and that source address in
// the GRH area; then an address handle made from the completion
// (ibv_init_ah_from_wc) / Expect a reply sent back to exactly that address.
TEST_F(Ud, AnySourceIsAcceptedAndAnswerable) {
  constexpr uint32_t kOtherIp = 0x7F000002;
  constexpr uint16_t kOtherPort = 20001;
  Craft c = send(kQkey, pattern(20, 1));
  c.src_ip = kOtherIp;
  c.src_port = kOtherPort;
  deliver(c);
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].slid, kOtherPort);
  EXPECT_EQ(wire::load_be32(buf.data() + 32), kOtherIp);

  ibv_ah_attr a{};
  ASSERT_EQ(core::ah_attr_from_wc(*engine, 1, wc[0], reinterpret_cast<const ibv_grh*>(buf.data()), &a), 0);
  EXPECT_EQ(a.grh.dgid.raw[15], 2);
  core::Ah ah;
  ASSERT_EQ(core::resolve_ah(*engine, a, &ah), 0);
  std::vector<uint8_t> src = pattern(8, 2);
  ASSERT_EQ(try_post(ud_wr(&ah, kSenderQpn, kQkey), src, 8), 0);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].dst.ip, kOtherIp);
  EXPECT_EQ(sent[0].dst.port, kOtherPort);
  sent.clear();
}

// Receive an RC and a UC SEND_ONLY addressed to the UD QP / Expect both
// dropped and counted as the wrong service, the receive kept for a UD one.
TEST_F(Ud, OtherServicesOpcodesAreDropped) {
  uint64_t before = engine->stats.rx_wrong_service.load();
  deliver({Craft{.opcode = kSendOnly, .payload = pattern(8, 1)},
           Craft{.opcode = 0x20 | kSendOnly, .payload = pattern(8, 1)}});
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_TRUE(take().empty());
  EXPECT_EQ(engine->stats.rx_wrong_service.load(), before + 2);
  deliver(send(kQkey, pattern(8, 2)));
  EXPECT_EQ(poll(*rcq).size(), 1u);
}

// Receive UD datagrams for a QP number no QP has, and for the multicast QPN
// (0xFFFFFF, IBA 10.5.2.4) on a group no QP joined / Expect both dropped and
// counted as having no QP; the posted receive kept.
TEST_F(Ud, UnknownQpAndUnjoinedMulticastAreDropped) {
  uint64_t before = engine->stats.rx_no_qp.load();
  Craft other = send(kQkey, pattern(8, 1));
  other.dest_qp = qp->qp_num() ^ 0x1;
  Craft mcast = send(kQkey, pattern(8, 1));
  mcast.dest_qp = 0xFFFFFF;
  deliver({other, mcast});
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_TRUE(take().empty());
  EXPECT_EQ(engine->stats.rx_no_qp.load(), before + 2);
  deliver(send(kQkey, pattern(8, 2)));
  EXPECT_EQ(poll(*rcq).size(), 1u);
}

// Receive UD SEND_ONLY with the privileged Q_Key bit set in DETH (0x80000000
// | the QP's key) / Expect it dropped and counted: the receiver compares the
// whole key (roce-facts §2.5; the bit-31 substitution is a sender rule).
TEST_F(Ud, ReceiveComparesTheWholeQkey) {
  uint64_t before = engine->stats.rx_qkey_violations.load();
  deliver(send(kQkey | 0x80000000u, pattern(8, 1)));
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_EQ(engine->stats.rx_qkey_violations.load(), before + 1);
}

// --- requester -----------------------------------------------------------------

// Post two signaled UD SENDs through an address handle / Expect one
// SEND_ONLY (0x64) each, to the AH's address and UDP port, BTH DestQP = the
// WR's remote QPN, DETH = (the WR's Q_Key, our QP number), consecutive PSNs
// from sq_psn, no AckReq; each WQE completed at once (no ACK on UD) and no
// retransmission later.
TEST_F(Ud, SendThroughAddressHandleCompletesWithoutAck) {
  core::Ah* ah = peer_ah();
  std::vector<uint8_t> src = pattern(300, 4);
  for (uint64_t id = 1; id <= 2; ++id) {
    ibv_send_wr wr = ud_wr(ah, kSenderQpn, 0x01234567);
    wr.wr_id = id;
    ASSERT_EQ(try_post(wr, src, 300), 0);
  }
  auto tx = take();  // checks the destination: kPeerIp, kPeerPort
  ASSERT_EQ(tx.size(), 2u);
  for (uint32_t i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(tx[i].opcode, kUdSendOnly);
    EXPECT_EQ(tx[i].dest_qp, kSenderQpn);
    EXPECT_EQ(tx[i].psn, sq(i));
    EXPECT_FALSE(tx[i].ack_req);
    ASSERT_TRUE(tx[i].deth_qkey.has_value());
    EXPECT_EQ(*tx[i].deth_qkey, 0x01234567u);
    EXPECT_EQ(tx[i].deth_src_qp, qp->qp_num());
    EXPECT_EQ(tx[i].payload, src);
  }
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 2u);
  for (uint64_t i = 0; i < 2; ++i) {
    EXPECT_EQ(wc[i].wr_id, i + 1);
    EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc[i].opcode, IBV_WC_SEND);
  }
  run_timers(Clock::now() + std::chrono::seconds(10));
  EXPECT_TRUE(take().empty());
}

// Post a solicited UD SEND_WITH_IMM / Expect SEND_ONLY_WITH_IMMEDIATE (0x65):
// DETH before ImmDt, the immediate unchanged, SE set.
TEST_F(Ud, SendWithImmediateAndSolicitedEvent) {
  std::vector<uint8_t> src = pattern(5, 1);
  ibv_send_wr wr = ud_wr(peer_ah(), kSenderQpn, kQkey, IBV_WR_SEND_WITH_IMM);
  wr.send_flags |= IBV_SEND_SOLICITED;
  wr.imm_data = 0x10203040;
  ASSERT_EQ(try_post(wr, src, 5), 0);
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kUdSendOnlyImm);
  EXPECT_EQ(tx[0].imm, 0x10203040u);
  EXPECT_EQ(tx[0].deth_qkey, kQkey);
  EXPECT_TRUE(tx[0].se);
  EXPECT_EQ(tx[0].pad, 3u);
  EXPECT_EQ(tx[0].payload, src);
}

// Post a UD SEND whose remote Q_Key has bit 31 set / Expect the QP's own
// Q_Key in DETH instead (IBA 10.2.5 controlled Q_Keys; roce-facts §2.5).
TEST_F(Ud, PrivilegedQkeyTakesTheQpsOwn) {
  std::vector<uint8_t> src = pattern(4, 1);
  ASSERT_EQ(try_post(ud_wr(peer_ah(), kSenderQpn, 0x80000001), src, 4), 0);
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].deth_qkey, kQkey);
}

// Post a zero-length UD SEND / Expect one SEND_ONLY without payload; receive
// one / Expect byte_len 40 (the GRH area alone).
TEST_F(Ud, ZeroLengthMessage) {
  std::vector<uint8_t> src(1, 0);
  ASSERT_EQ(try_post(ud_wr(peer_ah(), kSenderQpn, kQkey), src, 0), 0);
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_TRUE(tx[0].payload.empty());
  EXPECT_EQ(tx[0].pad, 0u);
  deliver(send(kQkey, {}));
  auto wc = poll(*rcq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].byte_len, 40u);
}

// Post on a UD QP an RDMA WRITE, an RDMA READ and a SEND without an address
// handle / Expect EINVAL for each and nothing sent (IBA 9.4: UD has SEND only;
// rdma-core rxe's validate_send_wr / mlx5 need wr.ud.ah).
TEST_F(Ud, NonSendAndAddresslessWorkRequestsAreRejected) {
  core::Ah* ah = peer_ah();
  std::vector<uint8_t> src(8, 0);
  EXPECT_EQ(try_post(ud_wr(ah, kSenderQpn, kQkey, IBV_WR_RDMA_WRITE), src, 8), EINVAL);
  EXPECT_EQ(try_post(ud_wr(ah, kSenderQpn, kQkey, IBV_WR_RDMA_READ), src, 8), EINVAL);
  ibv_send_wr wr = ud_wr(ah, kSenderQpn, kQkey);
  wr.wr.ud.ah = nullptr;
  EXPECT_EQ(try_post(wr, src, 8), EINVAL);
  EXPECT_TRUE(sent.empty());
  EXPECT_TRUE(poll(*scq).empty());
}

}  // namespace
}  // namespace uroce::engine::test
