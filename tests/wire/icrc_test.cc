// ICRC golden vectors (roce-facts.md §3.2 V1–V3, and V5 over IPv6) and the
// masking rules of §3.1.
//
// Each vector is a whole Ethernet frame (no FCS). The tests rebuild the
// wire::Ipv4Flow from the frame's own IPv4/UDP headers, run wire::icrc_ipv4
// over the UDP payload and compare with the trailing 4 bytes (the ICRC is
// little-endian on the wire). A small reference implementation of §3.1 that
// works on the whole frame checks the masking independently.
#include "wire/icrc.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "wire/byte_order.h"
#include "wire/headers.h"
#include "wire/opcode.h"

namespace uroce::wire {
namespace {

std::vector<uint8_t> from_hex(const std::string& s) {
  std::vector<uint8_t> out;
  int hi = -1;
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) continue;
    int v = std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10;
    if (hi < 0) {
      hi = v;
    } else {
      out.push_back(uint8_t(hi << 4 | v));
      hi = -1;
    }
  }
  EXPECT_LT(hi, 0) << "odd number of hex digits";
  return out;
}

// V1: hardware-generated CNP (ConnectX-4 Lx), IP ID 0x718C, DF, TOS 0xC2.
const char* const kV1 =
    "e41d2dab2bc27cfe90643b32080045c2003c718c400040119161 0a001101 0a001201"
    "000012b700280000 8100ffff40000118 00000000 "
    "00000000000000000000000000000000 82fd002a";
// V2: UC SEND_ONLY, MigReq=1, PadCnt=2, DestQP 0xD3, PSN 13571856.
const char* const kV2 =
    "248a07a8fa22248a07a8fa22080045010040047840004011b4d5c0a80007c0a80007c00012"
    "b7002caca2"
    "2460ffff000000d300cf17104630818be28935d90e9a95505401be885e500000 78f353f3";
// V3: RC ACKNOWLEDGE (AETH 0x1F, MSN 1), UDP checksum 0.
const char* const kV3 =
    "020000000001020000000002080045000030000740004011b962c0"
    "a80002c0a80001c00212b7001c0000"
    "1100ffff00000012000001001f000001 a60cd6fe";

constexpr size_t kEth = 14, kIp = 20, kUdp = 8;
constexpr size_t kRoce = kEth + kIp + kUdp;  // offset of the BTH in a frame

// The addressing of a frame, read from its IPv4 and UDP headers.
Ipv4Flow flow_of(const std::vector<uint8_t>& f) {
  const uint8_t* ip = f.data() + kEth;
  const uint8_t* udp = ip + kIp;
  Ipv4Flow fl;
  fl.src_ip = load_be32(ip + 12);
  fl.dst_ip = load_be32(ip + 16);
  fl.ip_id = load_be16(ip + 4);
  fl.ip_flags = load_be16(ip + 6);
  fl.src_port = load_be16(udp);
  fl.dst_port = load_be16(udp + 2);
  return fl;
}

uint32_t wire_icrc(const std::vector<uint8_t>& f) {
  uint32_t v;
  std::memcpy(&v, f.data() + f.size() - 4, 4);
  return v;  // little-endian on the wire; this test runs on x86
}

uint32_t impl_icrc(const std::vector<uint8_t>& f) { return icrc_ipv4(flow_of(f), f.data() + kRoce, f.size() - kRoce); }

// Independent implementation of §3.1 over the whole frame (IPv4, no options).
uint32_t reference_icrc(const std::vector<uint8_t>& f) {
  const size_t n = f.size() - kEth - kIcrcSize;
  std::vector<uint8_t> s(8 + n, 0xFF);
  std::memcpy(s.data() + 8, f.data() + kEth, n);
  uint8_t* ip = s.data() + 8;
  ip[1] = 0xFF;                      // TOS
  ip[8] = 0xFF;                      // TTL
  ip[10] = ip[11] = 0xFF;            // header checksum
  ip[kIp + 6] = ip[kIp + 7] = 0xFF;  // UDP checksum
  ip[kIp + kUdp + 4] = 0xFF;         // BTH byte 4
  return crc32(0, s.data(), s.size());
}

struct Vector {
  const char* name;
  const char* hex;
  uint32_t crc;  // CRC value from the facts sheet
};
const Vector kVectors[] = {
    {"V1_cnp", kV1, 0x2A00FD82},
    {"V2_uc_send_only", kV2, 0xF353F378},
    {"V3_rc_ack", kV3, 0xFED60CA6},
};

class IcrcVector : public ::testing::TestWithParam<Vector> {};

// Receive the facts-sheet frame / Expect icrc_ipv4 over its UDP payload to
// equal the trailing 4 bytes (and the CRC value the sheet states).
TEST_P(IcrcVector, MatchesGoldenFrame) {
  auto f = from_hex(GetParam().hex);
  ASSERT_GT(f.size(), kRoce + kBthSize + kIcrcSize);
  // Sanity of the frame itself: UDP length covers BTH..ICRC.
  EXPECT_EQ(load_be16(f.data() + kEth + kIp + 4), f.size() - kEth - kIp);
  EXPECT_EQ(wire_icrc(f), GetParam().crc);
  EXPECT_EQ(reference_icrc(f), GetParam().crc);
  EXPECT_EQ(impl_icrc(f), GetParam().crc);
}

// Expect the same CRC when the packet is handed over as a gather list cut at
// every possible place (the BTH may straddle segments, as in TxBatch).
TEST_P(IcrcVector, GatherListSplitAnywhere) {
  auto f = from_hex(GetParam().hex);
  uint8_t* p = f.data() + kRoce;
  size_t body = f.size() - kRoce - kIcrcSize;
  for (size_t a = 0; a <= body; ++a) {
    for (size_t b = a; b <= body; b += 3) {
      iovec v[3] = {{p, a}, {p + a, b - a}, {p + b, body - b}};
      ASSERT_EQ(icrc_ipv4(flow_of(f), std::span<const iovec>(v, 3), f.size() - kRoce), GetParam().crc)
          << "split at " << a << "," << b;
    }
  }
}

// Expect the masked fields (§3.1 table) not to change the ICRC: TOS, TTL, IP
// checksum, UDP checksum, BTH byte 4 (FECN/BECN/Resv6a).
TEST_P(IcrcVector, MaskedFieldsDoNotChangeCrc) {
  const auto orig = from_hex(GetParam().hex);
  const size_t masked[] = {kEth + 1, kEth + 8, kEth + 10, kEth + 11, kEth + kIp + 6, kEth + kIp + 7, kRoce + 4};
  for (size_t off : masked) {
    for (uint8_t x : {uint8_t(0x01), uint8_t(0x80), uint8_t(0xFF)}) {
      auto f = orig;
      f[off] ^= x;
      EXPECT_EQ(reference_icrc(f), GetParam().crc) << "offset " << off;
      EXPECT_EQ(impl_icrc(f), GetParam().crc) << "offset " << off;
    }
  }
}

// Expect every unmasked byte (IP ID/flags/addresses, UDP ports/length, BTH
// opcode/flags/P_Key/QP/AckReq/PSN, extension headers, payload, pad) to change
// it.
TEST_P(IcrcVector, UnmaskedFieldsChangeCrc) {
  const auto orig = from_hex(GetParam().hex);
  const size_t ip_fields[] = {kEth + 4,  kEth + 5,  kEth + 6,  kEth + 7,       kEth + 12,
                              kEth + 15, kEth + 16, kEth + 19, kEth + kIp + 0, kEth + kIp + 3};
  for (size_t off : ip_fields) {
    auto f = orig;
    f[off] ^= 0x01;
    EXPECT_NE(reference_icrc(f), GetParam().crc) << "offset " << off;
    EXPECT_NE(impl_icrc(f), GetParam().crc) << "offset " << off;
  }
  for (size_t off = kRoce; off < orig.size() - kIcrcSize; ++off) {
    if (off == kRoce + 4) continue;  // masked
    auto f = orig;
    f[off] ^= 0x01;
    EXPECT_NE(impl_icrc(f), GetParam().crc) << "offset " << off;
  }
}

INSTANTIATE_TEST_SUITE_P(Facts, IcrcVector, ::testing::ValuesIn(kVectors),
                         [](const auto& info) { return std::string(info.param.name); });

// Receive V3 with the AckReq bit set / Expect a different ICRC (the A bit is
// covered; only byte 4 of the BTH is masked).
TEST(Icrc, AckReqBitIsCovered) {
  auto f = from_hex(kV3);
  f[kRoce + 8] |= 0x80;
  EXPECT_NE(impl_icrc(f), 0xFED60CA6u);
  EXPECT_EQ(impl_icrc(f), reference_icrc(f));
}

// Expect a one-byte payload change to change the CRC (V2 carries payload).
TEST(Icrc, PayloadIsCovered) {
  auto f = from_hex(kV2);
  f[kRoce + kBthSize] ^= 0x40;
  EXPECT_NE(impl_icrc(f), 0xF353F378u);
  EXPECT_EQ(impl_icrc(f), reference_icrc(f));
}

// The facts sheet's debug aid for V3: CRC input with masked bytes visible.
TEST(Icrc, V3CrcInputDebugAid) {
  auto input = from_hex(
      "ffffffffffffffff45ff003000074000ff11ffffc0a80002c0a800"
      "01c00212b7001cffff1100ffffff000012000001001f000001");
  EXPECT_EQ(crc32(0, input.data(), input.size()), 0xFED60CA6u);
  // §3.1 step 3: the register after eight 0xFF bytes is 0xDEBB20E3 (inverted).
  uint8_t ff[8];
  std::memset(ff, 0xFF, 8);
  EXPECT_EQ(~crc32(0, ff, 8), 0xDEBB20E3u);
}

// uroce senders: IP ID 0 and DF (the Ipv4Flow defaults). Random packets built
// into a frame with those fields agree with the reference implementation.
TEST(Icrc, DefaultFlowMatchesReferenceOnRandomPackets) {
  std::mt19937 rng(12345);
  for (int iter = 0; iter < 200; ++iter) {
    size_t roce_len = kBthSize + 4 + (rng() % 300);
    std::vector<uint8_t> f(kRoce + roce_len);
    for (auto& b : f) b = uint8_t(rng());
    uint8_t* ip = f.data() + kEth;
    ip[0] = 0x45;
    store_be16(ip + 2, uint16_t(kIp + kUdp + roce_len));
    store_be16(ip + 4, 0);
    store_be16(ip + 6, 0x4000);
    ip[9] = 17;
    store_be16(ip + kIp + 4, uint16_t(kUdp + roce_len));
    Ipv4Flow fl;
    fl.src_ip = load_be32(ip + 12);
    fl.dst_ip = load_be32(ip + 16);
    fl.src_port = load_be16(ip + kIp);
    fl.dst_port = load_be16(ip + kIp + 2);
    ASSERT_EQ(icrc_ipv4(fl, f.data() + kRoce, roce_len), reference_icrc(f)) << "iteration " << iter;
  }
}

}  // namespace
}  // namespace uroce::wire

namespace uroce::wire {
namespace {

// The folded CRC-32 must equal zlib's for every length (below, at and above
// the 64-byte folding threshold, multiples of 16 and not) and alignment, and
// chain like it (crc32(crc32(0, a), b) == crc32(0, a+b)).
// V5: IPv6 RC SEND_ONLY (TC 0x68, flow label 0x12345, hop limit 64), fd00::1
// -> fd00::2, "hello" + 3 pad bytes, AckReq. Self-derived in the facts sheet;
// tests/tools/icrc_check.py (Python's zlib, no code shared with uroce)
// computes the same ICRC, and rxe_icrc.c masks the same IPv6 fields.
const char* const kV5 =
    "02000000000202000000000186dd6681234500201140fd000000000000000000000000000001"
    "fd000000000000000000000000000002c00112b7002069dd"
    "0430ffff000000118000010068656c6c6f000000 05bda64c";
constexpr size_t kIp6 = 40;
constexpr size_t kRoce6 = kEth + kIp6 + kUdp;

Ipv6Flow flow6_of(const std::vector<uint8_t>& f) {
  const uint8_t* ip = f.data() + kEth;
  Ipv6Flow fl;
  std::memcpy(fl.src_ip.data(), ip + 8, 16);
  std::memcpy(fl.dst_ip.data(), ip + 24, 16);
  fl.src_port = load_be16(ip + kIp6);
  fl.dst_port = load_be16(ip + kIp6 + 2);
  return fl;
}

uint32_t impl_icrc6(const std::vector<uint8_t>& f) {
  return icrc_ipv6(flow6_of(f), f.data() + kRoce6, f.size() - kRoce6);
}

// Independent implementation of §3.1 over a whole IPv6 frame.
uint32_t reference_icrc6(const std::vector<uint8_t>& f) {
  const size_t n = f.size() - kEth - kIcrcSize;
  std::vector<uint8_t> s(8 + n, 0xFF);
  std::memcpy(s.data() + 8, f.data() + kEth, n);
  uint8_t* ip = s.data() + 8;
  ip[0] |= 0x0F;                       // traffic class, high nibble
  ip[1] = ip[2] = ip[3] = 0xFF;        // traffic class, low nibble; flow label
  ip[7] = 0xFF;                        // hop limit
  ip[kIp6 + 6] = ip[kIp6 + 7] = 0xFF;  // UDP checksum
  ip[kIp6 + kUdp + 4] = 0xFF;          // BTH byte 4
  return crc32(0, s.data(), s.size());
}

// Receive V5 / Expect icrc_ipv6 over its UDP payload to equal the trailing 4
// bytes, as the independent reference computes them.
TEST(Icrc6, MatchesGoldenFrameV5) {
  auto f = from_hex(kV5);
  ASSERT_EQ(f.size(), 86u);
  EXPECT_EQ(load_be16(f.data() + kEth + 4), f.size() - kEth - kIp6);  // payload length
  EXPECT_EQ(wire_icrc(f), 0x4CA6BD05u);
  EXPECT_EQ(reference_icrc6(f), 0x4CA6BD05u);
  EXPECT_EQ(impl_icrc6(f), 0x4CA6BD05u);
  // Through the flow of either version, and the receiver's check.
  IpFlow flow(flow6_of(f));
  iovec v{f.data() + kRoce6, f.size() - kRoce6 - kIcrcSize};
  EXPECT_EQ(icrc(flow, std::span<const iovec>(&v, 1), f.size() - kRoce6), 0x4CA6BD05u);
  EXPECT_TRUE(icrc_matches(flow, f.data() + kRoce6, f.size() - kRoce6, 0x4CA6BD05u));
  EXPECT_FALSE(icrc_matches(flow, f.data() + kRoce6, f.size() - kRoce6, 0x4CA6BD04u));
}

// Expect the same CRC from a gather list cut anywhere (the head holds only
// 8 bytes of the packet after the 56-byte IPv6 pseudo-header).
TEST(Icrc6, GatherListSplitAnywhere) {
  auto f = from_hex(kV5);
  uint8_t* p = f.data() + kRoce6;
  size_t body = f.size() - kRoce6 - kIcrcSize;
  for (size_t a = 0; a <= body; ++a) {
    for (size_t b = a; b <= body; ++b) {
      iovec v[3] = {{p, a}, {p + a, b - a}, {p + b, body - b}};
      ASSERT_EQ(icrc_ipv6(flow6_of(f), std::span<const iovec>(v, 3), f.size() - kRoce6), 0x4CA6BD05u)
          << "split at " << a << "," << b;
    }
  }
}

// Expect traffic class, flow label, hop limit, UDP checksum and BTH byte 4 not
// to change the ICRC, and the addresses, ports, UDP length, BTH and payload to.
TEST(Icrc6, MaskedAndCoveredFields) {
  const auto orig = from_hex(kV5);
  const size_t masked[] = {kEth + 0, kEth + 1,        kEth + 2,        kEth + 3,
                           kEth + 7, kEth + kIp6 + 6, kEth + kIp6 + 7, kRoce6 + 4};
  for (size_t off : masked) {
    auto f = orig;
    f[off] ^= off == kEth ? 0x0F : 0xA5;  // byte 0: the traffic class nibble only (not the version)
    EXPECT_EQ(reference_icrc6(f), 0x4CA6BD05u) << "offset " << off;
    EXPECT_EQ(impl_icrc6(f), 0x4CA6BD05u) << "offset " << off;
  }
  const size_t covered[] = {kEth + 8, kEth + 23, kEth + 24, kEth + 39, kEth + kIp6 + 0, kEth + kIp6 + 3};
  for (size_t off : covered) {
    auto f = orig;
    f[off] ^= 0x01;
    EXPECT_NE(impl_icrc6(f), 0x4CA6BD05u) << "offset " << off;
    EXPECT_EQ(impl_icrc6(f), reference_icrc6(f)) << "offset " << off;
  }
  for (size_t off = kRoce6; off < orig.size() - kIcrcSize; ++off) {
    if (off == kRoce6 + 4) continue;  // masked
    auto f = orig;
    f[off] ^= 0x01;
    EXPECT_NE(impl_icrc6(f), 0x4CA6BD05u) << "offset " << off;
  }
}

// An IPv4-mapped address is not IPv6 on the wire: the same packet between
// the IPv4 addresses has the IPv4 ICRC, and IpFlow's conversion keeps it.
TEST(Icrc6, Ipv4FlowConvertsToIpv4Icrc) {
  auto f = from_hex(kV3);
  IpFlow flow = flow_of(f);
  EXPECT_FALSE(flow.ipv6);
  iovec v{f.data() + kRoce, f.size() - kRoce - kIcrcSize};
  EXPECT_EQ(icrc(flow, std::span<const iovec>(&v, 1), f.size() - kRoce), 0xFED60CA6u);
  EXPECT_TRUE(icrc_matches(flow, f.data() + kRoce, f.size() - kRoce, 0xFED60CA6u));
}

// `n` pseudo-random bytes (a linear congruential generator from `seed`).
std::vector<uint8_t> lcg_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = uint8_t((seed = seed * 1103515245u + 12345u) >> 16);
  return v;
}

// A 64-byte CRC head whose byte i is i * mul + add.
void fill_head(uint8_t (&head)[64], unsigned mul, unsigned add) {
  for (unsigned i = 0; i < 64; ++i) head[i] = uint8_t(i * mul + add);
}

TEST(Crc32, FoldedEqualsZlibForAllLengthsAndAlignments) {
  std::vector<uint8_t> buf = lcg_bytes(9000 + 16, 12345);
  for (size_t off = 0; off < 16; off += 3) {
    for (size_t len = 0; len <= 600; ++len)
      ASSERT_EQ(crc32(0, buf.data() + off, len), crc32_portable(0, buf.data() + off, len)) << off << " " << len;
    for (size_t len : {1023u, 1024u, 1025u, 4096u, 4100u, 9000u})
      ASSERT_EQ(crc32(0, buf.data() + off, len), crc32_portable(0, buf.data() + off, len)) << off << " " << len;
  }
  for (size_t len = 3800; len <= 4200; ++len)  // packet-sized, every tail
    ASSERT_EQ(crc32(0, buf.data() + 1, len), crc32_portable(0, buf.data() + 1, len)) << len;
  uint32_t seed = crc32_portable(0, buf.data(), 100);
  EXPECT_EQ(crc32(seed, buf.data() + 100, 4000), crc32_portable(seed, buf.data() + 100, 4000));
  for (size_t len = 16; len < 64; ++len)  // one lane (short packets), from a running CRC
    ASSERT_EQ(crc32(seed, buf.data() + 100, len), crc32_portable(seed, buf.data() + 100, len)) << len;
  EXPECT_EQ(crc32(crc32(0, buf.data(), 100), buf.data() + 100, 4000), crc32_portable(0, buf.data(), 4100));
}

// Each folder the CPU runs (not only the one crc32 picks) against zlib, every
// length to 600 and packet-sized ones, from a running CRC too.
TEST(Crc32, EveryFolderEqualsZlib) {
  std::vector<uint8_t> buf = lcg_bytes(9000 + 16, 4242);
  for (const Crc32Folder& f : crc32_folders()) {
    for (size_t len = 0; len <= 600; ++len)
      ASSERT_EQ(f.crc32(0, buf.data() + 5, len), crc32_portable(0, buf.data() + 5, len)) << f.name << " " << len;
    for (size_t len : {1023u, 1024u, 1040u, 4095u, 4096u, 4112u, 9000u})
      ASSERT_EQ(f.crc32(0x5A5Au, buf.data() + 1, len), crc32_portable(0x5A5Au, buf.data() + 1, len))
          << f.name << " " << len;
  }
  std::printf("folders on this CPU:");
  for (const Crc32Folder& f : crc32_folders()) std::printf(" %s", f.name);
  std::printf("\n");
}

// The head-first CRC (the ICRC's 64-byte pseudo-header head, then the packet)
// equals the CRC of the two pieces chained, for every length on both sides of
// the wide folder's 192-byte threshold.
TEST(Crc32, AfterHeadEqualsChainedCrc) {
  std::vector<uint8_t> buf = lcg_bytes(4400, 777);
  uint8_t head[64];
  fill_head(head, 37, 1);
  for (size_t len = 0; len <= 4400; len += (len < 600 ? 1 : 97)) {
    uint32_t want = crc32_portable(crc32_portable(0x1234u, head, 64), buf.data() + 3, std::min(len, buf.size() - 3));
    ASSERT_EQ(crc32_after_head(0x1234u, head, buf.data() + 3, std::min(len, buf.size() - 3)), want) << len;
  }
}

// The copying CRC (CopyIn: the payload stored in the same pass) leaves the
// buffer as a memcpy would and gives the CRC of the result, wherever the copy
// lies: inside the first 192 bytes, across the wide folder's 256-byte steps,
// up to the end, for lengths on both sides of its 448-byte threshold.
TEST(Crc32, AfterHeadCopyingEqualsCopyThenCrc) {
  std::vector<uint8_t> src = lcg_bytes(5000, 99);
  uint8_t head[64];
  fill_head(head, 11, 5);
  for (size_t len : {0u, 15u, 200u, 447u, 448u, 449u, 700u, 4096u, 4112u, 4113u}) {
    for (size_t at : {0u, 1u, 12u, 191u, 192u, 193u, 260u, 448u, 1000u}) {
      for (size_t n : {0u, 1u, 100u, 256u, 1000u, 4096u}) {
        if (at + n > len) continue;
        std::vector<uint8_t> a(len, 0xA5), b(len, 0xA5);
        if (n) std::memcpy(a.data() + at, src.data() + 7, n);
        uint32_t want = crc32_after_head(0x55u, head, a.data(), len);
        uint32_t got = crc32_after_head_copying(0x55u, head, b.data(), len, CopyIn{at, src.data() + 7, n});
        ASSERT_EQ(got, want) << len << " " << at << " " << n;
        ASSERT_EQ(a, b) << len << " " << at << " " << n;
      }
    }
  }
}

// The copying ICRC equals copy-then-ICRC for IPv4 and IPv6, with the payload
// starting inside the head's packet bytes (a 12-byte BTH) or after them.
TEST(Icrc, CopyingEqualsCopyThenIcrc) {
  std::vector<uint8_t> payload = lcg_bytes(4096, 3);
  Ipv4Flow f4{0x0A000001, 0x0A000002, 49152, 4791, 7};
  Ipv6Flow f6{};
  f6.src_ip[15] = 1;
  f6.dst_ip[15] = 2;
  f6.src_port = 49152;
  f6.dst_port = 4791;
  for (size_t hdr : {12u, 28u, 40u}) {
    for (size_t n : {0u, 8u, 64u, 1024u, 4096u}) {
      size_t len = hdr + n + kIcrcSize;
      std::vector<uint8_t> a(len, 0x3C), b(len, 0x3C), c(len, 0x3C);
      std::memcpy(a.data() + hdr, payload.data(), n);
      CopyIn copy{hdr, payload.data(), n};
      ASSERT_EQ(icrc_ipv4_copying(f4, b.data(), len, copy), icrc_ipv4(f4, a.data(), len)) << hdr << " " << n;
      ASSERT_EQ(icrc_ipv6_copying(f6, c.data(), len, copy), icrc_ipv6(f6, a.data(), len)) << hdr << " " << n;
      ASSERT_TRUE(std::equal(a.begin(), a.end() - kIcrcSize, b.begin())) << hdr << " " << n;
      ASSERT_TRUE(std::equal(a.begin(), a.end() - kIcrcSize, c.begin())) << hdr << " " << n;
    }
  }
}

}  // namespace
}  // namespace uroce::wire

namespace uroce::wire {
namespace {

// GSO segment k carries IP identification k (icrc.h): the delta of the ICRC
// for an identification change is what recomputing gives.
TEST(IcrcGsoId, DeltaEqualsRecomputation) {
  std::mt19937 rng(7);
  for (size_t len : {size_t(32), size_t(1060), size_t(4112), size_t(8999)}) {
    std::vector<uint8_t> pkt(len);
    for (auto& b : pkt) b = uint8_t(rng());
    Ipv4Flow flow{0x7f000001, 0x7f000002, 49152, 4791};
    uint32_t base = icrc_ipv4(flow, pkt.data(), len);
    for (uint16_t id : {uint16_t(1), uint16_t(2), uint16_t(37), uint16_t(63), uint16_t(0x1234)}) {
      Ipv4Flow f = flow;
      f.ip_id = id;
      EXPECT_EQ(icrc_ipv4(f, pkt.data(), len), base ^ icrc_ip_id_delta(len, id)) << "len " << len << " id " << id;
    }
  }
}

// Receive a segment whose ICRC was computed with identification k (0..63)
// while the receiver tried another one / Expect: matched. Any other
// identification, or a corrupted payload / Expect: not matched.
TEST(IcrcGsoId, MatchesEveryGsoIdentificationAndNothingElse) {
  std::mt19937 rng(11);
  std::vector<uint8_t> pkt(4112);
  for (auto& b : pkt) b = uint8_t(rng());
  Ipv4Flow flow{0x0a000001, 0x0a000002, 50000, 4791};
  uint32_t computed_with_3 = [&] {
    Ipv4Flow f = flow;
    f.ip_id = 3;
    return icrc_ipv4(f, pkt.data(), pkt.size());
  }();
  for (uint16_t k = 0; k <= kMaxGsoIpId; ++k) {
    Ipv4Flow f = flow;
    f.ip_id = k;
    uint32_t wire = icrc_ipv4(f, pkt.data(), pkt.size());
    EXPECT_TRUE(icrc_matches_gso_id(computed_with_3, 3, wire, pkt.size())) << "id " << k;
  }
  Ipv4Flow far = flow;
  far.ip_id = 64;
  EXPECT_FALSE(icrc_matches_gso_id(computed_with_3, 3, icrc_ipv4(far, pkt.data(), pkt.size()), pkt.size()));
  pkt[100] ^= 1;
  EXPECT_FALSE(icrc_matches_gso_id(computed_with_3, 3, icrc_ipv4(flow, pkt.data(), pkt.size()), pkt.size()));
}

}  // namespace
}  // namespace uroce::wire

namespace uroce::wire {
namespace {

// --- Any identification (rxe, NICs): icrc_ip_field_xor, icrc_ipv4_matches_any_id ---

// Receive V1 (a ConnectX-4 CNP sent with IP ID 0x718C and DF) with the
// identification unknown / Expect the field solved from the ICRC alone to be
// exactly the header's 0x718C4000, and the packet accepted by the any-ID check
// but not by the check for uroce senders (0..63).
TEST(IcrcAnyId, SolvesTheIdentificationOfAHardwareFrame) {
  auto f = from_hex(kV1);
  Ipv4Flow fl = flow_of(f);
  ASSERT_EQ(fl.ip_id, 0x718C);
  fl.ip_id = 0;
  const uint8_t* pkt = f.data() + kRoce;
  size_t len = f.size() - kRoce;
  uint32_t with_zero = icrc_ipv4(fl, pkt, len);
  EXPECT_EQ(ip_id_field(0, kIpFlagDf) ^ icrc_ip_field_xor(len, with_zero ^ wire_icrc(f)), 0x718C4000u);
  EXPECT_TRUE(icrc_ipv4_matches_any_id(fl, pkt, len, wire_icrc(f)));
  EXPECT_FALSE(icrc_ipv4_matches(fl, pkt, len, wire_icrc(f)));
}

// Compute ICRCs with random identifications and flags / Expect the solver to
// give back exactly the field used, for short and long packets.
TEST(IcrcAnyId, SolverInvertsEveryFieldChange) {
  std::mt19937 rng(5);
  for (size_t len : {size_t(16), size_t(20), size_t(76), size_t(1060), size_t(4112), size_t(9000)}) {
    std::vector<uint8_t> pkt(len);
    for (auto& b : pkt) b = uint8_t(rng());
    Ipv4Flow flow{0xC6336402, 0xC6336401, 0xC123, 4791};
    uint32_t base = icrc_ipv4(flow, pkt.data(), len);
    for (int i = 0; i < 200; ++i) {
      Ipv4Flow f = flow;
      f.ip_id = uint16_t(rng());
      f.ip_flags = uint16_t(rng());
      uint32_t got = icrc_ip_field_xor(len, base ^ icrc_ipv4(f, pkt.data(), len));
      ASSERT_EQ(got, ip_id_field(f.ip_id, f.ip_flags) ^ ip_id_field(0, kIpFlagDf)) << "len " << len;
    }
  }
}

// Receive a packet sent with any identification, with DF or without /
// Expect accepted. Sent as a fragment (MF, an offset) or with the reserved
// flag / Expect refused: no unfragmented datagram carries those.
TEST(IcrcAnyId, AcceptsAnyIdentificationOfAnUnfragmentedDatagram) {
  std::mt19937 rng(9);
  std::vector<uint8_t> pkt(1060);
  for (auto& b : pkt) b = uint8_t(rng());
  Ipv4Flow rx{0xC6336402, 0xC6336401, 0xC123, 4791};  // what the receiver knows: id 0, DF
  for (uint16_t id : {uint16_t(0), uint16_t(1), uint16_t(64), uint16_t(0x718C), uint16_t(0xFFFF)}) {
    for (uint16_t flags : {kIpFlagDf, uint16_t(0)}) {
      Ipv4Flow tx = rx;
      tx.ip_id = id;
      tx.ip_flags = flags;
      EXPECT_TRUE(icrc_ipv4_matches_any_id(rx, pkt.data(), pkt.size(), icrc_ipv4(tx, pkt.data(), pkt.size())))
          << "id " << id << " flags " << flags;
    }
    for (uint16_t flags : {uint16_t(0x2000), uint16_t(0x8000), uint16_t(0x4001), uint16_t(0x0010)}) {
      Ipv4Flow tx = rx;
      tx.ip_id = id;
      tx.ip_flags = flags;
      EXPECT_FALSE(icrc_ipv4_matches_any_id(rx, pkt.data(), pkt.size(), icrc_ipv4(tx, pkt.data(), pkt.size())))
          << "id " << id << " flags " << flags;
    }
  }
}

// Receive, from a uroce sender's port and from a RoCE source port, packets
// sent with identification 0x1234 / Expect the RoCE port's accepted, the
// uroce port's refused (its senders use 0..63 only).
TEST(IcrcAnyId, PolicyFollowsTheSourcePort) {
  std::vector<uint8_t> pkt(100, 0x5A);
  for (uint16_t port : {uint16_t(4791), uint16_t(0xBFFF), uint16_t(0xC000), uint16_t(0xFFFF)}) {
    Ipv4Flow rx{0x0A000001, 0x0A000002, port, 4791};
    Ipv4Flow tx = rx;
    tx.ip_id = 0x1234;
    bool roce_port = port >= kRoceSourcePortMin;
    EXPECT_EQ(icrc_ipv4_received_ok(rx, pkt.data(), pkt.size(), icrc_ipv4(tx, pkt.data(), pkt.size())), roce_port)
        << "port " << port;
    tx.ip_id = 5;  // a GSO segment's: accepted from either
    EXPECT_TRUE(icrc_ipv4_received_ok(rx, pkt.data(), pkt.size(), icrc_ipv4(tx, pkt.data(), pkt.size())));
  }
}

// Flip every single bit of packets (a 64-byte SEND, a 1 KiB and a 4 KiB
// segment) sent by a uroce sender with identification 0 / Expect every one
// caught: between uroce processes the check keeps full strength for the
// corruption fault injection makes.
TEST(IcrcAnyId, EverySingleBitFlipFromAUroceSenderIsCaught) {
  std::mt19937 rng(13);
  for (size_t len : {size_t(64 + 16), size_t(1024 + 16), size_t(4096 + 16)}) {
    std::vector<uint8_t> pkt(len);
    for (auto& b : pkt) b = uint8_t(rng());
    Ipv4Flow flow{0x7F000001, 0x7F000001, 18000, 4791};
    uint32_t sent = icrc_ipv4(flow, pkt.data(), len);
    size_t missed = 0;
    for (size_t bit = 0; bit < (len - kIcrcSize) * 8; ++bit) {
      if (bit / 8 == 4) continue;  // BTH byte 4 is masked out of the ICRC
      pkt[bit / 8] ^= uint8_t(1u << bit % 8);
      missed += icrc_ipv4_received_ok(flow, pkt.data(), len, sent);
      pkt[bit / 8] ^= uint8_t(1u << bit % 8);
    }
    EXPECT_EQ(missed, 0u) << "len " << len;
  }
}

}  // namespace
}  // namespace uroce::wire
