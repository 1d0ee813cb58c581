// TxBatch builds packets in place (header, payload pieces, pad, ICRC); golden
// bytes from roce-facts.md §3.2 V3, and the gather/bounce/flush mechanics.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine_harness.h"

namespace uroce::engine::test {
namespace {

// Build V3 (RC ACKNOWLEDGE, PSN 0x100, AETH 0x1F, MSN 1; 192.168.0.2:0xC002 ->
// 192.168.0.1:4791, IP ID 7, DF) through TxBatch / Expect exactly V3's UDP
// payload, ICRC included.
TEST(TxBatchTest, GoldenV3Ack) {
  std::vector<Sent> sent;
  FakeTransport t(&sent, 4791);
  TxBatch tx;
  tx.use(&t);
  wire::Ipv4Flow flow{0xC0A80002, 0xC0A80001, 0xC002, 4791, 7, 0x4000};
  uint8_t* h = tx.begin_packet(transport::Endpoint{0xC0A80001, 4791}, 0xC0A80002, 16);
  wire::Bth(h).fill(0x11, false, 0, 0xFFFF, 0x12, false, 0x100);
  wire::Aeth(h + 12).fill(0x1F, 1);
  tx.end_packet(flow);
  EXPECT_EQ(tx.pending(), 1u);
  tx.flush();
  EXPECT_EQ(tx.pending(), 0u);
  ASSERT_EQ(sent.size(), 1u);
  const std::vector<uint8_t> v3 = {0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x00, 0x00,
                                   0x01, 0x00, 0x1f, 0x00, 0x00, 0x01, 0xa6, 0x0c, 0xd6, 0xfe};
  EXPECT_EQ(sent[0].bytes, v3);
  EXPECT_EQ(sent[0].dst.ip, 0xC0A80001u);
  EXPECT_EQ(sent[0].dst.port, 4791);
  EXPECT_EQ(sent[0].src_ip, 0xC0A80002u);
}

// Payload handed over in more pieces than a datagram can gather / Expect the
// pieces copied in order, zero pad to 4 bytes, and the ICRC of the contiguous
// packet.
TEST(TxBatchTest, ManyPiecesArePaddedAndChecksummed) {
  std::vector<Sent> sent;
  FakeTransport t(&sent, 5000);
  TxBatch tx;
  tx.use(&t);
  auto data = pattern(1021, 3);
  wire::Ipv4Flow flow{0x0A000001, 0x0A000002, 5000, 6000};
  for (unsigned pieces : {1u, 2u, 3u, 7u}) {
    unsigned pad = (4 - (data.size() & 3)) & 3;
    uint8_t* h = tx.begin_packet(transport::Endpoint{0x0A000002, 6000}, 0x0A000001, 12);
    wire::Bth(h).fill(0x04, false, pad, 0xFFFF, 0x99, true, 77);
    size_t step = (data.size() + pieces - 1) / pieces;
    for (size_t off = 0; off < data.size(); off += step)
      tx.add_payload(data.data() + off, uint32_t(std::min(step, data.size() - off)));
    tx.end_packet(flow);
  }
  tx.flush();
  ASSERT_EQ(sent.size(), 4u);
  for (auto& s : sent) {
    ASSERT_EQ(s.bytes.size(), 12 + 1024 + 4u);
    EXPECT_TRUE(std::equal(data.begin(), data.end(), s.bytes.begin() + 12));
    EXPECT_EQ(s.bytes[12 + 1021], 0);
    EXPECT_EQ(s.bytes[12 + 1023], 0);
    uint32_t crc;
    std::memcpy(&crc, s.bytes.data() + s.bytes.size() - 4, 4);
    EXPECT_EQ(crc, wire::icrc_ipv4(flow, s.bytes.data(), s.bytes.size()));
    wire::PacketView v;
    ASSERT_EQ(wire::PacketView::parse(s.bytes.data(), s.bytes.size(), v), wire::ParseError::kNone);
    EXPECT_EQ(v.payload_len, 1021u);
  }
}

// More packets than one batch holds / Expect an automatic flush, all packets
// sent in order.
TEST(TxBatchTest, FullBatchFlushesItself) {
  std::vector<Sent> sent;
  FakeTransport t(&sent, 5000);
  TxBatch tx;
  tx.use(&t);
  wire::Ipv4Flow flow{1, 2, 3, 4};
  const unsigned n = TxBatch::kMaxPackets * 2 + 5;
  for (unsigned i = 0; i < n; ++i) {
    uint8_t* h = tx.begin_packet(transport::Endpoint{2, 4}, 1, 16);
    wire::Bth(h).fill(0x11, false, 0, 0xFFFF, 1, false, i);
    wire::Aeth(h + 12).fill(0x1F, i);
    tx.end_packet(flow);
  }
  EXPECT_EQ(sent.size(), TxBatch::kMaxPackets * 2);
  tx.flush();
  ASSERT_EQ(sent.size(), n);
  for (unsigned i = 0; i < n; ++i) EXPECT_EQ(wire::Bth(sent[i].bytes.data()).psn(), i);
}

// Switching transports / Expect pending packets flushed to the old one first.
TEST(TxBatchTest, UseAnotherTransportFlushesFirst) {
  std::vector<Sent> a_sent, b_sent;
  FakeTransport a(&a_sent, 1), b(&b_sent, 2);
  TxBatch tx;
  tx.use(&a);
  wire::Ipv4Flow flow{1, 2, 3, 4};
  uint8_t* h = tx.begin_packet(transport::Endpoint{2, 4}, 1, 16);
  wire::Bth(h).fill(0x11, false, 0, 0xFFFF, 1, false, 0);
  tx.end_packet(flow);
  tx.use(&b);
  EXPECT_EQ(a_sent.size(), 1u);
  EXPECT_EQ(tx.pending(), 0u);
  tx.flush();
  EXPECT_TRUE(b_sent.empty());
}

}  // namespace
}  // namespace uroce::engine::test

namespace uroce::engine::test {
namespace {

// Two packets ended with Icrc::kOmit (a same-host peer, Delivery::icrc), then
// one with its ICRC / Expect the ICRC's room zero in the first two, their
// datagram marked bare, and the third not in their GSO message.
TEST(TxBatchTest, BarePacketHasNoIcrcAndTravelsApart) {
  std::vector<Sent> sent;
  FakeTransport t(&sent, 5000);
  t.gso_segments = 64;
  TxBatch tx;
  tx.use(&t);
  wire::Ipv4Flow flow{1, 2, 3, 4};
  for (unsigned i = 0; i < 3; ++i) {
    uint8_t* h = tx.begin_packet(transport::Endpoint{2, 4}, 1, 16);
    wire::Bth(h).fill(0x11, false, 0, 0xFFFF, 1, false, i);
    wire::Aeth(h + 12).fill(0x1F, i);
    tx.end_packet(flow, i == 2 ? TxBatch::Icrc::kCompute : TxBatch::Icrc::kOmit);
  }
  tx.flush();
  ASSERT_EQ(sent.size(), 3u);
  for (unsigned i = 0; i < 3; ++i) {
    uint32_t crc;
    std::memcpy(&crc, sent[i].bytes.data() + 16, 4);
    EXPECT_EQ(sent[i].bare, i != 2);
    EXPECT_EQ(crc, i == 2 ? wire::icrc_ipv4(flow, sent[i].bytes.data(), 20) : 0u);
  }
  EXPECT_EQ(sent[0].message, sent[1].message);
  EXPECT_NE(sent[1].message, sent[2].message);
}

// A batch on a transport that offers room in place (a same-host ring's).
struct InPlaceBatch {
  std::vector<Sent> sent;
  FakeTransport t{&sent, 5000};
  TxBatch tx;
  InPlaceBatch() {
    t.in_place_room = 4096;
    tx.use(&t);
  }
};

// A bare packet begun on an empty batch, the transport offering room in
// place / Expect it sent at its end (no flush), header, payload, a zero pad
// and a zero ICRC room, and nothing left pending.
TEST(TxBatchTest, BarePacketOnAnEmptyBatchIsWrittenInPlace) {
  InPlaceBatch in_place;
  auto& [sent, t, tx] = in_place;
  const uint8_t payload[5] = {1, 2, 3, 4, 5};
  uint8_t* h = tx.begin_packet(transport::Endpoint{2, 4}, 1, 12, TxBatch::Icrc::kOmit, 5);
  wire::Bth(h).fill(0x04, false, 3, 0xFFFF, 9, true, 77);
  ASSERT_TRUE(tx.add_payload(payload, 5));
  EXPECT_EQ(tx.end_packet(wire::Ipv4Flow{1, 2, 3, 4}, TxBatch::Icrc::kOmit), 12u + 5 + 3 + 4);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].in_place);
  EXPECT_EQ(tx.pending(), 0u);
  const std::vector<uint8_t>& b = sent[0].bytes;
  ASSERT_EQ(b.size(), 24u);
  EXPECT_EQ(wire::Bth(const_cast<uint8_t*>(b.data())).psn(), 77u);
  EXPECT_EQ(std::vector<uint8_t>(b.begin() + 12, b.begin() + 17), std::vector<uint8_t>(payload, payload + 5));
  EXPECT_EQ(std::vector<uint8_t>(b.begin() + 17, b.end()), std::vector<uint8_t>(7, 0));
  tx.flush();
  EXPECT_EQ(sent.size(), 1u);
}

// A packet pending in the batch, then a bare one / Expect the bare one
// behind it in the batch (never overtaking), both sent at the flush.
TEST(TxBatchTest, BarePacketBehindAPendingOneWaitsItsTurn) {
  InPlaceBatch in_place;
  auto& [sent, t, tx] = in_place;
  wire::Ipv4Flow flow{1, 2, 3, 4};
  uint8_t* h = tx.begin_packet(transport::Endpoint{2, 4}, 1, 16);
  wire::Bth(h).fill(0x11, false, 0, 0xFFFF, 1, false, 1);
  tx.end_packet(flow, TxBatch::Icrc::kOmit);
  h = tx.begin_packet(transport::Endpoint{2, 4}, 1, 16, TxBatch::Icrc::kOmit, 0);
  wire::Bth(h).fill(0x11, false, 0, 0xFFFF, 1, false, 2);
  tx.end_packet(flow, TxBatch::Icrc::kOmit);
  EXPECT_TRUE(sent.empty());
  tx.flush();
  ASSERT_EQ(sent.size(), 2u);
  for (unsigned i = 0; i < 2; ++i) {
    EXPECT_FALSE(sent[i].in_place);
    EXPECT_EQ(wire::Bth(sent[i].bytes.data()).psn(), i + 1);
  }
}

// In place: more payload than was reserved, and a packet abandoned / Expect
// neither sent, each slot given back, and the batch usable after.
TEST(TxBatchTest, InPlacePacketThatOverrunsOrIsAbortedIsDropped) {
  InPlaceBatch in_place;
  auto& [sent, t, tx] = in_place;
  wire::Ipv4Flow flow{1, 2, 3, 4};
  const uint8_t payload[8] = {};
  tx.begin_packet(transport::Endpoint{2, 4}, 1, 12, TxBatch::Icrc::kOmit, 4);
  EXPECT_FALSE(tx.add_payload(payload, 8));
  EXPECT_EQ(tx.end_packet(flow, TxBatch::Icrc::kOmit), 0u);
  tx.begin_packet(transport::Endpoint{2, 4}, 1, 12, TxBatch::Icrc::kOmit, 4);
  tx.abort_packet();
  EXPECT_EQ(t.abandoned, 2u);
  EXPECT_TRUE(sent.empty());
  tx.begin_packet(transport::Endpoint{2, 4}, 1, 12, TxBatch::Icrc::kOmit, 0);
  EXPECT_EQ(tx.end_packet(flow, TxBatch::Icrc::kOmit), 16u);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].in_place);
}

}  // namespace
}  // namespace uroce::engine::test
