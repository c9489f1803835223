// Integer vectors for the integer linear kernels (kernels/int8_linear.h): 64 bytes of unsigned
// weight codes and 16 int32 lanes, with AVX-512 VNNI intrinsics when the translation unit is
// compiled with -mavx512f -mavx512bw -mavx512vnni, and a portable build computing the same exact
// integers lane by lane. Float lanes are simd::Vec16 (kernels/simd.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/simd.h"

namespace vericache::simd {

inline int32_t load_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

struct Bytes64 {
  __m512i v;
};
struct Int16 {
  __m512i v;
};

inline Bytes64 load_bytes64(const uint8_t* p) { return {_mm512_loadu_si512(p)}; }
inline Bytes64 low_nibbles(Bytes64 b) { return {_mm512_and_si512(b.v, _mm512_set1_epi8(0x0f))}; }
inline Bytes64 high_nibbles(Bytes64 b) { return {_mm512_and_si512(_mm512_srli_epi16(b.v, 4), _mm512_set1_epi8(0x0f))}; }
// Each byte's bits [pos, pos + bits) moved to bits [4, 4 + bits), the others cleared.
inline Bytes64 high_bits(Bytes64 plane, int pos, int bits) {
  const __m512i moved = pos <= 4 ? _mm512_sll_epi16(plane.v, _mm_cvtsi32_si128(4 - pos))
                                 : _mm512_srl_epi16(plane.v, _mm_cvtsi32_si128(pos - 4));
  return {_mm512_and_si512(moved, _mm512_set1_epi8(static_cast<char>(((1 << bits) - 1) << 4)))};
}
inline Bytes64 bytes_or(Bytes64 a, Bytes64 b) { return {_mm512_or_si512(a.v, b.v)}; }
inline Int16 izero() { return {_mm512_setzero_si512()}; }
// Lane j += sum_{t<4} w[4j + t] (unsigned) * a[t] (signed): four signed bytes a broadcast to all lanes.
inline Int16 dot4(Int16 acc, Bytes64 w, const int8_t* a) {
  return {_mm512_dpbusd_epi32(acc.v, w.v, _mm512_set1_epi32(load_i32(a)))};
}
inline Int16 iadd(Int16 a, Int16 b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline Int16 isub(Int16 a, int32_t s) { return {_mm512_sub_epi32(a.v, _mm512_set1_epi32(s))}; }
inline Vec16 to_float(Int16 a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline Vec16 abs(Vec16 a) { return {_mm512_abs_ps(a.v)}; }
// Integral lanes in [-127, 127] stored as 16 signed bytes.
inline void store_codes(int8_t* p, Vec16 integral) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(integral.v)));
}

#elif !defined(__AVX512F__)

struct Bytes64 {
  uint8_t v[64];
};
struct Int16 {
  int32_t v[kLanes];
};

inline Bytes64 load_bytes64(const uint8_t* p) {
  Bytes64 b;
  std::memcpy(b.v, p, 64);
  return b;
}
inline Bytes64 low_nibbles(Bytes64 b) {
  for (uint8_t& x : b.v) x &= 0x0f;
  return b;
}
inline Bytes64 high_nibbles(Bytes64 b) {
  for (uint8_t& x : b.v) x = static_cast<uint8_t>(x >> 4);
  return b;
}
inline Bytes64 high_bits(Bytes64 plane, int pos, int bits) {
  for (uint8_t& x : plane.v) x = static_cast<uint8_t>(((x >> pos) & ((1 << bits) - 1)) << 4);
  return plane;
}
inline Bytes64 bytes_or(Bytes64 a, Bytes64 b) {
  for (int i = 0; i < 64; ++i) a.v[i] |= b.v[i];
  return a;
}
inline Int16 izero() { return Int16{}; }
inline Int16 dot4(Int16 acc, Bytes64 w, const int8_t* a) {
  for (int j = 0; j < kLanes; ++j)
    for (int t = 0; t < 4; ++t) acc.v[j] += static_cast<int32_t>(w.v[4 * j + t]) * a[t];
  return acc;
}
inline Int16 iadd(Int16 a, Int16 b) {
  for (int j = 0; j < kLanes; ++j) a.v[j] += b.v[j];
  return a;
}
inline Int16 isub(Int16 a, int32_t s) {
  for (int j = 0; j < kLanes; ++j) a.v[j] -= s;
  return a;
}
inline Vec16 to_float(Int16 a) { return map([&](int i) { return static_cast<float>(a.v[i]); }); }
inline Vec16 abs(Vec16 a) { return map([&](int i) { return std::fabs(a.v[i]); }); }
inline void store_codes(int8_t* p, Vec16 integral) {
  for (int i = 0; i < kLanes; ++i) p[i] = static_cast<int8_t>(static_cast<int32_t>(integral.v[i]));
}

#else
#error "simd_int.h: an AVX-512 build needs -mavx512bw -mavx512vnni as well"
#endif

}  // namespace vericache::simd
