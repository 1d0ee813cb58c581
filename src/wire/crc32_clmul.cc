// CRC-32 (the IEEE 802.3 polynomial, reflected, as zlib's crc32 and the ICRC
// use) folded with carry-less multiplication: Intel's "Fast CRC Computation
// for Generic Polynomials Using PCLMULQDQ Instruction", with the folding
// constants of that paper for the reflected polynomial 0xEDB88320 (the ones
// Linux's crc32-pclmul uses). About ten times zlib's table-driven speed on a
// 4 KiB packet; the ICRC of every packet sent and received goes through here.
#include <zlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "wire/icrc.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace uroce::wire {

namespace {

// Stores the part of `c` that falls in [from, to) of `p`.
inline void copy_part(uint8_t* p, size_t from, size_t to, const CopyIn& c) {
  size_t a = std::max(from, c.at), b = std::min(to, c.at + c.len);
  if (a < b) std::memcpy(p + a, c.src + (a - c.at), b - a);
}

uint32_t crc32_zlib(uint32_t crc, const void* data, size_t len) {
  return uint32_t(::crc32_z(crc, static_cast<const Bytef*>(data), len));
}

#if defined(__x86_64__)

#define UROCE_CLMUL __attribute__((target("pclmul,sse4.1")))

UROCE_CLMUL inline __m128i load16(const uint8_t* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); }

// x * k (both 64-bit halves, each by its own constant) + next.
UROCE_CLMUL inline __m128i fold(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

// The CRC of a 128-bit folding state: 128 -> 64 bits (appending 32 zero
// bits), 64 -> 32 with k5, then Barrett.
UROCE_CLMUL inline uint32_t reduce128(__m128i x) {
  const __m128i k4 = _mm_set_epi64x(0x0ccaa009e, 0);                 // x^(128-32) mod P, in the high half
  const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);                 // x^64 mod P
  const __m128i poly_mu = _mm_set_epi64x(0x1f7011641, 0x1db710641);  // mu, P (bit-reflected)
  const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
  x = _mm_xor_si128(_mm_clmulepi64_si128(k4, x, 0x01), _mm_srli_si128(x, 8));
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), k5, 0x00);
  x = _mm_xor_si128(_mm_srli_si128(x, 4), t);
  t = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), poly_mu, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly_mu, 0x00);
  x = _mm_xor_si128(x, t);
  return uint32_t(_mm_extract_epi32(x, 1));
}

// Folds `len` bytes (a multiple of 16, at least 16) into the CRC state `crc`
// (not inverted: the caller inverts before and after, as zlib does inside).
// It starts from `crc` and the first 64 bytes or, under 64, from the first 16
// in one lane: short inputs such as an ACK's ICRC input of 52 bytes, which
// zlib's byte loop took ~80 ns for (without VPCLMULQDQ, every packet's too).
UROCE_CLMUL uint32_t fold_clmul(uint32_t crc, const uint8_t* p, size_t len) {
  const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);  // x^(4*128-32), x^(4*128+32) mod P
  const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);  // x^(128-32), x^(128+32) mod P

  __m128i x;
  if (len < 64) {
    x = _mm_xor_si128(load16(p), _mm_cvtsi32_si128(int(crc)));
    p += 16;
    len -= 16;
  } else {
    __m128i x0 = _mm_xor_si128(load16(p), _mm_cvtsi32_si128(int(crc)));
    __m128i x1 = load16(p + 16), x2 = load16(p + 32), x3 = load16(p + 48);
    p += 64;
    len -= 64;
    for (; len >= 64; p += 64, len -= 64) {  // four 128-bit lanes at a time
      x0 = fold(x0, k1k2, load16(p));
      x1 = fold(x1, k1k2, load16(p + 16));
      x2 = fold(x2, k1k2, load16(p + 32));
      x3 = fold(x3, k1k2, load16(p + 48));
    }
    // Four lanes into one.
    x = fold(x0, k3k4, x1);
    x = fold(x, k3k4, x2);
    x = fold(x, k3k4, x3);
  }
  for (; len >= 16; p += 16, len -= 16) x = fold(x, k3k4, load16(p));  // the remaining 16-byte blocks

  return reduce128(x);
}

#define UROCE_VCLMUL __attribute__((target("avx512f,avx512bw,avx512vl,vpclmulqdq,pclmul,sse4.1")))

// Moves each 128-bit lane of `x` on by the distance its pair of constants in
// `k` stands for (a zero pair drops the lane) and XORs in `next`.
UROCE_VCLMUL inline __m512i fold512(__m512i x, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11), next,
                                   0x96);  // a ^ b ^ c
}

// Up to 64 bytes at `p`, the rest of the register zero: nothing past them is read.
UROCE_VCLMUL inline __m512i load_upto64(const uint8_t* p, size_t n) {
  return _mm512_maskz_loadu_epi8(__mmask64(n >= 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1), p);
}

// The constants that move a 128-bit lane on by d lanes (d * 128 bits):
// x^(128d+32) mod P in the low half, x^(128d-32) in the high; d = 0 (the lane
// taken as it is) and the lanes past the data are zero.
constexpr uint64_t kLaneMove[15][2] = {{0, 0},
                                       {0x1751997d0, 0x0ccaa009e},
                                       {0x0f1da05aa, 0x15a546366},
                                       {0x03db1ecdc, 0x174359406},
                                       {0x154442bd4, 0x1c6e41596},
                                       {0x1c7569e54, 0x0ae0b5394},
                                       {0x0df068dc2, 0x18cb44e58},
                                       {0x1ea89367e, 0x1d7cfc6ac},
                                       {0x1e88ef372, 0x14a7fe880},
                                       {0x1fdc60a7c, 0x03f41287a},
                                       {0x0e3543be0, 0x14b57d3f0},
                                       {0x1816ab61c, 0x10aae2566},
                                       {0x1821d8bc0, 0x12e958ac4},
                                       {0x1b35adb0e, 0x1e7146aac},
                                       {0x19159bb02, 0x125f17dfc}};

// Four consecutive blocks' constants, the first `d` blocks from the last
// (lanes at or past the last: zero).
UROCE_VCLMUL inline __m512i lane_moves_from(int d) {
  auto at = [](int k) { return kLaneMove[k > 0 ? k : 0]; };
  return _mm512_set_epi64(at(d - 3)[1], at(d - 3)[0], at(d - 2)[1], at(d - 2)[0], at(d - 1)[1], at(d - 1)[0], at(d)[1],
                          at(d)[0]);
}

// The four 128-bit lanes of `w` XORed into one. (The masked forms: GCC 12
// warns that the plain ones' undefined source is used uninitialized.)
UROCE_VCLMUL inline __m128i xor_lanes(__m512i w) {
  w = _mm512_xor_si512(w, _mm512_mask_shuffle_i64x2(w, 0xFF, w, w, 0x4E));  // lanes 0^2, 1^3
  w = _mm512_xor_si512(w, _mm512_mask_shuffle_i64x2(w, 0xFF, w, w, 0xB1));  // and those two
  return _mm512_maskz_extracti32x4_epi32(0xF, w, 0);
}

// The CRC of `first` (four 128-bit lanes: a folding state, or a head with the
// CRC XORed in) followed by the `len` bytes at `p` (a multiple of 16, under
// 192): every block moved straight onto the last with its own constants
// (independent multiplies), the last taken as it is, the four lanes XORed
// into one and reduced once. It ends the wide folder and is the whole of a
// short packet's ICRC. Inlined into both: called, the wide folder's finish
// took 3 ns more a packet (70 against 67 for 4080 bytes).
[[gnu::always_inline]] UROCE_VCLMUL inline uint32_t fold_onto_last(__m512i first, const uint8_t* p, size_t len) {
  int blocks = int(len / 16);  // after first's four
  int last = 3 + blocks;       // the last block's index
  __m512i raw = blocks == 0 ? _mm512_maskz_mov_epi64(0xC0, first) : _mm512_setzero_si512();
  __m512i w = fold512(first, lane_moves_from(last), raw);
  for (int from = 0; from < blocks * 16; from += 64) {  // masked loads: nothing past the data is read
    __m512i d = load_upto64(p + from, len - size_t(from));
    int at = 4 + from / 16;  // index of d's first block
    if (last - at < 4) w = _mm512_xor_si512(w, _mm512_maskz_mov_epi64(__mmask8(3u << (2 * (last - at))), d));
    w = fold512(d, lane_moves_from(last - at), w);
  }
  return reduce128(xor_lanes(w));
}

// The same folding with 512-bit registers (VPCLMULQDQ): sixteen 128-bit lanes,
// 256 bytes a step, then one register 64 bytes a step. The state starts as
// z0..z3 (the first 256 bytes, the CRC already XORed in); `p`, `len` (a
// multiple of 16) are what follows. The finish moves every lane straight to
// the last one's place with its own constants (independent multiplies)
// rather than folding them one after the other (and through memory: the
// state was stored and read back as four 128-bit lanes). Measured on CRCs
// of 4080 bytes (a middle packet's), each waiting for the previous one:
// 118 -> 67 ns; 4032 bytes, which end on a 256-byte step, 69 -> 68.
UROCE_VCLMUL uint32_t fold_vclmul_from(__m512i z0, __m512i z1, __m512i z2, __m512i z3, const uint8_t* p, size_t len) {
  // x^(2048-32), x^(2048+32) and x^(512-32), x^(512+32) mod P in every lane.
  const __m512i k2048 = _mm512_set_epi64(0x1322d1430, 0x11542778a, 0x1322d1430, 0x11542778a, 0x1322d1430, 0x11542778a,
                                         0x1322d1430, 0x11542778a);
  const __m512i k512 = _mm512_set_epi64(0x1c6e41596, 0x154442bd4, 0x1c6e41596, 0x154442bd4, 0x1c6e41596, 0x154442bd4,
                                        0x1c6e41596, 0x154442bd4);
  // x^(1024-32), x^(1024+32) and x^(1536-32), x^(1536+32): 128 and 192 bytes on.
  const __m512i k1024 = _mm512_set_epi64(0x14a7fe880, 0x1e88ef372, 0x14a7fe880, 0x1e88ef372, 0x14a7fe880, 0x1e88ef372,
                                         0x14a7fe880, 0x1e88ef372);
  const __m512i k1536 = _mm512_set_epi64(0x12e958ac4, 0x1821d8bc0, 0x12e958ac4, 0x1821d8bc0, 0x12e958ac4, 0x1821d8bc0,
                                         0x12e958ac4, 0x1821d8bc0);
  for (; len >= 256; p += 256, len -= 256) {
    z0 = fold512(z0, k2048, _mm512_loadu_si512(p));
    z1 = fold512(z1, k2048, _mm512_loadu_si512(p + 64));
    z2 = fold512(z2, k2048, _mm512_loadu_si512(p + 128));
    z3 = fold512(z3, k2048, _mm512_loadu_si512(p + 192));
  }
  // 256 bytes of state into 64: z0, z1, z2 moved 192, 128, 64 bytes on, onto z3.
  __m512i a = fold512(z0, k1536, z3);
  __m512i b = fold512(z1, k1024, _mm512_setzero_si512());
  __m512i z = fold512(z2, k512, _mm512_xor_si512(a, b));
  // The tail of a packet (up to 255 bytes) 64 bytes a step rather than 16.
  for (; len >= 64; p += 64, len -= 64) z = fold512(z, k512, _mm512_loadu_si512(p));
  return fold_onto_last(z, p, len);  // the last 0-3 blocks
}

UROCE_VCLMUL inline __m512i load_with_crc(const uint8_t* p, uint32_t crc) {
  return _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_zextsi128_si512(_mm_cvtsi32_si128(int(crc))));
}

// `len`: a multiple of 16, at least 256.
UROCE_VCLMUL uint32_t fold_vclmul(uint32_t crc, const uint8_t* p, size_t len) {
  return fold_vclmul_from(load_with_crc(p, crc), _mm512_loadu_si512(p + 64), _mm512_loadu_si512(p + 128),
                          _mm512_loadu_si512(p + 192), p + 256, len - 256);
}

// The 64 bytes of `head` followed by `p`: `len` a multiple of 16, at least 192.
UROCE_VCLMUL uint32_t fold_vclmul_head(uint32_t crc, const uint8_t* head, const uint8_t* p, size_t len) {
  return fold_vclmul_from(load_with_crc(head, crc), _mm512_loadu_si512(p), _mm512_loadu_si512(p + 64),
                          _mm512_loadu_si512(p + 128), p + 192, len - 192);
}

// The 64 bytes of `head` followed by `p`, `len` (a multiple of 16) under 192:
// a short packet's ICRC (a ping-pong's, an ACK's) in one pass and one
// reduction, where head and packet were two CRCs of serial folds.
UROCE_VCLMUL uint32_t fold_vclmul_head_short(uint32_t crc, const uint8_t* head, const uint8_t* p, size_t len) {
  return fold_onto_last(load_with_crc(head, crc), p, len);
}

// fold_vclmul_head over `p` while `c` is stored into it: a 256-byte step that
// lies inside `c` loads from c.src and stores what it folds; other bytes are
// stored before they are loaded. `len`: a multiple of 16, at least 448.
UROCE_VCLMUL uint32_t fold_vclmul_head_copying(uint32_t crc, const uint8_t* head, uint8_t* p, size_t len,
                                               const CopyIn& c) {
  const __m512i k2048 = _mm512_set_epi64(0x1322d1430, 0x11542778a, 0x1322d1430, 0x11542778a, 0x1322d1430, 0x11542778a,
                                         0x1322d1430, 0x11542778a);
  copy_part(p, 0, 192, c);
  __m512i z0 = load_with_crc(head, crc), z1 = _mm512_loadu_si512(p), z2 = _mm512_loadu_si512(p + 64),
          z3 = _mm512_loadu_si512(p + 128);
  size_t off = 192;
  for (; off + 256 <= len; off += 256) {
    bool inside = off >= c.at && off + 256 <= c.at + c.len;
    if (!inside) copy_part(p, off, off + 256, c);
    const uint8_t* from = inside ? c.src + (off - c.at) : p + off;
    // The source's 256 bytes kCopyAhead on, where the caller allows
    // (CopyIn::ahead). Written out here: in a function of its own, which
    // GCC finds free of side effects, the prefetches were dropped.
    if (size_t next = off - c.at + kCopyAhead; inside && next + 256 <= c.len + c.ahead) {
      for (size_t line = 0; line < 256; line += 64) __builtin_prefetch(c.src + next + line, 0, 3);
    }
    __m512i d0 = _mm512_loadu_si512(from), d1 = _mm512_loadu_si512(from + 64), d2 = _mm512_loadu_si512(from + 128),
            d3 = _mm512_loadu_si512(from + 192);
    if (inside) {
      _mm512_storeu_si512(p + off, d0);
      _mm512_storeu_si512(p + off + 64, d1);
      _mm512_storeu_si512(p + off + 128, d2);
      _mm512_storeu_si512(p + off + 192, d3);
    }
    z0 = fold512(z0, k2048, d0);
    z1 = fold512(z1, k2048, d1);
    z2 = fold512(z2, k2048, d2);
    z3 = fold512(z3, k2048, d3);
  }
  copy_part(p, off, len, c);
  return fold_vclmul_from(z0, z1, z2, z3, p + off, len - off);
}

#define UROCE_YCLMUL __attribute__((target("avx2,vpclmulqdq,pclmul,sse4.1")))

UROCE_YCLMUL inline __m256i load32(const uint8_t* q) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)); }

// fold with 256-bit registers: each 128-bit lane by its own pair of constants.
UROCE_YCLMUL inline __m256i fold256(__m256i x, __m256i k, __m256i next) {
  return _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00), _mm256_clmulepi64_epi128(x, k, 0x11)),
                          next);
}

// The constants that move a register's low lane on by `low` lanes and its
// high lane by `high` (kLaneMove; 0: the lane dropped).
UROCE_YCLMUL inline __m256i lane_moves(int high, int low) {
  return _mm256_set_epi64x(int64_t(kLaneMove[high][1]), int64_t(kLaneMove[high][0]), int64_t(kLaneMove[low][1]),
                           int64_t(kLaneMove[low][0]));
}

// The folding with 256-bit registers (VPCLMULQDQ without AVX-512: AMD Zen 3
// and later, Intel's client cores): sixteen 128-bit lanes, 256 bytes a step
// (with eight, 128 bytes a step, the folds waited for each other: 255 ns
// below), then eight, then every lane moved straight onto the last
// (independent multiplies) and the rest 16 bytes a step. CRCs of 4080 bytes
// (a middle packet's) on an AMD EPYC VM, each waiting for the previous one:
// fold_clmul 397 ns, this 190-203. `len`: a multiple of 16, at least 128.
UROCE_YCLMUL uint32_t fold_yclmul(uint32_t crc, const uint8_t* p, size_t len) {
  const __m256i k1024 = lane_moves(8, 8);  // 128 bytes on
  __m256i y0 = _mm256_xor_si256(load32(p), _mm256_zextsi128_si256(_mm_cvtsi32_si128(int(crc))));
  __m256i y1 = load32(p + 32), y2 = load32(p + 64), y3 = load32(p + 96);
  p += 128;
  len -= 128;
  if (len >= 256) {  // y4..y7: the next 128 bytes
    const __m256i k2048 = _mm256_set_epi64x(0x1322d1430, 0x11542778a, 0x1322d1430, 0x11542778a);  // 256 bytes on
    __m256i y4 = load32(p), y5 = load32(p + 32), y6 = load32(p + 64), y7 = load32(p + 96);
    p += 128;
    len -= 128;
    for (; len >= 256; p += 256, len -= 256) {
      y0 = fold256(y0, k2048, load32(p));
      y1 = fold256(y1, k2048, load32(p + 32));
      y2 = fold256(y2, k2048, load32(p + 64));
      y3 = fold256(y3, k2048, load32(p + 96));
      y4 = fold256(y4, k2048, load32(p + 128));
      y5 = fold256(y5, k2048, load32(p + 160));
      y6 = fold256(y6, k2048, load32(p + 192));
      y7 = fold256(y7, k2048, load32(p + 224));
    }
    y0 = fold256(y0, k1024, y4);  // y0..y3 moved onto y4..y7
    y1 = fold256(y1, k1024, y5);
    y2 = fold256(y2, k1024, y6);
    y3 = fold256(y3, k1024, y7);
  }
  for (; len >= 128; p += 128, len -= 128) {
    y0 = fold256(y0, k1024, load32(p));
    y1 = fold256(y1, k1024, load32(p + 32));
    y2 = fold256(y2, k1024, load32(p + 64));
    y3 = fold256(y3, k1024, load32(p + 96));
  }
  // Lanes 0..7 (y0's low lane first) moved 7..0 lanes on; the last as it is.
  __m256i acc = fold256(y3, lane_moves(0, 1), _mm256_blend_epi32(_mm256_setzero_si256(), y3, 0xF0));
  acc = fold256(y2, lane_moves(2, 3), acc);
  acc = fold256(y1, lane_moves(4, 5), acc);
  acc = fold256(y0, lane_moves(6, 7), acc);
  __m128i x = _mm_xor_si128(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
  const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);  // x^(128-32), x^(128+32) mod P
  for (; len >= 16; p += 16, len -= 16) x = fold(x, k3k4, load16(p));
  return reduce128(x);
}

bool have_yclmul() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq") &&
                          __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return yes;
}

bool have_vclmul() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq");
  return yes;
}

bool have_clmul() {
  static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return yes;
}

// crc32 through one folder: the input's whole 16-byte blocks when there are
// `min` bytes of them (the folder's least), the rest by zlib.
template <uint32_t (*Fold)(uint32_t, const uint8_t*, size_t), size_t min>
uint32_t crc32_by(uint32_t crc, const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t body = len & ~size_t(15);
  if (body < min) return crc32_zlib(crc, data, len);
  crc = ~Fold(~crc, p, body);
  return len == body ? crc : crc32_zlib(crc, p + body, len - body);
}

#endif

}  // namespace

uint32_t crc32(uint32_t crc, const void* data, size_t len) {
#if defined(__x86_64__)
  // The widest folder from 256 bytes on, the 128-bit one below.
  if (len >= 256 && have_vclmul()) return crc32_by<fold_vclmul, 256>(crc, data, len);
  if (len >= 256 && have_yclmul()) return crc32_by<fold_yclmul, 128>(crc, data, len);
  if (have_clmul()) return crc32_by<fold_clmul, 16>(crc, data, len);
#endif
  return crc32_zlib(crc, data, len);
}

uint32_t crc32_after_head(uint32_t crc, const uint8_t (&head)[64], const void* data, size_t len) {
#if defined(__x86_64__)
  if (have_vclmul()) {
    const auto* p = static_cast<const uint8_t*>(data);
    size_t body = len & ~size_t(15);
    crc = ~(len >= 192 ? fold_vclmul_head(~crc, head, p, body) : fold_vclmul_head_short(~crc, head, p, body));
    return len == body ? crc : crc32_zlib(crc, p + body, len - body);
  }
#endif
  return crc32(crc32(crc, head, sizeof head), data, len);
}

uint32_t crc32_after_head_copying(uint32_t crc, const uint8_t (&head)[64], uint8_t* data, size_t len,
                                  const CopyIn& copy) {
#if defined(__x86_64__)
  size_t body = len & ~size_t(15);
  if (body >= 448 && have_vclmul()) {
    crc = ~fold_vclmul_head_copying(~crc, head, data, body, copy);
    copy_part(data, body, len, copy);
    return len == body ? crc : crc32_zlib(crc, data + body, len - body);
  }
#endif
  copy_part(data, 0, len, copy);
  return crc32_after_head(crc, head, data, len);
}

uint32_t crc32_portable(uint32_t crc, const void* data, size_t len) { return crc32_zlib(crc, data, len); }

std::vector<Crc32Folder> crc32_folders() {
  std::vector<Crc32Folder> v;
#if defined(__x86_64__)
  if (have_clmul()) v.push_back({"clmul", crc32_by<fold_clmul, 16>});
  if (have_yclmul()) v.push_back({"yclmul", crc32_by<fold_yclmul, 128>});
  if (have_vclmul()) v.push_back({"vclmul", crc32_by<fold_vclmul, 256>});
#endif
  return v;
}

}  // namespace uroce::wire
