#include "model/weight_repack.h"

#include <cstring>

#include "util/half.h"

namespace vericache {
namespace {

constexpr int64_t kQ4KBytes = 144, kQ6KBytes = 210;
constexpr int64_t kNibbleF32Bytes = 24, kInt8F32Bytes = 40;  // per 32 values

float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return fp16_to_fp32(h);
}

void store_f32(uint8_t* p, float v) { std::memcpy(p, &v, sizeof v); }

// One Q4_K super-block (256 values) into 8 kNibbleF32 blocks.
void repack_q4_k(const uint8_t* b, uint8_t* out) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  for (int j = 0; j < 8; ++j, out += kNibbleF32Bytes) {
    uint8_t sc, m;
    k_quant_scale_min(b + 4, j, &sc, &m);
    store_f32(out, d * static_cast<float>(sc));
    store_f32(out + 4, -(dmin * static_cast<float>(m)));
    const uint8_t* q = b + 16 + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int i = 0; i < 16; ++i) {
      out[8 + i] = static_cast<uint8_t>(((q[i] >> shift) & 0x0f) | (((q[i + 16] >> shift) & 0x0f) << 4));
    }
  }
}

// One Q6_K super-block (256 values) into 8 kInt8F32 blocks.
void repack_q6_k(const uint8_t* b, uint8_t* out) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int j = 0; j < 8; ++j, out += kInt8F32Bytes) {
    store_f32(out, d * static_cast<float>(scales[2 * j]));
    store_f32(out + 4, d * static_cast<float>(scales[2 * j + 1]));
    for (int i = 0; i < 32; ++i) {
      const int e = 32 * j + i, half = e / 128, r = e % 128;
      const int low = (ql[64 * half + r % 64] >> (4 * (r / 64))) & 0x0f;
      const int high = (qh[32 * half + r % 32] >> (2 * (r / 32))) & 0x03;
      out[8 + i] = static_cast<uint8_t>(static_cast<int8_t>((low | (high << 4)) - 32));
    }
  }
}

}  // namespace

std::optional<cpu::WeightFormat> repacked_format(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_K: return cpu::WeightFormat::kNibbleF32;
    case GgmlType::kQ6_K: return cpu::WeightFormat::kInt8F32;
    default: return std::nullopt;
  }
}

int64_t repacked_row_bytes(cpu::WeightFormat format, int64_t k) {
  return k / 32 * (format == cpu::WeightFormat::kNibbleF32 ? kNibbleF32Bytes : kInt8F32Bytes);
}

void repack_rows(GgmlType type, const uint8_t* src, int64_t rows, int64_t k, uint8_t* dst) {
  const bool q4 = type == GgmlType::kQ4_K;
  const int64_t blocks = rows * (k / 256);
  for (int64_t s = 0; s < blocks; ++s) {
    if (q4) {
      repack_q4_k(src + s * kQ4KBytes, dst + s * 8 * kNibbleF32Bytes);
    } else {
      repack_q6_k(src + s * kQ6KBytes, dst + s * 8 * kInt8F32Bytes);
    }
  }
}

}  // namespace vericache
