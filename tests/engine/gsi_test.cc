// QP1 (engine/gsi.h): CM MADs in UD SEND_ONLY packets to QPN 1 are checked,
// routed (to the process's sink, to a listener's socket, or answered for a
// service nobody serves), and reach the sink only after the data packets
// of their burst have completed; MADs leave as the kernel's CM sends them.
#include "engine/gsi.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "engine_harness.h"
#include "wire/byte_order.h"

namespace uroce::engine::test {
namespace {

using wire::Operation;
using wire::Service;
constexpr uint8_t kUdSendOnly = wire::make_opcode(Service::kUd, Operation::kSendOnly);
constexpr uint8_t kSendOnly = wire::make_opcode(Service::kRc, Operation::kSendOnly);

// What the sink saw: each MAD and, at that moment, the receive completions
// already queued (polled from `g_rcq`).
struct SinkLog {
  std::vector<GsiMad> mads;
  std::vector<size_t> completions_seen;
};
SinkLog* g_log = nullptr;
core::Cq* g_rcq = nullptr;

void record(const GsiMad& m) {
  g_log->mads.push_back(m);
  size_t n = 0;
  ibv_wc wc[8];
  if (g_rcq) n = size_t(std::max(0, g_rcq->poll(8, wc)));
  g_log->completions_seen.push_back(n);
}

// A CM MAD with `attr`, its TransactionID 0x1122334455667788, and `body`
// bytes written from offset 24.
std::vector<uint8_t> cm_mad(uint16_t attr, std::vector<std::pair<size_t, uint32_t>> be32_at = {}) {
  std::vector<uint8_t> m(kMadBytes, 0);
  m[0] = 1;     // base version
  m[1] = 0x07;  // CM
  m[2] = 2;     // class version
  m[3] = 0x03;  // Send
  wire::store_be64(m.data() + 8, 0x1122334455667788ull);
  wire::store_be16(m.data() + 16, attr);
  for (auto [at, v] : be32_at) wire::store_be32(m.data() + at, v);
  return m;
}

Craft gsi_packet(std::vector<uint8_t> mad, uint32_t qkey = wire::kGsiQkey) {
  return Craft{.opcode = kUdSendOnly, .dest_qp = kGsiQpn, .deth_qkey = qkey, .deth_src_qp = kGsiQpn, .payload = mad};
}

// A free UDP port, found by binding one.
uint16_t free_udp_port() {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  socklen_t len = sizeof a;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

class Gsi : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    g_log = &log;
    set_gsi_sink(record);
  }
  void TearDown() override {
    set_gsi_sink(nullptr);
    g_log = nullptr;
    g_rcq = nullptr;
    EngineTest::TearDown();
  }
  SinkLog log;
};

// Receive an RTU naming one of our communication IDs / Expect it at the sink
// with the sender's address and port and our address, nothing sent.
TEST_F(Gsi, MadForUsReachesTheSink) {
  auto mad = cm_mad(0x0014, {{24, 0xAABB0001}, {28, 0x00C0FFEE}});
  deliver(gsi_packet(mad));
  ASSERT_EQ(log.mads.size(), 1u);
  EXPECT_EQ(std::vector<uint8_t>(log.mads[0].mad.begin(), log.mads[0].mad.end()), mad);
  EXPECT_EQ(log.mads[0].src, (transport::Endpoint{kPeerIp, kPeerPort}));
  EXPECT_EQ(log.mads[0].dst_ip, transport::IpAddress(local_ip));
  EXPECT_EQ(log.mads[0].src_qpn, kGsiQpn);
  EXPECT_EQ(engine->stats.rx_gsi.load(), 1u);
  EXPECT_TRUE(take().empty());
}

// Receive, in one burst, a SEND for the RC QP and then a DREQ / Expect the
// sink called after the SEND's receive completion was queued (a CM event
// never overtakes the data before it).
TEST_F(Gsi, MadReachesTheSinkAfterTheDataOfItsBurst) {
  bring_up();
  std::vector<uint8_t> buf(64, 0);
  recv_buf(buf, 1);
  g_rcq = rcq.get();
  deliver({Craft{.opcode = kSendOnly, .psn = rq(0), .ack_req = true, .payload = pattern(32, 1)},
           gsi_packet(cm_mad(0x0015, {{28, 0x00000042}}))});
  ASSERT_EQ(log.mads.size(), 1u);
  EXPECT_EQ(log.completions_seen[0], 1u);
}

// Receive QP1 packets that are not CM MADs: a wrong Q_Key, a short payload,
// another management class, an RC opcode / Expect each dropped and counted,
// nothing at the sink.
TEST_F(Gsi, WhatIsNotACmMadIsDropped) {
  auto other_class = cm_mad(0x0014);
  other_class[1] = 0x04;  // performance management
  deliver({gsi_packet(cm_mad(0x0014), 0x12345678), gsi_packet(std::vector<uint8_t>(200, 1)), gsi_packet(other_class),
           Craft{.opcode = kSendOnly, .dest_qp = kGsiQpn, .payload = cm_mad(0x0014)}});
  EXPECT_TRUE(log.mads.empty());
  EXPECT_EQ(engine->stats.rx_gsi_dropped.load(), 4u);
  EXPECT_TRUE(take().empty());
}

// Receive CM MADs that no CM takes, each naming a communication ID: a bad base
// version, a bad class version, and the attributes ClassPortInfo, LAP, APR
// and an unknown one / Expect each dropped and counted, nothing at the sink,
// nothing answered.
TEST_F(Gsi, MalformedCmMadIsDropped) {
  const std::vector<std::pair<size_t, uint32_t>> ids = {{24, 0xAABB0001}, {28, 0x00C0FFEE}};
  auto bad_base = cm_mad(0x0014, ids);
  bad_base[0] = 2;
  auto bad_class = cm_mad(0x0015, ids);
  bad_class[2] = 1;
  deliver({gsi_packet(bad_base), gsi_packet(bad_class), gsi_packet(cm_mad(0x0001, ids)),
           gsi_packet(cm_mad(0x0019, ids)), gsi_packet(cm_mad(0x001A, ids)), gsi_packet(cm_mad(0x00FF, ids))});
  EXPECT_TRUE(log.mads.empty());
  EXPECT_EQ(engine->stats.rx_gsi_dropped.load(), 6u);
  EXPECT_EQ(engine->stats.rx_gsi.load(), 4u);  // the well-formed ones were CM MADs
  EXPECT_TRUE(take().empty());
}

// Receive a REQ for an rdma_cm port nobody listens on / Expect the host's
// answer: a REJ, reason 8 (invalid service ID), naming the REQ's
// communication ID, in the REQ's transaction, from QP1 to QP1 at the
// sender's port.
TEST_F(Gsi, RequestForAServiceNobodyServesIsRejected) {
  uint16_t port = free_udp_port();
  auto req = cm_mad(0x0010, {{24, 0x01020304}});
  wire::store_be64(req.data() + 32, 0x0000000001060000ull | port);
  deliver(gsi_packet(req));
  EXPECT_TRUE(log.mads.empty());
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kUdSendOnly);
  EXPECT_EQ(tx[0].dest_qp, kGsiQpn);
  EXPECT_EQ(tx[0].deth_qkey, wire::kGsiQkey);
  EXPECT_EQ(tx[0].deth_src_qp, kGsiQpn);
  ASSERT_EQ(tx[0].payload.size(), kMadBytes);
  const uint8_t* rej = tx[0].payload.data();
  EXPECT_EQ(rej[1], 0x07);
  EXPECT_EQ(wire::load_be64(rej + 8), 0x1122334455667788ull);
  EXPECT_EQ(wire::load_be16(rej + 16), 0x0012);       // REJ
  EXPECT_EQ(wire::load_be32(rej + 28), 0x01020304u);  // remote communication ID: the REQ's
  EXPECT_EQ(rej[32] >> 6, 0);                         // the REQ is what is rejected
  EXPECT_EQ(wire::load_be16(rej + 34), 8);            // invalid service ID
}

// Receive a REQ for a port whose listener holds its socket at our address /
// Expect the MAD passed there in an envelope with its addresses, nothing
// answered.
TEST_F(Gsi, RequestIsPassedToTheListenersSocket) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(local_ip);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  auto req = cm_mad(0x0010, {{24, 0x01020304}});
  wire::store_be64(req.data() + 32, 0x0000000001060000ull | ntohs(a.sin_port));
  deliver(gsi_packet(req));
  std::vector<uint8_t> got(kGsiEnvelopeBytes + 8);
  ssize_t n = recv(fd, got.data(), got.size(), MSG_DONTWAIT);
  close(fd);
  ASSERT_EQ(n, ssize_t(kGsiEnvelopeBytes));
  auto m = decode_gsi_envelope(std::span<const uint8_t>(got.data(), size_t(n)));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(std::vector<uint8_t>(m->mad.begin(), m->mad.end()), req);
  EXPECT_EQ(m->src, (transport::Endpoint{kPeerIp, kPeerPort}));
  EXPECT_EQ(m->dst_ip, transport::IpAddress(local_ip));
  EXPECT_TRUE(take().empty());
  EXPECT_TRUE(log.mads.empty());
}

// Send a MAD / Expect one UD SEND_ONLY from QP1 to QP1 with the GSI Q_Key,
// P_Key 0xFFFF and the MAD as its whole payload, with a correct ICRC (take()).
TEST_F(Gsi, SentMadIsAUdSendOnlyFromQp1) {
  auto mad = cm_mad(0x0014, {{24, 7}, {28, 9}});
  ASSERT_EQ(gsi_send(*engine, transport::Endpoint{kPeerIp, kPeerPort}, local_ip,
                     std::span<const uint8_t, kMadBytes>(mad.data(), kMadBytes)),
            0);
  auto tx = take();
  ASSERT_EQ(tx.size(), 1u);
  EXPECT_EQ(tx[0].opcode, kUdSendOnly);
  EXPECT_EQ(tx[0].dest_qp, kGsiQpn);
  EXPECT_EQ(tx[0].deth_qkey, wire::kGsiQkey);
  EXPECT_EQ(tx[0].deth_src_qp, kGsiQpn);
  EXPECT_EQ(tx[0].payload, mad);
  EXPECT_EQ(engine->stats.tx_gsi.load(), 1u);
}

// A MAD is answered at a uroce engine's private port (below the RoCE source
// ports), else at the host's QP1 on 4791.
TEST(GsiReply, PrivatePortOrHostPort) {
  EXPECT_EQ(gsi_reply_endpoint({0x0A000001, 40000}).port, 40000);
  EXPECT_EQ(gsi_reply_endpoint({0x0A000001, 0xC001}).port, wire::kRoceV2Port);
  EXPECT_EQ(gsi_reply_endpoint({0x0A000001, 0}).port, wire::kRoceV2Port);
}

// Encode and decode an envelope / Expect the same MAD and addresses (an IPv6
// link-local one with its interface); anything but an envelope of the exact
// size and magic / Expect nullopt.
TEST(GsiEnvelope, RoundTripAndJunk) {
  GsiMad m;
  std::array<uint8_t, 16> ll{0xFE, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5};
  m.src = transport::Endpoint{transport::IpAddress::from_bytes(ll.data(), 3), 40001};
  m.dst_ip = transport::IpAddress(0x0A000002);
  m.src_qpn = 1;
  for (size_t i = 0; i < kMadBytes; ++i) m.mad[i] = uint8_t(i);
  std::array<uint8_t, kGsiEnvelopeBytes> env;
  encode_gsi_envelope(m, env);
  auto back = decode_gsi_envelope(env);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->src, m.src);
  EXPECT_EQ(back->src.ip.scope, 3u);
  EXPECT_EQ(back->dst_ip, m.dst_ip);
  EXPECT_EQ(back->mad, m.mad);
  EXPECT_FALSE(decode_gsi_envelope(std::span<const uint8_t>(env.data(), env.size() - 1)).has_value());
  env[0] ^= 1;
  EXPECT_FALSE(decode_gsi_envelope(env).has_value());
}

}  // namespace
}  // namespace uroce::engine::test
