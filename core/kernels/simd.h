// Vec16: sixteen float32 lanes, the unit every CPU kernel computes in.
//
// Two implementations with identical results: AVX-512 intrinsics when the translation unit is
// compiled with -mavx512f, and a portable one that performs the same IEEE-754 operation on each
// lane in the same order (fused multiply-add via std::fma, the same reduction tree, the same exp
// polynomial). Kernels written on Vec16 are therefore bitwise reproducible across both builds.
// Translation units including this header must be compiled with -ffp-contract=off.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#else
#include "util/half.h"
#endif

namespace vericache::simd {

constexpr int kLanes = 16;

#if defined(__AVX512F__)

struct Vec16 {
  __m512 v;
};

inline Vec16 zero() { return {_mm512_setzero_ps()}; }
inline Vec16 set1(float x) { return {_mm512_set1_ps(x)}; }
inline Vec16 load(const float* p) { return {_mm512_loadu_ps(p)}; }
// Lanes >= n read as 0 and touch no memory.
inline Vec16 load_partial(const float* p, int n) {
  return {_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p)};
}
inline void store(float* p, Vec16 a) { _mm512_storeu_ps(p, a.v); }
inline void store_partial(float* p, Vec16 a, int n) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << n) - 1u), a.v);
}
inline Vec16 add(Vec16 a, Vec16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Vec16 sub(Vec16 a, Vec16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Vec16 mul(Vec16 a, Vec16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vec16 div(Vec16 a, Vec16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline Vec16 max(Vec16 a, Vec16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline Vec16 min(Vec16 a, Vec16 b) { return {_mm512_min_ps(a.v, b.v)}; }
// a * b + c, rounded once.
inline Vec16 fma(Vec16 a, Vec16 b, Vec16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline Vec16 round_nearest(Vec16 a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
// a * 2^n for integral n.
inline Vec16 scale2(Vec16 a, Vec16 n) { return {_mm512_scalef_ps(a.v, n.v)}; }

// ((lanes i + i+8) then (i + i+4) then (i + i+2) then (0 + 1)).
inline float reduce_add(Vec16 a) {
  const __m256 lo = _mm512_castps512_ps256(a.v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1));
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

inline float reduce_max(Vec16 a) { return _mm512_reduce_max_ps(a.v); }

// IEEE binary16 bits -> float, exact (F16C).
inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
// 16 IEEE binary16 values -> floats, exact.
inline Vec16 load_halves(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}

// 16 bytes as floats: the low (shift 0) or high (shift 4) nibble of each, or each signed byte.
inline Vec16 nibbles(const uint8_t* p, int shift) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(b, shift), _mm512_set1_epi32(0x0f)))};
}
inline Vec16 signed_bytes(const int8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
// table[(p[i] >> shift) & 15] for 16 bytes: a 4-bit code looked up in a 16-entry table.
inline Vec16 lookup_nibbles(Vec16 table, const uint8_t* p, int shift) {
  __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  if (shift != 0) idx = _mm512_srli_epi32(idx, shift);
  return {_mm512_permutexvar_ps(idx, table.v)};  // uses index bits 3..0 only
}
// Lane i: a 5-bit code looked up in the 32-entry table (lo = entries 0..15, hi = 16..31), the code
// being ((p[i] >> shift) & 15) | (bit i of `high_bits`) << 4 (a Q5_0 value).
inline Vec16 lookup_five_bits(Vec16 lo, Vec16 hi, const uint8_t* p, int shift, uint32_t high_bits) {
  __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  idx = _mm512_and_si512(_mm512_srli_epi32(idx, shift), _mm512_set1_epi32(0x0f));
  idx = _mm512_mask_or_epi32(idx, static_cast<__mmask16>(high_bits & 0xffffu), idx, _mm512_set1_epi32(16));
  return {_mm512_permutex2var_ps(lo.v, idx, hi.v)};
}
inline Vec16 iota() { return {_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)}; }

// 16 bytes as floats (8-bit codes).
inline Vec16 bytes16(const uint8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}

// Lane i = table[code i] for 16 consecutive B-bit codes (B = 2, 3 or 4) packed LSB first from p
// (2B bytes read). `table` repeats every 2^B entries (code_table): the lookup reads a 4-bit window
// whose low B bits are the code.
template <int B>
inline Vec16 lookup_codes(Vec16 table, const uint8_t* p) {
  static_assert(B == 2 || B == 3 || B == 4);
  uint64_t word = 0;
  std::memcpy(&word, p, 2 * B);
  __m512i windows;
  if constexpr (B == 4) {
    // Byte 2j = byte j (low nibble), byte 2j + 1 = byte j >> 4 in its low nibble.
    const __m128i x = _mm_cvtsi64_si128(static_cast<long long>(word));
    windows = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(x, _mm_srli_epi16(x, 4)));
  } else if constexpr (B == 2) {
    // Lane i: byte i / 4 shifted right by 2 (i % 4).
    const __m128i x = _mm_cvtsi32_si128(static_cast<int>(word));
    const __m128i spread = _mm_shuffle_epi8(x, _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    windows = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(spread),
                                _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6));
  } else {
    const __m512i w = _mm512_set1_epi64(static_cast<long long>(word));
    const __m512i lo = _mm512_srlv_epi64(w, _mm512_setr_epi64(0, 3, 6, 9, 12, 15, 18, 21));
    const __m512i hi = _mm512_srlv_epi64(w, _mm512_setr_epi64(24, 27, 30, 33, 36, 39, 42, 45));
    windows = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(lo)), _mm512_cvtepi64_epi32(hi), 1);
  }
  return {_mm512_permutexvar_ps(windows, table.v)};  // uses index bits 3..0 only
}

#else

struct Vec16 {
  float v[kLanes];
};

template <typename F>
inline Vec16 map(F f) {
  Vec16 r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = f(i);
  return r;
}

inline Vec16 zero() { return map([](int) { return 0.0f; }); }
inline Vec16 set1(float x) { return map([x](int) { return x; }); }
inline Vec16 load(const float* p) { return map([p](int i) { return p[i]; }); }
inline Vec16 load_partial(const float* p, int n) { return map([p, n](int i) { return i < n ? p[i] : 0.0f; }); }
inline void store(float* p, Vec16 a) {
  for (int i = 0; i < kLanes; ++i) p[i] = a.v[i];
}
inline void store_partial(float* p, Vec16 a, int n) {
  for (int i = 0; i < n; ++i) p[i] = a.v[i];
}
inline Vec16 add(Vec16 a, Vec16 b) { return map([&](int i) { return a.v[i] + b.v[i]; }); }
inline Vec16 sub(Vec16 a, Vec16 b) { return map([&](int i) { return a.v[i] - b.v[i]; }); }
inline Vec16 mul(Vec16 a, Vec16 b) { return map([&](int i) { return a.v[i] * b.v[i]; }); }
inline Vec16 div(Vec16 a, Vec16 b) { return map([&](int i) { return a.v[i] / b.v[i]; }); }
// Same NaN rule as vmaxps / vminps: the second operand when either is NaN or both are zero.
inline Vec16 max(Vec16 a, Vec16 b) { return map([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; }); }
inline Vec16 min(Vec16 a, Vec16 b) { return map([&](int i) { return a.v[i] < b.v[i] ? a.v[i] : b.v[i]; }); }
inline Vec16 fma(Vec16 a, Vec16 b, Vec16 c) { return map([&](int i) { return std::fma(a.v[i], b.v[i], c.v[i]); }); }
inline Vec16 round_nearest(Vec16 a) { return map([&](int i) { return std::nearbyint(a.v[i]); }); }
inline Vec16 scale2(Vec16 a, Vec16 n) {
  return map([&](int i) { return std::ldexp(a.v[i], static_cast<int>(n.v[i])); });
}

inline float reduce_add(Vec16 a) {
  float s8[8], s4[4], s2[2];
  for (int i = 0; i < 8; ++i) s8[i] = a.v[i] + a.v[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  for (int i = 0; i < 2; ++i) s2[i] = s4[i] + s4[i + 2];
  return s2[0] + s2[1];
}

inline float reduce_max(Vec16 a) {
  float m = a.v[0];
  for (int i = 1; i < kLanes; ++i) m = a.v[i] > m ? a.v[i] : m;
  return m;
}

inline float half_to_float(uint16_t h) { return fp16_to_fp32(h); }
inline Vec16 load_halves(const uint16_t* p) { return map([p](int i) { return fp16_to_fp32(p[i]); }); }

inline Vec16 nibbles(const uint8_t* p, int shift) {
  return map([&](int i) { return static_cast<float>((p[i] >> shift) & 0x0f); });
}
inline Vec16 signed_bytes(const int8_t* p) { return map([&](int i) { return static_cast<float>(p[i]); }); }
inline Vec16 lookup_nibbles(Vec16 table, const uint8_t* p, int shift) {
  return map([&](int i) { return table.v[(p[i] >> shift) & 0x0f]; });
}
inline Vec16 lookup_five_bits(Vec16 lo, Vec16 hi, const uint8_t* p, int shift, uint32_t high_bits) {
  return map([&](int i) {
    const int code = ((p[i] >> shift) & 0x0f) | static_cast<int>(((high_bits >> i) & 1u) << 4);
    return code < 16 ? lo.v[code] : hi.v[code - 16];
  });
}
inline Vec16 iota() { return map([](int i) { return static_cast<float>(i); }); }

inline Vec16 bytes16(const uint8_t* p) { return map([p](int i) { return static_cast<float>(p[i]); }); }

template <int B>
inline Vec16 lookup_codes(Vec16 table, const uint8_t* p) {
  static_assert(B == 2 || B == 3 || B == 4);
  uint64_t word = 0;
  std::memcpy(&word, p, 2 * B);
  return map([&](int i) { return table.v[(word >> (i * B)) & ((1u << B) - 1)]; });
}

#endif

// The 16-entry table lookup_codes reads for B-bit codes of one min-max group: entry q holds
// (q mod 2^B) * scale + minimum, the product rounded before the sum (never fused).
template <int B>
inline Vec16 code_table(Vec16 scale, Vec16 minimum) {
  static_assert(B == 2 || B == 3 || B == 4);
  static constexpr float kCodes[3][kLanes] = {{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3},
                                              {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7},
                                              {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}};
  return add(mul(load(kCodes[B - 2]), scale), minimum);
}

// e^x for each lane, within 2 ulp over the float range: Cody-Waite reduction by ln 2, a degree-6
// polynomial (Cephes expf coefficients), and an exact scale by 2^n. Underflows to 0, overflows to inf.
inline Vec16 exp(Vec16 x) {
  x = min(max(x, set1(-104.0f)), set1(89.0f));
  const Vec16 n = round_nearest(mul(x, set1(1.44269504088896341f)));
  Vec16 r = fma(n, set1(-0.693359375f), x);
  r = fma(n, set1(2.12194440e-4f), r);
  Vec16 p = set1(1.9875691500e-4f);
  p = fma(p, r, set1(1.3981999507e-3f));
  p = fma(p, r, set1(8.3334519073e-3f));
  p = fma(p, r, set1(4.1665795894e-2f));
  p = fma(p, r, set1(1.6666665459e-1f));
  p = fma(p, r, set1(5.0000001201e-1f));
  const Vec16 y = add(fma(p, mul(r, r), r), set1(1.0f));
  return scale2(y, n);
}

}  // namespace vericache::simd
