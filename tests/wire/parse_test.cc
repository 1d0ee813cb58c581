// PacketView::parse: every rejection reason, and the payload length of good
// packets (UDP payload = BTH + ext. headers + payload + pad + ICRC).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "wire/headers.h"

namespace uroce::wire {
namespace {

// A packet of `opcode` with `payload` bytes and `pad` pad bytes plus ICRC.
std::vector<uint8_t> packet(uint8_t opcode, uint32_t payload, unsigned pad, unsigned header_len = 0) {
  if (!header_len) header_len = opcode_info(opcode).valid() ? opcode_info(opcode).header_len : kBthSize;
  std::vector<uint8_t> p(header_len + payload + pad + kIcrcSize, 0);
  Bth(p.data()).fill(opcode, false, pad, 0xFFFF, 0x11, false, 0);
  return p;
}

ParseError parse(std::vector<uint8_t>& p, PacketView* out = nullptr) {
  PacketView v;
  ParseError e = PacketView::parse(p.data(), p.size(), v);
  if (out) *out = v;
  return e;
}

// Receive fewer bytes than BTH + ICRC / Expect kTooShort.
TEST(Parse, TooShortForBth) {
  for (size_t n = 0; n < kBthSize + kIcrcSize; ++n) {
    std::vector<uint8_t> p(n, 0);
    PacketView v;
    EXPECT_EQ(PacketView::parse(p.data(), p.size(), v), ParseError::kTooShort) << n;
  }
}

// Receive a WRITE_ONLY cut inside its RETH / Expect kTooShort.
TEST(Parse, TooShortForExtendedHeaders) {
  auto p = packet(0x0A, 0, 0);
  p.resize(12 + 15 + 4);
  EXPECT_EQ(parse(p), ParseError::kTooShort);
  auto a = packet(0x12, 0, 0);  // ATOMIC_ACK: BTH + AETH + AtomicAckETH
  a.resize(12 + 4 + 7 + 4);
  EXPECT_EQ(parse(a), ParseError::kTooShort);
  auto u = packet(0x64, 0, 0);  // UD SEND_ONLY without a full DETH
  u.resize(12 + 7 + 4);
  EXPECT_EQ(parse(u), ParseError::kTooShort);
}

// Receive TVer = 1 / Expect kBadVersion.
TEST(Parse, BadTransportVersion) {
  auto p = packet(0x04, 8, 0);
  p[1] |= 0x01;
  EXPECT_EQ(parse(p), ParseError::kBadVersion);
  p[1] = (p[1] & 0xF0) | 0x0F;
  EXPECT_EQ(parse(p), ParseError::kBadVersion);
}

// Receive reserved / foreign-service opcodes / Expect kUnknownOpcode.
TEST(Parse, UnknownOpcode) {
  for (uint8_t op : {uint8_t(0x15), uint8_t(0x18), uint8_t(0x2C), uint8_t(0x66), uint8_t(0xFF)}) {
    auto p = packet(op, 0, 0, kBthSize + 16);
    EXPECT_EQ(parse(p), ParseError::kUnknownOpcode) << std::hex << unsigned(op);
  }
}

// Receive PadCnt larger than the payload / Expect kBadPad.
TEST(Parse, PadLargerThanPayload) {
  auto p = packet(0x04, 2, 0);
  Bth(p.data()).fill(0x04, false, 3, 0xFFFF, 0x11, false,
                     0);  // 2 bytes, claims 3 pad
  EXPECT_EQ(parse(p), ParseError::kBadPad);
  auto e = packet(0x04, 0, 0);
  Bth(e.data()).fill(0x04, false, 1, 0xFFFF, 0x11, false, 0);
  EXPECT_EQ(parse(e), ParseError::kBadPad);
  // Exactly as many bytes as the pad: accepted, empty payload.
  auto ok = packet(0x04, 0, 3);
  PacketView v;
  EXPECT_EQ(parse(ok, &v), ParseError::kNone);
  EXPECT_EQ(v.payload_len, 0u);
}

// Receive an ACK / READ request / atomic with trailing payload / Expect
// kBadLength.
TEST(Parse, PayloadOnOpcodeWithoutPayload) {
  for (uint8_t op : {uint8_t(0x11), uint8_t(0x12), uint8_t(0x0C), uint8_t(0x13), uint8_t(0x14)}) {
    auto p = packet(op, 4, 0);
    EXPECT_EQ(parse(p), ParseError::kBadLength) << std::hex << unsigned(op);
    auto q = packet(op, 0, 0);
    EXPECT_EQ(parse(q), ParseError::kNone) << std::hex << unsigned(op);
  }
}

// Receive well-formed packets / Expect payload length without pad, info set.
TEST(Parse, GoodPackets) {
  PacketView v;
  auto s = packet(0x04, 13, 3);
  ASSERT_EQ(parse(s, &v), ParseError::kNone);
  EXPECT_EQ(v.payload_len, 13u);
  EXPECT_EQ(v.len, s.size());
  EXPECT_EQ(v.info, &opcode_info(0x04));
  EXPECT_EQ(v.payload(), s.data() + 12);

  auto w = packet(0x0B, 1024, 0);
  ASSERT_EQ(parse(w, &v), ParseError::kNone);
  EXPECT_EQ(v.payload_len, 1024u);
  EXPECT_EQ(v.payload(), w.data() + 32);

  auto u = packet(0x65, 256, 0);
  ASSERT_EQ(parse(u, &v), ParseError::kNone);
  EXPECT_EQ(v.payload_len, 256u);
  EXPECT_EQ(v.payload(), u.data() + 24);

  auto a = packet(0x11, 0, 0);
  ASSERT_EQ(parse(a, &v), ParseError::kNone);
  EXPECT_EQ(v.payload_len, 0u);

  auto c = packet(0x81, 0, 0);  // CNP: BTH + 16 reserved bytes + ICRC
  ASSERT_EQ(c.size(), 32u);
  EXPECT_EQ(parse(c, &v), ParseError::kNone);
}

TEST(Parse, ErrorNames) {
  EXPECT_STREQ(parse_error_name(ParseError::kNone), "none");
  EXPECT_STRNE(parse_error_name(ParseError::kTooShort), "?");
  EXPECT_STRNE(parse_error_name(ParseError::kBadPad), "?");
}

}  // namespace
}  // namespace uroce::wire
