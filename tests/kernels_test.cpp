// CPU kernels against double-precision references, row-count invariance on random shapes, and
// the AVX-512 / portable builds giving identical bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_support.h"
#include "kernels/cpu_kernels.h"
#include "kernels/simd.h"
#include "model/ggml_dequant.h"
#include "model/weight_repack.h"
#include "util/half.h"

namespace vericache::cpu {
namespace {

using vericache::GgmlType;

using vericache::testing::random_vector;

// Every build this CPU runs, portable first.
std::vector<const KernelTable*> tables() { return supported_kernels(); }

TEST(Kernels, LinearMatchesDoubleReferenceAndIsRowCountInvariant) {
  for (const KernelTable* k : tables()) {
    for (int64_t kdim : {16, 37, 576, 1536}) {
      const int64_t n = 45, m_max = 19;
      const auto x = random_vector(m_max * kdim, 1);
      const auto w = random_vector(n * kdim, 2, 0.05f);
      std::vector<float> all(m_max * n);
      const WeightView wv{WeightFormat::kF32, w.data(), n, kdim, kdim * 4};
      k->linear(x.data(), kdim, m_max, wv, 0, n, all.data(), n);
      for (int64_t r = 0; r < m_max; ++r) {
        for (int64_t c = 0; c < n; ++c) {
          double ref = 0;
          for (int64_t i = 0; i < kdim; ++i) ref += static_cast<double>(x[r * kdim + i]) * w[c * kdim + i];
          ASSERT_NEAR(all[r * n + c], ref, 1e-4 * std::sqrt(static_cast<double>(kdim))) << k->isa;
        }
      }
      // Any row computed alone, in any column range, gives the same bits.
      for (int64_t r = 0; r < m_max; ++r) {
        std::vector<float> one(n);
        k->linear(x.data() + r * kdim, kdim, 1, wv, 0, 20, one.data(), n);
        k->linear(x.data() + r * kdim, kdim, 1, wv, 20, n, one.data(), n);
        ASSERT_EQ(std::memcmp(one.data(), all.data() + r * n, n * sizeof(float)), 0)
            << k->isa << ": row " << r << " of K=" << kdim;
      }
    }
  }
}

// Random blocks of every type the kernels read (K-quants repacked as at load): linear over the
// blocks equals linear over their dequantization (model/ggml_dequant.h) bit for bit, for the
// in-register path (<= 4 rows) and the buffered one, in both builds; so does an embedding-row lookup.
TEST(Kernels, QuantizedLinearEqualsLinearOverDequantizedWeights) {
  std::mt19937 rng(11);
  const int64_t kdim = 512, n = 21, rows = 7;  // two K-quant super-blocks per row
  const auto x = random_vector(rows * kdim, 12);
  struct Case {
    GgmlType type;
    int64_t block_values, block_bytes;
  };
  const std::vector<Case> cases{{GgmlType::kQ8_0, 32, 34}, {GgmlType::kQ4_0, 32, 18},   {GgmlType::kQ4_1, 32, 20},
                                {GgmlType::kQ5_0, 32, 22}, {GgmlType::kQ4_K, 256, 144}, {GgmlType::kQ6_K, 256, 210}};
  for (const Case& c : cases) {
    const int64_t file_row_bytes = kdim / c.block_values * c.block_bytes;
    const std::vector<uint8_t> blocks = testing::random_ggml_rows(c.type, n, kdim, rng);
    ASSERT_EQ(static_cast<int64_t>(blocks.size()), n * file_row_bytes);
    std::vector<float> dense(n * kdim);
    ASSERT_TRUE(dequantize(c.type, blocks.data(), n * kdim, dense.data()).ok());
    // The kernels read ggml's 32-value blocks as they are and K-quants repacked.
    const auto repacked = repacked_format(c.type);
    const WeightFormat format = repacked                    ? *repacked
                                : c.type == GgmlType::kQ8_0 ? WeightFormat::kQ8_0
                                : c.type == GgmlType::kQ4_0 ? WeightFormat::kQ4_0
                                : c.type == GgmlType::kQ4_1 ? WeightFormat::kQ4_1
                                                            : WeightFormat::kQ5_0;
    std::vector<uint8_t> stored = blocks;
    int64_t row_bytes = file_row_bytes;
    if (repacked) {
      row_bytes = repacked_row_bytes(format, kdim);
      stored.resize(n * row_bytes);
      repack_rows(c.type, blocks.data(), n, kdim, stored.data());
    }
    const WeightView quant{format, stored.data(), n, kdim, row_bytes};
    const WeightView f32{WeightFormat::kF32, dense.data(), n, kdim, kdim * 4};
    const std::string name = ggml_type_name(c.type);
    for (const KernelTable* k : tables()) {
      for (int64_t m : {1, 3, 4, 7}) {
        std::vector<float> a(m * n), b(m * n);
        k->linear(x.data(), kdim, m, quant, 0, n, a.data(), n);
        k->linear(x.data(), kdim, m, f32, 0, n, b.data(), n);
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
            << name << " " << k->isa << " rows " << m;
      }
      std::vector<float> row(kdim);
      k->weight_row(quant, 5, row.data());
      EXPECT_EQ(std::memcmp(row.data(), dense.data() + 5 * kdim, kdim * sizeof(float)), 0) << name << " " << k->isa;
    }
  }
}

TEST(Kernels, BuildsAgreeBitwise) {
  if (tables().size() == 1) GTEST_SKIP() << "this CPU has no AVX-512";
  const KernelTable& slow = portable_kernels();
  for (const KernelTable* fast : tables()) {
    const int64_t m = 5, kdim = 200, n = 33;
    const auto x = random_vector(m * kdim, 3);
    const auto w = random_vector(n * kdim, 4);
    std::vector<float> a(m * n), b(m * n);
    const WeightView wv{WeightFormat::kF32, w.data(), n, kdim, kdim * 4};
    fast->linear(x.data(), kdim, m, wv, 0, n, a.data(), n);
    slow.linear(x.data(), kdim, m, wv, 0, n, b.data(), n);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << fast->isa;

    const auto norm_w = random_vector(kdim, 5);
    std::vector<float> na(kdim), nb(kdim);
    fast->rms_norm(x.data(), kdim - 3, norm_w.data(), 1e-5f, na.data());
    slow.rms_norm(x.data(), kdim - 3, norm_w.data(), 1e-5f, nb.data());
    EXPECT_EQ(std::memcmp(na.data(), nb.data(), (kdim - 3) * sizeof(float)), 0) << fast->isa;

    const auto gate = random_vector(1000, 6, 8.0f);
    std::vector<float> sa(1000), sb(1000);
    fast->silu_mul(gate.data(), x.data(), 1000, sa.data());
    slow.silu_mul(gate.data(), x.data(), 1000, sb.data());
    EXPECT_EQ(std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float)), 0) << fast->isa;
  }
}

TEST(Kernels, ExpIsAccurateToTwoUlp) {
  int max_ulp = 0;
  for (float x = -103.0f; x < 88.5f; x += 0.0137f) {
    float in[16], out[16];
    for (int i = 0; i < 16; ++i) in[i] = x + i * 1e-3f;
    simd::store(out, simd::exp(simd::load(in)));
    for (int i = 0; i < 16; ++i) {
      const float ref = static_cast<float>(std::exp(static_cast<double>(in[i])));
      if (ref < 1e-37f) continue;  // subnormal results: absolute error only
      int32_t a, b;
      std::memcpy(&a, &out[i], 4);
      std::memcpy(&b, &ref, 4);
      max_ulp = std::max(max_ulp, std::abs(a - b));
    }
  }
  EXPECT_LE(max_ulp, 2);
  float big[16], out[16];
  for (float& v : big) v = 100.0f;
  simd::store(out, simd::exp(simd::load(big)));
  EXPECT_TRUE(std::isinf(out[0]));
  for (float& v : big) v = -200.0f;
  simd::store(out, simd::exp(simd::load(big)));
  EXPECT_EQ(out[0], 0.0f);
}

// Arguments for attention of `q` rows over the pages `kp`, `vp` through `table`, scale 1/8.
PagedAttentionArgs attention_args(const std::vector<float>& q, std::vector<float>& out, const std::vector<float>& kp,
                                  const std::vector<float>& vp, const std::vector<int32_t>& table, int64_t heads,
                                  int64_t kv_heads, int64_t hd, int64_t ps, int64_t cached) {
  PagedAttentionArgs a;
  a.q = q.data();
  a.q_row_stride = heads * hd;
  a.out = out.data();
  a.out_row_stride = heads * hd;
  a.k_pages = kp.data();
  a.v_pages = vp.data();
  a.block_table = table.data();
  a.page_size = ps;
  a.n_heads = heads;
  a.n_kv_heads = kv_heads;
  a.head_dim = hd;
  a.cached_len = cached;
  a.scale = 0.125f;
  return a;
}

// Row r of a call over `a`, computed alone: a one-row call over a cache one slot longer per
// earlier row. True when it gives the bits of `together`, that call's output.
bool row_alone_gives_the_same_bits(const KernelTable& k, PagedAttentionArgs a, int64_t r, const float* together) {
  const int64_t width = a.n_heads * a.head_dim;
  std::vector<float> single(width);
  a.q += r * a.q_row_stride;
  a.out = single.data();
  a.cached_len += r;
  for (int64_t g = 0; g < a.n_kv_heads; ++g) k.attention(a, g, 0, 1);
  return std::memcmp(single.data(), together + r * a.out_row_stride, width * sizeof(float)) == 0;
}

// Attention over a hand-made paged cache against a double-precision softmax reference, and each
// row equal whether computed with its neighbours or alone.
TEST(Kernels, PagedAttentionMatchesReferenceAndIsRowInvariant) {
  const int64_t heads = 6, kv_heads = 2, hd = 64, ps = 16, pages = 8, cached = 70, rows = 9;
  const int64_t group = heads / kv_heads;
  auto kp = random_vector(pages * kv_heads * hd * ps, 7);
  auto vp = random_vector(pages * kv_heads * ps * hd, 8);
  const auto q = random_vector(rows * heads * hd, 9, 0.3f);
  const std::vector<int32_t> table{5, 2, 7, 0, 3, 1, 6, 4};  // scattered pages
  for (const KernelTable* k : tables()) {
    std::vector<float> out(rows * heads * hd);
    PagedAttentionArgs a = attention_args(q, out, kp, vp, table, heads, kv_heads, hd, ps, cached);
    for (int64_t g = 0; g < kv_heads; ++g) k->attention(a, g, 0, rows);
    auto key = [&](int64_t slot, int64_t g, int64_t d) {
      return kp[((table[slot / ps] * kv_heads + g) * hd + d) * ps + slot % ps];
    };
    auto value = [&](int64_t slot, int64_t g, int64_t d) {
      return vp[((table[slot / ps] * kv_heads + g) * ps + slot % ps) * hd + d];
    };
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t len = cached + r + 1;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t g = h / group;
        std::vector<double> s(len);
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < len; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += q[(r * heads + h) * hd + d] * static_cast<double>(key(j, g, d));
          s[j] = dot * 0.125;
          mx = std::max(mx, s[j]);
        }
        for (double& v : s) sum += (v = std::exp(v - mx));
        for (int64_t d = 0; d < hd; ++d) {
          double o = 0;
          for (int64_t j = 0; j < len; ++j) o += s[j] * value(j, g, d);
          ASSERT_NEAR(out[(r * heads + h) * hd + d], o / sum, 1e-5) << k->isa << " row " << r << " head " << h;
        }
      }
      ASSERT_TRUE(row_alone_gives_the_same_bits(*k, a, r, out.data())) << k->isa << " row " << r;
    }
  }
}

// A quantized cache's unpacked slots are read from prefix pages ahead of the paged cache: the same
// slots split between the two (at every page boundary) give bitwise the attention of one paged cache.
TEST(Kernels, PagedAttentionReadsPrefixPagesAsThePagedCache) {
  const int64_t heads = 6, kv_heads = 2, hd = 64, ps = 16, pages = 8, cached = 100, rows = 5;
  const auto kp = random_vector(pages * kv_heads * hd * ps, 17);
  const auto vp = random_vector(pages * kv_heads * ps * hd, 18);
  const auto q = random_vector(rows * heads * hd, 19, 0.3f);
  const std::vector<int32_t> table{5, 2, 7, 0, 3, 1, 6, 4};
  const int64_t page_floats = kv_heads * hd * ps;
  for (const KernelTable* k : tables()) {
    std::vector<float> whole(rows * heads * hd), split(rows * heads * hd);
    const PagedAttentionArgs a = attention_args(q, whole, kp, vp, table, heads, kv_heads, hd, ps, cached);
    for (int64_t g = 0; g < kv_heads; ++g) k->attention(a, g, 0, rows);
    for (int64_t prefix_pages = 1; prefix_pages <= 6; ++prefix_pages) {
      // The first prefix_pages logical pages copied, in order, into contiguous prefix pages.
      std::vector<float> pk(prefix_pages * page_floats), pv(prefix_pages * page_floats);
      for (int64_t p = 0; p < prefix_pages; ++p) {
        std::copy_n(kp.data() + table[p] * page_floats, page_floats, pk.data() + p * page_floats);
        std::copy_n(vp.data() + table[p] * page_floats, page_floats, pv.data() + p * page_floats);
      }
      PagedAttentionArgs b = a;
      b.out = split.data();
      b.block_table = table.data() + prefix_pages;
      b.prefix_k_pages = pk.data();
      b.prefix_v_pages = pv.data();
      b.prefix_len = prefix_pages * ps;
      for (int64_t g = 0; g < kv_heads; ++g) k->attention(b, g, 0, rows);
      ASSERT_EQ(std::memcmp(whole.data(), split.data(), whole.size() * sizeof(float)), 0)
          << k->isa << ", " << prefix_pages << " prefix pages";
    }
  }
}

// The bfloat16 pair product of every build (KernelTable::dot_bf16) on values chosen so that each
// rule of vdpbf16ps changes the result: the odd product is added before the even one, denormal
// inputs read as zero, denormal results flush to zero (keeping the sign), and a product is exact.
TEST(Kernels, BFloat16PairProductFollowsVdpbf16ps) {
  auto bf = [](float x) { return fp32_to_bf16(x); };
  auto pair = [](uint16_t even, uint16_t odd) {
    return static_cast<uint32_t>(even) | static_cast<uint32_t>(odd) << 16;
  };
  const float tiny = std::ldexp(1.0f, -24);
  struct Case {
    const char* rule;
    float acc;
    uint32_t a, b;
    float expected;
  };
  const Case cases[] = {
      // Odd first: (2^-24 + 1) rounds to 1, then 1 + 2^-24 rounds to 1. Even first would give 1 + 2^-23.
      {"odd product first", tiny, pair(bf(tiny), bf(1.0f)), pair(bf(1.0f), bf(1.0f)), 1.0f},
      {"even product second", tiny, pair(bf(1.0f), bf(tiny)), pair(bf(1.0f), bf(1.0f)), 1.0f + 2 * tiny},
      // A bfloat16 denormal (0x0001) times 2^100 would be about 2^-33; read as zero it adds nothing.
      {"denormal input is zero", 1.0f, pair(0x0001, 0), pair(bf(std::ldexp(1.0f, 100)), 0), 1.0f},
      // 2^-64 * 2^-63 = 2^-127, a float32 denormal: flushed to zero, keeping its sign.
      {"denormal result flushes", 0.0f, pair(bf(std::ldexp(1.0f, -64)), 0), pair(bf(-std::ldexp(1.0f, -63)), 0), -0.0f},
      // (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14 is exact in float32 (a product rounded to bfloat16 would
      // lose 2^-14).
      {"exact product", 0.0f, pair(bf(1.0078125f), 0), pair(bf(1.0078125f), 0),
       1.0f + std::ldexp(1.0f, -6) + std::ldexp(1.0f, -14)},
  };
  for (const KernelTable* k : tables()) {
    for (const Case& c : cases) {
      const float got = k->dot_bf16(c.acc, c.a, c.b);
      EXPECT_EQ(float_to_bits(got), float_to_bits(c.expected)) << k->isa << ", " << c.rule << ": " << got;
    }
  }
}

// Attention over bfloat16 pages (KvElement::kBFloat16) computes in bfloat16 products: close to a
// double-precision reference that rounds the queries to bfloat16 (within 2^-9 of the largest
// value: each numerator's rounding to bfloat16 moves its weight by at most 2^-9 of it), not the bits of float32 pages
// holding the same values; identical bits in every build (one page of keys 300 times larger makes some numerators
// float32 denormals), for each row alone or with its neighbours, whole or in the three phases; on both head sizes, with
// and without float prefix pages ahead.
TEST(Kernels, BFloat16PagesComputeInBFloat16Products) {
  const int64_t heads = 6, kv_heads = 2, ps = 16, pages = 8, cached = 100, rows = 5, group = heads / kv_heads;
  const std::vector<int32_t> table{5, 2, 7, 0, 3, 1, 6, 4};
  int64_t denormals = 0;  // numerators in the float32 denormal range, over all cases
  for (const int64_t hd : {64, 128}) {
    auto kp = random_vector(pages * kv_heads * hd * ps, 27);
    const auto vp = random_vector(pages * kv_heads * ps * hd, 28);
    const auto q = random_vector(rows * heads * hd, 29, 0.3f);
    const int64_t page_floats = kv_heads * hd * ps, prefix_pages = 2;
    for (int64_t i = 0; i < page_floats; ++i) kp[table[4] * page_floats + i] *= 300.0f;  // slots 64..79
    std::vector<uint16_t> kb(kp.size()), vb(vp.size());
    std::vector<float> kw(kp.size()), vw(vp.size());  // the bfloat16 values, widened
    for (size_t i = 0; i < kp.size(); ++i) kw[i] = bf16_to_fp32(kb[i] = fp32_to_bf16(kp[i]));
    for (size_t i = 0; i < vp.size(); ++i) vw[i] = bf16_to_fp32(vb[i] = fp32_to_bf16(vp[i]));
    float largest_value = 0;
    for (size_t i = 0; i < vp.size(); ++i) largest_value = std::max({largest_value, std::abs(vp[i]), std::abs(vw[i])});
    std::vector<float> pk(prefix_pages * page_floats), pv(prefix_pages * page_floats);
    for (int64_t p = 0; p < prefix_pages; ++p) {
      std::copy_n(kp.data() + table[p] * page_floats, page_floats, pk.data() + p * page_floats);
      std::copy_n(vp.data() + table[p] * page_floats, page_floats, pv.data() + p * page_floats);
    }
    for (const bool prefix : {false, true}) {
      std::vector<float> first;  // the first build's output
      for (const KernelTable* k : tables()) {
        const std::string where = std::string(k->isa) + ", head_dim " + std::to_string(hd) + (prefix ? ", prefix" : "");
        std::vector<float> widened(rows * heads * hd), bf16(widened.size()), phased(widened.size());
        auto args = [&](const void* kpages, const void* vpages, KvElement element, std::vector<float>& out) {
          PagedAttentionArgs a = attention_args(q, out, kw, vw, table, heads, kv_heads, hd, ps, cached);
          a.k_pages = kpages;
          a.v_pages = vpages;
          a.kv_element = element;
          if (prefix) {
            a.block_table = table.data() + prefix_pages;
            a.prefix_k_pages = pk.data();
            a.prefix_v_pages = pv.data();
            a.prefix_len = prefix_pages * ps;
          }
          return a;
        };
        const PagedAttentionArgs w = args(kw.data(), vw.data(), KvElement::kFloat32, widened);
        const PagedAttentionArgs b = args(kb.data(), vb.data(), KvElement::kBFloat16, bf16);
        for (int64_t g = 0; g < kv_heads; ++g) {
          k->attention(w, g, 0, rows);
          k->attention(b, g, 0, rows);
        }
        EXPECT_NE(std::memcmp(widened.data(), bf16.data(), bf16.size() * sizeof(float)), 0) << where;
        if (first.empty()) first = bf16;
        EXPECT_EQ(std::memcmp(first.data(), bf16.data(), bf16.size() * sizeof(float)), 0) << where << ", builds";

        // The reference: slot j's key and value as the kernel reads them (prefix slots float32,
        // the others bfloat16 with the query rounded to bfloat16 too).
        const int64_t prefix_len = prefix ? prefix_pages * ps : 0;
        auto at = [&](int64_t slot) {
          return slot < prefix_len ? std::pair{slot / ps, true} : std::pair{int64_t{table[slot / ps]}, false};
        };
        double worst = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t len = cached + r + 1;
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t g = h / group;
            const float* qv = q.data() + (r * heads + h) * hd;
            std::vector<double> s(len);
            double mx = -1e300, sum = 0;
            for (int64_t j = 0; j < len; ++j) {
              const auto [page, float_prefix] = at(j);
              const float* keys = float_prefix ? pk.data() : kw.data();
              double dot = 0;
              for (int64_t d = 0; d < hd; ++d) {
                const double qd = float_prefix ? qv[d] : bf16_to_fp32(fp32_to_bf16(qv[d]));
                dot += qd * keys[((page * kv_heads + g) * hd + d) * ps + j % ps];
              }
              mx = std::max(mx, s[j] = dot * 0.125);
            }
            for (double& v : s) sum += (v = std::exp(v - mx));
            for (int64_t d = 0; d < hd; ++d) {
              double o = 0;
              for (int64_t j = 0; j < len; ++j) {
                const auto [page, float_prefix] = at(j);
                o += s[j] * (float_prefix ? pv.data() : vw.data())[((page * kv_heads + g) * ps + j % ps) * hd + d];
              }
              worst = std::max(worst, std::abs(bf16[(r * heads + h) * hd + d] - o / sum));
            }
          }
          EXPECT_TRUE(row_alone_gives_the_same_bits(*k, b, r, bf16.data())) << where << ", row " << r << " alone";
        }
        EXPECT_LT(worst, std::ldexp(largest_value, -9)) << where;

        // The phases over one tile of the 5 rows (15 query vectors), slots in two ranges.
        PagedAttentionArgs ph = b;
        ph.out = phased.data();
        const int64_t count = rows * group, slots = (cached + rows + 15) / 16 * 16;
        std::vector<float> scores(count * slots), sums(count);
        for (int64_t g = 0; g < kv_heads; ++g) {
          k->attention_scores(ph, g, 0, rows, 0, 48, scores.data(), slots);
          k->attention_scores(ph, g, 0, rows, 48, slots, scores.data(), slots);
          for (int64_t t = 0; t < count; ++t) {
            sums[t] = k->softmax_numerators(scores.data() + t * slots, cached + t / group + 1);
          }
          k->attention_values(ph, g, 0, rows, scores.data(), slots, sums.data(), 0, hd);
          denormals += std::count_if(scores.begin(), scores.end(), [](float e) { return e > 0 && e < FLT_MIN; });
        }
        EXPECT_EQ(std::memcmp(phased.data(), bf16.data(), bf16.size() * sizeof(float)), 0) << where << ", phases";
      }
    }
  }
  EXPECT_GT(denormals, 0) << "no numerator was a float32 denormal: the test data no longer reach DAZ";
}

// Code i of `bits` bits, LSB first (the layout's definition, read bit by bit).
uint32_t code_at(const uint8_t* bytes, int64_t i, int bits) {
  uint32_t code = 0;
  for (int b = 0; b < bits; ++b) {
    const int64_t bit = i * bits + b;
    code |= static_cast<uint32_t>((bytes[bit / 8] >> (bit % 8)) & 1) << b;
  }
  return code;
}

float group_value(const uint8_t* group, uint32_t code) {
  uint16_t scale, minimum;
  std::memcpy(&scale, group, 2);
  std::memcpy(&minimum, group + 2, 2);
  const float product = static_cast<float>(code) * fp16_to_fp32(scale);
  return product + fp16_to_fp32(minimum);
}

// Packed pages in the min-max-groups layout (random codes and groups, pages in a shuffled order),
// read in place by attention, give the same bits as the float prefix pages they dequantize to by
// the layout's definition (vericache/packed_layout.h), computed here independently.
TEST(Kernels, PackedPagesReadInPlaceEqualTheirDequantizedFloats) {
  struct Case {
    int64_t hd, ps, key_group, value_group;
    int bits;
  };
  const int64_t heads = 6, kv_heads = 3, rows = 3, float_slots = 21;
  const std::vector<Case> cases{{64, 16, 32, 32, 2},  {64, 16, 32, 16, 3}, {64, 32, 16, 64, 4},
                                {128, 16, 16, 32, 8}, {64, 16, 64, 32, 4}, {128, 32, 32, 128, 2}};
  for (const Case& c : cases) {
    const MinMaxGroupsLayout L{c.ps, kv_heads, c.hd, c.key_group, c.value_group, c.bits};
    ASSERT_EQ(L.violation(), "");
    const int64_t n_packed = 3 * std::max<int64_t>(1, c.key_group / c.ps), stored = n_packed + 2;
    std::mt19937 rng(static_cast<uint32_t>(c.hd + c.ps + c.key_group + c.bits));
    std::vector<uint8_t> storage(stored * L.bytes());
    for (uint8_t& b : storage) b = static_cast<uint8_t>(rng());
    // Finite float16 groups: scale in [2^-10, 2^-2), minimum in (-2, -2^-5].
    auto put_group = [&](uint8_t* at) {
      const auto scale = static_cast<uint16_t>((5 + rng() % 8) << 10 | (rng() & 0x3ff));
      const auto minimum = static_cast<uint16_t>(0x8000 | (10 + rng() % 6) << 10 | (rng() & 0x3ff));
      std::memcpy(at, &scale, 2);
      std::memcpy(at + 2, &minimum, 2);
    };
    for (int64_t p = 0; p < stored; ++p) {
      uint8_t* page = storage.data() + p * L.bytes();
      for (int64_t e = 0; e < L.key_groups_per_page(); ++e) put_group(page + L.key_groups_offset() + 4 * e);
      for (int64_t e = 0; e < L.value_groups_per_page(); ++e) put_group(page + L.value_groups_offset() + 4 * e);
    }
    std::vector<int32_t> packed_pages(stored);
    std::iota(packed_pages.begin(), packed_pages.end(), 0);
    std::shuffle(packed_pages.begin(), packed_pages.end(), rng);
    packed_pages.resize(n_packed);

    // The floats the packed slots stand for, as prefix pages.
    const int64_t page_floats = kv_heads * c.hd * c.ps;
    std::vector<float> pk(n_packed * page_floats), pv(n_packed * page_floats);
    auto page_of = [&](int64_t j) { return storage.data() + packed_pages[j] * L.bytes(); };
    for (int64_t t = 0; t < n_packed * c.ps; ++t) {
      const int64_t j = t / c.ps, o = t % c.ps;
      for (int64_t h = 0; h < kv_heads; ++h) {
        for (int64_t ch = 0; ch < c.hd; ++ch) {
          const int64_t index = ((t / c.key_group) * kv_heads + h) * c.hd + ch;
          const uint8_t* kg =
              page_of(index / L.key_groups_per_page()) + L.key_groups_offset() + 4 * (index % L.key_groups_per_page());
          pk[((j * kv_heads + h) * c.hd + ch) * c.ps + o] =
              group_value(kg, code_at(page_of(j) + L.key_codes_offset(), (h * c.hd + ch) * c.ps + o, c.bits));
          const uint8_t* vg = page_of(j) + L.value_groups_offset() +
                              4 * ((o * kv_heads + h) * (c.hd / c.value_group) + ch / c.value_group);
          pv[((j * kv_heads + h) * c.ps + o) * c.hd + ch] =
              group_value(vg, code_at(page_of(j) + L.value_codes_offset(), (h * c.ps + o) * c.hd + ch, c.bits));
        }
      }
    }

    const int64_t float_pages = (float_slots + rows + c.ps - 1) / c.ps;
    const auto kp = random_vector(float_pages * page_floats, 31);
    const auto vp = random_vector(float_pages * page_floats, 32);
    const auto q = random_vector(rows * heads * c.hd, 33, 0.3f);
    std::vector<int32_t> table(float_pages);
    std::iota(table.rbegin(), table.rend(), 0);
    for (const KernelTable* k : tables()) {
      std::vector<float> from_floats(rows * heads * c.hd), in_place(rows * heads * c.hd);
      PagedAttentionArgs a =
          attention_args(q, from_floats, kp, vp, table, heads, kv_heads, c.hd, c.ps, n_packed * c.ps + float_slots);
      a.prefix_len = n_packed * c.ps;
      a.prefix_k_pages = pk.data();
      a.prefix_v_pages = pv.data();
      for (int64_t g = 0; g < kv_heads; ++g) k->attention(a, g, 0, rows);
      PagedAttentionArgs b = a;
      b.out = in_place.data();
      b.prefix_k_pages = b.prefix_v_pages = nullptr;
      b.packed_layout = &L;
      b.packed_storage = storage.data();
      b.packed_pages = packed_pages.data();
      for (int64_t g = 0; g < kv_heads; ++g) k->attention(b, g, 0, rows);
      ASSERT_EQ(std::memcmp(from_floats.data(), in_place.data(), in_place.size() * sizeof(float)), 0)
          << k->isa << ": head_dim " << c.hd << ", page " << c.ps << ", groups " << c.key_group << "/" << c.value_group
          << ", " << c.bits << " bits";
    }
  }
}

}  // namespace
}  // namespace vericache::cpu
