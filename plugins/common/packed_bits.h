// Helpers the bundled quantizers share: codes of 2, 3, 4 or 8 bits packed LSB-first into bytes,
// and asymmetric min-max round-to-nearest over a group with float16 scale and minimum.
// Header-only (compiled into each plugin). Not part of the installed contract.
#pragma once

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace vericache::plugin {

// Bytes that hold `count` codes of `bits` bits.
constexpr int64_t packed_code_bytes(int64_t count, int bits) { return (count * bits + 7) / 8; }

// Code i of `bits` bits lives at bit offset i * bits, least significant bit first. The byte after
// the last code's may be read (never written): keep one byte of slack after a code region.
inline void put_code(uint8_t* bytes, int64_t i, int bits, uint32_t code) {
  const int64_t bit = i * bits;
  const uint32_t shifted = code << (bit & 7);
  bytes[bit >> 3] |= static_cast<uint8_t>(shifted);
  if ((bit & 7) + bits > 8) bytes[(bit >> 3) + 1] |= static_cast<uint8_t>(shifted >> 8);
}

inline uint32_t get_code(const uint8_t* bytes, int64_t i, int bits) {
  const int64_t bit = i * bits;
  uint32_t window = bytes[bit >> 3];
  if ((bit & 7) + bits > 8) window |= static_cast<uint32_t>(bytes[(bit >> 3) + 1]) << 8;
  return (window >> (bit & 7)) & ((1u << bits) - 1);
}

// One group's quantizer as KIVI defines it: m = min, s = (max - m) / (2^b - 1), both stored as
// float16; code = clamp(round((x - m) / s), 0, 2^b - 1) with the stored m and s (ties to even);
// x^ = code * s + m. A constant group (s = 0) gets code 0.
struct MinMaxGroup {
  c10::Half scale;
  c10::Half minimum;

  static MinMaxGroup fit(float lo, float hi, int bits) {
    return MinMaxGroup{c10::Half((hi - lo) / static_cast<float>((1 << bits) - 1)), c10::Half(lo)};
  }
  uint32_t code(float x, int bits) const {
    const float s = static_cast<float>(scale);
    if (!(s > 0)) return 0;
    const float q = std::nearbyint((x - static_cast<float>(minimum)) / s);
    return static_cast<uint32_t>(std::clamp(q, 0.0f, static_cast<float>((1 << bits) - 1)));
  }
  float value(uint32_t code) const {
    return static_cast<float>(code) * static_cast<float>(scale) + static_cast<float>(minimum);
  }
};

}  // namespace vericache::plugin
