// Invariant CRC of a RoCEv2 packet (roce-facts.md §3.1).
//
// The CRC covers 8 bytes of 0xFF (stand-in for the LRH), the IP header and UDP
// header with their variant fields masked to ones, the BTH with byte 4 masked,
// and everything after it up to (not including) the ICRC. uroce only sees the
// UDP payload, so the IPv4 and UDP headers are reconstructed from the
// addresses and lengths: uroce senders use an unconnected socket with DF set,
// which makes the kernel send IPv4 identification 0 and flags DF (design §4).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace uroce::wire {

// The addressing a packet travels with, in host byte order.
struct Ipv4Flow {
  uint32_t src_ip = 0;
  uint32_t dst_ip = 0;
  uint16_t src_port = 0;
  uint16_t dst_port = 0;
  uint16_t ip_id = 0;          // 0 for uroce senders (see above)
  uint16_t ip_flags = 0x4000;  // DF
};

// ICRC of a packet whose BTH starts `roce[0]` and whose segments hold the whole
// packet except the trailing 4 ICRC bytes. `roce_len_with_icrc` is the UDP
// payload length (ICRC included), needed for the IP and UDP length fields.
uint32_t icrc_ipv4(const Ipv4Flow& flow, std::span<const iovec> roce, size_t roce_len_with_icrc);

// Convenience for a contiguous packet (BTH .. ICRC inclusive).
uint32_t icrc_ipv4(const Ipv4Flow& flow, const uint8_t* packet, size_t len_with_icrc);

// Plain CRC-32 (zlib polynomial), for tests and the CM.
uint32_t crc32(uint32_t crc, const void* data, size_t len);
// The same by zlib's tables alone (the reference crc32 is tested against).
uint32_t crc32_portable(uint32_t crc, const void* data, size_t len);

}  // namespace uroce::wire
