// Device capabilities uroce reports and enforces (ibv_query_device).
#pragma once

#include <cstdint>

namespace uroce::core {

inline constexpr uint32_t kMaxQp = 1 << 16;
inline constexpr uint32_t kMaxQpWr = 1 << 15;
inline constexpr uint32_t kMaxSge = 32;
inline constexpr uint32_t kMaxInlineData = 512;
inline constexpr uint32_t kMaxCq = 1 << 16;
inline constexpr uint32_t kMaxCqe = (1 << 20) - 1;
inline constexpr uint32_t kMaxMr = 1 << 20;
inline constexpr uint64_t kMaxMrSize = uint64_t(1) << 40;
inline constexpr uint32_t kMaxPd = 1 << 16;
inline constexpr uint32_t kMaxRdAtomic = 128;  // as rxe: max_qp_rd_atom / max_qp_init_rd_atom
inline constexpr uint32_t kMaxSrq = 1 << 14;
inline constexpr uint32_t kMaxSrqWr = 1 << 15;
inline constexpr uint32_t kMaxSrqSge = 32;
inline constexpr uint32_t kMaxAh = 1 << 16;
inline constexpr uint32_t kMaxMsgSize = 1u << 31;
inline constexpr uint32_t kVendorId = 0xFFFFFF;    // no IEEE OUI: a software device
inline constexpr uint32_t kVendorPartId = 0x5552;  // "UR"
inline constexpr uint32_t kHwVersion = 1;

}  // namespace uroce::core
