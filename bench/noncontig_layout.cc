#include "noncontig_layout.h"

#include <algorithm>
#include <cstring>

namespace noncontig {

std::string_view family_name(Family f) {
  switch (f) {
    case Family::kWrite:
      return "write";
    case Family::kRead:
      return "read";
    case Family::kSend:
      return "send";
  }
  return "?";
}

std::string_view method_name(Method m) {
  switch (m) {
    case Method::kSgl:
      return "sgl";
    case Method::kPack:
      return "pack";
    case Method::kMulti:
      return "multi";
  }
  return "?";
}

uint32_t throughput_window(uint32_t n, uint32_t size) {
  size_t w = std::min<size_t>({kMaxWindow, kMaxBatchWrs / n, kBatchBytes / (size_t(n) * size)});
  return uint32_t(std::max<size_t>(w, 1));
}

namespace {

uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t word_at(uint64_t seed, uint32_t i, size_t word) { return mix(seed ^ (uint64_t(i) << 40) ^ word); }

}  // namespace

void fill_buffer(uint8_t* p, uint64_t seed, uint32_t i, uint32_t size) {
  for (size_t w = 0; w < size / 8; ++w) {
    uint64_t v = word_at(seed, i, w);
    std::memcpy(p + 8 * w, &v, 8);
  }
}

size_t check_buffer(const uint8_t* p, uint64_t seed, uint32_t i, uint32_t size) {
  size_t bad = 0;
  for (size_t w = 0; w < size / 8; ++w) {
    uint64_t v = word_at(seed, i, w);
    if (std::memcmp(p + 8 * w, &v, 8) == 0) continue;
    for (int b = 0; b < 8; ++b) bad += p[8 * w + b] != uint8_t(v >> (8 * b));
  }
  return bad;
}

void pack(uint8_t* contig, const uint8_t* scattered, const Shape& s, uint32_t scattered_slot) {
  for (uint32_t i = 0; i < s.n; ++i)
    std::memcpy(contig + size_t(i) * s.size, scattered + scattered_offset(s, scattered_slot, i), s.size);
}

void unpack(uint8_t* scattered, const uint8_t* contig, const Shape& s, uint32_t scattered_slot) {
  for (uint32_t i = 0; i < s.n; ++i)
    std::memcpy(scattered + scattered_offset(s, scattered_slot, i), contig + size_t(i) * s.size, s.size);
}

}  // namespace noncontig
