// The quantization plugins on the contract's packed pages, without a model: the page holds the bit
// math, a round trip equals an independent float reference of the method's formulas (and stays
// within half a quantization step), packing in blocks equals packing at once, and bad parameters
// are refused with their reason. Engine losslessness with a quantizer drafting is in engine_test.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <vericache/compressor.h>
#include <vericache/plugin_abi.h>

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
void random_pages(int64_t pages, at::Tensor* k, at::Tensor* v, int64_t heads = kHeads) {
  at::manual_seed(7);
  *k = at::randn({pages, heads, kDim, kPage}) * 2;
  *v = at::randn({pages, heads, kPage, kDim});
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

// Slot positions first, first + 1, ... for every one of `heads` KV heads: int64 [heads, slots].
at::Tensor slot_positions(int64_t heads, int64_t slots, int64_t first) {
  return at::arange(first, first + slots, at::kLong).unsqueeze(0).expand({heads, -1}).contiguous();
}

// Packs `k`, `v` as blocks of `block_pages` pages (slot order) into a fresh pool; the slots hold
// positions first_position, first_position + 1, ... of request `request`.
Packed pack_blocks(Compressor& c, const PackedFormat& f, const at::Tensor& k, const at::Tensor& v, int64_t block_pages,
                   int64_t first_position = 0, int64_t request = 0) {
  Packed out{std::move(*PackedPagePool::create(k.size(0) + 3, f.bytes_per_page)), {}};
  std::vector<int32_t> spare;  // taken first, so the blocks' pages are not 0, 1, 2, ...
  EXPECT_TRUE(out.pool.allocate(3, &spare).ok());
  const at::Tensor positions = slot_positions(k.size(1), k.size(0) * kPage, first_position);
  for (int64_t first = 0; first < k.size(0); first += block_pages) {
    std::vector<int32_t> block;
    EXPECT_TRUE(out.pool.allocate(block_pages, &block).ok());
    PackedPages dest{out.pool.storage(), block, positions.narrow(1, first * kPage, block_pages * kPage), request};
    const Status s = c.pack(0, k.narrow(0, first, block_pages).contiguous(), v.narrow(0, first, block_pages).contiguous(), dest);
    EXPECT_TRUE(s.ok()) << s.message();
    out.pages.insert(out.pages.end(), block.begin(), block.end());
  }
  return out;
}

void unpack_all(Compressor& c, const Packed& p, at::Tensor* k, at::Tensor* v, int64_t heads = kHeads,
                int64_t first_position = 0, int64_t request = 0) {
  const auto n = static_cast<int64_t>(p.pages.size());
  *k = at::full({n, heads, kDim, kPage}, NAN);
  *v = at::full({n, heads, kPage, kDim}, NAN);
  const PackedPages src{p.pool.storage(), p.pages, slot_positions(heads, n * kPage, first_position), request};
  const Status s = c.unpack(0, src, *k, *v);
  EXPECT_TRUE(s.ok()) << s.message();
}

// A quantizer's page for layout(): per slot H*d key codes and H*d value codes of `bits` bits and 32
// bits of parameters per group of G keys and per group of G values; packed in blocks of `flush`.
Result<PackedFormat> expect_page_bit_math(Compressor& c, int bits, int64_t group, int64_t flush) {
  auto f = c.packed_format(layout());
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return f;
  const int64_t per_slot_bits = 2 * kHeads * kDim * bits + 2 * (kHeads * kDim / group) * 32;
  EXPECT_EQ(f->bytes_per_page * 8, kPage * per_slot_bits) << c.name() << " " << bits << " bits, G = " << group;
  EXPECT_EQ(f->bit_scheme, bits);
  EXPECT_EQ(f->flush_slots, flush);
  return f;
}

TEST(Kivi, PackedPageHoldsTheBitMath) {
  for (int bits : {2, 3, 4, 8}) {
    for (int64_t group : {16, 32, 64}) {
      auto c = kivi("{\"bits\": " + std::to_string(bits) + ", \"group_size\": " + std::to_string(group) +
                    ", \"residual_length\": 128}");
      ASSERT_NE(c, nullptr);
      // KIVI's parameters: a float16 (scale, min) pair per G keys of a channel and per G values of a token.
      auto f = expect_page_bit_math(*c, bits, group, 128);
      ASSERT_TRUE(f.ok());
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

// A quantizer that only describes its page, for the runtime's checks of a packed format.
class DescribesPage : public CompressorBase {
 public:
  explicit DescribesPage(PackedFormat f)
      : CompressorBase("describes_page", CompressorFamily::kQuantization, CompressionMode::kOnline, kAllScenarios),
        format_(f) {}

 protected:
  Result<PackedFormat> packed_format_impl(const KvLayout&) override { return format_; }

 private:
  PackedFormat format_;
};

// KIVI names the standard min-max-groups layout when the fused kernel can read it (groups of a
// multiple of 16) and keeps it opaque otherwise; the runtime checks a standard layout's definition.
TEST(Kivi, DeclaresTheStandardLayoutTheRuntimeChecks) {
  const KvPageSpec spec{1, kHeads, kDim, kPage};
  for (int bits : {2, 3, 4, 8}) {
    auto c = kivi(R"({"bits": )" + std::to_string(bits) + R"(, "group_size": 32, "residual_length": 64})");
    ASSERT_NE(c, nullptr);
    auto f = checked_packed_format(*c, spec);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(f->layout, PackedLayout::kMinMaxGroups);
    EXPECT_EQ(f->key_group, 32);
    EXPECT_EQ(f->value_group, 32);
    EXPECT_EQ(f->bytes_per_page, (MinMaxGroupsLayout{kPage, kHeads, kDim, 32, 32, bits}.bytes()));
  }
  auto small = kivi(R"({"group_size": 8, "residual_length": 32})");
  ASSERT_NE(small, nullptr);
  auto f = checked_packed_format(*small, spec);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->layout, PackedLayout::kOpaque);

  const MinMaxGroupsLayout good{kPage, kHeads, kDim, 32, 32, 4};
  auto check = [&](PackedFormat format, int64_t page_size = kPage) {
    DescribesPage c(format);
    return checked_packed_format(c, KvPageSpec{1, kHeads, kDim, page_size}).status().message();
  };
  EXPECT_EQ(check({4, good.bytes(), 32, PackedLayout::kMinMaxGroups, 32, 32}), "");
  EXPECT_EQ(check({4, good.bytes() + 1, 32, PackedLayout::kMinMaxGroups, 32, 32}),
            "describes_page: packed format: the min-max-groups layout has " + std::to_string(good.bytes()) +
                " bytes per page, the format says " + std::to_string(good.bytes() + 1));
  EXPECT_EQ(check({4, good.bytes(), 32, PackedLayout::kMinMaxGroups, 24, 32}),
            "describes_page: packed format: min-max-groups layout: key group (24) must be a multiple of 16");
  EXPECT_EQ(check({4, good.bytes(), 64, PackedLayout::kMinMaxGroups, 48, 32}, 32),
            "describes_page: packed format: min-max-groups layout: key group (48) must be a multiple or a divisor of "
            "the page size 32");
  EXPECT_EQ(check({4, good.bytes(), 32, PackedLayout::kMinMaxGroups, 32, 48}),
            "describes_page: packed format: min-max-groups layout: value group (48) must be a multiple of 16 dividing "
            "the head dimension 64");
  EXPECT_EQ(check({4, good.bytes(), 32, static_cast<PackedLayout>(7), 32, 32}), "describes_page: packed format: unknown layout 7");
}

// --- RotateKV ---------------------------------------------------------------------------------

constexpr double kRopeBase = 10000.0;

// A model shape for RotateKV without a model: one layer of `heads` KV heads of kDim channels.
ModelShape rotatekv_shape(int64_t heads) {
  ModelShape shape;
  shape.n_layers = 1;
  shape.d_model = 48;
  shape.n_heads = 2 * heads;
  shape.n_kv_heads = heads;
  shape.head_dim = kDim;
  shape.rope_freq_base = kRopeBase;
  shape.name = "quantizer-test";
  shape.fingerprint = "0123456789abcdef";
  return shape;
}

// `j` in a new temporary file, removed when the test process exits; its path.
std::string write_temp_json(const nlohmann::json& j) {
  static std::vector<std::string> written;
  static const struct RemoveAtExit {
    ~RemoveAtExit() {
      for (const std::string& file : written) std::filesystem::remove(file);
    }
  } cleanup;
  const std::string path = std::filesystem::temp_directory_path() / ("vericache_calibration_" + std::to_string(getpid()) +
                                                                     "_" + std::to_string(written.size()) + ".json");
  written.push_back(path);
  std::ofstream(path) << j.dump();
  return path;
}

// A calibration file in the documented format (plugins/rotatekv/rotatekv_calibration.h), written
// here by hand: `order` is the layer's key-channel order.
std::string write_calibration(const ModelShape& shape, int64_t head_group, const std::vector<int32_t>& order,
                              const std::string& fingerprint = "0123456789abcdef") {
  const nlohmann::json j{{"format", "vericache-calibration"},
                         {"compressor", "rotatekv"},
                         {"version", 1},
                         {"model",
                          {{"name", shape.name}, {"fingerprint", fingerprint}, {"n_layers", 1},
                           {"n_kv_heads", shape.n_kv_heads}, {"head_dim", shape.head_dim}}},
                         {"head_group", head_group},
                         {"layers", nlohmann::json::array({nlohmann::json{{"key_order", order}}})},
                         {"calibration", {{"by", "quantizer_test"}}}};
  return write_temp_json(j);
}

// A random permutation of n channels.
std::vector<int32_t> shuffled(int64_t n) {
  at::manual_seed(11);
  const at::Tensor p = at::randperm(n, at::kInt);
  return std::vector<int32_t>(p.data_ptr<int32_t>(), p.data_ptr<int32_t>() + n);
}

std::shared_ptr<Compressor> rotatekv(const std::string& params, const ModelShape& shape) {
  auto loaded = load_compressor(std::string(VC_PLUGIN_DIR) + "/vc_plugin_rotatekv.so", params);
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  if (!loaded.ok()) return nullptr;
  const Status attached = (*loaded)->attach(shape);
  EXPECT_TRUE(attached.ok()) << attached.message();
  return attached.ok() ? *loaded : nullptr;
}

// The normalized Sylvester Hadamard matrix of size n, built by its recursion.
at::Tensor hadamard(int64_t n) {
  at::Tensor h = at::ones({1, 1});
  while (h.size(0) < n) h = at::cat({at::cat({h, h}, 1), at::cat({h, -h}, 1)}, 0);
  return h / std::sqrt(static_cast<double>(n));
}

// RoPE on x [tokens, heads, d] at `positions` [tokens] (adjacent pairs), or its inverse.
at::Tensor rope(const at::Tensor& x, const at::Tensor& positions, bool inverse) {
  const at::Tensor inv_freq = 1.0 / at::pow(kRopeBase, at::arange(0, kDim, 2, at::kLong).to(at::kFloat) / double(kDim));
  const at::Tensor angle = positions.to(at::kFloat).unsqueeze(1) * inv_freq.unsqueeze(0);  // [tokens, d/2]
  const at::Tensor c = angle.cos().unsqueeze(1), s = (inverse ? -angle.sin() : angle.sin()).unsqueeze(1);
  const at::Tensor pairs = x.reshape({x.size(0), x.size(1), kDim / 2, 2});
  const at::Tensor a = pairs.select(3, 0), b = pairs.select(3, 1);
  return at::stack({a * c - b * s, a * s + b * c}, 3).reshape(x.sizes());
}

// RotateKV's per-token group quantizer over the last axis of x [tokens, N] in groups of G:
// hi = clip max, lo = clip min, s = (hi - lo) / (2^b - 1) in float16, z = round(-lo / s), code =
// clamp(round(x / s) + z, 0, 2^b - 1), x^ = s (code - z). `step` receives s per entry.
at::Tensor rtn_reference(const at::Tensor& x, int64_t group, int bits, double clip, at::Tensor* step) {
  const at::Tensor g = x.reshape({x.size(0), -1, group});
  const at::Tensor lo = std::get<0>(g.min(-1, true)) * clip, hi = std::get<0>(g.max(-1, true)) * clip;
  const double levels = (1 << bits) - 1;
  const at::Tensor s = ((hi - lo) / levels).to(at::kHalf).to(at::kFloat);
  const at::Tensor z = at::round(-lo / s);
  const at::Tensor code = at::clamp(at::round(g / s) + z, 0, levels);
  *step = s.expand_as(g).reshape(x.sizes());
  return (s * (code - z)).reshape(x.sizes());
}

// RotateKV's round trip of keys and values in page layout, written with tensor operations.
void rotatekv_reference(const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions, int64_t head_group,
                        const std::vector<int32_t>& order, int bits, double clip, at::Tensor* k_out, at::Tensor* v_out,
                        at::Tensor* k_step, at::Tensor* v_step) {
  const int64_t pages = k.size(0), heads = k.size(1), n = pages * kPage, channels = heads * kDim;
  const at::Tensor keys = k.permute({0, 3, 1, 2}).reshape({n, heads, kDim});
  const at::Tensor values = v.permute({0, 2, 1, 3}).reshape({n, heads, kDim});
  const at::Tensor hk = hadamard(head_group * kDim), hv = hadamard(kDim);
  const at::Tensor index = at::tensor(order, at::kLong);

  const at::Tensor rotated = at::matmul(rope(keys, positions, true).reshape({n, heads / head_group, -1}), hk);
  const at::Tensor ordered = rotated.reshape({n, channels}).index_select(1, index);
  const at::Tensor k_hat = rtn_reference(ordered, kDim, bits, clip, k_step);
  const at::Tensor unordered = at::zeros_like(k_hat).index_copy(1, index, k_hat);
  const at::Tensor k_back = rope(at::matmul(unordered.reshape({n, heads / head_group, -1}), hk).reshape({n, heads, kDim}),
                                 positions, false);
  *k_out = k_back.reshape({pages, kPage, heads, kDim}).permute({0, 2, 3, 1}).contiguous();

  const at::Tensor v_rot = at::matmul(values, hv).reshape({n, channels});
  const at::Tensor v_hat = rtn_reference(v_rot, kDim, bits, clip, v_step);
  *v_out = at::matmul(v_hat.reshape({n, heads, kDim}), hv).reshape({pages, kPage, heads, kDim}).permute({0, 2, 1, 3}).contiguous();
}

TEST(RotateKv, PackedPageHoldsTheBitMath) {
  const ModelShape shape = rotatekv_shape(3);
  const std::string file = write_calibration(shape, 1, shuffled(3 * kDim));
  for (int bits : {2, 3, 4, 8}) {
    for (int64_t group : {32, 64, 96}) {
      auto c = rotatekv("{\"bits\": " + std::to_string(bits) + ", \"group_size\": " + std::to_string(group) +
                            ", \"calibration\": \"" + file + "\"}",
                        shape);
      ASSERT_NE(c, nullptr);
      // RotateKV's parameters: a float16 scale and an int16 zero point per G keys and per G values of
      // a token. No residual window: each page is packed once it is committed.
      EXPECT_TRUE(expect_page_bit_math(*c, bits, group, kPage).ok());
    }
  }
}

// The round trip equals an independent tensor implementation of RotateKV's formulas (up to float
// rounding of the transforms, which may move a value across a rounding boundary: at most one entry
// in a thousand), and with clip 1 each token's error stays within one quantization step per entry
// (the transforms are orthogonal, so the bound carries over from the rotated space). Grouped-head
// rotations of 1, 2 and 4 heads, a shuffled channel order, positions from 1000 on.
TEST(RotateKv, RoundTripEqualsTheReferenceWithinAStep) {
  constexpr int64_t kRotHeads = 4, kPages = 3;
  const ModelShape shape = rotatekv_shape(kRotHeads);
  const KvLayout four_heads{1, kRotHeads, kDim, kPage};
  const std::vector<int32_t> order = shuffled(kRotHeads * kDim);
  for (int64_t head_group : {1, 2, 4}) {
    const std::string file = write_calibration(shape, head_group, order);
    for (int bits : {2, 3, 4, 8}) {
      for (double clip : {1.0, 0.8}) {
        const std::string label =
            std::to_string(bits) + " bits, head group " + std::to_string(head_group) + ", clip " + std::to_string(clip);
        auto c = rotatekv("{\"bits\": " + std::to_string(bits) + ", \"clip_ratio\": " + std::to_string(clip) +
                              ", \"calibration\": \"" + file + "\"}",
                          shape);
        ASSERT_NE(c, nullptr);
        auto f = c->packed_format(four_heads);
        ASSERT_TRUE(f.ok()) << f.status().message();
        at::Tensor k, v, k_hat, v_hat, k_ref, v_ref, k_step, v_step;
        random_pages(kPages, &k, &v, kRotHeads);
        const Packed p = pack_blocks(*c, *f, k, v, 1, /*first_position=*/1000);
        unpack_all(*c, p, &k_hat, &v_hat, kRotHeads, 1000);
        const at::Tensor positions = at::arange(1000, 1000 + kPages * kPage, at::kLong);
        rotatekv_reference(k, v, positions, head_group, order, bits, clip, &k_ref, &v_ref, &k_step, &v_step);

        for (const auto& [got, want, what] : {std::tuple(k_hat, k_ref, "keys"), std::tuple(v_hat, v_ref, "values")}) {
          const double off = ((got - want).abs() > 1e-3 + 1e-3 * want.abs()).to(at::kDouble).mean().item<double>();
          EXPECT_LE(off, 1e-3) << label << ": " << what << " differ from the reference in " << off * 100 << "% of entries";
        }
        if (clip == 1.0) {
          const double slack = 1.0 + ((1 << bits) - 1) / 2048.0;  // float16 rounding of the step
          const at::Tensor k_err = (k_hat - k).permute({0, 3, 1, 2}).reshape({kPages * kPage, -1}).norm(2, 1);
          const at::Tensor v_err = (v_hat - v).permute({0, 2, 1, 3}).reshape({kPages * kPage, -1}).norm(2, 1);
          const at::Tensor k_bound = (k_step * slack).norm(2, 1) + 1e-4, v_bound = (v_step * slack).norm(2, 1) + 1e-4;
          EXPECT_TRUE((k_err <= k_bound).all().item<bool>())
              << label << ": key error " << (k_err / k_bound).max().item<float>() << " of the bound";
          EXPECT_TRUE((v_err <= v_bound).all().item<bool>())
              << label << ": value error " << (v_err / v_bound).max().item<float>() << " of the bound";
        }
      }
    }
  }
}

// Sink tokens (the largest |x| of the residual stream at a request's first prefill forward) come
// back bit for bit; other tokens, and the same tokens of a request without sinks, do not; a
// released request's sinks are gone.
TEST(RotateKv, SinkTokensComeBackBitExact) {
  const ModelShape shape = rotatekv_shape(kHeads);
  auto c = rotatekv("{\"calibration\": \"" + write_calibration(shape, 1, shuffled(kHeads * kDim)) + "\"}", shape);
  ASSERT_NE(c, nullptr);
  auto f = c->packed_format(layout());
  ASSERT_TRUE(f.ok());
  constexpr int64_t kPages = 2, kRows = kPages * kPage, kRequest = 7;
  at::manual_seed(3);
  // The residual stream holds 20 massive entries, at tokens 3 and 21; the normed attention input
  // (not where RotateKV looks) has its largest entries at token 9.
  at::Tensor residual = at::randn({kRows, shape.d_model});
  residual.index_put_({3, at::indexing::Slice(0, 10)}, 400.0);
  residual.index_put_({21, at::indexing::Slice(10, 20)}, -300.0);
  at::Tensor hidden = at::randn({kRows, shape.d_model});
  hidden.index_put_({9, at::indexing::Slice(0, 20)}, 50.0);
  const std::vector<int64_t> offsets{0, kRows}, ids{kRequest}, cache_lengths{0};
  const std::vector<double> ratios{1.0};
  LayerActivations acts;
  acts.residual = residual;
  acts.hidden = hidden;
  acts.positions = at::arange(kRows, at::kLong);
  acts.row_offsets = offsets;
  acts.request_ids = ids;
  acts.ratios = ratios;
  acts.cache_lengths = cache_lengths;
  std::vector<LayerDrops> drops;
  ASSERT_TRUE(c->update(acts, &drops).ok());
  EXPECT_TRUE(drops.empty());

  at::Tensor k, v, k_hat, v_hat;
  random_pages(kPages, &k, &v);
  const Packed p = pack_blocks(*c, *f, k, v, kPages, 0, kRequest);
  unpack_all(*c, p, &k_hat, &v_hat, kHeads, 0, kRequest);
  auto slot_equal = [](const at::Tensor& a, const at::Tensor& b, int64_t slot) {
    return at::equal(a[slot / kPage].select(2, slot % kPage), b[slot / kPage].select(2, slot % kPage));
  };
  auto value_equal = [](const at::Tensor& a, const at::Tensor& b, int64_t slot) {
    return at::equal(a[slot / kPage].select(1, slot % kPage), b[slot / kPage].select(1, slot % kPage));
  };
  for (int64_t slot = 0; slot < kRows; ++slot) {
    const bool sink = slot == 3 || slot == 21;
    EXPECT_EQ(slot_equal(k_hat, k, slot), sink) << "key of slot " << slot;
    EXPECT_EQ(value_equal(v_hat, v, slot), sink) << "value of slot " << slot;
  }
  at::Tensor k_other, v_other;
  unpack_all(*c, p, &k_other, &v_other, kHeads, 0, /*request=*/8);
  EXPECT_FALSE(slot_equal(k_other, k, 3)) << "another request's token 3 is not a sink";
  c->release(kRequest);
  unpack_all(*c, p, &k_other, &v_other, kHeads, 0, kRequest);
  EXPECT_FALSE(slot_equal(k_other, k, 3)) << "released: the sinks are forgotten";
}

TEST(RotateKv, RefusesMissingOrMismatchedCalibration) {
  const ModelShape shape = rotatekv_shape(kHeads);
  auto attach_error = [&](const std::string& params, const ModelShape& s) {
    auto loaded = load_compressor(std::string(VC_PLUGIN_DIR) + "/vc_plugin_rotatekv.so", params);
    EXPECT_TRUE(loaded.ok());
    return loaded.ok() ? (*loaded)->attach(s).message() : "";
  };
  unsetenv("VERICACHE_ROTATEKV_CALIBRATION");
  EXPECT_EQ(attach_error("{}", shape),
            "rotatekv: no calibration file: make one with 'vericache calibrate --compressor rotatekv --out "
            "rotatekv.json', then pass --params '{\"calibration\": \"rotatekv.json\"}' (or set "
            "VERICACHE_ROTATEKV_CALIBRATION)");
  EXPECT_EQ(attach_error(R"({"calibration": "/nonexistent/r.json"})", shape),
            "rotatekv: cannot read calibration file '/nonexistent/r.json'; make one with 'vericache calibrate "
            "--compressor rotatekv --out /nonexistent/r.json'");
  const std::string other = write_calibration(shape, 1, shuffled(kHeads * kDim), "fedcba9876543210");
  EXPECT_EQ(attach_error("{\"calibration\": \"" + other + "\"}", shape),
            "rotatekv: calibration file '" + other +
                "' was made for model 'quantizer-test' (fingerprint fedcba9876543210), not this one ('quantizer-test', "
                "fingerprint 0123456789abcdef); make one with 'vericache calibrate --compressor rotatekv --out " + other +
                "' --model <this model>");
  std::vector<int32_t> repeated = shuffled(kHeads * kDim);
  repeated[1] = repeated[0];
  const std::string broken = write_calibration(shape, 1, repeated);
  EXPECT_EQ(attach_error("{\"calibration\": \"" + broken + "\"}", shape),
            "rotatekv: calibration file '" + broken + "': a layer's key_order is not a permutation of 192 channels");
  auto c = rotatekv("{\"group_size\": 80, \"calibration\": \"" + write_calibration(shape, 1, shuffled(kHeads * kDim)) +
                        "\"}",
                    shape);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->packed_format(layout()).status().message(),
            "rotatekv: 'group_size' (80) must divide the 192 channels of a token's keys (n_kv_heads * head_dim)");
}


// --- KVQuant ----------------------------------------------------------------------------------

// A KVQuant calibration file in the documented format (plugins/kvquant/kvquant_calibration.h),
// written here by hand: key ranges [lower, upper] per channel, for every bit width the datatype
// `centroids(bits)` with Q-Norm terms (1.1, 0.01).
std::vector<float> centroids(int bits) {
  // Denser near 0, as k-means puts them on bell-shaped data: sign(u) |u|^1.5 on an even grid.
  std::vector<float> c;
  const int n = 1 << bits;
  for (int i = 0; i < n; ++i) {
    const double u = -1.0 + (2.0 * i + 1.0) / n;
    c.push_back(static_cast<float>(std::copysign(std::pow(std::abs(u), 1.5), u)));
  }
  return c;
}

std::string write_kvquant_calibration(const ModelShape& shape, const std::vector<float>& lower,
                                      const std::vector<float>& upper, double outlier_fraction = 0.01,
                                      int broken_bits = 0) {
  nlohmann::json types = nlohmann::json::object();
  for (int bits : {2, 3, 4, 8}) {
    std::vector<float> c = centroids(bits);
    if (bits == broken_bits) std::swap(c[0], c[1]);
    types[std::to_string(bits)] = {{"centroids", c}, {"norm_scale", 1.1}, {"norm_offset", 0.01}};
  }
  const nlohmann::json j{{"format", "vericache-calibration"},
                         {"compressor", "kvquant"},
                         {"version", 1},
                         {"model",
                          {{"name", shape.name}, {"fingerprint", shape.fingerprint}, {"n_layers", 1},
                           {"n_kv_heads", shape.n_kv_heads}, {"head_dim", shape.head_dim}}},
                         {"outlier_fraction", outlier_fraction},
                         {"layers", nlohmann::json::array({nlohmann::json{
                                        {"key_lower", lower}, {"key_upper", upper}, {"key_types", types}, {"value_types", types}}})},
                         {"calibration", {{"by", "quantizer_test"}}}};
  return write_temp_json(j);
}

// Key ranges wide enough for random_pages' keys (normal, sd 2) but for the planted outliers, and
// uneven across channels: [-9 - c/64, 8 + c/32].
std::string kvquant_calibration(const ModelShape& shape, double outlier_fraction = 0.01) {
  std::vector<float> lower, upper;
  for (int64_t c = 0; c < shape.n_kv_heads * shape.head_dim; ++c) {
    lower.push_back(-9.0f - static_cast<float>(c) / 64);
    upper.push_back(8.0f + static_cast<float>(c) / 32);
  }
  return write_kvquant_calibration(shape, lower, upper, outlier_fraction);
}

std::shared_ptr<Compressor> kvquant(const std::string& params, const ModelShape& shape) {
  auto loaded = load_compressor(std::string(VC_PLUGIN_DIR) + "/vc_plugin_kvquant.so", params);
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  if (!loaded.ok()) return nullptr;
  const Status attached = (*loaded)->attach(shape);
  EXPECT_TRUE(attached.ok()) << attached.message();
  return attached.ok() ? *loaded : nullptr;
}

std::string kvquant_params(int bits, const std::string& file, const std::string& more = "") {
  return "{\"bits\": " + std::to_string(bits) + ", \"calibration\": \"" + file + "\"" + more + "}";
}

TEST(KvQuant, PackedPageHoldsTheBitMath) {
  const ModelShape shape = rotatekv_shape(kHeads);
  // Outliers per token: the fraction of the 192 channels, rounded up.
  for (const auto& [fraction, capacity] : {std::pair(0.01, 2), std::pair(0.0, 0), std::pair(0.05, 10)}) {
    const std::string file = kvquant_calibration(shape, fraction);
    for (int bits : {2, 3, 4, 8}) {
      auto c = kvquant(kvquant_params(bits, file), shape);
      ASSERT_NE(c, nullptr);
      auto f = c->packed_format(layout());
      ASSERT_TRUE(f.ok()) << f.status().message();
      // Per token: H*d key codes and H*d value codes of b bits, a float16 (zero, half) value range,
      // and (uint16 channel, float16 value) per outlier for keys and again for values. No residual
      // window: key ranges are static, each page is packed once it is committed.
      const int64_t per_slot_bits = 2 * kHeads * kDim * bits + 32 + 2 * capacity * 32;
      EXPECT_EQ(f->bytes_per_page * 8, kPage * per_slot_bits) << bits << " bits, outlier fraction " << fraction;
      EXPECT_EQ(f->bit_scheme, bits);
      EXPECT_EQ(f->flush_slots, kPage);
    }
  }
}

// KVQuant's round trip written independently with tensor operations (ties between centroids and
// between outlier candidates do not occur on these random values).
void kvquant_reference(const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions, const std::string& file,
                       int bits, bool qnorm, int64_t capacity, at::Tensor* k_out, at::Tensor* v_out,
                       at::Tensor* k_bound) {
  const int64_t pages = k.size(0), heads = k.size(1), n = pages * kPage, channels = heads * kDim;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(file));
  const nlohmann::json& layer = j["layers"][0];
  const at::Tensor lower = at::tensor(layer["key_lower"].get<std::vector<float>>());
  const at::Tensor upper = at::tensor(layer["key_upper"].get<std::vector<float>>());
  const at::Tensor c = at::tensor(centroids(bits));
  const at::Tensor levels = qnorm ? c * 1.1f + 0.01f : c;
  // The largest rounding error of an entry inside [-1, 1]: half the widest gap, or an end's distance.
  const at::Tensor gaps = (c.narrow(0, 1, c.size(0) - 1) - c.narrow(0, 0, c.size(0) - 1)) / 2;
  const double worst =
      std::max({gaps.max().item<double>(), 1.0 - c[-1].item<double>(), 1.0 + c[0].item<double>()});
  auto round_to_levels = [&](const at::Tensor& x) {  // x [rows, N] normalized -> levels of the nearest centroid
    return levels.index_select(0, (x.unsqueeze(-1) - c).abs().argmin(-1).reshape({-1})).reshape(x.sizes());
  };
  auto with_outliers = [](const at::Tensor& x_hat, const at::Tensor& x, const at::Tensor& outlier) {
    return at::where(outlier, x.to(at::kHalf).to(at::kFloat), x_hat);
  };

  // Keys: RoPE undone, per channel against the calibrated range; outliers: outside the range, the
  // `capacity` farthest out.
  const at::Tensor keys = rope(k.permute({0, 3, 1, 2}).reshape({n, heads, kDim}), positions, true).reshape({n, channels});
  const at::Tensor zero = (upper + lower) / 2, half = (upper - lower) / 2;
  const at::Tensor kn = (keys - zero) / half;
  const at::Tensor far = at::where(kn.abs() > 1, kn.abs(), at::zeros_like(kn));
  const at::Tensor k_idx = std::get<1>(far.topk(capacity, 1));
  const at::Tensor k_outlier = at::zeros_like(kn, at::kBool).scatter(1, k_idx, far.gather(1, k_idx) > 0);
  const at::Tensor k_hat = with_outliers(round_to_levels(kn) * half + zero, keys, k_outlier);
  *k_bound = (half * worst).expand({n, channels});
  *k_out = rope(k_hat.reshape({n, heads, kDim}), positions, false).reshape({pages, kPage, heads, kDim}).permute({0, 2, 3, 1}).contiguous();

  // Values: per token; outliers: the `capacity` farthest from the lower median; range of the rest.
  const at::Tensor values = v.permute({0, 2, 1, 3}).reshape({n, channels});
  const at::Tensor median = std::get<0>(values.sort(1)).select(1, (channels - 1) / 2).unsqueeze(1);
  const at::Tensor v_idx = std::get<1>((values - median).abs().topk(capacity, 1));
  const at::Tensor outlier = at::zeros_like(values, at::kBool).scatter(1, v_idx, true);
  const at::Tensor hi = std::get<0>(at::where(outlier, at::full_like(values, -INFINITY), values).max(1, true));
  const at::Tensor lo = std::get<0>(at::where(outlier, at::full_like(values, INFINITY), values).min(1, true));
  const at::Tensor v_zero = ((hi + lo) / 2).to(at::kHalf).to(at::kFloat), v_half = ((hi - lo) / 2).to(at::kHalf).to(at::kFloat);
  const at::Tensor v_hat = with_outliers(round_to_levels((values - v_zero) / v_half) * v_half + v_zero, values, outlier);
  *v_out = v_hat.reshape({pages, kPage, heads, kDim}).permute({0, 2, 1, 3}).contiguous();
}

// The round trip equals the reference (up to float rounding of RoPE, which may move a value across a
// rounding boundary: at most one entry in a thousand), and without Q-Norm every key entry inside its
// calibrated range comes back within the datatype's largest rounding error times the channel's
// half range (checked per head before RoPE, which is orthogonal).
TEST(KvQuant, RoundTripEqualsTheReference) {
  constexpr int64_t kPages = 3;
  const ModelShape shape = rotatekv_shape(kHeads);
  const std::string file = kvquant_calibration(shape);
  for (int bits : {2, 3, 4, 8}) {
    for (bool qnorm : {false, true}) {
      const std::string label = std::to_string(bits) + " bits, qnorm " + (qnorm ? "on" : "off");
      auto c = kvquant(kvquant_params(bits, file, std::string(", \"first_tokens\": 0, \"qnorm\": ") + (qnorm ? "true" : "false")),
                       shape);
      ASSERT_NE(c, nullptr);
      auto f = c->packed_format(layout());
      ASSERT_TRUE(f.ok()) << f.status().message();
      at::Tensor k, v, k_hat, v_hat, k_ref, v_ref, k_bound;
      random_pages(kPages, &k, &v);
      const Packed p = pack_blocks(*c, *f, k, v, 1, /*first_position=*/1000);
      unpack_all(*c, p, &k_hat, &v_hat, kHeads, 1000);
      const at::Tensor positions = at::arange(1000, 1000 + kPages * kPage, at::kLong);
      kvquant_reference(k, v, positions, file, bits, qnorm, 2, &k_ref, &v_ref, &k_bound);
      for (const auto& [got, want, what] : {std::tuple(k_hat, k_ref, "keys"), std::tuple(v_hat, v_ref, "values")}) {
        const double off = ((got - want).abs() > 1e-3 + 1e-3 * want.abs()).to(at::kDouble).mean().item<double>();
        EXPECT_LE(off, 1e-3) << label << ": " << what << " differ from the reference in " << off * 100 << "% of entries";
      }
      if (!qnorm) {
        const int64_t n = kPages * kPage;
        const at::Tensor pre = rope(k.permute({0, 3, 1, 2}).reshape({n, kHeads, kDim}), positions, true).reshape({n, -1});
        const at::Tensor pre_hat = rope(k_hat.permute({0, 3, 1, 2}).reshape({n, kHeads, kDim}), positions, true).reshape({n, -1});
        const at::Tensor inside = (pre.abs() < 8.0f);  // every channel's range holds [-8, 8]
        const at::Tensor err = (pre_hat - pre).abs();
        EXPECT_TRUE((at::where(inside, err - k_bound * 1.0001 - 1e-4, at::zeros_like(err)) <= 0).all().item<bool>())
            << label << ": a key inside its range is off by more than the datatype's rounding";
      }
    }
  }
}

// Outliers come back as their float16 values; with first_tokens = 3 the first three positions come
// back bit for bit and later ones do not; a released request's first tokens are gone.
TEST(KvQuant, OutliersAndFirstTokensComeBackExact) {
  const ModelShape shape = rotatekv_shape(kHeads);
  const std::string file = kvquant_calibration(shape);
  at::Tensor k, v, k_hat, v_hat;
  random_pages(2, &k, &v);
  k.index_put_({0, 1, 6, 0}, 30.5);   // slot 0 (position 0: RoPE leaves it alone), head 1, channel 6
  v.index_put_({1, 0, 4, 9}, -25.0);  // random_pages' value outlier: slot 20, head 0, channel 9
  {
    auto c = kvquant(kvquant_params(4, file, ", \"first_tokens\": 0"), shape);
    ASSERT_NE(c, nullptr);
    const Packed p = pack_blocks(*c, *c->packed_format(layout()), k, v, 2);
    unpack_all(*c, p, &k_hat, &v_hat);
    EXPECT_EQ(k_hat[0][1][6][0].item<float>(), 30.5f);
    EXPECT_EQ(v_hat[1][0][4][9].item<float>(), -25.0f);
    EXPECT_FALSE(at::equal(k_hat[0].select(2, 0), k[0].select(2, 0))) << "first_tokens 0 keeps no token exact";
  }
  constexpr int64_t kRequest = 5;
  auto c = kvquant(kvquant_params(2, file, ", \"first_tokens\": 3"), shape);
  ASSERT_NE(c, nullptr);
  const Packed p = pack_blocks(*c, *c->packed_format(layout()), k, v, 1, 0, kRequest);
  unpack_all(*c, p, &k_hat, &v_hat, kHeads, 0, kRequest);
  for (int64_t slot = 0; slot < 2 * kPage; ++slot) {
    const bool exact = slot < 3;
    EXPECT_EQ(at::equal(k_hat[slot / kPage].select(2, slot % kPage), k[slot / kPage].select(2, slot % kPage)), exact)
        << "key of slot " << slot;
    EXPECT_EQ(at::equal(v_hat[slot / kPage].select(1, slot % kPage), v[slot / kPage].select(1, slot % kPage)), exact)
        << "value of slot " << slot;
  }
  c->release(kRequest);
  unpack_all(*c, p, &k_hat, &v_hat, kHeads, 0, kRequest);
  EXPECT_FALSE(at::equal(v_hat[0].select(1, 1), v[0].select(1, 1))) << "released: the first tokens are forgotten";
}

TEST(KvQuant, RefusesMissingOrMismatchedCalibration) {
  const ModelShape shape = rotatekv_shape(kHeads);
  auto attach_error = [&](const std::string& params) {
    auto loaded = load_compressor(std::string(VC_PLUGIN_DIR) + "/vc_plugin_kvquant.so", params);
    EXPECT_TRUE(loaded.ok());
    return loaded.ok() ? (*loaded)->attach(shape).message() : "";
  };
  unsetenv("VERICACHE_KVQUANT_CALIBRATION");
  EXPECT_EQ(attach_error("{}"),
            "kvquant: no calibration file: make one with 'vericache calibrate --compressor kvquant --out "
            "kvquant.json', then pass --params '{\"calibration\": \"kvquant.json\"}' (or set "
            "VERICACHE_KVQUANT_CALIBRATION)");
  // A RotateKV file is not a KVQuant one.
  const std::string rotatekv_file = write_calibration(shape, 1, shuffled(kHeads * kDim));
  EXPECT_EQ(attach_error("{\"calibration\": \"" + rotatekv_file + "\"}"),
            "kvquant: calibration file '" + rotatekv_file +
                "' is not a KVQuant vericache-calibration JSON file; make one with 'vericache calibrate --compressor "
                "kvquant --out " + rotatekv_file + "'");
  const std::vector<float> lower(kHeads * kDim, -1.0f), upper(kHeads * kDim, 1.0f);
  const std::string unordered = write_kvquant_calibration(shape, lower, upper, 0.01, /*broken_bits=*/3);
  EXPECT_EQ(attach_error("{\"calibration\": \"" + unordered + "\"}"),
            "kvquant: calibration file '" + unordered + "': a layer's 3-bit key datatype is not 8 increasing centroids");
  const std::string short_range = write_kvquant_calibration(shape, std::vector<float>(100, -1.0f), upper);
  EXPECT_EQ(attach_error("{\"calibration\": \"" + short_range + "\"}"),
            "kvquant: calibration file '" + short_range + "': a layer's key range does not have 192 channels");
  auto bad = load_compressor(std::string(VC_PLUGIN_DIR) + "/vc_plugin_kvquant.so", R"({"bits": 5})");
  EXPECT_EQ(bad.status().message(), "plugins: kvquant: bad parameters: 'bits' must be 2, 3, 4 or 8, got 5");
}

}  // namespace
}  // namespace vericache
