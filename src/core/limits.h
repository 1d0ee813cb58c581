// Device capabilities uroce reports and enforces (ibv_query_device).
//
// Object counts are per context and enforced at creation (ENOMEM beyond, as a
// device whose resources are exhausted). They are chosen so that a machine
// can hold them: a CQ stores 64-byte entries, so max_cq CQs of max_cqe
// entries are 2 GiB at worst; see docs/architecture.md, "Decisions".
#pragma once

#include <cstdint>

namespace uroce::core {

inline constexpr uint32_t kMaxQp = 4096;
inline constexpr uint32_t kMaxQpWr = 1 << 15;
inline constexpr uint32_t kMaxSge = 32;
inline constexpr uint32_t kMaxInlineData = 512;
inline constexpr uint32_t kMaxCq = 1024;
inline constexpr uint32_t kMaxCqe = (1 << 22) - 1;  // as mlx5 (libfabric rxm asks for ~200k)
inline constexpr uint32_t kMaxMr = 16384;
inline constexpr uint32_t kMaxMw = 16384;  // windows share the MR key table
inline constexpr uint64_t kMaxMrSize = uint64_t(1) << 40;
// Device memory per context (ibv_device_attr_ex.max_dm_size; mlx5 has 128 KiB).
inline constexpr uint64_t kMaxDmSize = 256 * 1024;
inline constexpr uint32_t kMaxPd = 4096;
inline constexpr uint32_t kMaxRdAtomic = 128;  // as rxe: max_qp_rd_atom / max_qp_init_rd_atom
// The CA's ACK delay bound, 4.096 us * 2^15 (rxe's value; uroce acknowledges
// at the end of each receive burst, far sooner): ibv_query_device's
// local_ca_ack_delay and the CM REP's target ACK delay.
inline constexpr uint8_t kLocalCaAckDelay = 15;
inline constexpr uint32_t kMaxSrq = 1024;
inline constexpr uint32_t kMaxSrqWr = 1 << 15;
inline constexpr uint32_t kMaxSrqSge = 32;
inline constexpr uint32_t kMaxAh = 16384;
// UD multicast: QPs per group (rxe's 56). Groups per context: the kernel's
// per-socket limit of IP multicast memberships (net.ipv4.igmp_max_memberships).
inline constexpr uint32_t kMaxMcastQpAttach = 56;
uint32_t max_mcast_groups();
// Slots of port 1's GID table (ibv_query_port's gid_tbl_len; mlx5 has 256): the host's
// addresses fill the first ones, the rest are empty, as on a NIC (ibv_query_gid: a zero
// GID; ibv_query_gid_ex: ENODATA). More addresses than that make the table longer.
inline constexpr uint32_t kGidTableLen = 256;
inline constexpr uint32_t kMaxMsgSize = 1u << 31;
inline constexpr uint32_t kVendorId = 0xFFFFFF;    // no IEEE OUI: a software device
inline constexpr uint32_t kVendorPartId = 0x5552;  // "UR"
inline constexpr uint32_t kHwVersion = 1;

}  // namespace uroce::core
