// XRC protocol tests (IBA Vol. 1 Annex A14, XRC, engine/xrc_target.h): crafted XRC
// requests in for a target QP (IBV_QPT_XRC_RECV) delivering into XRC SRQs,
// the relay of requests for SRQs of other contexts out and in, and an
// initiator QP (IBV_QPT_XRC_SEND) whose requests carry the XRCETH.
//
// The objects are wired as verbs/xrc_verbs.cc does: a private domain
// (XrcDomain::open(-1, O_CREAT)) in an EngineXrcd, the target attached to it
// with xrc_target_attach, XRC SRQs as core::Srq with xrcd, xrc_cq and the
// number register_xrc_srq gives. The harness creates every QP with its PD and
// CQs whatever the type; a target ignores them (receives, PD and CQ are the
// named SRQ's), which the tests make sure of by giving the SRQs their own PD
// and CQs; TargetWithoutPdOrCqs runs a target made exactly as create_target
// makes it (no PD, no CQs).
#include <fcntl.h>

#include <array>
#include <cstring>
#include <memory>

#include "core/srq.h"
#include "engine/xrc_domain.h"
#include "engine/xrc_target.h"
#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

// XRC opcodes: the RC ones | 0xA0.
constexpr uint8_t kXrcSendFirst = 0xA0, kXrcSendMiddle = 0xA1, kXrcSendLast = 0xA2, kXrcSendOnly = 0xA4,
                  kXrcWriteOnly = 0xAA, kXrcReadRequest = 0xAC, kXrcReadRespOnly = 0xB0, kXrcAck = 0xB1,
                  kXrcAtomicAck = 0xB2, kXrcFetchAdd = 0xB4;

// The prefix of a relayed request (RelayHeader in xrc_target.cc; host byte order).
struct RelayHdr {
  uint8_t marker;
  uint8_t version;
  uint16_t home_port;
  uint32_t qp_num;
  uint32_t slot_index;
  uint32_t from_ip;
  uint32_t to_ip;
  uint16_t from_port;
  uint16_t to_port;  // the port the request arrived at
  uint64_t domain_dev;
  uint64_t domain_ino;
};
static_assert(sizeof(RelayHdr) == 40);

constexpr uint16_t kOtherPort = 20000;  // another context's UDP port (LID)

uint32_t srq_number(uint16_t port, uint32_t index) { return (uint32_t(port) << 8) | index; }

// What every XRC fixture needs: domains, XRC SRQs and their PDs and CQs.
class XrcTest : public EngineTest {
 protected:
  void TearDown() override {
    if (engine) {
      if (qp) xrc_target_detach(*qp);
      for (auto& s : srqs) {
        // SRQs of a second context were unregistered by the test that closed it.
        if (s->ctx == engine) engine->unregister_xrc_srq(s.get());
        xrc_domain_of(s.get())->remove_srq(s->srq_num);
      }
    }
    srqs.clear();
    cqs.clear();
    EngineTest::TearDown();  // deregisters the MRs: the PDs go after
    pds.clear();
    xrcds.clear();
  }

  EngineXrcd* open_xrcd(EngineContext* ctx, std::shared_ptr<XrcDomain> domain = nullptr) {
    auto x = std::make_unique<EngineXrcd>();
    if (!domain) {
      auto opened = XrcDomain::open(-1, O_CREAT);
      EXPECT_TRUE(opened.ok()) << "XrcDomain::open: " << opened.err();
      if (opened.ok()) domain = std::move(*opened);
    }
    x->domain = std::move(domain);
    x->ctx = ctx;
    x->ibxrcd.context = ctx->ib();
    xrcds.push_back(std::move(x));
    return xrcds.back().get();
  }

  core::Pd* new_pd(EngineContext* ctx) {
    auto p = std::make_unique<core::Pd>();
    p->ctx = ctx;
    p->ibpd.context = ctx->ib();
    pds.push_back(std::move(p));
    return pds.back().get();
  }

  core::Cq* new_cq(EngineContext* ctx) {
    cqs.push_back(std::make_unique<core::Cq>(ctx->ib(), 64, nullptr, nullptr));
    return cqs.back().get();
  }

  // An XRC SRQ of `x` in `ctx`, as create_srq_ex makes one.
  core::Srq* new_srq(EngineContext* ctx, EngineXrcd* x, core::Pd* p, core::Cq* cq) {
    auto s = std::make_unique<core::Srq>(ctx, p, 16, 4);
    s->ibsrq.context = ctx->ib();
    s->ibsrq.pd = &p->ibpd;
    s->xrcd = x;
    s->xrc_cq = cq;
    s->srq_num = ctx->register_xrc_srq(s.get());
    EXPECT_EQ(xrc_srq_port(s->srq_num), ctx->lid());
    EXPECT_TRUE(x->domain->add_srq(s->srq_num));
    srqs.push_back(std::move(s));
    return srqs.back().get();
  }

  core::Mr* reg_in(core::Pd* p, std::vector<uint8_t>& buf, unsigned access, EngineContext* ctx = nullptr) {
    auto r = (ctx ? ctx : engine)->mrs.add(p, buf.data(), buf.size(), reinterpret_cast<uint64_t>(buf.data()), access);
    EXPECT_TRUE(r.ok()) << r.err();
    if (!r.ok()) return nullptr;
    if (!ctx || ctx == engine) mrs.push_back(*r);
    return *r;
  }

  static void srq_recv(core::Srq* s, uint64_t wr_id, std::vector<uint8_t>& buf, const core::Mr* mr) {
    ibv_sge g = sge(buf.data(), uint32_t(buf.size()), mr);
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &g;
    wr.num_sge = 1;
    ASSERT_EQ(s->post(wr), 0);
  }

  void deliver_raw(std::vector<uint8_t>& bytes, transport::Endpoint src, uint32_t dst_ip,
                   EngineContext* ctx = nullptr) {
    transport::RxDatagram d;
    d.data = bytes.data();
    d.len = uint32_t(bytes.size());
    d.src = src;
    d.dst_ip = dst_ip;
    (ctx ? ctx : engine)->process_burst(std::span(&d, 1));
  }

  std::vector<std::unique_ptr<EngineXrcd>> xrcds;
  std::vector<std::unique_ptr<core::Pd>> pds;
  std::vector<std::unique_ptr<core::Cq>> cqs;
  std::vector<std::unique_ptr<core::Srq>> srqs;
};

// The QP under test is an XRC target of domain `xrcd` with two XRC SRQs, A and
// B, each with its own CQ, both in the PD `spd` (not the harness's PD).
class XrcTargetQp : public XrcTest {
 protected:
  XrcTargetQp() {
    qp_type = IBV_QPT_XRC_RECV;
    qp_access |= IBV_ACCESS_REMOTE_ATOMIC;
  }
  void SetUp() override {
    EngineTest::SetUp();
    ASSERT_NE(engine, nullptr);
    xrcd = open_xrcd(engine);
    ASSERT_NE(xrcd->domain, nullptr);
    ASSERT_EQ(xrc_target_attach(*qp, *xrcd), 0);
    spd = new_pd(engine);
    cq_a = new_cq(engine);
    cq_b = new_cq(engine);
    srq_a = new_srq(engine, xrcd, spd, cq_a);
    srq_b = new_srq(engine, xrcd, spd, cq_b);
    ASSERT_NE(srq_a->srq_num, srq_b->srq_num);
    bring_up();
  }

  // A receive buffer in the SRQs' PD, posted to `s`.
  core::Mr* srq_buf(core::Srq* s, std::vector<uint8_t>& buf, uint64_t wr_id) {
    core::Mr* mr = reg_in(spd, buf, IBV_ACCESS_LOCAL_WRITE);
    srq_recv(s, wr_id, buf, mr);
    return mr;
  }

  Craft send_only(uint32_t psn, uint32_t srqn, std::vector<uint8_t> payload) {
    return Craft{.opcode = kXrcSendOnly, .psn = psn, .ack_req = true, .xrc_srqn = srqn, .payload = std::move(payload)};
  }

  // One XRC ACK/NAK (responses carry no XRCETH) to the initiator.
  void expect_single_ack(uint8_t syndrome, uint32_t psn) {
    auto tx = take();
    ASSERT_EQ(tx.size(), 1u);
    EXPECT_EQ(tx[0].opcode, kXrcAck);
    ASSERT_TRUE(tx[0].syndrome.has_value());
    EXPECT_EQ(*tx[0].syndrome, syndrome);
    EXPECT_EQ(tx[0].psn, psn);
    EXPECT_EQ(tx[0].dest_qp, kPeerQpn);
    EXPECT_FALSE(tx[0].xrc_srqn.has_value());
    EXPECT_TRUE(tx[0].payload.empty());
  }

  RelayHdr relay_hdr() const {
    const XrcDomainKey& k = xrcd->domain->key();
    return RelayHdr{0xFF,      1,          kLocalPort, qp->qp_num(), qp->xrc->slot_index, kPeerIp, local_ip,
                    kPeerPort, kLocalPort, k.dev,      k.ino};
  }

  // A relay datagram: `h`, then the request as the peer sent it to us.
  std::vector<uint8_t> relay_datagram(const RelayHdr& h, const Craft& c) {
    std::vector<uint8_t> d(sizeof h);
    std::memcpy(d.data(), &h, sizeof h);
    auto inner = build(c);
    d.insert(d.end(), inner.begin(), inner.end());
    return d;
  }

  EngineXrcd* xrcd = nullptr;
  core::Pd* spd = nullptr;
  core::Cq *cq_a = nullptr, *cq_b = nullptr;
  core::Srq *srq_a = nullptr, *srq_b = nullptr;
};

// Receive XRC SEND_ONLY(ePSN, AckReq) naming SRQ A, which has a receive posted /
// Expect one XRC ACK (0xB1, syndrome ACK, request PSN, MSN 1, no XRCETH), the
// bytes in A's buffer, and one RECV completion on A's CQ (not the QP's receive
// CQ, not B's) with qp_num = the target QP and src_qp = the initiator.
TEST_F(XrcTargetQp, SendOnlyDeliversIntoNamedSrq) {
  std::vector<uint8_t> buf(256, 0xEE);
  srq_buf(srq_a, buf, 41);
  auto data = pattern(100, 3);
  deliver(send_only(rq(0), srq_a->srq_num, data));

  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kXrcAck);
  EXPECT_EQ(tx[0].syndrome, wire::kAckNoCredit);
  EXPECT_EQ(tx[0].psn, rq(0));
  EXPECT_EQ(tx[0].msn, 1u);
  EXPECT_EQ(tx[0].dest_qp, kPeerQpn);
  EXPECT_FALSE(tx[0].xrc_srqn.has_value());

  auto wc = poll(*cq_a);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 41u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 100u);
  EXPECT_EQ(wc[0].qp_num, qp->qp_num());
  EXPECT_EQ(wc[0].src_qp, kPeerQpn);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), buf.begin()));
  EXPECT_EQ(buf[100], 0xEE) << "nothing written past the message";
  EXPECT_TRUE(poll(*cq_b).empty());
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
}

// Receive XRC SEND FIRST/MIDDLE/LAST (AckReq on LAST), each naming SRQ A /
// Expect the whole message in A's buffer, one completion on A's CQ and one
// ACK for the LAST PSN.
TEST_F(XrcTargetQp, MultiPacketSendIntoOneSrq) {
  std::vector<uint8_t> buf(4096, 0);
  srq_buf(srq_a, buf, 7);
  auto data = pattern(2 * kMtu + 10, 4);
  std::vector<uint8_t> a(data.begin(), data.begin() + kMtu), b(data.begin() + kMtu, data.begin() + 2 * kMtu),
      c(data.begin() + 2 * kMtu, data.end());
  uint32_t n = srq_a->srq_num;
  deliver({Craft{.opcode = kXrcSendFirst, .psn = rq(0), .xrc_srqn = n, .payload = a},
           Craft{.opcode = kXrcSendMiddle, .psn = rq(1), .xrc_srqn = n, .payload = b},
           Craft{.opcode = kXrcSendLast, .psn = rq(2), .ack_req = true, .xrc_srqn = n, .payload = c}});
  expect_single_ack(wire::kAckNoCredit, rq(2));
  auto wc = poll(*cq_a);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 7u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].byte_len, 2 * kMtu + 10);
  EXPECT_EQ(wc[0].qp_num, qp->qp_num());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), buf.begin()));
  EXPECT_TRUE(poll(*cq_b).empty());
}

// Receive XRC SEND_FIRST naming SRQ A, then SEND_LAST naming SRQ B (same
// domain) / Expect NAK invalid request (0x61) with the LAST's PSN and the QP in
// ERR; the WQE taken from A completes in error on A's CQ (the CQ of the SRQ
// the WQE belongs to), nothing on B's; B's WQE is not consumed.
TEST_F(XrcTargetQp, MessageSwitchingSrqIsInvalidRequest) {
  std::vector<uint8_t> buf_a(4096, 0), buf_b(4096, 0);
  srq_buf(srq_a, buf_a, 1);
  srq_buf(srq_b, buf_b, 2);
  deliver({Craft{.opcode = kXrcSendFirst, .psn = rq(0), .xrc_srqn = srq_a->srq_num, .payload = pattern(kMtu, 1)},
           Craft{.opcode = kXrcSendLast,
                 .psn = rq(1),
                 .ack_req = true,
                 .xrc_srqn = srq_b->srq_num,
                 .payload = pattern(10, 2)}});
  expect_single_ack(nak(1), rq(1));
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
  auto wc_a = poll(*cq_a);
  ASSERT_EQ(wc_a.size(), 1u) << "the error completion of A's WQE belongs on A's CQ";
  EXPECT_EQ(wc_a[0].wr_id, 1u);
  EXPECT_NE(wc_a[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc_a[0].qp_num, qp->qp_num());
  auto wc_b = poll(*cq_b);
  EXPECT_TRUE(wc_b.empty()) << "B's CQ got wr_id " << wc_b[0].wr_id << " status " << wc_b[0].status;
  core::RecvWqe w;
  std::array<core::Sge, core::kMaxSrqSge> sges;
  bool limit = false;
  ASSERT_TRUE(srq_b->take(&w, sges.data(), &limit)) << "B's WQE is still posted";
  EXPECT_EQ(w.wr_id, 2u);
}

// Receive XRC SEND_ONLY naming an SRQ number of this context's port that has
// no SRQ / Expect NAK invalid request (request PSN), QP in ERR, no completion.
TEST_F(XrcTargetQp, SendNamingMissingSrqIsInvalidRequest) {
  deliver(send_only(rq(0), srq_number(kLocalPort, 200), pattern(16, 1)));
  expect_single_ack(nak(1), rq(0));
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
  EXPECT_TRUE(poll(*cq_a).empty());
  EXPECT_TRUE(poll(*cq_b).empty());
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_EQ(engine->stats.tx_xrc_relayed.load(), 0u);
}

// Receive XRC SEND_ONLY naming an XRC SRQ of this context but of another
// domain (with a receive posted) / Expect NAK invalid request, QP in ERR, the
// other domain's WQE untouched and no completion anywhere.
TEST_F(XrcTargetQp, SendNamingSrqOfOtherDomainIsInvalidRequest) {
  EngineXrcd* other = open_xrcd(engine);
  core::Cq* cq_c = new_cq(engine);
  core::Srq* srq_c = new_srq(engine, other, spd, cq_c);
  std::vector<uint8_t> buf(256, 0);
  srq_buf(srq_c, buf, 9);
  deliver(send_only(rq(0), srq_c->srq_num, pattern(16, 1)));
  expect_single_ack(nak(1), rq(0));
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
  EXPECT_TRUE(poll(*cq_c).empty());
  EXPECT_TRUE(poll(*cq_a).empty());
  EXPECT_EQ(buf[0], 0);
  core::RecvWqe w;
  std::array<core::Sge, core::kMaxSrqSge> sges;
  bool limit = false;
  ASSERT_TRUE(srq_c->take(&w, sges.data(), &limit));
  EXPECT_EQ(w.wr_id, 9u);
}

// Receive XRC SEND_ONLY naming SRQ A, which is empty / Expect RNR NAK
// (0x20|min_rnr_timer, request PSN), no completion, QP still RTS; once a
// receive is posted to A the same PSN is accepted.
TEST_F(XrcTargetQp, EmptySrqIsRnrNak) {
  auto data = pattern(32, 1);
  deliver(send_only(rq(0), srq_a->srq_num, data));
  expect_single_ack(rnr_nak(min_rnr_timer), rq(0));
  EXPECT_TRUE(poll(*cq_a).empty());
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);

  std::vector<uint8_t> buf(64, 0);
  srq_buf(srq_a, buf, 5);
  deliver(send_only(rq(0), srq_a->srq_num, data));
  expect_single_ack(wire::kAckNoCredit, rq(0));
  auto wc = poll(*cq_a);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 5u);
  EXPECT_EQ(wc[0].byte_len, 32u);
}

// Receive XRC RDMA_WRITE_ONLY naming SRQ A with the R_Key of an MR in A's PD /
// Expect the memory written, an ACK, no receive completion.
TEST_F(XrcTargetQp, WriteChecksRkeyAgainstSrqPd) {
  std::vector<uint8_t> target(1024, 0);
  core::Mr* mr = reg_in(spd, target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  auto data = pattern(300, 9);
  deliver(Craft{.opcode = kXrcWriteOnly,
                .psn = rq(0),
                .ack_req = true,
                .xrc_srqn = srq_a->srq_num,
                .reth_va = reinterpret_cast<uint64_t>(target.data()) + 100,
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 300,
                .payload = data});
  expect_single_ack(wire::kAckNoCredit, rq(0));
  EXPECT_TRUE(std::equal(data.begin(), data.end(), target.begin() + 100));
  EXPECT_EQ(target[99], 0);
  EXPECT_EQ(target[400], 0);
  EXPECT_TRUE(poll(*cq_a).empty());
}

// Receive XRC RDMA_WRITE_ONLY naming SRQ A with the R_Key of an MR of another
// PD (the one the harness created the QP with: a target has no PD of its own)
// / Expect NAK remote access (0x62), memory untouched, QP in ERR.
TEST_F(XrcTargetQp, WriteRkeyOfOtherPdIsRemoteAccessNak) {
  std::vector<uint8_t> target(1024, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  deliver(Craft{.opcode = kXrcWriteOnly,
                .psn = rq(0),
                .ack_req = true,
                .xrc_srqn = srq_a->srq_num,
                .reth_va = reinterpret_cast<uint64_t>(target.data()),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 64,
                .payload = pattern(64, 2)});
  expect_single_ack(nak(2), rq(0));
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
  for (uint8_t b : target) ASSERT_EQ(b, 0);
}

// Receive XRC RDMA_READ_REQUEST naming SRQ A, R_Key of an MR in A's PD /
// Expect one XRC READ_RESPONSE_ONLY (0xB0) with the request PSN, AETH ACK and
// the bytes; the next request PSN is the one after.
TEST_F(XrcTargetQp, ReadRequestAnsweredWithXrcReadResponse) {
  auto src = pattern(300, 5);
  core::Mr* mr = reg_in(spd, src, IBV_ACCESS_REMOTE_READ);
  deliver(Craft{.opcode = kXrcReadRequest,
                .psn = rq(0),
                .ack_req = true,
                .xrc_srqn = srq_a->srq_num,
                .reth_va = reinterpret_cast<uint64_t>(src.data()),
                .reth_rkey = mr->ibmr.rkey,
                .reth_len = 300});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kXrcReadRespOnly);
  EXPECT_EQ(tx[0].psn, rq(0));
  EXPECT_EQ(tx[0].dest_qp, kPeerQpn);
  EXPECT_EQ(tx[0].syndrome, wire::kAckNoCredit);
  EXPECT_FALSE(tx[0].xrc_srqn.has_value());
  EXPECT_EQ(tx[0].payload, src);

  std::vector<uint8_t> buf(64, 0);
  srq_buf(srq_a, buf, 3);
  deliver(send_only(rq(1), srq_a->srq_num, {1, 2, 3}));
  expect_single_ack(wire::kAckNoCredit, rq(1));
  EXPECT_EQ(poll(*cq_a).size(), 1u);
}

// Receive XRC FETCH_ADD naming SRQ A, R_Key of an MR in A's PD / Expect XRC
// ATOMIC_ACKNOWLEDGE (0xB2) with the original value and the memory updated.
TEST_F(XrcTargetQp, FetchAddAnsweredWithXrcAtomicAck) {
  std::vector<uint8_t> mem(64, 0);
  uint64_t v = 40;
  std::memcpy(mem.data() + 8, &v, 8);
  core::Mr* mr = reg_in(spd, mem, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  deliver(Craft{.opcode = kXrcFetchAdd,
                .psn = rq(0),
                .ack_req = true,
                .xrc_srqn = srq_a->srq_num,
                .atomic_va = reinterpret_cast<uint64_t>(mem.data()) + 8,
                .atomic_rkey = mr->ibmr.rkey,
                .swap_add = 2});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kXrcAtomicAck);
  EXPECT_EQ(tx[0].psn, rq(0));
  EXPECT_EQ(tx[0].syndrome, wire::kAckNoCredit);
  EXPECT_EQ(tx[0].atomic_orig, 40u);
  std::memcpy(&v, mem.data() + 8, 8);
  EXPECT_EQ(v, 42u);
}

// Receive XRC SEND_ONLY naming SRQ number (P << 8) | 3 of another context's
// port P / Expect exactly one datagram, to 127.0.0.1:P from 127.0.0.1: the
// 40-byte relay header (marker 0xFF, version 1, home_port = our port, the
// target QP and its slot, the request's sender and our address, the domain
// key), then the received packet byte for byte; no ACK, no completion.
TEST_F(XrcTargetQp, RequestForOtherContextsSrqIsRelayed) {
  std::vector<uint8_t> buf(256, 0);
  srq_buf(srq_a, buf, 1);
  ASSERT_TRUE(xrcd->domain->add_srq(srq_number(kOtherPort, 3)));  // as that context's create_srq_ex does
  Craft c = send_only(rq(0), srq_number(kOtherPort, 3), pattern(50, 8));
  auto packet = build(c);
  deliver(c);

  ASSERT_EQ(sent.size(), 1u);
  const Sent& s = sent[0];
  EXPECT_EQ(s.dst.ip, kLoopback);
  EXPECT_EQ(s.dst.port, kOtherPort);
  EXPECT_EQ(s.src_ip, kLoopback);
  ASSERT_EQ(s.bytes.size(), sizeof(RelayHdr) + packet.size());
  RelayHdr h;
  std::memcpy(&h, s.bytes.data(), sizeof h);
  EXPECT_EQ(h.marker, 0xFF);
  EXPECT_EQ(h.version, 1);
  EXPECT_EQ(h.home_port, kLocalPort);
  EXPECT_EQ(h.qp_num, qp->qp_num());
  EXPECT_EQ(h.slot_index, qp->xrc->slot_index);
  EXPECT_EQ(h.from_ip, kPeerIp);
  EXPECT_EQ(h.from_port, kPeerPort);
  EXPECT_EQ(h.to_ip, local_ip);
  EXPECT_EQ(h.to_port, kLocalPort);
  EXPECT_EQ(h.domain_dev, xrcd->domain->key().dev);
  EXPECT_EQ(h.domain_ino, xrcd->domain->key().ino);
  EXPECT_TRUE(std::equal(packet.begin(), packet.end(), s.bytes.begin() + sizeof(RelayHdr)));
  sent.clear();
  EXPECT_EQ(engine->stats.tx_xrc_relayed.load(), 1u);
  EXPECT_TRUE(poll(*cq_a).empty());
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);
}

// Receive XRC SEND_ONLY naming an SRQ number of another port that is no SRQ of
// the domain / Expect no relay (a peer cannot make us send to arbitrary local
// ports) but NAK invalid request from here, and the target in ERR.
TEST_F(XrcTargetQp, RequestForUnknownSrqOfOtherPortIsNotRelayed) {
  deliver(send_only(rq(0), srq_number(kOtherPort, 4), pattern(8, 1)));
  expect_single_ack(nak(1), rq(0));
  EXPECT_EQ(engine->stats.tx_xrc_relayed.load(), 0u);
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
}

// Receive a relay datagram (from 127.0.0.1, some port) for our target QP and
// slot whose request names SRQ A / Expect the relay proxy to answer the
// initiator itself (XRC ACK to the peer, correct ICRC), the completion on A's
// CQ with qp_num = the target QP; the shared state advanced: the same PSN
// delivered directly afterwards is a duplicate, ACKed and not delivered again.
TEST_F(XrcTargetQp, RelayedRequestRunsOnSharedState) {
  std::vector<uint8_t> buf1(256, 0), buf2(256, 0);
  srq_buf(srq_a, buf1, 11);
  srq_buf(srq_a, buf2, 12);
  auto data = pattern(80, 6);
  Craft c = send_only(rq(0), srq_a->srq_num, data);
  auto d = relay_datagram(relay_hdr(), c);
  deliver_raw(d, transport::Endpoint{kLoopback, 40000}, kLoopback);

  auto tx = take();  // checks destination (the peer) and ICRC
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kXrcAck);
  EXPECT_EQ(tx[0].syndrome, wire::kAckNoCredit);
  EXPECT_EQ(tx[0].psn, rq(0));
  EXPECT_EQ(tx[0].msn, 1u);
  EXPECT_EQ(tx[0].dest_qp, kPeerQpn);
  auto wc = poll(*cq_a);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 11u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 80u);
  EXPECT_EQ(wc[0].qp_num, qp->qp_num());
  EXPECT_EQ(wc[0].src_qp, kPeerQpn);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), buf1.begin()));

  uint64_t dups = engine->stats.rx_duplicates.load();
  deliver(c);
  expect_single_ack(wire::kAckNoCredit, rq(0));
  EXPECT_TRUE(poll(*cq_a).empty()) << "a duplicate is not delivered again";
  EXPECT_EQ(engine->stats.rx_duplicates.load(), dups + 1);
  EXPECT_EQ(buf2[0], 0);
}

// Receive relay datagrams that must not run: from a non-loopback address, for
// a wrong slot, a wrong QP number, an unknown domain, or with a corrupted inner
// ICRC / Expect each dropped and counted (rx_malformed, rx_no_qp, rx_bad_icrc),
// nothing sent or completed and the state untouched: a valid relay of the same
// request then runs normally.
TEST_F(XrcTargetQp, BadRelayDatagramsAreDroppedAndCounted) {
  std::vector<uint8_t> buf(256, 0);
  srq_buf(srq_a, buf, 21);
  Craft c = send_only(rq(0), srq_a->srq_num, pattern(40, 1));
  const transport::Endpoint lo{kLoopback, 40000};
  Stats& st = engine->stats;

  uint64_t malformed = st.rx_malformed.load();
  auto d = relay_datagram(relay_hdr(), c);
  deliver_raw(d, transport::Endpoint{0x0A000001, 40000}, kLoopback);
  EXPECT_EQ(st.rx_malformed.load(), malformed + 1) << "non-loopback source";

  uint64_t no_qp = st.rx_no_qp.load();
  RelayHdr h = relay_hdr();
  h.slot_index += 1;
  d = relay_datagram(h, c);
  deliver_raw(d, lo, kLoopback);
  EXPECT_EQ(st.rx_no_qp.load(), no_qp + 1) << "wrong slot";
  h = relay_hdr();
  h.qp_num += 1;
  d = relay_datagram(h, c);
  deliver_raw(d, lo, kLoopback);
  EXPECT_EQ(st.rx_no_qp.load(), no_qp + 2) << "wrong QP number";
  h = relay_hdr();
  h.domain_ino += 1000;
  d = relay_datagram(h, c);
  deliver_raw(d, lo, kLoopback);
  EXPECT_EQ(st.rx_no_qp.load(), no_qp + 3) << "unknown domain";

  uint64_t bad_icrc = st.rx_bad_icrc.load();
  Craft bad = c;
  bad.corrupt_icrc = true;
  d = relay_datagram(relay_hdr(), bad);
  deliver_raw(d, lo, kLoopback);
  EXPECT_EQ(st.rx_bad_icrc.load(), bad_icrc + 1) << "corrupted inner ICRC";

  EXPECT_TRUE(sent.empty());
  EXPECT_TRUE(poll(*cq_a).empty());
  EXPECT_EQ(qp->state(), IBV_QPS_RTS);

  d = relay_datagram(relay_hdr(), c);
  deliver_raw(d, lo, kLoopback);
  expect_single_ack(wire::kAckNoCredit, rq(0));
  auto wc = poll(*cq_a);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 21u);
}

// Receive a relay datagram whose request (WRITE naming SRQ A, R_Key of another
// PD) is a class C error / Expect the relay proxy to NAK it (0x62) and the
// target QP to be in ERR from then on (IBA 10.3.1: left only through RESET):
// the QP reports ERR, a RTS->RTS modify (valid only from RTS) does not bring
// it back (it fails, or leaves the QP in ERR), and a request delivered
// directly afterwards is dropped.
TEST_F(XrcTargetQp, FatalErrorThroughRelayLeavesTargetInErr) {
  std::vector<uint8_t> target(256, 0);
  core::Mr* mr = reg(target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);  // the harness's PD
  Craft w{.opcode = kXrcWriteOnly,
          .psn = rq(0),
          .ack_req = true,
          .xrc_srqn = srq_a->srq_num,
          .reth_va = reinterpret_cast<uint64_t>(target.data()),
          .reth_rkey = mr->ibmr.rkey,
          .reth_len = 16,
          .payload = pattern(16, 1)};
  auto d = relay_datagram(relay_hdr(), w);
  deliver_raw(d, transport::Endpoint{kLoopback, 40000}, kLoopback);
  expect_single_ack(nak(2), rq(0));
  EXPECT_EQ(target[0], 0);

  // Nothing has reached the target QP itself since (the state is the slot's);
  // ibv_query_qp and ibv_modify_qp take it from there.
  {
    std::lock_guard lock(qp->mu);
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    ASSERT_EQ(xrc_target_query(*qp, &attr, &init), 0);
    EXPECT_EQ(attr.qp_state, IBV_QPS_ERR) << "ibv_query_qp of the target";
    attr = ibv_qp_attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.min_rnr_timer = 3;
    (void)qp->modify(attr, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER);
  }
  std::vector<uint8_t> buf(64, 0);
  srq_buf(srq_a, buf, 1);
  deliver(send_only(rq(1), srq_a->srq_num, {1}));
  for (const Pkt& p : take())
    ADD_FAILURE() << "the target answered after its fatal error: opcode 0x" << std::hex << unsigned(p.opcode)
                  << " syndrome 0x" << unsigned(p.syndrome.value_or(0)) << std::dec << " psn " << p.psn;
  EXPECT_TRUE(poll(*cq_a).empty());
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
}

// A handle opened on the target (ibv_open_qp, here in the same context) changes
// its RNR timer (RTS->RTS) / Expect the target itself to answer with the new
// timer, both handles to report it, and the target to stop answering once its
// own handle (closed first: kept) and then the opened one are gone.
TEST_F(XrcTargetQp, ModifyThroughOpenedHandleReachesTarget) {
  ASSERT_EQ(engine->reserve(core::Resource::kQp), 0);  // as ibv_create_qp: reclaiming the QP releases it
  auto opened = xrc_target_open(*engine, *xrcd, qp->qp_num(), nullptr);
  ASSERT_TRUE(opened.ok()) << opened.err();
  EngineQp* h = *opened;
  EXPECT_EQ(h->qp_num(), qp->qp_num());
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  {
    std::lock_guard lock(h->mu);
    ASSERT_EQ(xrc_target_query(*h, &a, &init), 0);
    EXPECT_EQ(a.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(a.min_rnr_timer, min_rnr_timer);
    a = ibv_qp_attr{};
    a.min_rnr_timer = 20;
    ASSERT_EQ(h->modify(a, IBV_QP_MIN_RNR_TIMER), 0);
  }
  deliver(send_only(rq(0), srq_a->srq_num, pattern(8, 1)));  // SRQ A is empty
  expect_single_ack(rnr_nak(20), rq(0));
  {
    std::lock_guard lock(qp->mu);
    ASSERT_EQ(xrc_target_query(*qp, &a, &init), 0);
    EXPECT_EQ(a.min_rnr_timer, 20);
  }

  // The creator's handle goes first: the QP is kept (still registered) for h.
  EXPECT_EQ(xrc_target_close(*qp), HandleClose::kQpKept);
  deliver(send_only(rq(0), srq_a->srq_num, pattern(8, 1)));
  expect_single_ack(rnr_nak(20), rq(0));
  // The last handle: the QP is gone; the kept object no longer answers.
  EXPECT_EQ(xrc_target_close(*h), HandleClose::kHandleOnly);
  delete h;
  EXPECT_TRUE(xrc_target_unheld(*qp));
  deliver(send_only(rq(0), srq_a->srq_num, pattern(8, 1)));
  EXPECT_TRUE(take().empty());
  EXPECT_EQ(engine->stats.rx_no_qp.load(), 1u);
  // The context reclaims it (as its progress thread does, at the next prune).
  engine->run_timers(Clock::now() + std::chrono::seconds(1));
  EXPECT_EQ(engine->in_use(core::Resource::kQp), 0u);
  qp = new EngineQp(engine, nullptr, nullptr, nullptr, IBV_QPT_XRC_RECV, core::QpCaps{1, 1, 1, 1, 0}, false,
                    engine->allocate_qp_num(), nullptr);  // what TearDown destroys
  engine->register_qp(qp);
}

// A target made as create_target makes it (no PD, no CQs, no receive queue) /
// Expect the same behaviour without touching any of them: SEND into SRQ A
// completes on A's CQ; SEND for an empty SRQ B is RNR NAKed; FIRST naming A
// then LAST naming B is NAK invalid request, A's WQE completing in error on
// A's CQ, and the QP goes to ERR.
TEST_F(XrcTargetQp, TargetWithoutPdOrCqs) {
  xrc_target_detach(*qp);
  engine->unregister_qp(qp);
  delete qp;
  qp = new EngineQp(engine, nullptr, nullptr, nullptr, IBV_QPT_XRC_RECV, core::QpCaps{1, 1, 1, 1, 0}, false,
                    engine->allocate_qp_num(), nullptr);
  engine->register_qp(qp);
  ASSERT_EQ(xrc_target_attach(*qp, *xrcd), 0);
  bring_up();

  std::vector<uint8_t> buf1(64, 0), buf2(4096, 0);
  srq_buf(srq_a, buf1, 1);
  deliver(send_only(rq(0), srq_a->srq_num, {1, 2}));
  expect_single_ack(wire::kAckNoCredit, rq(0));
  auto wc = poll(*cq_a);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].qp_num, qp->qp_num());
  EXPECT_EQ(wc[0].byte_len, 2u);

  deliver(send_only(rq(1), srq_b->srq_num, {3}));
  expect_single_ack(rnr_nak(min_rnr_timer), rq(1));

  srq_buf(srq_a, buf2, 2);
  deliver({Craft{.opcode = kXrcSendFirst, .psn = rq(1), .xrc_srqn = srq_a->srq_num, .payload = pattern(kMtu, 1)},
           Craft{.opcode = kXrcSendLast,
                 .psn = rq(2),
                 .ack_req = true,
                 .xrc_srqn = srq_b->srq_num,
                 .payload = pattern(10, 2)}});
  expect_single_ack(nak(1), rq(2));
  EXPECT_EQ(qp->state(), IBV_QPS_ERR);
  wc = poll(*cq_a);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_NE(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_TRUE(poll(*cq_b).empty());
}

// Two contexts of one process on the same domain: the target QP in ours, an
// XRC SRQ in a second context (port P). Receive a SEND naming that SRQ / Expect
// it relayed to P; hand the relay to the second context / Expect that context
// to ACK the initiator (from its own port, correct ICRC) and complete on its
// SRQ's CQ for our target QP; then a request for PSN + 1 naming our SRQ A,
// delivered to us, is in sequence (the state is shared).
TEST_F(XrcTargetQp, RelayRoundTripBetweenContexts) {
  constexpr uint16_t kPort2 = 20001;
  std::vector<Sent> sent2;
  EngineContext* e2 = EngineContext::open_with(core::devices()[0], std::make_unique<FakeTransport>(&sent2, kPort2),
                                               /*start_thread=*/false);
  ASSERT_NE(e2, nullptr);
  {
    EngineXrcd* x2 = open_xrcd(e2, xrcd->domain);
    core::Pd* pd2 = new_pd(e2);
    core::Cq* cq2 = new_cq(e2);
    core::Srq* srq2 = new_srq(e2, x2, pd2, cq2);
    std::vector<uint8_t> buf2(256, 0);
    core::Mr* mr2 = reg_in(pd2, buf2, IBV_ACCESS_LOCAL_WRITE, e2);
    srq_recv(srq2, 31, buf2, mr2);

    auto data = pattern(60, 2);
    deliver(send_only(rq(0), srq2->srq_num, data));
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_EQ(sent[0].dst.port, kPort2);
    std::vector<uint8_t> relayed = sent[0].bytes;
    sent.clear();
    deliver_raw(relayed, transport::Endpoint{kLoopback, kLocalPort}, kLoopback, e2);

    ASSERT_EQ(sent2.size(), 1u);
    EXPECT_EQ(sent2[0].dst.ip, kPeerIp);
    EXPECT_EQ(sent2[0].dst.port, kPeerPort);
    wire::PacketView v;
    ASSERT_EQ(wire::PacketView::parse(sent2[0].bytes.data(), sent2[0].bytes.size(), v), wire::ParseError::kNone);
    EXPECT_EQ(v.bth().opcode(), kXrcAck);
    EXPECT_EQ(v.bth().psn(), rq(0));
    EXPECT_EQ(v.bth().dest_qp(), kPeerQpn);
    EXPECT_EQ(v.aeth().syndrome(), wire::kAckNoCredit);
    wire::Ipv4Flow flow{sent2[0].src_ip, kPeerIp, kPort2, kPeerPort};
    EXPECT_EQ(wire::icrc_ipv4(flow, sent2[0].bytes.data(), sent2[0].bytes.size()), v.icrc_wire());
    auto wc = poll(*cq2);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].wr_id, 31u);
    EXPECT_EQ(wc[0].qp_num, qp->qp_num());
    EXPECT_EQ(wc[0].byte_len, 60u);
    EXPECT_TRUE(std::equal(data.begin(), data.end(), buf2.begin()));

    std::vector<uint8_t> buf(64, 0);
    srq_buf(srq_a, buf, 32);
    deliver(send_only(rq(1), srq_a->srq_num, {7}));
    expect_single_ack(wire::kAckNoCredit, rq(1));
    EXPECT_EQ(poll(*cq_a).size(), 1u);

    e2->unregister_xrc_srq(srq2);
    EXPECT_EQ(e2->mrs.remove(mr2), 0);
  }
  e2->close();
}

// The QP under test is an XRC initiator (an RC send queue whose requests name
// the target's XRC SRQ). The harness also gives it a receive CQ, unused.
class XrcInitiator : public XrcTest {
 protected:
  static constexpr uint32_t kRemoteSrqn = 0x123456;
  XrcInitiator() { qp_type = IBV_QPT_XRC_SEND; }
  void SetUp() override {
    EngineTest::SetUp();
    ASSERT_NE(engine, nullptr);
    bring_up();
    src = pattern(4096, 11);
    src_mr = reg(src, IBV_ACCESS_LOCAL_WRITE);
  }

  std::vector<uint8_t> src;
  core::Mr* src_mr = nullptr;
};

// Post a SEND with remote_srqn N / Expect XRC SEND_ONLY (0xA4) with XRCETH = N,
// AckReq, sq_psn; a plain RC ACK (0x11) for it is dropped (wrong service) and
// completes nothing; the XRC ACK (0xB1) completes it.
TEST_F(XrcInitiator, SendCarriesXrcethAndNeedsXrcAck) {
  ibv_send_wr wr{};
  wr.wr_id = 5;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.qp_type.xrc.remote_srqn = kRemoteSrqn;
  post_send(wr, {sge(src.data(), 100, src_mr)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kXrcSendOnly);
  ASSERT_TRUE(tx[0].xrc_srqn.has_value());
  EXPECT_EQ(*tx[0].xrc_srqn, kRemoteSrqn);
  EXPECT_EQ(tx[0].psn, sq(0));
  EXPECT_EQ(tx[0].dest_qp, kPeerQpn);
  EXPECT_TRUE(tx[0].ack_req);
  ASSERT_EQ(tx[0].payload.size(), 100u);
  EXPECT_TRUE(std::equal(tx[0].payload.begin(), tx[0].payload.end(), src.begin()));

  uint64_t wrong = engine->stats.rx_wrong_service.load();
  deliver(Craft{.opcode = kAck, .psn = sq(0), .syndrome = wire::kAckNoCredit, .msn = 1});
  EXPECT_EQ(engine->stats.rx_wrong_service.load(), wrong + 1);
  EXPECT_TRUE(poll(*scq).empty());

  deliver(Craft{.opcode = kXrcAck, .psn = sq(0), .syndrome = wire::kAckNoCredit, .msn = 1});
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 5u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(wc[0].qp_num, qp->qp_num());
  EXPECT_TRUE(take().empty());
}

// Post an RDMA READ with remote_srqn N / Expect XRC READ_REQUEST (0xAC) with
// XRCETH = N and the RETH; XRC READ_RESPONSE_ONLY / Expect the bytes in the
// local buffer and an RDMA_READ completion.
TEST_F(XrcInitiator, ReadCarriesXrceth) {
  std::vector<uint8_t> dst(200, 0);
  core::Mr* dst_mr = reg(dst, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.wr_id = 8;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = 0xABC000;
  wr.wr.rdma.rkey = 0x4321;
  wr.qp_type.xrc.remote_srqn = kRemoteSrqn;
  post_send(wr, {sge(dst.data(), 200, dst_mr)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kXrcReadRequest);
  ASSERT_TRUE(tx[0].xrc_srqn.has_value());
  EXPECT_EQ(*tx[0].xrc_srqn, kRemoteSrqn);
  ASSERT_TRUE(tx[0].reth_va.has_value());
  EXPECT_EQ(*tx[0].reth_va, 0xABC000u);
  EXPECT_EQ(tx[0].reth_rkey, 0x4321u);
  EXPECT_EQ(tx[0].reth_len, 200u);
  EXPECT_EQ(tx[0].psn, sq(0));

  auto data = pattern(200, 3);
  deliver(Craft{.opcode = kXrcReadRespOnly, .psn = sq(0), .syndrome = wire::kAckNoCredit, .msn = 1, .payload = data});
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 8u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wc[0].byte_len, 200u);
  EXPECT_EQ(dst, data);
}

// Post an atomic FETCH_ADD with remote_srqn N / Expect XRC FETCH_ADD (0xB4)
// with XRCETH = N and the AtomicETH; XRC ATOMIC_ACKNOWLEDGE / Expect the
// original value in the local buffer and a FETCH_ADD completion.
TEST_F(XrcInitiator, AtomicCarriesXrceth) {
  std::vector<uint8_t> dst(8, 0);
  core::Mr* dst_mr = reg(dst, IBV_ACCESS_LOCAL_WRITE);
  ibv_send_wr wr{};
  wr.wr_id = 9;
  wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.atomic.remote_addr = 0xABC008;
  wr.wr.atomic.rkey = 0x5555;
  wr.wr.atomic.compare_add = 7;
  wr.qp_type.xrc.remote_srqn = kRemoteSrqn;
  post_send(wr, {sge(dst.data(), 8, dst_mr)});
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kXrcFetchAdd);
  EXPECT_EQ(tx[0].xrc_srqn, kRemoteSrqn);
  EXPECT_EQ(tx[0].atomic_va, 0xABC008u);
  EXPECT_EQ(tx[0].atomic_rkey, 0x5555u);
  EXPECT_EQ(tx[0].swap_add, 7u);

  deliver(Craft{.opcode = kXrcAtomicAck, .psn = sq(0), .syndrome = wire::kAckNoCredit, .msn = 1, .atomic_orig = 99});
  auto wc = poll(*scq);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 9u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_FETCH_ADD);
  uint64_t orig;
  std::memcpy(&orig, dst.data(), 8);
  EXPECT_EQ(orig, 99u);
}

// Receive an XRC request (SEND_ONLY) at an initiator / Expect it dropped as the
// wrong service: nothing sent, no completion.
TEST_F(XrcInitiator, RequestToInitiatorIsDropped) {
  uint64_t wrong = engine->stats.rx_wrong_service.load();
  deliver(Craft{.opcode = kXrcSendOnly, .psn = 0, .ack_req = true, .xrc_srqn = 0x42, .payload = {1, 2, 3}});
  EXPECT_EQ(engine->stats.rx_wrong_service.load(), wrong + 1);
  EXPECT_TRUE(sent.empty());
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_TRUE(poll(*scq).empty());
}

}  // namespace
}  // namespace uroce::engine::test
