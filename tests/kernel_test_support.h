// Random inputs for the kernel tests (kernels_test.cpp, int8_linear_test.cpp): normal float
// vectors, and weight rows of a GGUF quantized type with random codes and finite scales.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "model/ggml_types.h"

namespace vericache::testing {

inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// `n` rows of `k` values of `type` (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K or Q6_K) in the file's blocks:
// random bytes, with every f16 scale finite and in [0.0039, 2) in magnitude.
inline std::vector<uint8_t> random_ggml_rows(GgmlType type, int64_t n, int64_t k, std::mt19937& rng) {
  struct Shape {
    GgmlType type;
    int64_t block_values, block_bytes;
    std::vector<int> f16_offsets;  // where the block's f16 scales are
  };
  static const std::vector<Shape> shapes{{GgmlType::kQ8_0, 32, 34, {0}},   {GgmlType::kQ4_0, 32, 18, {0}},
                                         {GgmlType::kQ4_1, 32, 20, {0, 2}}, {GgmlType::kQ5_0, 32, 22, {0}},
                                         {GgmlType::kQ4_K, 256, 144, {0, 2}}, {GgmlType::kQ6_K, 256, 210, {208}}};
  const Shape* s = nullptr;
  for (const Shape& x : shapes) s = x.type == type ? &x : s;
  if (s == nullptr) return {};
  std::vector<uint8_t> blocks(n * k / s->block_values * s->block_bytes);
  for (auto& b : blocks) b = static_cast<uint8_t>(rng());
  for (int64_t blk = 0; blk < n * k / s->block_values; ++blk) {
    for (const int offset : s->f16_offsets) {
      const uint16_t h = static_cast<uint16_t>(0x1c00 + rng() % 0x2000) | (rng() % 2 ? 0x8000 : 0);
      std::memcpy(&blocks[blk * s->block_bytes + offset], &h, 2);
    }
  }
  return blocks;
}

}  // namespace vericache::testing
