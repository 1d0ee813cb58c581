#include "wire/icrc.h"

#include <algorithm>
#include <cstring>

#include "wire/byte_order.h"
#include "wire/opcode.h"

namespace uroce::wire {

uint32_t icrc_ipv4(const Ipv4Flow& flow, std::span<const iovec> roce, size_t roce_len_with_icrc) {
  // 8 x 0xFF, masked IPv4 header (20), masked UDP header (8).
  uint8_t pseudo[8 + 20 + 8];
  std::memset(pseudo, 0xFF, 8);
  uint8_t* ip = pseudo + 8;
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
  uint8_t* udp = ip + 20;
  store_be16(udp, flow.src_port);
  store_be16(udp + 2, flow.dst_port);
  store_be16(udp + 4, uint16_t(8 + roce_len_with_icrc));
  udp[6] = udp[7] = 0xFF;  // checksum masked

  uint32_t crc = crc32(0, pseudo, sizeof(pseudo));

  // BTH with byte 4 (FECN, BECN, Resv6a) masked; it may straddle segments.
  uint8_t bth[kBthSize];
  size_t got = 0;
  size_t seg = 0, seg_off = 0;
  while (got < kBthSize && seg < roce.size()) {
    const auto* base = static_cast<const uint8_t*>(roce[seg].iov_base);
    size_t n = std::min(kBthSize - got, roce[seg].iov_len - seg_off);
    std::memcpy(bth + got, base + seg_off, n);
    got += n;
    seg_off += n;
    if (seg_off == roce[seg].iov_len) {
      ++seg;
      seg_off = 0;
    }
  }
  bth[4] = 0xFF;
  crc = crc32(crc, bth, got);
  for (; seg < roce.size(); ++seg, seg_off = 0) {
    const auto* base = static_cast<const uint8_t*>(roce[seg].iov_base);
    crc = crc32(crc, base + seg_off, roce[seg].iov_len - seg_off);
  }
  return crc;
}

uint32_t icrc_ipv4(const Ipv4Flow& flow, const uint8_t* packet, size_t len_with_icrc) {
  iovec v{const_cast<uint8_t*>(packet), len_with_icrc - kIcrcSize};
  return icrc_ipv4(flow, std::span<const iovec>(&v, 1), len_with_icrc);
}

}  // namespace uroce::wire
