// ggml tensor types as numbered in GGUF files, with their block geometry.
//
// Quantized types store blocks of `block_elements` values in `block_bytes` bytes; a row's
// contiguous dimension must be a multiple of block_elements. The byte layout of each block that
// VeriCache can dequantize is documented in ggml_dequant.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vericache {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeInfo {
  GgmlType type;
  const char* name;
  int64_t block_elements;
  uint64_t block_bytes;
  bool dequantizable;  // ggml_dequant.h handles it
};

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block, from its 12-byte
// scale array (the block's bytes 4..15).
inline void k_quant_scale_min(const uint8_t* scales, int j, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4);
    *min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// nullptr for a number that names no ggml type.
const GgmlTypeInfo* ggml_type_info(uint32_t type);
// "Q4_K", or "type <n>" for an unknown number.
const char* ggml_type_name(GgmlType type);

}  // namespace vericache
