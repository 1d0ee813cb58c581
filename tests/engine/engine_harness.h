// Test harness for protocol tests of the engine, in the style of eRPC's
// protocol tests: one engine over a FakeTransport that captures every
// datagram it is asked to send and never receives; crafted packets are fed
// to EngineContext::process_burst and the tests assert on the captured
// transmit queue and on the completions.
//
// Packets fed to the engine carry a correct ICRC (computed for the flow
// peer -> local, as the engine's receive check expects), so the tests also
// run with UROCE_ICRC_CHECK at its default (on).
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/cq.h"
#include "core/device.h"
#include "core/mr.h"
#include "core/pd.h"
#include "engine/engine_context.h"
#include "engine/engine_qp.h"
#include "engine/roles.h"
#include "engine/tx_batch.h"
#include "transport/datagram.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/psn.h"

namespace uroce::engine::test {

// One datagram the engine sent.
struct Sent {
  transport::Endpoint dst;
  uint32_t src_ip = 0;
  std::vector<uint8_t> bytes;  // BTH .. ICRC
  // Of a GSO message: its number among the datagrams sent, its segment size,
  // and this packet's place in it (its IP identification on the wire).
  unsigned message = 0;
  uint16_t segment_size = 0;
  uint16_t ip_id = 0;
  bool jumbo = false;     // sent with send_jumbo (no ICRC)
  bool bare = false;      // TxDatagram::bare (no ICRC)
  unsigned pieces = 0;    // buffers the packet was gathered from
  bool in_place = false;  // written in place (reserve_bare / commit_bare), not sent by send_burst
};

class FakeTransport : public transport::DatagramTransport {
 public:
  FakeTransport(std::vector<Sent>* sink, uint16_t port) : sink_(sink), port_(port) {}
  size_t send_burst(std::span<transport::TxDatagram> burst) noexcept override {
    if (on_send) on_send(burst.size());
    for (auto& d : burst) {
      std::vector<uint8_t> bytes;
      for (unsigned i = 0; i < d.iovcnt; ++i) {
        auto* p = static_cast<const uint8_t*>(d.iov[i].iov_base);
        bytes.insert(bytes.end(), p, p + d.iov[i].iov_len);
      }
      // A GSO message: one packet per segment, as the kernel sends it.
      size_t seg = d.segment_size ? d.segment_size : std::max<size_t>(bytes.size(), 1);
      uint16_t id = 0;
      for (size_t off = 0; off < bytes.size() || off == 0; off += seg, ++id) {
        Sent s;
        s.dst = d.dst;
        s.src_ip = d.src_ip.v4();
        s.message = messages_;
        s.segment_size = d.segment_size;
        s.ip_id = id;
        s.bytes.assign(bytes.begin() + long(off), bytes.begin() + long(std::min(bytes.size(), off + seg)));
        s.pieces = pieces_within(d, off, off + s.bytes.size());
        s.bare = d.bare;
        sink_->push_back(std::move(s));
        if (bytes.empty()) break;
      }
      ++messages_;
    }
    return burst.size();
  }
  // How many of d's buffers hold bytes of [begin, end).
  static unsigned pieces_within(const transport::TxDatagram& d, size_t begin, size_t end) {
    unsigned n = 0;
    size_t at = 0;
    for (unsigned i = 0; i < d.iovcnt; at += d.iov[i].iov_len, ++i)
      if (d.iov[i].iov_len > 0 && at < end && at + d.iov[i].iov_len > begin) ++n;
    return n;
  }
  // Same-host jumbo packets: taken (captured whole) when jumbo_payload > 0.
  transport::JumboSend send_jumbo(const transport::Endpoint& dst, const transport::IpAddress& src_ip, const iovec* iov,
                                  unsigned iovcnt) noexcept override {
    if (!jumbo_payload) return transport::JumboSend::kNotLocal;
    Sent s;
    s.dst = dst;
    s.src_ip = src_ip.v4();
    s.message = messages_++;
    s.jumbo = true;
    for (unsigned i = 0; i < iovcnt; ++i) {
      auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
      s.bytes.insert(s.bytes.end(), p, p + iov[i].iov_len);
    }
    sink_->push_back(std::move(s));
    return transport::JumboSend::kSent;
  }
  uint32_t jumbo_limit(const transport::Endpoint&) noexcept override { return jumbo_payload; }
  // Same-host packets written in place: offered when in_place_room > 0 (up
  // to that many bytes), one slot at a time, as a ring would.
  bool reserve_bare(const transport::Endpoint& dst, const transport::IpAddress& src_ip, uint32_t len,
                    transport::BareSlot& slot) noexcept override {
    if (len > in_place_room || slot_open_) return false;
    slot_open_ = true;
    slot_ = Sent{};
    slot_.dst = dst;
    slot_.src_ip = src_ip.v4();
    slot_.bare = slot_.in_place = true;
    slot_.bytes.assign(len, 0xEE);  // not zero: what the writer leaves unwritten shows
    slot = transport::BareSlot{slot_.bytes.data(), this};
    return true;
  }
  void commit_bare(transport::BareSlot& slot) noexcept override {
    slot_.message = messages_++;
    sink_->push_back(std::move(slot_));
    slot_open_ = false;
    slot = {};
  }
  void abandon_bare(transport::BareSlot& slot) noexcept override {
    ++abandoned;
    slot_open_ = false;
    slot = {};
  }
  uint32_t in_place_room = 0;
  unsigned abandoned = 0;
  bool slot_open_ = false;
  Sent slot_;
  uint32_t jumbo_payload = 0;  // the largest jumbo payload taken (0: none, as over UDP)
  unsigned max_gso_segments() const noexcept override { return gso_segments; }
  // GSO messages this transport takes (1: none, as a transport without GSO).
  unsigned gso_segments = 1;
  bool through_memory(const transport::Endpoint&) noexcept override { return memory_path; }
  bool memory_path = false;  // the peer is reached through shared memory
  // The peer's board (ShmTransport::post_board): words taken when board_open.
  bool post_board(const transport::Endpoint& dst, uint32_t cell, uint64_t word) noexcept override {
    if (!board_open) return false;
    board.push_back(BoardPost{dst, cell, word});
    return true;
  }
  struct BoardPost {
    transport::Endpoint dst;
    uint32_t cell;
    uint64_t word;
  };
  bool board_open = false;
  std::vector<BoardPost> board;
  // Same-host mailboxes (engine/mailbox.h), when `mailboxes`: this engine's
  // own (whichever cell) and the peer's, a page each here.
  uint8_t* own_mailbox(uint32_t) noexcept override { return mailboxes ? own_page->data() : nullptr; }
  bool peer_mailbox(const transport::Endpoint& dst, uint32_t, transport::PeerMailbox* out) noexcept override {
    if (!mailboxes) return false;
    out->box = peer_page->data();
    out->port = dst.port;
    return true;
  }
  void notify_mailbox(const transport::PeerMailbox&) noexcept override { ++mail_notices; }
  struct alignas(64) Page : std::array<uint8_t, transport::kMailboxBytes> {};
  bool mailboxes = false;
  std::unique_ptr<Page> own_page = std::make_unique<Page>();
  std::unique_ptr<Page> peer_page = std::make_unique<Page>();
  unsigned mail_notices = 0;
  size_t recv_burst(std::span<transport::RxDatagram>, int) noexcept override { return 0; }
  void wake() noexcept override {}
  uint16_t local_port() const noexcept override { return port_; }

  // Called before each burst is captured (tests observe what is visible then).
  std::function<void(size_t)> on_send;

 private:
  std::vector<Sent>* sink_;
  uint16_t port_;
  unsigned messages_ = 0;
};

// A captured packet, decoded.
struct Pkt {
  uint8_t opcode = 0;
  uint32_t psn = 0;
  uint32_t dest_qp = 0;
  bool ack_req = false;
  bool se = false;
  unsigned pad = 0;
  std::optional<uint8_t> syndrome;  // AETH
  uint32_t msn = 0;
  std::optional<uint32_t> xrc_srqn;  // XRCETH
  std::optional<uint64_t> reth_va;
  uint32_t reth_rkey = 0, reth_len = 0;
  std::optional<uint32_t> imm;        // raw (network order)
  std::optional<uint64_t> atomic_va;  // AtomicETH
  uint32_t atomic_rkey = 0;
  uint64_t swap_add = 0, compare = 0;
  std::optional<uint64_t> atomic_orig;  // AtomicAckETH
  std::optional<uint32_t> deth_qkey;    // DETH (UD)
  uint32_t deth_src_qp = 0;
  std::vector<uint8_t> payload;
  bool jumbo = false;
  unsigned pieces = 0;  // buffers it was gathered from (Sent::pieces)
};

// A request/response to feed into the engine.
struct Craft {
  uint8_t opcode = 0;
  uint32_t psn = 0;
  bool ack_req = false;
  bool se = false;
  std::optional<uint32_t> dest_qp;   // default: the fixture's QP
  std::optional<uint32_t> xrc_srqn;  // XRCETH of XRC requests (default 0)
  uint64_t reth_va = 0;
  uint32_t reth_rkey = 0, reth_len = 0;
  uint8_t syndrome = wire::kAckNoCredit;
  uint32_t msn = 0;
  uint32_t imm = 0;
  uint64_t atomic_va = 0;  // AtomicETH
  uint32_t atomic_rkey = 0;
  uint64_t swap_add = 0, compare = 0;
  uint64_t atomic_orig = 0;                 // AtomicAckETH
  uint32_t deth_qkey = 0, deth_src_qp = 0;  // DETH (UD)
  std::vector<uint8_t> payload;
  bool corrupt_icrc = false;
  std::optional<uint32_t> src_ip;    // default: the peer's address
  std::optional<uint16_t> src_port;  // default: the peer's port
  uint16_t ip_id = 0;                // the ICRC is computed with this IP identification
  uint8_t gso_index = 0;             // place in a GRO batch, as the transport reports it
  std::optional<uint16_t> dst_port;  // the UDP port it was sent to (default: our LID)
  bool jumbo = false;                // a same-host jumbo packet (no ICRC; RxDatagram::jumbo)
  bool bare = false;                 // a same-host bare packet (no ICRC; RxDatagram::bare)
  bool ce = false;                   // marked Congestion Experienced on the way (RxDatagram::ce)
};

// A captured packet's bytes up to its ICRC (which take() checks), for tests
// that pin every header bit.
inline std::vector<uint8_t> without_icrc(const Sent& s) {
  if (s.bytes.size() < wire::kIcrcSize) return s.bytes;
  return {s.bytes.begin(), s.bytes.end() - wire::kIcrcSize};
}

inline std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + i * 7 + (i >> 8));
  return v;
}

class EngineTest : public ::testing::Test {
 protected:
  static constexpr uint16_t kLocalPort = 18515;  // our LID
  static constexpr uint16_t kPeerPort = 19875;   // dlid of the AV
  static constexpr uint32_t kPeerIp = 0x7F000001;
  static constexpr uint32_t kPeerQpn = 0x000777;
  static constexpr unsigned kMtu = 1024;
  static constexpr uint32_t kQkey = 0x11223344;

  // Attributes of the QP under test; tests may change them before bring_up()
  // (qp_type: in the fixture's constructor, the QP is created in SetUp).
  ibv_qp_type qp_type = IBV_QPT_RC;
  bool one_cq = false;  // the QP's receive completions go to scq too
  unsigned qp_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  uint32_t rq_psn = 1000;
  uint32_t sq_psn = 5000;
  uint8_t min_rnr_timer = 12;
  uint8_t timeout = 14;  // 67 ms
  uint8_t retry_cnt = 3;
  uint8_t rnr_retry = 3;
  uint8_t max_dest_rd_atomic = 4;
  uint8_t max_rd_atomic = 4;
  // Runs on the new engine before the QP is created (e.g. to give it a host slot).
  std::function<void(EngineContext*)> configure_engine;

  void SetUp() override {
    auto t = std::make_unique<FakeTransport>(&sent, kLocalPort);
    transport = t.get();
    engine = EngineContext::open_with(core::devices()[0], std::move(t), /*start_thread=*/false);
    ASSERT_NE(engine, nullptr);
    if (configure_engine) configure_engine(engine);
    ASSERT_EQ(engine->lid(), kLocalPort);
    ASSERT_TRUE(engine->gid_ip(0, &local_ip));
    pd = std::make_unique<core::Pd>();
    pd->ctx = engine;
    pd->ibpd.context = engine->ib();
    scq = std::make_unique<core::Cq>(engine->ib(), 256, nullptr, nullptr);
    rcq = std::make_unique<core::Cq>(engine->ib(), 256, nullptr, nullptr);
    core::QpCaps caps{64, 64, 4, 4, 64};
    qp = new EngineQp(engine, pd.get(), scq.get(), one_cq ? scq.get() : rcq.get(), qp_type, caps, false,
                      engine->allocate_qp_num(), nullptr);
    engine->register_qp(qp);
  }

  void TearDown() override {
    if (!engine) return;
    engine->unregister_qp(qp);
    delete qp;
    for (core::Mr* mr : mrs) EXPECT_EQ(engine->mrs.remove(mr), 0);
    scq.reset();
    rcq.reset();
    pd.reset();
    engine->close();
  }

  // RESET -> INIT -> RTR -> RTS with the attributes above (IBA 10.3.1
  // required attributes of each type: an XRC initiator connects like an RC
  // send queue, an XRC target like an RC receive queue).
  void bring_up() {
    if (qp_type == IBV_QPT_UD) return bring_up_ud();
    std::lock_guard lock(qp->mu);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = qp_access;
    ASSERT_EQ(qp->modify(a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = kPeerQpn;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = max_dest_rd_atomic;
    a.min_rnr_timer = min_rnr_timer;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = core::ipv4_to_gid(kPeerIp);
    a.ah_attr.grh.sgid_index = 0;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.dlid = kPeerPort;
    a.ah_attr.port_num = 1;
    const bool rc = qp_type == IBV_QPT_RC;
    const bool rc_send = rc || qp_type == IBV_QPT_XRC_SEND;  // RC requester attributes at RTS
    const bool rc_recv = rc || qp_type == IBV_QPT_XRC_RECV;  // RC responder attributes at RTR
    ASSERT_EQ(qp->modify(a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                (rc_recv ? IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0)),
              0);
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = sq_psn;
    a.timeout = timeout;
    a.retry_cnt = retry_cnt;
    a.rnr_retry = rnr_retry;
    a.max_rd_atomic = max_rd_atomic;
    int rts_mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    if (rc_send) rts_mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    if (qp_type == IBV_QPT_XRC_RECV) rts_mask |= IBV_QP_TIMEOUT;
    ASSERT_EQ(qp->modify(a, rts_mask), 0);
    ASSERT_EQ(qp->state(), IBV_QPS_RTS);
    sent.clear();
  }

  // UD: Q_Key at INIT, nothing to connect (IBA 10.3.1 UD attribute masks).
  void bring_up_ud() {
    std::lock_guard lock(qp->mu);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = kQkey;
    ASSERT_EQ(qp->modify(a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
    a.qp_state = IBV_QPS_RTR;
    ASSERT_EQ(qp->modify(a, IBV_QP_STATE), 0);
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = sq_psn;
    ASSERT_EQ(qp->modify(a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
    sent.clear();
  }

  // Registers `buf` with `iova` (0: the buffer's address, as ibv_reg_mr).
  core::Mr* reg(std::vector<uint8_t>& buf, unsigned access, uint64_t iova = 0) {
    auto r =
        engine->mrs.add(pd.get(), buf.data(), buf.size(), iova ? iova : reinterpret_cast<uint64_t>(buf.data()), access);
    EXPECT_TRUE(r.ok()) << r.err();
    if (!r.ok()) return nullptr;
    mrs.push_back(*r);
    return *r;
  }

  // A receive buffer registered for local write, with one receive posted.
  core::Mr* recv_buf(std::vector<uint8_t>& buf, uint64_t wr_id) {
    core::Mr* mr = reg(buf, IBV_ACCESS_LOCAL_WRITE);
    post_recv(wr_id, {sge(buf.data(), uint32_t(buf.size()), mr)});
    return mr;
  }

  void post_recv(uint64_t wr_id, std::vector<ibv_sge> sges) {
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = sges.data();
    wr.num_sge = int(sges.size());
    std::lock_guard lock(qp->mu);
    ASSERT_EQ(qp->enqueue_recv(wr), 0);
  }

  // Posts like verbs post_send: enqueue under the QP mutex, then run the
  // requester (requester_post: not while the QP streams).
  void post_send(ibv_send_wr wr, std::vector<ibv_sge> sges) {
    wr.sg_list = sges.data();
    wr.num_sge = int(sges.size());
    std::lock_guard lock(qp->mu);
    ASSERT_EQ(qp->enqueue_send(wr), 0);
    requester_post(*qp);
  }

  static ibv_sge sge(const void* addr, uint32_t len, const core::Mr* mr) {
    return ibv_sge{reinterpret_cast<uint64_t>(addr), len, mr->ibmr.lkey};
  }

  std::vector<uint8_t> build(const Craft& c) {
    const wire::OpcodeInfo& info = wire::opcode_info(c.opcode);
    EXPECT_TRUE(info.valid());
    unsigned pad = (4 - (c.payload.size() & 3)) & 3;
    std::vector<uint8_t> p(info.header_len + c.payload.size() + pad + wire::kIcrcSize, 0);
    wire::Bth(p.data()).fill(c.opcode, c.se, pad, wire::kDefaultPkey, c.dest_qp.value_or(qp->qp_num()), c.ack_req,
                             c.psn);
    if (info.has(wire::Hdr::kXrceth))
      wire::Xrceth(p.data() + info.offset[unsigned(wire::Hdr::kXrceth)]).fill(c.xrc_srqn.value_or(0));
    if (info.has(wire::Hdr::kReth))
      wire::Reth(p.data() + info.offset[unsigned(wire::Hdr::kReth)]).fill(c.reth_va, c.reth_rkey, c.reth_len);
    if (info.has(wire::Hdr::kAeth))
      wire::Aeth(p.data() + info.offset[unsigned(wire::Hdr::kAeth)]).fill(c.syndrome, c.msn);
    if (info.has(wire::Hdr::kImmDt)) wire::ImmDt(p.data() + info.offset[unsigned(wire::Hdr::kImmDt)]).fill_raw(c.imm);
    if (info.has(wire::Hdr::kDeth))
      wire::Deth(p.data() + info.offset[unsigned(wire::Hdr::kDeth)]).fill(c.deth_qkey, c.deth_src_qp);
    if (info.has(wire::Hdr::kAtomicEth))
      wire::AtomicEth(p.data() + info.offset[unsigned(wire::Hdr::kAtomicEth)])
          .fill(c.atomic_va, c.atomic_rkey, c.swap_add, c.compare);
    if (info.has(wire::Hdr::kAtomicAckEth))
      wire::AtomicAckEth(p.data() + info.offset[unsigned(wire::Hdr::kAtomicAckEth)]).fill(c.atomic_orig);
    if (!c.payload.empty()) std::memcpy(p.data() + info.header_len, c.payload.data(), c.payload.size());
    wire::Ipv4Flow flow{c.src_ip.value_or(kPeerIp), local_ip, c.src_port.value_or(kPeerPort),
                        c.dst_port.value_or(kLocalPort), c.ip_id};
    uint32_t crc = c.jumbo || c.bare ? 0 : wire::icrc_ipv4(flow, p.data(), p.size());  // jumbo, bare: none
    if (c.corrupt_icrc) crc ^= 1;
    std::memcpy(p.data() + p.size() - 4, &crc, 4);
    return p;
  }

  // Delivers packets to the engine as one receive burst (by default in the
  // progress thread's turn).
  void deliver(const std::vector<Craft>& burst, EngineContext::Turn turn = EngineContext::Turn::kProgress) {
    std::vector<std::vector<uint8_t>> bufs;
    for (const Craft& c : burst) bufs.push_back(build(c));
    std::vector<transport::RxDatagram> rx;
    for (size_t i = 0; i < bufs.size(); ++i) {
      auto& b = bufs[i];
      transport::RxDatagram d;
      d.data = b.data();
      d.len = uint32_t(b.size());
      d.src = transport::Endpoint{burst[i].src_ip.value_or(kPeerIp), burst[i].src_port.value_or(kPeerPort)};
      d.dst_ip = local_ip;
      d.gso_index = burst[i].gso_index;
      d.dst_port = burst[i].dst_port.value_or(kLocalPort);
      d.jumbo = burst[i].jumbo;
      d.bare = burst[i].bare;
      d.ce = burst[i].ce;
      rx.push_back(d);
    }
    engine->process_burst(std::span(rx.data(), rx.size()), turn);
  }
  void deliver(const Craft& c, EngineContext::Turn turn = EngineContext::Turn::kProgress) {
    deliver(std::vector<Craft>{c}, turn);
  }

  // Decodes (and clears) the capture; checks addressing, parse and ICRC of
  // each (none in a bare one).
  std::vector<Pkt> take() {
    std::vector<Pkt> out;
    for (Sent& s : sent) {
      EXPECT_EQ(s.dst.ip, kPeerIp);
      EXPECT_EQ(s.dst.port, kPeerPort);
      EXPECT_EQ(s.src_ip, local_ip);
      wire::PacketView v;
      EXPECT_EQ(wire::PacketView::parse(s.bytes.data(), s.bytes.size(), v), wire::ParseError::kNone);
      if (!v.info) continue;
      wire::Ipv4Flow flow{s.src_ip, s.dst.ip.v4(), kLocalPort, s.dst.port, s.ip_id};
      if (s.bare) {  // through shared memory: no ICRC (Delivery::icrc)
        EXPECT_EQ(v.icrc_wire(), 0u) << "a bare packet's ICRC room is zero";
      } else if (!s.jumbo) {
        EXPECT_EQ(wire::icrc_ipv4(flow, s.bytes.data(), s.bytes.size()), v.icrc_wire()) << "bad ICRC on the wire";
      }
      EXPECT_LE(s.pieces, transport::kMaxPacketPieces);
      Pkt p;
      p.jumbo = s.jumbo;
      p.pieces = s.pieces;
      wire::Bth bth = v.bth();
      p.opcode = bth.opcode();
      p.psn = bth.psn();
      p.dest_qp = bth.dest_qp();
      p.ack_req = bth.ack_req();
      p.se = bth.se();
      p.pad = bth.pad();
      EXPECT_EQ(bth.pkey(), 0xFFFF);
      EXPECT_EQ(bth.tver(), 0u);
      if (v.info->has(wire::Hdr::kAeth)) {
        p.syndrome = v.aeth().syndrome();
        p.msn = v.aeth().msn();
      }
      if (v.info->has(wire::Hdr::kXrceth)) p.xrc_srqn = v.xrceth().srq_num();
      if (v.info->has(wire::Hdr::kReth)) {
        p.reth_va = v.reth().va();
        p.reth_rkey = v.reth().rkey();
        p.reth_len = v.reth().dma_len();
      }
      if (v.info->has(wire::Hdr::kImmDt)) p.imm = v.imm().raw();
      if (v.info->has(wire::Hdr::kAtomicEth)) {
        wire::AtomicEth a = v.atomic_eth();
        p.atomic_va = a.va();
        p.atomic_rkey = a.rkey();
        p.swap_add = a.swap_add();
        p.compare = a.compare();
      }
      if (v.info->has(wire::Hdr::kAtomicAckEth)) p.atomic_orig = v.atomic_ack_eth().orig();
      if (v.info->has(wire::Hdr::kDeth)) {
        p.deth_qkey = v.deth().qkey();
        p.deth_src_qp = v.deth().src_qp();
      }
      // Pad bytes are zero.
      for (unsigned i = 0; i < p.pad; ++i) EXPECT_EQ(v.payload()[v.payload_len + i], 0);
      p.payload.assign(v.payload(), v.payload() + v.payload_len);
      out.push_back(std::move(p));
    }
    sent.clear();
    return out;
  }

  std::vector<ibv_wc> poll(core::Cq& cq) {
    std::vector<ibv_wc> out(64);
    int n = cq.poll(int(out.size()), out.data());
    out.resize(size_t(n));
    return out;
  }

  void run_timers(Clock::time_point t) { engine->run_timers(t); }

  // The fake transport's reach changed (memory_path, jumbo_payload): the QP
  // decides its delivery again, as it did at RTR (Delivery::decide).
  void redecide_delivery() { qp->delivery.decide(engine->transport(), engine->placement(), qp->type, qp->path.dst); }

  uint32_t rq(uint32_t n) const { return wire::psn_add(rq_psn, n); }
  uint32_t sq(uint32_t n) const { return wire::psn_add(sq_psn, n); }

  std::vector<Sent> sent;
  FakeTransport* transport = nullptr;  // owned by the engine
  EngineContext* engine = nullptr;
  uint32_t local_ip = 0;
  std::unique_ptr<core::Pd> pd;
  std::unique_ptr<core::Cq> scq, rcq;
  EngineQp* qp = nullptr;
  std::vector<core::Mr*> mrs;
};

inline constexpr uint32_t kLoopback = 0x7F000001;  // 127.0.0.1

// Opcodes used by the tests (RC).
inline constexpr uint8_t kSendFirst = 0x00, kSendMiddle = 0x01, kSendLast = 0x02, kSendLastImm = 0x03, kSendOnly = 0x04,
                         kSendOnlyImm = 0x05, kWriteFirst = 0x06, kWriteMiddle = 0x07, kWriteLast = 0x08,
                         kWriteOnly = 0x0A, kWriteOnlyImm = 0x0B, kReadRequest = 0x0C, kReadRespFirst = 0x0D,
                         kReadRespMiddle = 0x0E, kReadRespLast = 0x0F, kReadRespOnly = 0x10, kAck = 0x11,
                         kAtomicAck = 0x12, kCompareSwap = 0x13, kFetchAdd = 0x14;

inline uint8_t nak(uint8_t code) { return uint8_t(0x60 | code); }
inline uint8_t rnr_nak(uint8_t timer) { return uint8_t(0x20 | timer); }

}  // namespace uroce::engine::test
