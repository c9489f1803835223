// The quantization plugins on the contract's packed pages, without a model: the page holds the bit
// math, a round trip equals an independent float reference of the method's formulas (and stays
// within half a quantization step), packing in blocks equals packing at once, and bad parameters
// are refused with their reason. Engine losslessness with a quantizer drafting is in engine_test.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include <vericache/compressor.h>

#include "engine/compression.h"
#include "kv/packed_page_pool.h"
#include "loader/plugin_loader.h"

namespace vericache {
namespace {

constexpr int64_t kPage = 16, kHeads = 3, kDim = 64;

std::shared_ptr<Compressor> kivi(const std::string& params) {
  auto loaded = load_compressor(std::string(VC_PLUGIN_DIR) + "/vc_plugin_kivi.so", params);
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  return loaded.ok() ? *loaded : nullptr;
}

std::string load_error(const std::string& params) {
  auto loaded = load_compressor(std::string(VC_PLUGIN_DIR) + "/vc_plugin_kivi.so", params);
  return loaded.ok() ? "" : loaded.status().message();
}

KvLayout layout() { return KvLayout{1, kHeads, kDim, kPage}; }

// Keys and values of `pages` pages, page layout: K [pages, H, d, P], V [pages, H, P, d]. Normal
// values with a few large outliers, and one constant key channel and value group (scale 0).
void random_pages(int64_t pages, at::Tensor* k, at::Tensor* v) {
  at::manual_seed(7);
  *k = at::randn({pages, kHeads, kDim, kPage}) * 2;
  *v = at::randn({pages, kHeads, kPage, kDim});
  k->index_put_({at::indexing::Slice(), 0, 5, at::indexing::Slice()}, 0.75);
  v->index_put_({at::indexing::Slice(), 1, at::indexing::Slice(), at::indexing::Slice(0, 32)}, -1.5);
  k->index_put_({0, 2, 7, 3}, 40.0);
  v->index_put_({1, 0, 4, 9}, -25.0);
}

// KIVI's quantizer, written independently with tensor operations: groups along the last axis of
// `x` [..., groups * G]: m = min, s = (max - m) / (2^b - 1), both rounded to float16; code =
// clamp(round((x - m) / s), 0, 2^b - 1) (0 where s = 0); x^ = code * s + m. `step` receives s.
at::Tensor kivi_reference(const at::Tensor& x, int64_t group, int bits, at::Tensor* step) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() /= group;
  shape.push_back(group);
  const at::Tensor g = x.reshape(shape);
  const at::Tensor lo = std::get<0>(g.min(-1, true)), hi = std::get<0>(g.max(-1, true));
  const double levels = (1 << bits) - 1;
  const at::Tensor s = ((hi - lo) / levels).to(at::kHalf).to(at::kFloat);
  const at::Tensor m = lo.to(at::kHalf).to(at::kFloat);
  const at::Tensor code = at::where(s > 0, at::clamp(at::round((g - m) / s), 0, levels), at::zeros_like(g));
  *step = s.expand_as(g).reshape(x.sizes());
  return (code * s + m).reshape(x.sizes());
}

struct Packed {
  PackedPagePool pool;
  std::vector<int32_t> pages;
};

// Packs `k`, `v` as blocks of `block_pages` pages (slot order) into a fresh pool.
Packed pack_blocks(Compressor& c, const PackedFormat& f, const at::Tensor& k, const at::Tensor& v, int64_t block_pages) {
  Packed out{std::move(*PackedPagePool::create(k.size(0) + 3, f.bytes_per_page)), {}};
  std::vector<int32_t> spare;  // taken first, so the blocks' pages are not 0, 1, 2, ...
  EXPECT_TRUE(out.pool.allocate(3, &spare).ok());
  const at::Tensor positions = at::arange(k.size(0) * kPage, at::kLong).unsqueeze(0).expand({kHeads, -1}).contiguous();
  for (int64_t first = 0; first < k.size(0); first += block_pages) {
    std::vector<int32_t> block;
    EXPECT_TRUE(out.pool.allocate(block_pages, &block).ok());
    PackedPages dest{out.pool.storage(), block, positions.narrow(1, first * kPage, block_pages * kPage)};
    const Status s = c.pack(0, k.narrow(0, first, block_pages).contiguous(), v.narrow(0, first, block_pages).contiguous(), dest);
    EXPECT_TRUE(s.ok()) << s.message();
    out.pages.insert(out.pages.end(), block.begin(), block.end());
  }
  return out;
}

void unpack_all(Compressor& c, const Packed& p, at::Tensor* k, at::Tensor* v) {
  const auto n = static_cast<int64_t>(p.pages.size());
  *k = at::full({n, kHeads, kDim, kPage}, NAN);
  *v = at::full({n, kHeads, kPage, kDim}, NAN);
  const at::Tensor positions = at::arange(n * kPage, at::kLong).unsqueeze(0).expand({kHeads, -1}).contiguous();
  const PackedPages src{p.pool.storage(), p.pages, positions};
  const Status s = c.unpack(0, src, *k, *v);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(Kivi, PackedPageHoldsTheBitMath) {
  for (int bits : {2, 3, 4, 8}) {
    for (int64_t group : {16, 32, 64}) {
      auto c = kivi("{\"bits\": " + std::to_string(bits) + ", \"group_size\": " + std::to_string(group) +
                    ", \"residual_length\": 128}");
      ASSERT_NE(c, nullptr);
      auto f = c->packed_format(layout());
      ASSERT_TRUE(f.ok()) << f.status().message();
      // Per slot: H*d key codes and H*d value codes of `bits` bits, and a float16 (scale, min) pair
      // per G keys of a channel and per G values of a token.
      const int64_t per_slot_bits = 2 * kHeads * kDim * bits + 2 * (kHeads * kDim / group) * 32;
      EXPECT_EQ(f->bytes_per_page * 8, kPage * per_slot_bits) << bits << " bits, G = " << group;
      EXPECT_EQ(f->bit_scheme, bits);
      EXPECT_EQ(f->flush_slots, 128);
      std::printf("kivi %d bits G=%lld: %lld bytes per slot, %.4f of float32\n", bits, static_cast<long long>(group),
                  static_cast<long long>(f->bytes_per_page / kPage),
                  static_cast<double>(f->bytes_per_page) / (kPage * 2 * kHeads * kDim * 4));
    }
  }
}

TEST(Kivi, RoundTripEqualsTheReferenceWithinHalfAStep) {
  for (int bits : {2, 3, 4, 8}) {
    for (int64_t group : {16, 32}) {
      auto c = kivi("{\"bits\": " + std::to_string(bits) + ", \"group_size\": " + std::to_string(group) +
                    ", \"residual_length\": 32}");
      ASSERT_NE(c, nullptr);
      auto f = c->packed_format(layout());
      ASSERT_TRUE(f.ok());
      at::Tensor k, v, k_hat, v_hat;
      random_pages(4, &k, &v);
      const Packed p = pack_blocks(*c, *f, k, v, 2);
      unpack_all(*c, p, &k_hat, &v_hat);

      // Keys per channel along tokens: [H, d, tokens]; values per token along channels.
      const at::Tensor k_tokens = k.permute({1, 2, 0, 3}).reshape({kHeads, kDim, 4 * kPage});
      at::Tensor k_step, v_step;
      const at::Tensor k_ref = kivi_reference(k_tokens, group, bits, &k_step);
      const at::Tensor v_ref = kivi_reference(v, group, bits, &v_step);
      const at::Tensor k_got = k_hat.permute({1, 2, 0, 3}).reshape({kHeads, kDim, 4 * kPage});
      const std::string label = std::to_string(bits) + " bits, G = " + std::to_string(group);
      EXPECT_TRUE(at::equal(k_got, k_ref)) << label << ": keys differ from the reference by up to "
                                           << (k_got - k_ref).abs().max().item<float>();
      EXPECT_TRUE(at::equal(v_hat, v_ref)) << label << ": values differ from the reference by up to "
                                           << (v_hat - v_ref).abs().max().item<float>();
      // Half a step, with room for the float16 rounding of the group's minimum (relative 2^-11 of
      // |m| <= |x| + range) and of its step (relative 2^-11, times up to 2^b - 1 steps).
      const double levels = (1 << bits) - 1;
      auto bound = [&](const at::Tensor& step, const at::Tensor& x) {
        return step * (0.5 + levels / 512.0) + x.abs() / 1024.0 + 1e-6;
      };
      EXPECT_TRUE(((k_got - k_tokens).abs() <= bound(k_step, k_tokens)).all().item<bool>()) << label;
      EXPECT_TRUE(((v_hat - v).abs() <= bound(v_step, v)).all().item<bool>()) << label;
      // The constant channel and value group come back exactly (to float16 of their value).
      EXPECT_TRUE((k_hat.select(1, 0).select(1, 5) == 0.75f).all().item<bool>()) << label;
      EXPECT_TRUE((v_hat.select(1, 1).narrow(2, 0, 32) == -1.5f).all().item<bool>()) << label;
    }
  }
}

TEST(Kivi, PackingBlockByBlockEqualsPackingAtOnce) {
  auto c = kivi(R"({"bits": 2, "group_size": 32, "residual_length": 32})");
  ASSERT_NE(c, nullptr);
  auto f = c->packed_format(layout());
  ASSERT_TRUE(f.ok());
  at::Tensor k, v;
  random_pages(8, &k, &v);
  const Packed at_once = pack_blocks(*c, *f, k, v, 8);
  const Packed streamed = pack_blocks(*c, *f, k, v, 2);
  at::Tensor k1, v1, k2, v2;
  unpack_all(*c, at_once, &k1, &v1);
  unpack_all(*c, streamed, &k2, &v2);
  EXPECT_TRUE(at::equal(k1, k2));
  EXPECT_TRUE(at::equal(v1, v2));
  for (size_t j = 0; j < at_once.pages.size(); ++j) {
    EXPECT_TRUE(at::equal(at_once.pool.storage()[at_once.pages[j]], streamed.pool.storage()[streamed.pages[j]]))
        << "page " << j << " holds other bytes";
  }
}

TEST(Kivi, RefusesParametersThatDoNotFit) {
  EXPECT_EQ(load_error(R"({"bits": 5})"), "plugins: kivi: bad parameters: 'bits' must be 2, 3, 4 or 8, got 5");
  EXPECT_EQ(load_error(R"({"group_size": 32, "residual_length": 48})"),
            "plugins: kivi: bad parameters: 'residual_length' (48) must be a multiple of 'group_size' (32): keys are "
            "quantized in whole groups of tokens");
  auto c = kivi(R"({"group_size": 48, "residual_length": 96})");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->packed_format(layout()).status().message(),
            "kivi: 'group_size' (48) must divide the head dimension 64 (values are grouped along channels)");
  auto d = kivi(R"({"group_size": 8, "residual_length": 40})");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->packed_format(layout()).status().message(),
            "kivi: 'residual_length' (40) must be a multiple of the KV page size 16");
  // A token-dropping plugin has no packed pages.
  auto snapkv = load_compressor(std::string(VC_PLUGIN_DIR) + "/vc_plugin_snapkv.so", "{}");
  ASSERT_TRUE(snapkv.ok());
  EXPECT_EQ((*snapkv)->packed_format(layout()).status().message(), "snapkv: not a quantizer (no packed pages)");
}

}  // namespace
}  // namespace vericache
