// Address handle (ibv_create_ah): where a UD send goes. RoCE v2 needs the GRH
// (is_global): the destination GID is an IP address (IPv4-mapped or IPv6, of
// the source GID's version) and the DLID the peer's UDP port (design §3; see
// roce_udp_port).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "core/container_of.h"
#include "core/result.h"

namespace uroce::core {

class Context;

struct Ah {
  ibv_ah ibah{};  // ABI object
  ibv_ah_attr attr{};  // attr.grh: the destination GID and the source GID's index
  uint16_t dst_port = 0;

  static Ah* from(ibv_ah* a) { return UROCE_CONTAINER_OF(a, Ah, ibah); }
};

// The UDP port a packet for `dlid` goes to (design §3): a LID below 0xC000 is
// a uroce process's private port; 0, and 0xC000 and up (a source-port hint
// that mlx5 and UCX put there), mean the host's RoCE port (UROCE_PORT, 4791),
// where every QP of the host is reachable by its number.
uint16_t roce_udp_port(uint16_t dlid);

// Checks `attr` against the context's port and GID table (EINVAL as rxe: port,
// missing GRH, GID index, a destination GID that is no unicast IP address or
// not of the source GID's IP version) and fills the resolved port.
[[nodiscard]] int resolve_ah(const Context& ctx, const ibv_ah_attr& attr, Ah* out);

// Whether `dgid` can be reached from the local GID `sgid_index` (RoCEv2: an
// address of the same IP version: IPv4-mapped, multicast groups included, or
// unicast IPv6); the check of resolve_ah and of a QP's address vector.
bool gid_pair_valid(const Context& ctx, uint8_t sgid_index, const ibv_gid& dgid);

// The 40-byte GRH area of a UD receive buffer for an IPv4 packet (roce-facts
// §5.3): 20 zero bytes, then the IPv4 header of the datagram as it arrived.
inline constexpr uint32_t kGrhSize = 40;
void build_ipv4_grh(uint32_t src_ip, uint32_t dst_ip, uint32_t udp_payload_len, uint8_t out[kGrhSize]);
// The same for an IPv6 packet: the 40-byte IPv6 header as it arrived (traffic
// class and flow label 0, hop limit 64: a UDP socket does not see them).
void build_ipv6_grh(const uint8_t src[16], const uint8_t dst[16], uint32_t udp_payload_len, uint8_t out[kGrhSize]);

// ibv_init_ah_from_wc: the AH attributes that answer a received UD message.
[[nodiscard]] int ah_attr_from_wc(const Context& ctx, uint8_t port, const ibv_wc& wc, const ibv_grh* grh,
                                  ibv_ah_attr* attr);

}  // namespace uroce::core
