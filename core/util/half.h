// Exact conversions between IEEE binary16 / bfloat16 bit patterns and float.
#pragma once

#include <cstdint>
#include <cstring>

namespace vericache {

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// binary16 -> float, exact for every input (subnormals, infinities and NaNs included).
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_float(sign);
    // Subnormal: normalise the mantissa.
    exponent = 127 - 15 + 1;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= 0x3ffu;
    return bits_to_float(sign | (exponent << 23) | (mantissa << 13));
  }
  return bits_to_float(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

// bfloat16 -> float: the upper 16 bits of a float.
inline float bf16_to_fp32(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }

// float -> bfloat16 with round-to-nearest-even (NaN stays NaN).
inline uint16_t fp32_to_bf16(float f) {
  uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace vericache
