// bfloat16 products accumulated in float32: the arithmetic of AVX512_BF16's vdpbf16ps, in three
// builds that give identical bits.
//
// A Pairs16 holds sixteen 32-bit lanes of two bfloat16 values each: element 2i in the low half,
// element 2i + 1 in the high half. dot_bf16(acc, a, b) does, lane by lane, what the Intel SDM
// defines for vdpbf16ps: acc += a_odd * b_odd, then acc += a_even * b_even, each a float32
// fused multiply-add rounded to nearest even, with denormal inputs read as zero (DAZ) and denormal
// results flushed to zero (FTZ), whatever MXCSR says. A bfloat16 product is exact in float32, so
// each step is one rounding.
//   - compiled with -mavx512bf16: the instruction itself;
//   - compiled with -mavx512f only: the two steps as float32 FMAs with explicit DAZ and FTZ;
//   - portable: the same per lane with std::fma.
// The emulations flush a result whose magnitude is below FLT_MIN after rounding; a result that is
// tiny only before rounding (within half an ulp of FLT_MIN) is the one case they could disagree
// with the instruction on. Kernels tests compare the builds bit for bit on this CPU.
// Include after kernels/simd.h's requirements (-ffp-contract=off).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kernels/simd.h"
#include "util/half.h"

namespace vericache::simd {

#if defined(__AVX512F__)

struct Pairs16 {
  __m512i v;
};

inline Pairs16 set1_pair(uint32_t pair) { return {_mm512_set1_epi32(static_cast<int>(pair))}; }
// Lane i = even[i] | odd[i] << 16 (16 bfloat16 values from each pointer).
#if defined(__AVX512BW__)
inline Pairs16 interleave_bf16(const uint16_t* even, const uint16_t* odd) {
  const __m512i both =
      _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even))),
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(odd)), 1);
  const __m512i index = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                         5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return {_mm512_permutexvar_epi16(index, both)};
}
// interleave_bf16 of 32 values from each pointer: lanes of values 0-15 in `first`, 16-31 in `second`.
inline void interleave_bf16_32(const uint16_t* even, const uint16_t* odd, Pairs16* first, Pairs16* second) {
  const __m512i e = _mm512_loadu_si512(even), o = _mm512_loadu_si512(odd);
  const __m512i low = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37,
                                       5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
  first->v = _mm512_permutex2var_epi16(e, low, o);
  second->v = _mm512_permutex2var_epi16(e, high, o);
}
#else
inline Pairs16 interleave_bf16(const uint16_t* even, const uint16_t* odd) {
  const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even)));
  const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(odd)));
  return {_mm512_or_si512(lo, _mm512_slli_epi32(hi, 16))};
}
#endif
// Lane i = even[i], its odd element zero.
inline Pairs16 widen_bf16(const uint16_t* even) {
  return {_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even)))};
}
// The 16 lanes rounded to bfloat16, nearest even, and stored (finite inputs: a NaN's rounding is
// not defined here).
inline void store_bf16(uint16_t* p, Vec16 a) {
  const __m512i bits = _mm512_castps_si512(a.v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(rounded));
}

#if defined(__AVX512BF16__)
inline Vec16 dot_bf16(Vec16 acc, Pairs16 a, Pairs16 b) {
  return {_mm512_dpbf16_ps(acc.v, reinterpret_cast<__m512bh&>(a.v), reinterpret_cast<__m512bh&>(b.v))};
}
#else
namespace bf16_detail {
inline __m512 flush_denormals(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(FLT_MIN), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(
      x, tiny, _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));
}
inline __m512 high_half(__m512i pairs) {
  return flush_denormals(
      _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int>(0xffff0000u)))));
}
inline __m512 low_half(__m512i pairs) { return flush_denormals(_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16))); }
}  // namespace bf16_detail

inline Vec16 dot_bf16(Vec16 acc, Pairs16 a, Pairs16 b) {
  using namespace bf16_detail;
  __m512 r = _mm512_fmadd_ps(high_half(a.v), high_half(b.v), flush_denormals(acc.v));
  r = flush_denormals(r);
  return {flush_denormals(_mm512_fmadd_ps(low_half(a.v), low_half(b.v), r))};
}
#endif

#else

struct Pairs16 {
  uint32_t v[kLanes];
};

inline Pairs16 set1_pair(uint32_t pair) {
  Pairs16 r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = pair;
  return r;
}
inline Pairs16 interleave_bf16(const uint16_t* even, const uint16_t* odd) {
  Pairs16 r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = static_cast<uint32_t>(even[i]) | static_cast<uint32_t>(odd[i]) << 16;
  return r;
}
inline Pairs16 widen_bf16(const uint16_t* even) {
  Pairs16 r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = even[i];
  return r;
}
inline void store_bf16(uint16_t* p, Vec16 a) {
  for (int i = 0; i < kLanes; ++i) {
    const uint32_t bits = float_to_bits(a.v[i]);
    p[i] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
}

namespace bf16_detail {
inline float flush_denormal(float x) { return std::fabs(x) < FLT_MIN ? std::copysign(0.0f, x) : x; }
}  // namespace bf16_detail

inline Vec16 dot_bf16(Vec16 acc, Pairs16 a, Pairs16 b) {
  using bf16_detail::flush_denormal;
  return map([&](int i) {
    const float a_odd = flush_denormal(bits_to_float(a.v[i] & 0xffff0000u));
    const float b_odd = flush_denormal(bits_to_float(b.v[i] & 0xffff0000u));
    const float a_even = flush_denormal(bits_to_float(a.v[i] << 16));
    const float b_even = flush_denormal(bits_to_float(b.v[i] << 16));
    const float r = flush_denormal(std::fma(a_odd, b_odd, flush_denormal(acc.v[i])));
    return flush_denormal(std::fma(a_even, b_even, r));
  });
}

#endif

#if !defined(__AVX512BW__)
// interleave_bf16 of 32 values from each pointer: lanes of values 0-15 in `first`, 16-31 in
// `second` (the AVX-512BW build permutes both at once).
inline void interleave_bf16_32(const uint16_t* even, const uint16_t* odd, Pairs16* first, Pairs16* second) {
  *first = interleave_bf16(even, odd);
  *second = interleave_bf16(even + kLanes, odd + kLanes);
}
#endif

}  // namespace vericache::simd
