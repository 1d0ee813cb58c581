// 24-bit packet sequence number arithmetic (roce-facts.md §4.1).
#pragma once

#include <cstdint>

namespace uroce::wire {

inline constexpr uint32_t kPsnMask = 0xFFFFFF;

constexpr uint32_t psn_add(uint32_t psn, uint32_t n) { return (psn + n) & kPsnMask; }

// Signed distance a - b in the ±2^23 window: > 0 means a is after b.
constexpr int32_t psn_diff(uint32_t a, uint32_t b) { return static_cast<int32_t>((a - b) << 8) >> 8; }

constexpr bool psn_before(uint32_t a, uint32_t b) { return psn_diff(a, b) < 0; }
constexpr bool psn_after(uint32_t a, uint32_t b) { return psn_diff(a, b) > 0; }

// PSNs (packets) a message of `length` bytes takes at path MTU `mtu`: a
// zero-length message is one packet.
constexpr uint32_t packets_for(uint32_t length, uint32_t mtu) { return length == 0 ? 1 : (length + mtu - 1) / mtu; }

}  // namespace uroce::wire
