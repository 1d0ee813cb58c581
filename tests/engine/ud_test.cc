// Unreliable Datagram service (roce-facts.md §2.5, §5.3): crafted UD SEND_ONLY
// packets in, receive completions (GRH area, src_qp, slid) out, no ACKs.
#include <cstring>

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

  Craft send(uint32_t qkey, std::vector<uint8_t> payload) {
    return Craft{.opcode = kUdSendOnly,
                 .psn = 77,  // UD has no sequence: any PSN is accepted
                 .deth_qkey = qkey,
                 .deth_src_qp = kSenderQpn,
                 .payload = std::move(payload)};
  }

  std::vector<uint8_t> buf;
  core::Mr* mr = nullptr;
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

}  // namespace
}  // namespace uroce::engine::test
