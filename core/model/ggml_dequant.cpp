#include "model/ggml_dequant.h"

#include <cstring>
#include <string>

#include "util/half.h"

namespace vericache {
namespace {

constexpr GgmlTypeInfo kTypes[] = {
    {GgmlType::kF32, "F32", 1, 4, true},
    {GgmlType::kF16, "F16", 1, 2, true},
    {GgmlType::kQ4_0, "Q4_0", 32, 18, true},
    {GgmlType::kQ4_1, "Q4_1", 32, 20, true},
    {GgmlType::kQ5_0, "Q5_0", 32, 22, true},
    {GgmlType::kQ5_1, "Q5_1", 32, 24, true},
    {GgmlType::kQ8_0, "Q8_0", 32, 34, true},
    {GgmlType::kQ8_1, "Q8_1", 32, 36, false},
    {GgmlType::kQ2_K, "Q2_K", 256, 84, false},
    {GgmlType::kQ3_K, "Q3_K", 256, 110, false},
    {GgmlType::kQ4_K, "Q4_K", 256, 144, true},
    {GgmlType::kQ5_K, "Q5_K", 256, 176, true},
    {GgmlType::kQ6_K, "Q6_K", 256, 210, true},
    {GgmlType::kQ8_K, "Q8_K", 256, 292, false},
    {GgmlType::kIQ2_XXS, "IQ2_XXS", 256, 66, false},
    {GgmlType::kIQ2_XS, "IQ2_XS", 256, 74, false},
    {GgmlType::kIQ3_XXS, "IQ3_XXS", 256, 98, false},
    {GgmlType::kIQ1_S, "IQ1_S", 256, 50, false},
    {GgmlType::kIQ4_NL, "IQ4_NL", 32, 18, false},
    {GgmlType::kIQ3_S, "IQ3_S", 256, 110, false},
    {GgmlType::kIQ2_S, "IQ2_S", 256, 82, false},
    {GgmlType::kIQ4_XS, "IQ4_XS", 256, 136, false},
    {GgmlType::kI8, "I8", 1, 1, false},
    {GgmlType::kI16, "I16", 1, 2, false},
    {GgmlType::kI32, "I32", 1, 4, false},
    {GgmlType::kI64, "I64", 1, 8, false},
    {GgmlType::kF64, "F64", 1, 8, false},
    {GgmlType::kIQ1_M, "IQ1_M", 256, 56, false},
    {GgmlType::kBF16, "BF16", 1, 2, true},
    {GgmlType::kTQ1_0, "TQ1_0", 256, 54, false},
    {GgmlType::kTQ2_0, "TQ2_0", 256, 66, false},
    {GgmlType::kMXFP4, "MXFP4", 32, 17, false},
};

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

float load_f16(const uint8_t* p) { return fp16_to_fp32(load_u16(p)); }

// Low nibbles give elements 0..15, high nibbles 16..31 (Q4_0, Q4_1, Q5_0, Q5_1).
uint8_t nibble32(const uint8_t* qs, int i) { return i < 16 ? (qs[i] & 0x0f) : (qs[i - 16] >> 4); }

void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const auto* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(q[i]) * d;
}

void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(static_cast<int>(nibble32(b + 2, i)) - 8);
}

void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(nibble32(b + 4, i)) + m;
}

int q5_value(const uint8_t* qs, uint32_t qh, int i) {
  return static_cast<int>(nibble32(qs, i) | (((qh >> i) & 1u) << 4));
}

void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint32_t qh = load_u32(b + 2);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(q5_value(b + 6, qh, i) - 16);
}

void dequant_q5_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint32_t qh = load_u32(b + 4);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(q5_value(b + 8, qh, i)) + m;
}

// Q4_K and Q5_K share the super-block layout; Q5_K adds a fifth bit per value from qh[32].
template <bool kFifthBit>
void dequant_k_quant(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = kFifthBit ? b + 48 : b + 16;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    k_quant_scale_min(scales, j, &sc, &m);
    const float dj = d * static_cast<float>(sc);
    const float mj = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = (j % 2) * 4;
    for (int i = 0; i < 32; ++i) {
      int v = (q[i] >> shift) & 0x0f;
      if constexpr (kFifthBit) v |= ((qh[i] >> j) & 1) << 4;
      y[32 * j + i] = dj * static_cast<float>(v) - mj;
    }
  }
}

void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128;
    const int r = e % 128;
    const int low = (ql[64 * half + r % 64] >> (4 * (r / 64))) & 0x0f;
    const int high = (qh[32 * half + r % 32] >> (2 * (r / 32))) & 0x03;
    const float scale = d * static_cast<float>(scales[e / 16]);
    y[e] = scale * static_cast<float>((low | (high << 4)) - 32);
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return dequant_q8_0;
    case GgmlType::kQ4_0: return dequant_q4_0;
    case GgmlType::kQ4_1: return dequant_q4_1;
    case GgmlType::kQ5_0: return dequant_q5_0;
    case GgmlType::kQ5_1: return dequant_q5_1;
    case GgmlType::kQ4_K: return dequant_k_quant<false>;
    case GgmlType::kQ5_K: return dequant_k_quant<true>;
    case GgmlType::kQ6_K: return dequant_q6_k;
    default: return nullptr;
  }
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t type) {
  for (const auto& info : kTypes) {
    if (static_cast<uint32_t>(info.type) == type) return &info;
  }
  return nullptr;
}

const char* ggml_type_name(GgmlType type) {
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(type));
  return info != nullptr ? info->name : "unknown";
}

Status dequantize(GgmlType type, const uint8_t* src, int64_t n, float* dst) {
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(type));
  if (info == nullptr || !info->dequantizable) {
    return Status::not_supported(std::string("cannot dequantize tensor type ") +
                                 (info != nullptr ? info->name : std::to_string(static_cast<uint32_t>(type))));
  }
  if (n < 0 || n % info->block_elements != 0) {
    return Status::invalid_argument("dequantize: " + std::to_string(n) + " values is not a multiple of the " +
                                    info->name + " block size " + std::to_string(info->block_elements));
  }
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return Status();
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_f16(src + 2 * i);
      return Status();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_u16(src + 2 * i));
      return Status();
    default:
      break;
  }
  const BlockFn fn = block_fn(type);
  const int64_t blocks = n / info->block_elements;
  for (int64_t b = 0; b < blocks; ++b) {
    fn(src + b * info->block_bytes, dst + b * info->block_elements);
  }
  return Status();
}

}  // namespace vericache
