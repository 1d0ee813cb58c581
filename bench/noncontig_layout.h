// noncontig: what a transfer is (family, method, N buffers of S bytes), where its bytes live,
// and the pattern that fills and checks them. Shared by the client and the server.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace noncontig {

// Families of the study: one-sided WRITE (receiver notified by WRITE_WITH_IMM), one-sided READ
// (the reader scatters locally), two-sided SEND into a posted RECV.
enum class Family : uint32_t { kWrite, kRead, kSend };
// How the N buffers travel: one WR with an N-entry SGL, a CPU pack into one buffer (and the
// CPU unpack where the destination is N buffers), or N single-SGE WRs posted as one chain.
enum class Method : uint32_t { kSgl, kPack, kMulti };

inline constexpr uint32_t kMaxN = 32;                    // buffers per transfer (clamp)
inline constexpr uint32_t kMaxSize = 1u << 20;           // S, bytes
inline constexpr uint32_t kMinSize = 8;                  // S, bytes (a multiple of 8)
inline constexpr size_t kBatchBytes = size_t(32) << 20;  // payload of one batch at most
inline constexpr uint32_t kMaxWindow = 4096;             // transfers in flight (a batch)
inline constexpr uint32_t kMaxBatchWrs = 16384;          // WRs of one batch (multi: N a transfer)
inline constexpr uint32_t kGap = 64;                     // untouched bytes between buffers

std::string_view family_name(Family f);
std::string_view method_name(Method m);

// One measured point. window = transfers posted back to back before the receiver's reply.
struct Shape {
  uint32_t n;
  uint32_t size;
  uint32_t window;
};

// The throughput window of a shape: bounded by kMaxWindow, kMaxBatchWrs and kBatchBytes.
uint32_t throughput_window(uint32_t n, uint32_t size);

// Buffers of a "scattered" region: `window` slots of n buffers, each kGap bytes beyond the
// previous one's 64-byte-aligned end (never adjacent).
inline size_t stride_of(uint32_t size) { return ((size_t(size) + 63) & ~size_t(63)) + kGap; }
inline size_t scattered_offset(const Shape& s, uint32_t slot, uint32_t i) {
  return (size_t(slot) * s.n + i) * stride_of(s.size);
}
// A "contiguous" region: `window` slots of n * size bytes.
inline size_t contig_offset(const Shape& s, uint32_t slot) { return size_t(slot) * s.n * s.size; }

// Region sizes that hold every shape the limits above allow.
inline constexpr size_t kContigBytes = kBatchBytes;
inline constexpr size_t kScatteredBytes = kBatchBytes + size_t(kMaxBatchWrs) * 128;

// The payload pattern: byte k of buffer i of a transfer, for a seed (one per point).
void fill_buffer(uint8_t* p, uint64_t seed, uint32_t i, uint32_t size);
// Returns the number of bytes of p that differ from the pattern.
size_t check_buffer(const uint8_t* p, uint64_t seed, uint32_t i, uint32_t size);

// The pack and the unpack: n buffers of a scattered slot <-> one contiguous slot.
void pack(uint8_t* contig, const uint8_t* scattered, const Shape& s, uint32_t scattered_slot);
void unpack(uint8_t* scattered, const uint8_t* contig, const Shape& s, uint32_t scattered_slot);

}  // namespace noncontig
