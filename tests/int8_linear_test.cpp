// The integer linear kernels (kernels/int8_linear.h): bitwise equal to a plain scalar reference of
// the documented arithmetic, close to the float product of the dequantized weights and activations,
// row-count and column-range invariant, and equal across the VNNI and portable builds, for every
// weight type the models use.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu_kernels.h"
#include "kernels/int8_linear.h"
#include "model/ggml_dequant.h"
#include "model/int8_repack.h"
#include "model/weight_repack.h"
#include "util/half.h"
#include "kernel_test_support.h"

namespace vericache::cpu {
namespace {

using vericache::GgmlType;

using vericache::testing::random_vector;

std::vector<const IntKernelTable*> int_tables() {
  std::vector<const IntKernelTable*> t{&portable_int_kernels()};
  if (vnni_int_kernels() != nullptr) {
    t.push_back(vnni_int_kernels());
  } else {
    std::printf("[ note ] this CPU has no AVX-512 VNNI: only the portable integer kernels are tested\n");
  }
  return t;
}

// A weight matrix of one GGUF type with random codes and finite scales, in the float kernels'
// format (K-quants repacked as at load), with its dequantization.
struct RandomWeights {
  std::string name;
  std::vector<uint8_t> stored;
  WeightView view;
  std::vector<float> dense;  // [n][k]
};

RandomWeights random_weights(GgmlType type, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<uint8_t> blocks = testing::random_ggml_rows(type, n, k, rng);
  const auto repacked = repacked_format(type);
  const WeightFormat format = repacked                      ? *repacked
                              : type == GgmlType::kQ8_0 ? WeightFormat::kQ8_0
                              : type == GgmlType::kQ4_0 ? WeightFormat::kQ4_0
                              : type == GgmlType::kQ4_1 ? WeightFormat::kQ4_1
                                                        : WeightFormat::kQ5_0;
  const int64_t file_row_bytes = static_cast<int64_t>(blocks.size()) / n;
  RandomWeights w;
  w.name = ggml_type_name(type);
  w.dense.resize(n * k);
  EXPECT_TRUE(dequantize(type, blocks.data(), n * k, w.dense.data()).ok());
  int64_t row_bytes = file_row_bytes;
  w.stored = blocks;
  if (repacked) {
    row_bytes = repacked_row_bytes(format, k);
    w.stored.resize(n * row_bytes);
    repack_rows(type, blocks.data(), n, k, w.stored.data());
  }
  w.view = WeightView{format, w.stored.data(), n, k, row_bytes};
  return w;
}

const std::vector<GgmlType> kTypes{GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                   GgmlType::kQ5_0, GgmlType::kQ4_K, GgmlType::kQ6_K};

struct Activations {
  std::vector<int8_t> codes;
  std::vector<float> scales;
  std::vector<int32_t> half_sums;
  QuantizedRows rows(int64_t first, int64_t count, int64_t k) const {
    return QuantizedRows{codes.data() + first * k, scales.data() + first * (k / 32), half_sums.data() + first * (k / 16),
                         count, k};
  }
};

Activations quantize(const IntKernelTable& t, const std::vector<float>& x, int64_t m, int64_t k) {
  Activations a;
  a.codes.resize(m * k);
  a.scales.resize(m * k / 32);
  a.half_sums.resize(m * k / 16);
  t.quantize_rows(x.data(), k, m, k, a.codes.data(), a.scales.data(), a.half_sums.data());
  return a;
}

struct Panels {
  std::vector<uint8_t> bytes;
  IntWeightView view;
};

// w's panels in `format` (by default its own: int8-coded scales for the K-quants).
Panels panels_of(const WeightView& w, std::optional<IntWeightFormat> format = std::nullopt) {
  if (!format) format = int_weight_format(w.format);
  Panels p;
  p.bytes.resize(int_panels_bytes(*format, w.n, w.k));
  const auto view = repack_int_panels(w, *format, p.bytes.data());
  EXPECT_TRUE(view.has_value());
  if (view) p.view = *view;
  return p;
}

// The formats a weight of `type` can be repacked into: its own, and float32 scales if different.
std::vector<IntWeightFormat> formats_of(const WeightView& w) {
  std::vector<IntWeightFormat> formats{*int_weight_format(w.format)};
  if (formats[0].float_bytes == 1) formats.push_back(with_float_scales(formats[0]));
  return formats;
}

// Entry `index` of the scales and minimums of block b of panel p, read as int8_linear.h documents:
// floats or halves in the block, or an int8 code in the block times its group header's factor.
float read_scale(const IntWeightView& w, int64_t p, int64_t b, const uint8_t* block, int64_t index) {
  const IntWeightFormat& f = w.format;
  if (f.float_bytes == 1) {
    const int64_t header_bytes = 4 * kPanelColumns * (f.has_min ? 2 : 1);
    const int64_t group_bytes = header_bytes + 8 * int_block_bytes(f);
    const uint8_t* header = w.data + p * w.panel_bytes + (b / 8) * group_bytes;
    const bool minimum = index >= kPanelColumns * f.scales;
    float factor;
    std::memcpy(&factor, header + 4 * ((minimum ? kPanelColumns : 0) + index % kPanelColumns), 4);
    return factor * static_cast<float>(static_cast<int8_t>(block[index]));
  }
  if (f.float_bytes == 2) {
    uint16_t h;
    std::memcpy(&h, block + 2 * index, 2);
    return fp16_to_fp32(h);
  }
  float v;
  std::memcpy(&v, block + 4 * index, 4);
  return v;
}

// The arithmetic int8_linear.h documents, one output at a time in plain scalar C++, reading the
// panels byte by byte: integer half sums, then fma(s * a_d, I, acc) in block order.
float scalar_reference(const IntWeightView& w, const QuantizedRows& x, int64_t r, int64_t col) {
  const IntWeightFormat& f = w.format;
  const int64_t blocks = w.k / 32, p = col / kPanelColumns, j = col % kPanelColumns;
  float acc = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    // With int8-coded scales, groups of 8 blocks each after a header of 16 (or 32) float factors.
    const int64_t header_bytes = 4 * kPanelColumns * (f.has_min ? 2 : 1);
    const int64_t group_bytes = header_bytes + 8 * int_block_bytes(f);
    const uint8_t* block = w.data + p * w.panel_bytes +
                           (f.float_bytes == 1 ? (b / 8) * group_bytes + header_bytes + (b % 8) * int_block_bytes(f)
                                               : b * int_block_bytes(f));
    const uint8_t* codes = block + f.float_bytes * kPanelColumns * (f.scales + (f.has_min ? 1 : 0));
    int32_t half[2] = {0, 0}, code_sum[2] = {0, 0};
    for (int i = 0; i < 32; ++i) {
      const int group = i / 4, t = i % 4;
      int code;
      if (f.code_bits == 8) {
        code = codes[64 * group + 4 * j + t];
      } else {
        const uint8_t byte = codes[64 * (group % 4) + 4 * j + t];
        code = group < 4 ? byte & 0x0f : byte >> 4;
        if (f.code_bits > 4) {  // the high-bit plane
          const int h = f.code_bits - 4;
          code |= ((codes[256 + 64 * (group % h) + 4 * j + t] >> (h * (group / h))) & ((1 << h) - 1)) << 4;
        }
      }
      const int8_t a = x.codes[r * w.k + 32 * b + i];
      half[i / 16] += code * a;
      code_sum[i / 16] += a;
    }
    const float ad = x.scales[r * blocks + b];
    const int32_t i0 = half[0] - f.zero * code_sum[0], i1 = half[1] - f.zero * code_sum[1];
    if (f.scales == 1) {
      acc = std::fma(read_scale(w, p, b, block, j) * ad, static_cast<float>(i0 + i1), acc);
    } else {
      acc = std::fma(read_scale(w, p, b, block, j) * ad, static_cast<float>(i0), acc);
      acc = std::fma(read_scale(w, p, b, block, kPanelColumns + j) * ad, static_cast<float>(i1), acc);
    }
    if (f.has_min) {
      acc = std::fma(read_scale(w, p, b, block, kPanelColumns * f.scales + j) * ad,
                     static_cast<float>(code_sum[0] + code_sum[1]), acc);
    }
  }
  return acc;
}

TEST(IntLinear, QuantizedActivationsRoundEachValueToItsBlockScale) {
  const int64_t m = 3, k = 96;
  auto x = random_vector(m * k, 5, 3.0f);
  std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // an all-zero block: scale 0, codes 0
  for (const IntKernelTable* t : int_tables()) {
    const Activations a = quantize(*t, x, m, k);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t b = 0; b < k / 32; ++b) {
        const float d = a.scales[r * 3 + b];
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[r * k + 32 * b + i]));
        ASSERT_EQ(d, amax / 127.0f) << t->isa;
        int32_t sums[2] = {0, 0};
        for (int i = 0; i < 32; ++i) {
          const int8_t q = a.codes[r * k + 32 * b + i];
          ASSERT_LE(std::abs(q), 127);
          ASSERT_LE(std::fabs(x[r * k + 32 * b + i] - d * q), 0.5f * d * 1.0001f + 1e-30f) << t->isa;
          sums[i / 16] += q;
        }
        ASSERT_EQ(a.half_sums[r * 6 + 2 * b], sums[0]);
        ASSERT_EQ(a.half_sums[r * 6 + 2 * b + 1], sums[1]);
      }
    }
  }
}

// Every output equals the scalar reference bit for bit and the double product of the dequantized
// weights and dequantized activations to float rounding; any row range and panel range gives the
// same bits as the whole (1 to 64 rows, so every row tile of the kernels is used).
TEST(IntLinear, EveryTypeEqualsTheScalarReferenceAndIsRowCountInvariant) {
  const int64_t k = 512, n = 40, m = 64;  // the last panel has 8 columns
  const auto x = random_vector(m * k, 21);
  for (const GgmlType type : kTypes) {
    const RandomWeights w = random_weights(type, n, k, 22);
    for (const IntWeightFormat& format : formats_of(w.view)) {
      const std::string label = w.name + " (scale bytes " + std::to_string(format.float_bytes) + ")";
      for (const IntKernelTable* t : int_tables()) {
        const Panels p = panels_of(w.view, format);
        const Activations a = quantize(*t, x, m, k);
        std::vector<float> all(m * n);
        t->linear(a.rows(0, m, k), p.view, 0, p.view.panels(), all.data(), n);
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t c = 0; c < n; ++c) {
            ASSERT_EQ(all[r * n + c], scalar_reference(p.view, a.rows(0, m, k), r, c))
                << label << " " << t->isa << " row " << r << " column " << c;
            double ref = 0, magnitude = 0;
            for (int64_t i = 0; i < k; ++i) {
              const double xi = static_cast<double>(a.scales[r * 16 + i / 32]) * a.codes[r * k + i];
              ref += xi * w.dense[c * k + i];
              magnitude += std::fabs(xi * w.dense[c * k + i]);
            }
            ASSERT_NEAR(all[r * n + c], ref, 1e-5 * magnitude + 1e-6) << label << " " << t->isa;
          }
        }
        for (const int64_t rows : {1, 2, 3, 5, 7, 8, 9, 17, 33}) {
          for (int64_t first = 0; first + rows <= m; first += 29) {
            std::vector<float> part(rows * n);
            t->linear(a.rows(first, rows, k), p.view, 0, 1, part.data(), n);
            t->linear(a.rows(first, rows, k), p.view, 1, p.view.panels(), part.data(), n);
            ASSERT_EQ(std::memcmp(part.data(), all.data() + first * n, part.size() * sizeof(float)), 0)
                << label << " " << t->isa << ": rows " << first << ".." << first + rows;
          }
        }
      }
    }
  }
}

TEST(IntLinear, VnniAndPortableBuildsAgreeBitwise) {
  const IntKernelTable* fast = vnni_int_kernels();
  if (fast == nullptr) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  const IntKernelTable& slow = portable_int_kernels();
  const int64_t k = 1536, n = 70, m = 13;
  auto x = random_vector(m * k, 31, 2.0f);
  x[7] = 1e-30f;  // tiny and huge values: the scale and rounding edges
  x[40] = 6e4f;
  const Activations fa = quantize(*fast, x, m, k), sa = quantize(slow, x, m, k);
  ASSERT_EQ(fa.codes, sa.codes);
  ASSERT_EQ(std::memcmp(fa.scales.data(), sa.scales.data(), fa.scales.size() * 4), 0);
  ASSERT_EQ(fa.half_sums, sa.half_sums);
  for (const GgmlType type : kTypes) {
    const RandomWeights w = random_weights(type, n, k, 32);
    const Panels p = panels_of(w.view);
    std::vector<float> a(m * n), b(m * n);
    fast->linear(fa.rows(0, m, k), p.view, 0, p.view.panels(), a.data(), n);
    slow.linear(sa.rows(0, m, k), p.view, 0, p.view.panels(), b.data(), n);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << w.name;
  }
}

// The K-quants' scales and minimums coded as int8 times a factor per 256 values give the bits of
// the float32-scale panels (every product is exact) in fewer bytes: per column and 256 values 152
// against 192 bytes (Q4_K), 212 against 256 (Q6_K, 6-bit codes).
TEST(IntLinear, KQuantScalesCodedAsInt8GiveTheBitsOfFloatScales) {
  const int64_t k = 768, n = 40, m = 9;
  const auto x = random_vector(m * k, 51, 2.0f);
  for (const auto& [type, coded_bytes, float_bytes] : {std::tuple{GgmlType::kQ4_K, 152, 192}, std::tuple{GgmlType::kQ6_K, 212, 256}}) {
    const RandomWeights w = random_weights(type, n, k, 52);
    const IntWeightFormat coded = *int_weight_format(w.view.format);
    ASSERT_EQ(coded.float_bytes, 1) << w.name;
    const Panels a = panels_of(w.view, coded), b = panels_of(w.view, with_float_scales(coded));
    EXPECT_EQ(a.bytes.size() * float_bytes, b.bytes.size() * coded_bytes) << w.name;
    for (const IntKernelTable* t : int_tables()) {
      const Activations q = quantize(*t, x, m, k);
      std::vector<float> ya(m * n), yb(m * n);
      t->linear(q.rows(0, m, k), a.view, 0, a.view.panels(), ya.data(), n);
      t->linear(q.rows(0, m, k), b.view, 0, b.view.panels(), yb.data(), n);
      EXPECT_EQ(std::memcmp(ya.data(), yb.data(), ya.size() * sizeof(float)), 0) << w.name << " " << t->isa;
    }
  }
}

// A super-block whose scales no int8 codes times one factor give exactly (1 and the next float
// above it) keeps float32 scales for the whole matrix, with the same results.
TEST(IntLinear, ScalesWithNoExactInt8CodingKeepFloat32) {
  const int64_t k = 256, n = 16, m = 3;
  RandomWeights w = random_weights(GgmlType::kQ4_K, n, k, 61);
  const float one = 1.0f, above = std::nextafter(1.0f, 2.0f);
  std::memcpy(w.stored.data(), &one, 4);  // kNibbleF32 blocks 0 and 1 of row 0: f32 d | f32 m | nibbles
  std::memcpy(w.stored.data() + 24, &above, 4);
  std::vector<uint8_t> dst(int_panels_bytes(*int_weight_format(w.view.format), n, k));
  EXPECT_FALSE(repack_int_panels(w.view, *int_weight_format(w.view.format), dst.data()).has_value());
  std::vector<uint8_t> chosen;
  const IntWeightView view = repack_int_panels(w.view, [&](int64_t bytes) {
    chosen.assign(bytes, 0);
    return chosen.data();
  });
  EXPECT_EQ(view.format.float_bytes, 4);
  const Panels reference = panels_of(w.view, with_float_scales(view.format));
  ASSERT_EQ(chosen, reference.bytes);
  const IntKernelTable& t = best_int_kernels();
  const Activations a = quantize(t, random_vector(m * k, 62), m, k);
  std::vector<float> y(m * n);
  t.linear(a.rows(0, m, k), view, 0, 1, y.data(), n);
  for (int64_t c = 0; c < n; ++c) EXPECT_EQ(y[c], scalar_reference(view, a.rows(0, m, k), 0, c)) << c;
}

// The checks above can fail: one weight code changed in the panels moves that column's outputs
// away from the reference computed on the original panels.
TEST(IntLinear, AChangedCodeIsCaught) {
  const int64_t k = 64, n = 16, m = 2;
  const auto x = random_vector(m * k, 41);
  const RandomWeights w = random_weights(GgmlType::kQ8_0, n, k, 42);
  const Panels p = panels_of(w.view);
  Panels faulty = p;
  faulty.view.data = faulty.bytes.data();
  faulty.bytes[int_block_bytes(p.view.format) - 1] ^= 0x10;  // block 0, column 15, last group
  const IntKernelTable& t = best_int_kernels();
  const Activations a = quantize(t, x, m, k);
  std::vector<float> y(m * n);
  t.linear(a.rows(0, m, k), faulty.view, 0, 1, y.data(), n);
  EXPECT_EQ(y[0], scalar_reference(p.view, a.rows(0, m, k), 0, 0));
  EXPECT_NE(y[15], scalar_reference(p.view, a.rows(0, m, k), 0, 15));
}

}  // namespace
}  // namespace vericache::cpu
