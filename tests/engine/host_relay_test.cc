// Delivery by QP number behind the host's port (host/host_relay.h): a packet for
// another engine's slot is passed on to that engine's private port, unchanged
// behind a header that keeps its addresses; a relayed datagram is received as
// if it had arrived here; relays from off the host and packets for a dead
// slot are dropped and counted.
#include "host/host_relay.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine_harness.h"
#include "host/host_registry.h"
#include "transport/envelope.h"

namespace uroce::engine::test {
namespace {

using host::HostRegistry;
using host::kFirstHostSlot;
using host::kLastHostSlot;

constexpr uint8_t kRcSendOnly = 0x04;
constexpr uint16_t kOtherPort = 23456;  // the private port of the host's other engine
constexpr uint16_t kHostPort = 4791;
constexpr size_t kRelayHeader = 16;

class HostRelay : public EngineTest {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "uroce-host-relay-test-" + std::to_string(getpid());
    ::unlink(path_.c_str());
    ::setenv("UROCE_HOST_REGISTRY", path_.c_str(), 1);
    auto other = HostRegistry::open(kOtherPort);  // another engine of this host
    ASSERT_TRUE(other.ok()) << other.err();
    other_ = std::move(*other);
    configure_engine = [](EngineContext* e) {
      auto mine = HostRegistry::open(kLocalPort);
      ASSERT_TRUE(mine.ok()) << mine.err();
      e->attach_host_registry(std::move(*mine));
    };
    EngineTest::SetUp();
    bring_up();
  }
  void TearDown() override {
    EngineTest::TearDown();
    other_.reset();
    ::unlink(path_.c_str());
    ::unsetenv("UROCE_HOST_REGISTRY");
  }

  // The relay header (host byte order) followed by `packet`.
  static std::vector<uint8_t> wrap(const std::vector<uint8_t>& packet, uint32_t src_ip, uint32_t dst_ip,
                                   uint16_t src_port, uint16_t dst_port) {
    std::vector<uint8_t> v(kRelayHeader);
    v[0] = uint8_t(transport::Envelope::kHostRelay);
    v[1] = 1;  // version
    std::memcpy(&v[4], &src_ip, 4);
    std::memcpy(&v[8], &dst_ip, 4);
    std::memcpy(&v[12], &src_port, 2);
    std::memcpy(&v[14], &dst_port, 2);
    v.insert(v.end(), packet.begin(), packet.end());
    return v;
  }

  void deliver_raw(std::vector<uint8_t>& bytes, transport::Endpoint from, uint16_t dst_port) {
    transport::RxDatagram d;
    d.data = bytes.data();
    d.len = uint32_t(bytes.size());
    d.src = from;
    d.dst_ip = from.ip == kLoopback ? kLoopback : local_ip;
    d.dst_port = dst_port;
    engine->process_burst(std::span(&d, 1));
  }

  uint32_t other_qpn(uint32_t low) const { return other_->slot() << 16 | low; }

  std::string path_;
  std::unique_ptr<HostRegistry> other_;
};

TEST_F(HostRelay, QpNumbersCarryTheEnginesSlot) {
  unsigned slot = engine->host_registry()->slot();
  EXPECT_GE(slot, kFirstHostSlot);
  EXPECT_LE(slot, kLastHostSlot);
  EXPECT_NE(slot, other_->slot());
  EXPECT_EQ(qp->qp_num() >> 16, slot);
  EXPECT_EQ(engine->allocate_qp_num() >> 16, slot);
}

// Allocate: 20,000 numbers in the slot's 65,536, from two threads, none
// registered yet (as QPs being created at once, before ibv_create_qp
// registers them). Expect: no number twice (with 16 random bits a slot, a
// draw that checked only registered QPs would repeat one within ~300 draws).
TEST_F(HostRelay, QpNumbersAreUniqueBeforeTheyAreRegistered) {
  constexpr int kPerThread = 10000;
  std::vector<uint32_t> drawn[2];
  std::thread other([&] {
    for (int i = 0; i < kPerThread; ++i) drawn[1].push_back(engine->allocate_qp_num());
  });
  for (int i = 0; i < kPerThread; ++i) drawn[0].push_back(engine->allocate_qp_num());
  other.join();
  std::set<uint32_t> unique(drawn[0].begin(), drawn[0].end());
  unique.insert(drawn[1].begin(), drawn[1].end());
  EXPECT_EQ(unique.size(), size_t(2 * kPerThread));
  EXPECT_EQ(unique.count(qp->qp_num()), 0u);  // nor a registered QP's
}

// Receive: a SEND at the host's port for a QP of the other engine.
// Expect: one datagram to the other engine's private port on the loopback:
// the relay header (the datagram's addresses) and the packet unchanged; no ACK.
TEST_F(HostRelay, PacketForAnotherSlotIsPassedOnUnchanged) {
  Craft c{.opcode = kRcSendOnly, .psn = 9, .ack_req = true, .dest_qp = other_qpn(0x1234), .payload = pattern(40, 3)};
  c.dst_port = kHostPort;
  std::vector<uint8_t> packet = build(c);
  deliver(c);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].dst, (transport::Endpoint{kLoopback, kOtherPort}));
  EXPECT_EQ(sent[0].bytes, wrap(packet, kPeerIp, local_ip, kPeerPort, kHostPort));
  EXPECT_EQ(engine->stats.tx_host_relayed.load(), 1u);
  EXPECT_EQ(engine->stats.rx_no_qp.load(), 0u);
}

// Receive: a relayed SEND for our QP, sent by the peer to the host's port.
// Expect: the message delivered and ACKed to the peer, as if it had come
// straight here (the ICRC holds with the original ports).
TEST_F(HostRelay, RelayedPacketIsReceivedWithItsOriginalAddresses) {
  std::vector<uint8_t> buf(64, 0);
  core::Mr* mr = recv_buf(buf, 7);
  (void)mr;
  Craft c{.opcode = kRcSendOnly, .psn = rq(0), .ack_req = true, .payload = pattern(40, 5)};
  c.dst_port = kHostPort;
  std::vector<uint8_t> relayed = wrap(build(c), kPeerIp, local_ip, kPeerPort, kHostPort);
  deliver_raw(relayed, transport::Endpoint{kLoopback, kOtherPort}, kLocalPort);
  EXPECT_EQ(engine->stats.rx_bad_icrc.load(), 0u);
  EXPECT_EQ(engine->stats.rx_host_relayed.load(), 1u);
  auto wcs = poll(*rcq);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].byte_len, 40u);
  EXPECT_TRUE(std::equal(c.payload.begin(), c.payload.end(), buf.begin()));
  auto out = take();  // checks the destination: the peer
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].opcode, 0x11);  // RC ACKNOWLEDGE
}

// Receive: a relay datagram that did not come from this host's loopback.
// Expect: dropped and counted as malformed; nothing delivered or sent.
TEST_F(HostRelay, RelayFromOffTheHostIsDropped) {
  std::vector<uint8_t> buf(64, 0);
  (void)recv_buf(buf, 7);
  Craft c{.opcode = kRcSendOnly, .psn = rq(0), .ack_req = true, .payload = pattern(40, 5)};
  std::vector<uint8_t> relayed = wrap(build(c), kPeerIp, local_ip, kPeerPort, kLocalPort);
  deliver_raw(relayed, transport::Endpoint{0x0A000002, kOtherPort}, kLocalPort);
  EXPECT_EQ(engine->stats.rx_malformed.load(), 1u);
  EXPECT_TRUE(poll(*rcq).empty());
  EXPECT_TRUE(sent.empty());
}

// Receive: a packet for the slot of an engine that has gone.
// Expect: dropped and counted as no_qp; nothing sent.
TEST_F(HostRelay, PacketForADeadSlotIsDroppedAndCounted) {
  unsigned slot = other_->slot();
  other_.reset();
  engine->host_registry()->invalidate(slot);
  Craft c{.opcode = kRcSendOnly, .psn = 9, .dest_qp = slot << 16 | 0x42, .payload = pattern(8, 1)};
  deliver(c);
  EXPECT_TRUE(sent.empty());
  EXPECT_EQ(engine->stats.rx_no_qp.load(), 1u);
  EXPECT_EQ(engine->stats.tx_host_relayed.load(), 0u);
}

// Receive: a relayed packet whose QP is not ours either (a stale slot).
// Expect: not relayed a second time; dropped as no_qp.
TEST_F(HostRelay, RelayedPacketIsNeverRelayedAgain) {
  Craft c{.opcode = kRcSendOnly, .psn = 9, .dest_qp = other_qpn(0x99), .payload = pattern(8, 1)};
  std::vector<uint8_t> relayed = wrap(build(c), kPeerIp, local_ip, kPeerPort, kLocalPort);
  deliver_raw(relayed, transport::Endpoint{kLoopback, kOtherPort}, kLocalPort);
  EXPECT_TRUE(sent.empty());
  EXPECT_EQ(engine->stats.rx_no_qp.load(), 1u);
}

}  // namespace
}  // namespace uroce::engine::test
