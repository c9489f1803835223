// KIVI (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", ICML 2024), as
// jy-yuan/KIVI quantizes: asymmetric min-max round-to-nearest, keys per channel over groups of
// `group_size` consecutive tokens (after RoPE), values per token over groups of `group_size`
// channels; float16 scale and minimum per group; the newest tokens stay in full precision and are
// quantized in blocks of `residual_length` tokens once a block is complete (a block, never one
// token at a time: one-token key groups would have min = max). See README.md for the page layout
// and where this differs from the reference.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <vericache/plugin_abi.h>

#include "../common/packed_bits.h"
#include "../common/plugin_support.h"

namespace vericache::plugin {
namespace {

// The page is vericache/packed_layout.h's MinMaxGroupsLayout with key_group = value_group =
// group_size (KIVI's arrangement, which that layout standardises): key codes channel-major, value
// codes token-major, key groups striped over the layer's pages, value groups per slot.
void put_group(uint8_t* at, const MinMaxGroup& g) { std::memcpy(at, &g, sizeof g); }
MinMaxGroup get_group(const uint8_t* at) {
  MinMaxGroup g;
  std::memcpy(&g, at, sizeof g);
  return g;
}
static_assert(sizeof(MinMaxGroup) == 4, "two float16 values");

// The layout's sizes and byte offsets under short names (G: the group size, keys and values).
struct Geometry {
  int64_t P, H, D, G, bytes, kgpp, key_groups, value_codes, value_groups;
};
Geometry geometry(const MinMaxGroupsLayout& L) {
  return {L.page_size,           L.n_kv_heads,           L.head_dim,           L.key_group,          L.bytes(),
          L.key_groups_per_page(), L.key_groups_offset(), L.value_codes_offset(), L.value_groups_offset()};
}

class Kivi : public CompressorBase {
 public:
  Kivi(int bits, int64_t group, int64_t residual)
      : CompressorBase("kivi", CompressorFamily::kQuantization, CompressionMode::kOnline, kAllScenarios,
                       DecodeRows::kIgnored),  // no update(): the runtime packs the slots
        bits_(bits),
        group_(group),
        residual_(residual) {}

 protected:
  Result<PackedFormat> packed_format_impl(const KvLayout& layout) override {
    if (layout.head_dim % group_ != 0) {
      return Status::invalid_argument("'group_size' (" + std::to_string(group_) + ") must divide the head dimension " +
                                      std::to_string(layout.head_dim) + " (values are grouped along channels)");
    }
    if (residual_ % layout.page_size != 0) {
      return Status::invalid_argument("'residual_length' (" + std::to_string(residual_) +
                                      ") must be a multiple of the KV page size " + std::to_string(layout.page_size));
    }
    layout_ = MinMaxGroupsLayout{layout.page_size, layout.n_kv_heads, layout.head_dim, group_, group_, bits_};
    // Groups the fused kernel cannot read (not multiples of 16) are read through unpack().
    const PackedLayout standard = layout_->violation().empty() ? PackedLayout::kMinMaxGroups : PackedLayout::kOpaque;
    return PackedFormat{bits_, layout_->bytes(), residual_, standard, group_, group_};
  }

  Status pack_impl(int64_t, const at::Tensor& k, const at::Tensor& v, PackedPages& dest) override {
    const auto [P, H, D, G, bytes, kgpp, key_groups, value_codes, value_groups] = geometry(*layout_);
    const int64_t n_pages = static_cast<int64_t>(dest.pages.size());
    if (k.size(0) != n_pages || (n_pages * P) % G != 0) {
      return Status::internal("pack: a block must be whole pages and whole key groups");
    }
    const float* kp = k.data_ptr<float>();  // [pages][H][d][P]
    const float* vp = v.data_ptr<float>();  // [pages][H][P][d]
    uint8_t* storage = dest.storage.data_ptr<uint8_t>();
    auto page = [&](int64_t j) { return storage + static_cast<int64_t>(dest.pages[j]) * bytes; };
    for (int64_t j = 0; j < n_pages; ++j) std::memset(page(j), 0, key_groups);  // codes are OR-ed in

    // Keys: per (token group, head, channel), G consecutive slots, possibly across pages.
    const int64_t token_groups = n_pages * P / G;
    for (int64_t g = 0; g < token_groups; ++g) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t c = 0; c < D; ++c) {
          float lo = INFINITY, hi = -INFINITY;
          for (int64_t t = g * G; t < (g + 1) * G; ++t) {
            const float x = kp[((t / P * H + h) * D + c) * P + t % P];
            lo = std::min(lo, x);
            hi = std::max(hi, x);
          }
          const MinMaxGroup q = MinMaxGroup::fit(lo, hi, bits_);
          const int64_t index = (g * H + h) * D + c;
          put_group(page(index / kgpp) + key_groups + 4 * (index % kgpp), q);
          for (int64_t t = g * G; t < (g + 1) * G; ++t) {
            const int64_t within = (h * D + c) * P + t % P;
            put_code(page(t / P), within, bits_, q.code(kp[(t / P * H * D) * P + within], bits_));
          }
        }
      }
    }

    // Values: per (slot, head, channel group).
    const int64_t groups = D / G;
    for (int64_t j = 0; j < n_pages; ++j) {
      for (int64_t t = 0; t < P; ++t) {
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t gc = 0; gc < groups; ++gc) {
            const int64_t first = (h * P + t) * D + gc * G;
            const float* x = vp + j * H * P * D + first;
            float lo = INFINITY, hi = -INFINITY;
            for (int64_t c = 0; c < G; ++c) {
              lo = std::min(lo, x[c]);
              hi = std::max(hi, x[c]);
            }
            const MinMaxGroup q = MinMaxGroup::fit(lo, hi, bits_);
            put_group(page(j) + value_groups + 4 * ((t * H + h) * groups + gc), q);
            for (int64_t c = 0; c < G; ++c) put_code(page(j) + value_codes, first + c, bits_, q.code(x[c], bits_));
          }
        }
      }
    }
    return Status();
  }

  Status unpack_impl(int64_t, const PackedPages& src, at::Tensor& k, at::Tensor& v) override {
    const auto [P, H, D, G, bytes, kgpp, key_groups, value_codes, value_groups] = geometry(*layout_);
    const auto n_pages = static_cast<int64_t>(src.pages.size());
    const uint8_t* storage = src.storage.data_ptr<uint8_t>();
    float* kp = k.data_ptr<float>();
    float* vp = v.data_ptr<float>();
    const int64_t groups = D / G;
    at::parallel_for(0, n_pages, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t j = p0; j < p1; ++j) {
        const uint8_t* page = storage + static_cast<int64_t>(src.pages[j]) * bytes;
        float* kj = kp + j * H * D * P;
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t c = 0; c < D; ++c) {
            for (int64_t t = 0; t < P; ++t) {
              const int64_t g = (j * P + t) / G;
              const int64_t index = (g * H + h) * D + c;
              const MinMaxGroup q = get_group(storage +
                                              static_cast<int64_t>(src.pages[index / kgpp]) * bytes +
                                              key_groups + 4 * (index % kgpp));
              const int64_t within = (h * D + c) * P + t;
              kj[within] = q.value(get_code(page, within, bits_));
            }
          }
        }
        float* vj = vp + j * H * P * D;
        for (int64_t t = 0; t < P; ++t) {
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t gc = 0; gc < groups; ++gc) {
              const MinMaxGroup q = get_group(page + value_groups + 4 * ((t * H + h) * groups + gc));
              const int64_t first = (h * P + t) * D + gc * G;
              for (int64_t c = 0; c < G; ++c) vj[first + c] = q.value(get_code(page + value_codes, first + c, bits_));
            }
          }
        }
      }
    });
    return Status();
  }

 private:
  int bits_;
  int64_t group_;
  int64_t residual_;
  std::optional<MinMaxGroupsLayout> layout_;  // set by packed_format()
};

Status make_kivi(const std::string& json, std::unique_ptr<Compressor>* out) {
  ParamReader p(json);
  const auto bits = static_cast<int>(p.integer("bits", 2, 2, 8));
  const int64_t group = p.integer("group_size", 32, 1, 4096);
  const int64_t residual = p.integer("residual_length", 32, 1, 1 << 20);
  VC_RETURN_IF_ERROR(p.finish());
  VC_RETURN_IF_ERROR(check_bit_width(bits));
  if (residual % group != 0) {
    return Status::invalid_argument("'residual_length' (" + std::to_string(residual) +
                                    ") must be a multiple of 'group_size' (" + std::to_string(group) +
                                    "): keys are quantized in whole groups of tokens");
  }
  *out = std::make_unique<Kivi>(bits, group, residual);
  return Status();
}

}  // namespace
}  // namespace vericache::plugin

VC_EXPORT_COMPRESSOR("kivi",
                     "KIVI asymmetric quantization: keys per channel, values per token, full-precision residual "
                     "(jy-yuan/KIVI); parameters: bits (2), group_size (32), residual_length (32)",
                     vericache::CompressorFamily::kQuantization, vericache::CompressionMode::kOnline,
                     vericache::kAllScenarios, vericache::plugin::make_kivi)
