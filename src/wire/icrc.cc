#include "wire/icrc.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "wire/byte_order.h"
#include "wire/headers.h"
#include "wire/opcode.h"

namespace uroce::wire {

namespace {

// The ICRC of a packet whose pseudo-header (8 x 0xFF and the masked IP and
// UDP headers, kPseudo bytes) starts `head`: the rest of the head is filled
// with the packet's first bytes, so that the head and the rest each go
// through the folded CRC rather than the short pieces through zlib's byte
// loop.
template <size_t kPseudo>
uint32_t icrc_after_pseudo(uint8_t (&head)[64], std::span<const iovec> roce) {
  // The packet's first bytes, which may straddle segments.
  size_t got = 0;
  size_t seg = 0, seg_off = 0;
  while (got < sizeof head - kPseudo && seg < roce.size()) {
    const auto* base = static_cast<const uint8_t*>(roce[seg].iov_base);
    size_t n = std::min(sizeof head - kPseudo - got, roce[seg].iov_len - seg_off);
    std::memcpy(head + kPseudo + got, base + seg_off, n);
    got += n;
    seg_off += n;
    if (seg_off == roce[seg].iov_len) {
      ++seg;
      seg_off = 0;
    }
  }
  if (got > 4) head[kPseudo + 4] = 0xFF;  // BTH byte 4 (FECN, BECN, Resv6a) masked
  uint32_t crc;
  if (got == sizeof head - kPseudo && seg < roce.size()) {  // the head and the first piece in one pass
    crc = crc32_after_head(0, head, static_cast<const uint8_t*>(roce[seg].iov_base) + seg_off,
                           roce[seg].iov_len - seg_off);
    ++seg;
    seg_off = 0;
  } else {
    crc = crc32(0, head, kPseudo + got);
  }
  for (; seg < roce.size(); ++seg, seg_off = 0) {
    const auto* base = static_cast<const uint8_t*>(roce[seg].iov_base);
    crc = crc32(crc, base + seg_off, roce[seg].iov_len - seg_off);
  }
  return crc;
}

// The masked UDP header, 8 bytes at `udp`.
void put_udp(uint8_t* udp, uint16_t src_port, uint16_t dst_port, size_t roce_len_with_icrc) {
  store_be16(udp, src_port);
  store_be16(udp + 2, dst_port);
  store_be16(udp + 4, uint16_t(8 + roce_len_with_icrc));
  udp[6] = udp[7] = 0xFF;  // checksum masked
}

// The ICRC of the contiguous `packet` (`len` bytes before the ICRC) while
// `c` is stored into it: the bytes the head takes are stored first.
template <size_t kPseudo>
uint32_t icrc_after_pseudo_copying(uint8_t (&head)[64], uint8_t* packet, size_t len, const CopyIn& c) {
  constexpr size_t kTake = sizeof head - kPseudo;
  if (len <= kTake) {
    if (c.len) std::memcpy(packet + c.at, c.src, c.len);
    iovec v{packet, len};
    return icrc_after_pseudo<kPseudo>(head, std::span<const iovec>(&v, 1));
  }
  CopyIn rest{};
  if (c.at < kTake) {
    size_t n = std::min(c.len, kTake - c.at);
    std::memcpy(packet + c.at, c.src, n);
    if (c.len > n) rest = CopyIn{0, c.src + n, c.len - n, c.ahead};
  } else {
    rest = CopyIn{c.at - kTake, c.src, c.len, c.ahead};
  }
  std::memcpy(head + kPseudo, packet, kTake);
  head[kPseudo + 4] = 0xFF;  // BTH byte 4 (FECN, BECN, Resv6a) masked
  return crc32_after_head_copying(0, head, packet + kTake, len - kTake, rest);
}

// One 64-byte head: 8 x 0xFF, masked IPv4 header (20), masked UDP header (8);
// the first 28 bytes of the packet (its BTH and 16 more) complete it.
void put_ipv4_pseudo(uint8_t (&head)[64], const Ipv4Flow& flow, size_t roce_len_with_icrc) {
  std::memset(head, 0xFF, 8);
  uint8_t* ip = head + 8;
  ip[0] = 0x45;
  ip[1] = 0xFF;  // TOS masked
  store_be16(ip + 2, uint16_t(20 + 8 + roce_len_with_icrc));
  store_be16(ip + 4, flow.ip_id);
  store_be16(ip + 6, flow.ip_flags);
  ip[8] = 0xFF;            // TTL masked
  ip[9] = 17;              // UDP
  ip[10] = ip[11] = 0xFF;  // header checksum masked
  store_be32(ip + 12, flow.src_ip);
  store_be32(ip + 16, flow.dst_ip);
  put_udp(ip + 20, flow.src_port, flow.dst_port, roce_len_with_icrc);
}

// 8 x 0xFF, masked IPv6 header (40), masked UDP header (8); the packet's
// first 8 bytes complete the head (roce-facts §3.1; rxe_icrc.c masks the same).
void put_ipv6_pseudo(uint8_t (&head)[64], const Ipv6Flow& flow, size_t roce_len_with_icrc) {
  std::memset(head, 0xFF, 8);
  uint8_t* ip = head + 8;
  ip[0] = 0x6F;                                          // version 6; traffic class (high nibble) masked
  ip[1] = ip[2] = ip[3] = 0xFF;                          // traffic class (low nibble) and flow label masked
  store_be16(ip + 4, uint16_t(8 + roce_len_with_icrc));  // payload length: UDP header and payload
  ip[6] = 17;                                            // next header: UDP
  ip[7] = 0xFF;                                          // hop limit masked
  std::memcpy(ip + 8, flow.src_ip.data(), 16);
  std::memcpy(ip + 24, flow.dst_ip.data(), 16);
  put_udp(ip + 40, flow.src_port, flow.dst_port, roce_len_with_icrc);
}

constexpr size_t kIpv4Pseudo = 8 + 20 + 8;
constexpr size_t kIpv6Pseudo = 8 + 40 + 8;

}  // namespace

uint32_t icrc_ipv4(const Ipv4Flow& flow, std::span<const iovec> roce, size_t roce_len_with_icrc) {
  uint8_t head[64];
  put_ipv4_pseudo(head, flow, roce_len_with_icrc);
  return icrc_after_pseudo<kIpv4Pseudo>(head, roce);
}

uint32_t icrc_ipv6(const Ipv6Flow& flow, std::span<const iovec> roce, size_t roce_len_with_icrc) {
  uint8_t head[64];
  put_ipv6_pseudo(head, flow, roce_len_with_icrc);
  return icrc_after_pseudo<kIpv6Pseudo>(head, roce);
}

uint32_t icrc_ipv4_copying(const Ipv4Flow& flow, uint8_t* packet, size_t len_with_icrc, const CopyIn& copy) {
  uint8_t head[64];
  put_ipv4_pseudo(head, flow, len_with_icrc);
  return icrc_after_pseudo_copying<kIpv4Pseudo>(head, packet, len_with_icrc - kIcrcSize, copy);
}

uint32_t icrc_ipv6_copying(const Ipv6Flow& flow, uint8_t* packet, size_t len_with_icrc, const CopyIn& copy) {
  uint8_t head[64];
  put_ipv6_pseudo(head, flow, len_with_icrc);
  return icrc_after_pseudo_copying<kIpv6Pseudo>(head, packet, len_with_icrc - kIcrcSize, copy);
}

uint32_t icrc_ipv6(const Ipv6Flow& flow, const uint8_t* packet, size_t len_with_icrc) {
  iovec v{const_cast<uint8_t*>(packet), len_with_icrc - kIcrcSize};
  return icrc_ipv6(flow, std::span<const iovec>(&v, 1), len_with_icrc);
}

bool icrc_matches(const IpFlow& flow, const uint8_t* packet, size_t len_with_icrc, uint32_t received) {
  if (flow.ipv6) return icrc_ipv6(flow.v6, packet, len_with_icrc) == received;
  return icrc_ipv4_matches(flow.v4, packet, len_with_icrc, received);
}

uint32_t icrc_ipv4(const Ipv4Flow& flow, const uint8_t* packet, size_t len_with_icrc) {
  iovec v{const_cast<uint8_t*>(packet), len_with_icrc - kIcrcSize};
  return icrc_ipv4(flow, std::span<const iovec>(&v, 1), len_with_icrc);
}

namespace {
// The CRC input is 8 x 0xFF, the IPv4 header (identification at its bytes
// 4-5), the UDP header, then the packet without its ICRC.
constexpr size_t kIpIdOffset = 8 + 4;
constexpr size_t kPseudoLen = 8 + 20 + 8;
}  // namespace

bool icrc_ipv4_matches(const Ipv4Flow& flow, const uint8_t* packet, size_t len_with_icrc, uint32_t received) {
  uint32_t computed = icrc_ipv4(flow, packet, len_with_icrc);
  return computed == received || icrc_matches_gso_id(computed, flow.ip_id, received, len_with_icrc);
}

namespace {
// The linear part of the CRC of the IPv4 header's bytes 4-7 set to `field`
// (all else zero): what XOR `field` on those bytes does to the ICRC, given
// `after` = the operator of the zero bytes that follow them.
uint32_t ip_field_delta(uint32_t field, uLong after) {
  // CRC-32 is affine: crc(M ^ D) = crc(M) ^ crc(D) ^ crc(zeros), so the change
  // is the CRC's linear part of D: four bytes followed by zero bytes.
  uint8_t d[4];
  store_be32(d, field);
  static const uint8_t kZero4[4] = {0, 0, 0, 0};
  uLong lin4 = ::crc32(0, d, 4) ^ ::crc32(0, kZero4, 4);
  return uint32_t(crc32_combine_op(lin4, 0, after));
}

// How many bytes of the ICRC's input follow the IPv4 header's bytes 4-7.
size_t zeros_after_ip_field(size_t roce_len_with_icrc) {
  return kPseudoLen + roce_len_with_icrc - kIcrcSize - kIpIdOffset - 4;
}

// The operator of the zero bytes after the IPv4 header's bytes 4-7.
uLong after_ip_field(size_t roce_len_with_icrc) {
  return crc32_combine_gen64(z_off64_t(zeros_after_ip_field(roce_len_with_icrc)));
}

// The inverse of a one-to-one GF(2)-linear map of 32 bits, given the images
// of its unit vectors (column b = image of bit b): Gauss-Jordan elimination
// on (image, preimage) pairs until each image is one unit vector.
std::array<uint32_t, 32> invert(std::array<uint32_t, 32> image) {
  std::array<uint32_t, 32> pre{};
  for (unsigned b = 0; b < 32; ++b) pre[b] = 1u << b;
  for (unsigned bit = 0; bit < 32; ++bit) {
    unsigned p = bit;
    while (p < 32 && !(image[p] >> bit & 1)) ++p;
    if (p == 32) return {};  // not one to one: cannot happen for the CRC (see icrc.h)
    std::swap(image[p], image[bit]);
    std::swap(pre[p], pre[bit]);
    for (unsigned j = 0; j < 32; ++j) {
      if (j != bit && (image[j] >> bit & 1)) {
        image[j] ^= image[bit];
        pre[j] ^= pre[bit];
      }
    }
  }
  return pre;  // pre[b] maps to unit vector b
}
}  // namespace

uint32_t icrc_ip_id_delta(size_t roce_len_with_icrc, uint16_t id_xor) {
  return ip_field_delta(ip_id_field(id_xor, 0), after_ip_field(roce_len_with_icrc));
}

uint32_t icrc_ip_field_xor(size_t roce_len_with_icrc, uint32_t icrc_xor) {
  // icrc_xor = A(lin4(field)): lin4, the CRC's linear part of the field's four
  // bytes, then A, multiplication by x^(8z) for the z zero bytes after them.
  // x^(2^32 - 1) = 1 modulo the CRC-32 polynomial (irreducible), so A's
  // inverse is x^(8 (2^32 - 1 - z)), one operator per length: cached per
  // thread, direct-mapped. lin4's inverse is one matrix for every length.
  static const std::array<uint32_t, 32> kLin4Inverse = [] {
    std::array<uint32_t, 32> image;
    for (unsigned b = 0; b < 32; ++b) image[b] = ip_field_delta(1u << b, crc32_combine_gen64(0));
    return invert(image);
  }();
  struct Entry {
    size_t len = 0;
    uLong undo_zeros = 0;
  };
  thread_local std::array<Entry, 64> cache;
  Entry& e = cache[roce_len_with_icrc % cache.size()];
  if (e.len != roce_len_with_icrc) {
    e.undo_zeros = crc32_combine_gen64(z_off64_t(0xFFFFFFFFull - zeros_after_ip_field(roce_len_with_icrc)));
    e.len = roce_len_with_icrc;
  }
  uint32_t lin4 = uint32_t(crc32_combine_op(icrc_xor, 0, e.undo_zeros));
  uint32_t field = 0;
  for (uint32_t rest = lin4; rest; rest &= rest - 1) field ^= kLin4Inverse[unsigned(__builtin_ctz(rest))];
  return field;
}

bool icrc_ipv4_matches_any_id(const Ipv4Flow& flow, const uint8_t* packet, size_t len_with_icrc, uint32_t received) {
  uint32_t computed = icrc_ipv4(flow, packet, len_with_icrc);
  if (computed == received) return true;
  uint32_t field = ip_id_field(flow.ip_id, flow.ip_flags) ^ icrc_ip_field_xor(len_with_icrc, computed ^ received);
  uint16_t flags_and_offset = uint16_t(field);
  return flags_and_offset == kIpFlagDf || flags_and_offset == 0;
}

bool icrc_ipv4_received_ok(const Ipv4Flow& flow, const uint8_t* packet, size_t len_with_icrc, uint32_t received) {
  if (flow.src_port >= kRoceSourcePortMin) return icrc_ipv4_matches_any_id(flow, packet, len_with_icrc, received);
  return icrc_ipv4_matches(flow, packet, len_with_icrc, received);
}

bool icrc_matches_gso_id(uint32_t computed, uint16_t tried, uint32_t received, size_t roce_len_with_icrc) {
  // Per thread: the deltas of the identification's six low bits for the
  // packet lengths seen last (bulk traffic has one or two).
  struct Entry {
    size_t len = 0;
    std::array<uint32_t, 6> bit_delta{};
  };
  thread_local std::array<Entry, 4> cache;
  thread_local unsigned next = 0;
  Entry* e = nullptr;
  for (Entry& c : cache)
    if (c.len == roce_len_with_icrc) e = &c;
  if (!e) {
    e = &cache[next++ % cache.size()];
    e->len = roce_len_with_icrc;
    for (unsigned b = 0; b < e->bit_delta.size(); ++b)
      e->bit_delta[b] = icrc_ip_id_delta(roce_len_with_icrc, uint16_t(1u << b));
  }
  if (tried > kMaxGsoIpId) return false;
  // Visit every identification tried ^ gray(step), that is all of 0..63, one
  // XOR a step.
  uint32_t crc = computed;
  for (unsigned step = 1;; ++step) {
    if (crc == received) return true;
    unsigned bit = unsigned(__builtin_ctz(step));
    if (bit >= e->bit_delta.size()) return false;
    crc ^= e->bit_delta[bit];
  }
}

}  // namespace uroce::wire
