// Header views against hand-written golden bytes from the layouts of
// roce-facts.md §1.1 (BTH) and §2.1 (extended headers): fill a view, compare
// the bytes, and read every field back.
#include "wire/headers.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

namespace uroce::wire {
namespace {

template <size_t N>
void expect_bytes(const uint8_t* got, const std::array<uint8_t, N>& want) {
  for (size_t i = 0; i < N; ++i) EXPECT_EQ(got[i], want[i]) << "byte " << i;
}

// Expect: byte 0 opcode; byte 1 SE|M|PadCnt|TVer; 2–3 P_Key; byte 4 zero;
// 5–7 DestQP; byte 8 bit 7 AckReq; 9–11 PSN.
TEST(Headers, BthFillGolden) {
  uint8_t b[12];
  std::memset(b, 0xEE, sizeof b);
  Bth(b).fill(0x04, true, 2, 0xFFFF, 0x123456, true, 0xABCDEF);
  expect_bytes(b, std::array<uint8_t, 12>{0x04, 0xA0, 0xFF, 0xFF, 0x00, 0x12, 0x34, 0x56, 0x80, 0xAB, 0xCD, 0xEF});

  Bth(b).fill(0x2A, false, 3, 0x8001, 0x000001, false, 0x000000);
  expect_bytes(b, std::array<uint8_t, 12>{0x2A, 0x30, 0x80, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00});

  // Fields wider than their bits are truncated, never spill into neighbours.
  Bth(b).fill(0x11, false, 0, 0x1234, 0xFF000010, false, 0x01FFFFFF);
  expect_bytes(b, std::array<uint8_t, 12>{0x11, 0x00, 0x12, 0x34, 0x00, 0x00, 0x00, 0x10, 0x00, 0xFF, 0xFF, 0xFF});
}

TEST(Headers, BthReadBack) {
  // V2's BTH: UC SEND_ONLY, MigReq=1, PadCnt=2, P_Key 0xFFFF, DestQP 0xD3, PSN
  // 13571856.
  uint8_t b[12] = {0x24, 0x60, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0xD3, 0x00, 0xCF, 0x17, 0x10};
  Bth h(b);
  EXPECT_EQ(h.opcode(), 0x24);
  EXPECT_FALSE(h.se());
  EXPECT_TRUE(h.mig());
  EXPECT_EQ(h.pad(), 2u);
  EXPECT_EQ(h.tver(), 0u);
  EXPECT_EQ(h.pkey(), 0xFFFF);
  EXPECT_FALSE(h.fecn());
  EXPECT_FALSE(h.becn());
  EXPECT_EQ(h.dest_qp(), 0xD3u);
  EXPECT_FALSE(h.ack_req());
  EXPECT_EQ(h.psn(), 13571856u);

  // V1's BTH (CNP): BECN set in byte 4, DestQP 0x000118.
  uint8_t c[12] = {0x81, 0x00, 0xFF, 0xFF, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00};
  EXPECT_TRUE(Bth(c).becn());
  EXPECT_FALSE(Bth(c).fecn());
  EXPECT_EQ(Bth(c).dest_qp(), 0x118u);

  // V3's BTH: RC ACKNOWLEDGE to QP 0x12, PSN 1; and all bits of byte 1.
  uint8_t d[12] = {0x11, 0xFF, 0xFF, 0xFF, 0x80, 0x00, 0x00, 0x12, 0x80, 0x00, 0x00, 0x01};
  Bth v(d);
  EXPECT_TRUE(v.se());
  EXPECT_TRUE(v.mig());
  EXPECT_EQ(v.pad(), 3u);
  EXPECT_EQ(v.tver(), 0xFu);
  EXPECT_TRUE(v.fecn());
  EXPECT_TRUE(v.ack_req());
  EXPECT_EQ(v.psn(), 1u);
}

// RETH: 0–7 VA, 8–11 R_Key, 12–15 DMA length.
TEST(Headers, RethGolden) {
  uint8_t b[16];
  Reth r(b);
  r.fill(0x0102030405060708ull, 0x11223344, 0x80000000);
  expect_bytes(b, std::array<uint8_t, 16>{0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x11, 0x22, 0x33, 0x44, 0x80,
                                          0x00, 0x00, 0x00});
  EXPECT_EQ(r.va(), 0x0102030405060708ull);
  EXPECT_EQ(r.rkey(), 0x11223344u);
  EXPECT_EQ(r.dma_len(), 0x80000000u);
}

// AETH: 0 syndrome, 1–3 MSN.
TEST(Headers, AethGolden) {
  uint8_t b[4];
  Aeth a(b);
  a.fill(kAckNoCredit, 0x000102);
  expect_bytes(b, std::array<uint8_t, 4>{0x1F, 0x00, 0x01, 0x02});
  EXPECT_EQ(a.type(), AckType::kAck);
  EXPECT_EQ(a.code(), 31);
  EXPECT_EQ(a.msn(), 0x102u);

  a.fill(syndrome(AckType::kNak, uint8_t(NakCode::kRemoteAccess)), 0xFFFFFF);
  expect_bytes(b, std::array<uint8_t, 4>{0x62, 0xFF, 0xFF, 0xFF});
  EXPECT_EQ(a.type(), AckType::kNak);
  EXPECT_EQ(a.code(), 2);

  // §2.2/2.3 syndrome encodings.
  EXPECT_EQ(syndrome(AckType::kNak, uint8_t(NakCode::kPsnSeqError)), 0x60);
  EXPECT_EQ(syndrome(AckType::kNak, uint8_t(NakCode::kInvalidRequest)), 0x61);
  EXPECT_EQ(syndrome(AckType::kNak, uint8_t(NakCode::kRemoteOp)), 0x63);
  EXPECT_EQ(syndrome(AckType::kRnrNak, 14), 0x2E);
  EXPECT_EQ(syndrome(AckType::kRnrNak, 0), 0x20);
  uint8_t rnr[4] = {0x2E, 0, 0, 5};
  EXPECT_EQ(Aeth(rnr).type(), AckType::kRnrNak);
  EXPECT_EQ(Aeth(rnr).code(), 14);
  EXPECT_EQ(Aeth(rnr).msn(), 5u);
}

// DETH: 0–3 Q_Key, 4 reserved, 5–7 source QPN.
TEST(Headers, DethGolden) {
  uint8_t b[8];
  std::memset(b, 0xEE, sizeof b);
  Deth d(b);
  d.fill(kGsiQkey, 0x000001);
  expect_bytes(b, std::array<uint8_t, 8>{0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01});
  d.fill(0x01234567, 0xABCDEF);
  expect_bytes(b, std::array<uint8_t, 8>{0x01, 0x23, 0x45, 0x67, 0x00, 0xAB, 0xCD, 0xEF});
  EXPECT_EQ(d.qkey(), 0x01234567u);
  EXPECT_EQ(d.src_qp(), 0xABCDEFu);
}

// AtomicETH: 0–7 VA, 8–11 R_Key, 12–19 swap/add, 20–27 compare.
TEST(Headers, AtomicEthGolden) {
  uint8_t b[28];
  AtomicEth a(b);
  a.fill(0x1000000000000008ull, 0xCAFEBABE, 0x0A0B0C0D0E0F1011ull, 0x2122232425262728ull);
  expect_bytes(
      b, std::array<uint8_t, 28>{0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0xCA, 0xFE, 0xBA, 0xBE, 0x0A, 0x0B,
                                 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28});
  EXPECT_EQ(a.va(), 0x1000000000000008ull);
  EXPECT_EQ(a.rkey(), 0xCAFEBABEu);
  EXPECT_EQ(a.swap_add(), 0x0A0B0C0D0E0F1011ull);
  EXPECT_EQ(a.compare(), 0x2122232425262728ull);
}

// AtomicAckETH: 0–7 original value.
TEST(Headers, AtomicAckEthGolden) {
  uint8_t b[8];
  AtomicAckEth a(b);
  a.fill(0x8877665544332211ull);
  expect_bytes(b, std::array<uint8_t, 8>{0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11});
  EXPECT_EQ(a.orig(), 0x8877665544332211ull);
}

// ImmDt / IETH: opaque 32 bits; raw() keeps network order (verbs imm_data).
TEST(Headers, ImmDtAndIeth) {
  uint8_t b[4];
  ImmDt i(b);
  i.fill_value(0xDEADBEEF);
  expect_bytes(b, std::array<uint8_t, 4>{0xDE, 0xAD, 0xBE, 0xEF});
  EXPECT_EQ(i.value(), 0xDEADBEEFu);
  uint32_t raw = i.raw();
  EXPECT_EQ(std::memcmp(&raw, b, 4), 0);
  uint32_t net = 0x04030201;  // bytes 01 02 03 04 in memory on x86
  Ieth(b).fill_raw(net);
  expect_bytes(b, std::array<uint8_t, 4>{0x01, 0x02, 0x03, 0x04});
  EXPECT_EQ(Ieth(b).raw(), net);
}

// A whole RC WRITE_ONLY_WITH_IMMEDIATE header through PacketView accessors.
TEST(Headers, PacketViewLocatesHeaders) {
  std::vector<uint8_t> p(32 + 8 + 4, 0);
  Bth(p.data()).fill(0x0B, true, 0, 0xFFFF, 0x42, true, 7);
  Reth(p.data() + 12).fill(0x1000, 0x300, 8);
  ImmDt(p.data() + 28).fill_value(0x01020304);
  for (int i = 0; i < 8; ++i) p[32 + i] = uint8_t(i + 1);
  PacketView v;
  ASSERT_EQ(PacketView::parse(p.data(), p.size(), v), ParseError::kNone);
  EXPECT_EQ(v.reth().va(), 0x1000u);
  EXPECT_EQ(v.reth().rkey(), 0x300u);
  EXPECT_EQ(v.reth().dma_len(), 8u);
  EXPECT_EQ(v.imm().value(), 0x01020304u);
  EXPECT_EQ(v.payload(), p.data() + 32);
  EXPECT_EQ(v.payload_len, 8u);
  p[40] = 0x78;
  p[41] = 0x56;
  p[42] = 0x34;
  p[43] = 0x12;
  EXPECT_EQ(v.icrc_wire(), 0x12345678u);
}

// Expect: payload + PadCnt is a multiple of 4, PadCnt in 0-3 (roce-facts.md §1.1).
TEST(Headers, PadCountEndsThePayloadOnFourBytes) {
  EXPECT_EQ(pad_for(0), 0u);
  EXPECT_EQ(pad_for(1), 3u);
  EXPECT_EQ(pad_for(2), 2u);
  EXPECT_EQ(pad_for(3), 1u);
  EXPECT_EQ(pad_for(4), 0u);
  EXPECT_EQ(pad_for(4097), 3u);
  EXPECT_EQ(pad_for(4095), 1u);
}

}  // namespace
}  // namespace uroce::wire
