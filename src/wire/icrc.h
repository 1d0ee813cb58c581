// Invariant CRC of a RoCEv2 packet (roce-facts.md §3.1).
//
// The CRC covers 8 bytes of 0xFF (stand-in for the LRH), the IP header and UDP
// header with their variant fields masked to ones, the BTH with byte 4 masked,
// and everything after it up to (not including) the ICRC. uroce only sees the
// UDP payload, so the IP and UDP headers are reconstructed from the
// addresses and lengths: uroce senders use an unconnected socket with DF set,
// which makes the kernel send IPv4 identification 0 and flags DF (design §4).
// IPv6 has no such field: everything the ICRC covers (payload length, next
// header, addresses) is known from the datagram.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

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

// The addressing of a packet over IPv6: addresses in network byte order,
// ports in host byte order. The ICRC masks traffic class, flow label and hop
// limit, so they need not be known.
struct Ipv6Flow {
  std::array<uint8_t, 16> src_ip{};
  std::array<uint8_t, 16> dst_ip{};
  uint16_t src_port = 0;
  uint16_t dst_port = 0;
};

uint32_t icrc_ipv6(const Ipv6Flow& flow, std::span<const iovec> roce, size_t roce_len_with_icrc);
uint32_t icrc_ipv6(const Ipv6Flow& flow, const uint8_t* packet, size_t len_with_icrc);

// A packet's addressing over either IP version: `v4` unless `ipv6`. An
// IPv4 flow converts implicitly.
struct IpFlow {
  Ipv4Flow v4;
  bool ipv6 = false;
  Ipv6Flow v6;

  IpFlow() = default;
  IpFlow(const Ipv4Flow& f) : v4(f) {}  // NOLINT(google-explicit-constructor)
  explicit IpFlow(const Ipv6Flow& f) : ipv6(true), v6(f) {}
};

inline uint32_t icrc(const IpFlow& flow, std::span<const iovec> roce, size_t roce_len_with_icrc) {
  return flow.ipv6 ? icrc_ipv6(flow.v6, roce, roce_len_with_icrc) : icrc_ipv4(flow.v4, roce, roce_len_with_icrc);
}

// IP identification of segments sent with UDP GSO (transport/udp_transport.h).
//
// The ICRC covers the IPv4 identification. An unconnected DF socket sends a
// datagram with identification 0, but when the kernel (or a NIC) splits a GSO
// message into segments, segment k carries identification k (inet_gso_segment
// counts up from the first). So uroce computes segment k's ICRC with ip_id = k:
// the ICRC is right on the wire whether the message is split on the way or
// arrives whole at a UDP_GRO receiver. A receiver cannot read the
// identification from a UDP socket; it tries the segment's index in its GRO
// batch first and then every identification a GSO message can give (below).
inline constexpr uint16_t kMaxGsoIpId = 63;  // segments per GSO message - 1

// Whether `received` is the ICRC of the packet whose ICRC, computed with the
// identification `tried`, is `computed`, for some identification in
// 0..kMaxGsoIpId. Uses the CRC's linearity: changing the identification by
// XOR d changes the ICRC by a value that depends only on d and the packet
// length. Cheap (a few dozen XORs; a per-thread cache per length).
bool icrc_matches_gso_id(uint32_t computed, uint16_t tried, uint32_t received, size_t roce_len_with_icrc);

// A received packet's check: its ICRC `received` is that of the packet
// (BTH .. ICRC inclusive) with flow.ip_id, or with any GSO identification.
// For packets from uroce senders (see icrc_ipv4_matches_any_id).
bool icrc_ipv4_matches(const Ipv4Flow& flow, const uint8_t* packet, size_t len_with_icrc, uint32_t received);

// The IPv4 header's bytes 4-7 (identification, then flags and fragment
// offset) as one big-endian number: what an ICRC covers of the IPv4 header
// that a UDP socket does not show its receiver.
inline constexpr uint32_t ip_id_field(uint16_t id, uint16_t flags) { return uint32_t(id) << 16 | flags; }
inline constexpr uint16_t kIpFlagDf = 0x4000;

// The change of bytes 4-7 of the IPv4 header (XOR) that changes the ICRC of a
// packet of `roce_len_with_icrc` bytes by XOR `icrc_xor`. Exactly one exists:
// the ICRC is affine in its input, and the 32 bits of a field followed by n
// zero bits map onto the 32 bits of the CRC one to one (multiplication by
// x^n modulo the CRC polynomial, which has an inverse). The inverse's
// length-dependent part is one operator, cached per thread by length.
uint32_t icrc_ip_field_xor(size_t roce_len_with_icrc, uint32_t icrc_xor);

// A received packet's check when its sender may have used any IPv4
// identification and either DF or no flags (rxe and RoCE NICs: the kernel's
// __ip_select_ident gives a new identification per packet): the field that
// explains `received` is solved for (icrc_ip_field_xor) and accepted when its
// flags and fragment offset are those of an unfragmented datagram. 2^17 of
// the 2^32 possible ICRC values pass, so a corrupted packet slips through with
// probability 2^-15 (3.1e-5) against 2^-26 for icrc_ipv4_matches (64
// identifications, DF) and 2^-32 for IPv6 (docs/architecture.md, "ICRC").
bool icrc_ipv4_matches_any_id(const Ipv4Flow& flow, const uint8_t* packet, size_t len_with_icrc, uint32_t received);

// A received IPv4 packet's check, by its sender: one at a RoCE source port
// (>= kRoceSourcePortMin: rxe, a NIC) may have used any identification
// (icrc_ipv4_matches_any_id); one below it is a uroce sender, which uses 0
// with DF or a GSO segment's index (icrc_ipv4_matches). flow.ip_id: the
// identification to try first (the packet's place in its GRO batch).
bool icrc_ipv4_received_ok(const Ipv4Flow& flow, const uint8_t* packet, size_t len_with_icrc, uint32_t received);
// The same for either IP version (IPv6: the ICRC computed, nothing to guess).
bool icrc_matches(const IpFlow& flow, const uint8_t* packet, size_t len_with_icrc, uint32_t received);

// The change of the ICRC of a packet of `roce_len_with_icrc` bytes when its
// IPv4 identification changes by XOR `id_xor` (for tests and the above).
uint32_t icrc_ip_id_delta(size_t roce_len_with_icrc, uint16_t id_xor);

// Bytes of a packet that its ICRC's computation stores first: `len` bytes
// from `src` go to offset `at` of the packet (of `data` for the crc32 below).
// The sender defers a payload's copy from registered memory into its packet
// to the ICRC's pass, which then reads the payload once (TxBatch).
struct CopyIn {
  size_t at = 0;
  const uint8_t* src = nullptr;
  size_t len = 0;
  // Bytes after src + len that lie in the same registered region (at most
  // kCopyAhead): the pass prefetches them as it goes — the next packet's
  // payload, which a source in DRAM would otherwise make it wait for at the
  // start of every page (the hardware prefetcher stops at page boundaries).
  size_t ahead = 0;
};
inline constexpr size_t kCopyAhead = 4096;

// The ICRC of the contiguous `packet` (as icrc_ipv4 / icrc_ipv6), whose bytes
// `copy` names are stored from copy.src in the same pass (before: anything).
uint32_t icrc_ipv4_copying(const Ipv4Flow& flow, uint8_t* packet, size_t len_with_icrc, const CopyIn& copy);
uint32_t icrc_ipv6_copying(const Ipv6Flow& flow, uint8_t* packet, size_t len_with_icrc, const CopyIn& copy);

// Plain CRC-32 (zlib polynomial), for tests and the CM.
uint32_t crc32(uint32_t crc, const void* data, size_t len);
// crc32 of the 64 bytes of `head` followed by `data` (one pass where the
// wide folder is available: the ICRC's pseudo-header head and a payload).
uint32_t crc32_after_head(uint32_t crc, const uint8_t (&head)[64], const void* data, size_t len);
// crc32_after_head of `data` once `copy` is stored into it, in one pass.
uint32_t crc32_after_head_copying(uint32_t crc, const uint8_t (&head)[64], uint8_t* data, size_t len,
                                  const CopyIn& copy);
// The same by zlib's tables alone (the reference crc32 is tested against).
uint32_t crc32_portable(uint32_t crc, const void* data, size_t len);
// Every folder this CPU runs ("clmul", "yclmul": 256-bit VPCLMULQDQ, "vclmul":
// AVX-512), each as a whole crc32 however long the input: crc32 picks the
// widest for long inputs, and tests check the others too.
struct Crc32Folder {
  const char* name;
  uint32_t (*crc32)(uint32_t crc, const void* data, size_t len);
};
std::vector<Crc32Folder> crc32_folders();

}  // namespace uroce::wire
