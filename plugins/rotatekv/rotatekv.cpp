// RotateKV (Su et al., "RotateKV: Accurate and Robust 2-Bit KV Cache Quantization for LLMs via
// Outlier-Aware Adaptive Rotations", IJCAI 2025), as ZunhaiSu/RotateKV quantizes: keys before RoPE,
// Walsh-Hadamard rotated over groups of KV heads and put in a calibrated channel order; values
// Walsh-Hadamard rotated per head; both quantized per token in groups of channels with asymmetric
// round-to-nearest and a clip ratio; tokens carrying the layer's massive activations (attention
// sinks, found at prefill) kept in full precision. At read the key transform is undone and RoPE
// applied at each slot's own position. See README.md for the page layout and the deviations.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <vericache/plugin_abi.h>

#include "../common/exact_slots.h"
#include "../common/packed_bits.h"
#include "../common/plugin_support.h"
#include "../common/rope.h"
#include "rotatekv_calibration.h"

namespace vericache::plugin {
namespace {

// RotateKV's group quantizer (fake_quant.py): hi = clip * max, lo = clip * min, s = (hi - lo) /
// (2^b - 1) stored as float16, z = round(-lo / s) stored as int16; code = clamp(round(x / s) + z, 0,
// 2^b - 1); x^ = s * (code - z). A group with s = 0 stores s = 0, z = 0 and reads back zeros.
struct ZeroPointGroup {
  c10::Half scale;
  int16_t zero;

  static ZeroPointGroup fit(const float* x, int64_t n, int bits, float clip) {
    float lo = x[0], hi = x[0];
    for (int64_t i = 1; i < n; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    const c10::Half s((clip * hi - clip * lo) / static_cast<float>((1 << bits) - 1));
    if (!(static_cast<float>(s) > 0)) return ZeroPointGroup{c10::Half(0.0f), 0};
    const float z = std::nearbyint(-clip * lo / static_cast<float>(s));
    return ZeroPointGroup{s, static_cast<int16_t>(std::clamp(z, -32768.0f, 32767.0f))};
  }
  uint32_t code(float x, int bits) const {
    const float s = static_cast<float>(scale);
    if (!(s > 0)) return 0;
    const float q = std::nearbyint(x / s) + static_cast<float>(zero);
    return static_cast<uint32_t>(std::clamp(q, 0.0f, static_cast<float>((1 << bits) - 1)));
  }
  float value(uint32_t code) const { return static_cast<float>(scale) * (static_cast<float>(code) - zero); }
};
static_assert(sizeof(ZeroPointGroup) == 4, "float16 scale and int16 zero point");

// One packed page of P slots, N = H * d channels per token, groups of G channels, b bits; every
// slot's data is within its page:
//   key codes     [P][N] b bits each, the transformed key in calibrated order
//   value codes   [P][N] b bits each, the rotated value, heads in order
//   key groups    [P][N/G] ZeroPointGroup
//   value groups  [P][N/G] ZeroPointGroup
struct PageLayout {
  int64_t slots = 0, heads = 0, dim = 0, channels = 0, group = 0;
  int bits = 0;
  int64_t value_codes = 0, key_groups = 0, value_groups = 0, bytes = 0;  // byte offsets, size

  PageLayout(int64_t page_size, int64_t n_kv_heads, int64_t head_dim, int64_t group_size, int b)
      : slots(page_size), heads(n_kv_heads), dim(head_dim), channels(n_kv_heads * head_dim), group(group_size), bits(b) {
    value_codes = packed_code_bytes(slots * channels, bits);
    key_groups = 2 * value_codes;
    value_groups = key_groups + 4 * slots * (channels / group);
    bytes = value_groups + 4 * slots * (channels / group);
  }
};

class RotateKv : public CompressorBase {
 public:
  RotateKv(int bits, double clip, int64_t group, int64_t sink_entries, std::string calibration)
      : CompressorBase("rotatekv", CompressorFamily::kQuantization, CompressionMode::kOnline, kAllScenarios,
                       DecodeRows::kIgnored),  // update() reads the first prefill forward only
        bits_(bits),
        clip_(static_cast<float>(clip)),
        group_(group),
        sink_entries_(sink_entries),
        calibration_path_(std::move(calibration)) {}

 protected:
  Status attach_impl(const ModelShape& model) override {
    VC_ASSIGN_OR_RETURN(calibration_, rotatekv::load_calibration(calibration_path_, model));
    rope_.emplace(model.rope_freq_base, model.head_dim);
    return Status();
  }

  Result<PackedFormat> packed_format_impl(const KvLayout& layout) override {
    const int64_t group = group_ == 0 ? layout.head_dim : group_;
    if ((layout.n_kv_heads * layout.head_dim) % group != 0) {
      return Status::invalid_argument("'group_size' (" + std::to_string(group) + ") must divide the " +
                                      std::to_string(layout.n_kv_heads * layout.head_dim) +
                                      " channels of a token's keys (n_kv_heads * head_dim)");
    }
    layout_.emplace(layout.page_size, layout.n_kv_heads, layout.head_dim, group, bits_);
    exact_.emplace(layout.n_kv_heads, layout.head_dim, layout.page_size);
    return PackedFormat{bits_, layout_->bytes, layout.page_size};
  }

  // Sinks: at a request's first prefill forward of a layer, the tokens holding the `sink_entries`
  // largest |x| of the layer's input residual stream (over every token and channel).
  Status update_impl(const LayerActivations& acts, std::vector<LayerDrops>*) override {
    if (sink_entries_ == 0) return Status();
    for (size_t i = 0; i < acts.request_ids.size(); ++i) {
      const int64_t begin = acts.row_offsets[i], n = acts.row_offsets[i + 1] - begin;
      if (acts.cache_lengths[i] != 0 || n == 0) continue;
      const at::Tensor x = acts.residual.narrow(0, begin, n).abs().reshape({-1}).to(at::kCPU, at::kFloat);
      const at::Tensor top = std::get<1>(at::topk(x, std::min<int64_t>(sink_entries_, x.numel()))).to(at::kCPU);
      const at::Tensor positions = acts.positions.narrow(0, begin, n).to(at::kCPU);
      std::set<int64_t>& sinks = requests_[acts.request_ids[i]][acts.layer];
      sinks.clear();
      for (int64_t j = 0; j < top.numel(); ++j) {
        sinks.insert(positions[top[j].item<int64_t>() / acts.residual.size(1)].item<int64_t>());
      }
    }
    return Status();
  }

  Status pack_impl(int64_t layer, const at::Tensor& k, const at::Tensor& v, PackedPages& dest) override {
    const PageLayout& L = *layout_;
    const auto n_pages = static_cast<int64_t>(dest.pages.size());
    const float* kp = k.data_ptr<float>();  // [pages][H][d][P]
    const float* vp = v.data_ptr<float>();  // [pages][H][P][d]
    const at::Tensor positions = dest.positions.contiguous();  // [H, slots]
    const int64_t* pos = positions.data_ptr<int64_t>();
    uint8_t* storage = dest.storage.data_ptr<uint8_t>();
    const std::vector<int32_t>& order = calibration_.key_order[layer];

    at::parallel_for(0, n_pages, 1, [&](int64_t p0, int64_t p1) {
      std::vector<float> key(L.channels), ordered(L.channels), value(L.channels);
      std::vector<float> cos(rope_->pairs()), sin(rope_->pairs());
      for (int64_t j = p0; j < p1; ++j) {
        uint8_t* page = storage + static_cast<int64_t>(dest.pages[j]) * L.bytes;
        std::memset(page, 0, L.key_groups);  // codes are OR-ed in
        for (int64_t t = 0; t < L.slots; ++t) {
          const int64_t slot = j * L.slots + t;
          rope_->angles(pos[slot], cos.data(), sin.data());  // every head of a slot holds the same token
          for (int64_t h = 0; h < L.heads; ++h) {
            for (int64_t c = 0; c < L.dim; ++c) {
              key[h * L.dim + c] = kp[((j * L.heads + h) * L.dim + c) * L.slots + t];
              value[h * L.dim + c] = vp[((j * L.heads + h) * L.slots + t) * L.dim + c];
            }
            rope_->rotate(&key[h * L.dim], cos.data(), sin.data(), /*inverse=*/true);
            rotatekv::walsh_hadamard(&value[h * L.dim], L.dim);
          }
          for (int64_t g = 0; g < L.heads; g += calibration_.head_group) {
            rotatekv::walsh_hadamard(&key[g * L.dim], calibration_.head_group * L.dim);
          }
          for (int64_t c = 0; c < L.channels; ++c) ordered[c] = key[order[c]];
          quantize(ordered.data(), page, 0, L.key_groups, t);
          quantize(value.data(), page, L.value_codes, L.value_groups, t);
        }
      }
    });
    // Sink slots keep their exact keys (after RoPE) and values beside the packed pages.
    const auto request = requests_.find(dest.request_id);
    if (request != requests_.end() && request->second.count(layer)) {
      for (int64_t slot = 0; slot < n_pages * L.slots; ++slot) {
        if (request->second.at(layer).count(pos[slot])) exact_->keep(dest.request_id, layer, pos[slot], kp, vp, slot);
      }
    }
    return Status();
  }

  Status unpack_impl(int64_t layer, const PackedPages& src, at::Tensor& k, at::Tensor& v) override {
    const PageLayout& L = *layout_;
    const auto n_pages = static_cast<int64_t>(src.pages.size());
    const uint8_t* storage = src.storage.data_ptr<uint8_t>();
    const at::Tensor positions = src.positions.contiguous();  // [H, slots]
    const int64_t* pos = positions.data_ptr<int64_t>();
    float* kp = k.data_ptr<float>();
    float* vp = v.data_ptr<float>();
    const std::vector<int32_t>& order = calibration_.key_order[layer];
    at::parallel_for(0, n_pages, 1, [&](int64_t p0, int64_t p1) {
      std::vector<float> key(L.channels), ordered(L.channels), value(L.channels);
      std::vector<float> cos(rope_->pairs()), sin(rope_->pairs());
      for (int64_t j = p0; j < p1; ++j) {
        const uint8_t* page = storage + static_cast<int64_t>(src.pages[j]) * L.bytes;
        for (int64_t t = 0; t < L.slots; ++t) {
          const int64_t slot = j * L.slots + t;
          rope_->angles(pos[slot], cos.data(), sin.data());
          dequantize(page, 0, L.key_groups, t, ordered.data());
          dequantize(page, L.value_codes, L.value_groups, t, value.data());
          for (int64_t c = 0; c < L.channels; ++c) key[order[c]] = ordered[c];
          for (int64_t g = 0; g < L.heads; g += calibration_.head_group) {
            rotatekv::walsh_hadamard(&key[g * L.dim], calibration_.head_group * L.dim);
          }
          for (int64_t h = 0; h < L.heads; ++h) {
            rope_->rotate(&key[h * L.dim], cos.data(), sin.data(), /*inverse=*/false);
            rotatekv::walsh_hadamard(&value[h * L.dim], L.dim);
            for (int64_t c = 0; c < L.dim; ++c) {
              kp[((j * L.heads + h) * L.dim + c) * L.slots + t] = key[h * L.dim + c];
              vp[((j * L.heads + h) * L.slots + t) * L.dim + c] = value[h * L.dim + c];
            }
          }
        }
      }
    });
    exact_->restore(src.request_id, layer, pos, n_pages * L.slots, kp, vp);
    return Status();
  }

  void release_impl(int64_t request_id) override {
    requests_.erase(request_id);
    if (exact_) exact_->forget(request_id);
  }

 private:
  // Slot t's N channels `x`, quantized in groups into the codes at `codes` and the groups at `groups`.
  void quantize(const float* x, uint8_t* page, int64_t codes, int64_t groups, int64_t t) const {
    const PageLayout& L = *layout_;
    for (int64_t g = 0; g < L.channels / L.group; ++g) {
      const ZeroPointGroup q = ZeroPointGroup::fit(x + g * L.group, L.group, bits_, clip_);
      std::memcpy(page + groups + 4 * (t * (L.channels / L.group) + g), &q, sizeof q);
      for (int64_t c = g * L.group; c < (g + 1) * L.group; ++c) {
        put_code(page + codes, t * L.channels + c, bits_, q.code(x[c], bits_));
      }
    }
  }
  void dequantize(const uint8_t* page, int64_t codes, int64_t groups, int64_t t, float* x) const {
    const PageLayout& L = *layout_;
    for (int64_t g = 0; g < L.channels / L.group; ++g) {
      ZeroPointGroup q;
      std::memcpy(&q, page + groups + 4 * (t * (L.channels / L.group) + g), sizeof q);
      for (int64_t c = g * L.group; c < (g + 1) * L.group; ++c) x[c] = q.value(get_code(page + codes, t * L.channels + c, bits_));
    }
  }

  int bits_;
  float clip_;
  int64_t group_;  // 0: head_dim
  int64_t sink_entries_;
  std::string calibration_path_;
  rotatekv::Calibration calibration_;
  std::optional<Rope> rope_;
  std::optional<PageLayout> layout_;  // set by packed_format()
  std::optional<ExactSlots> exact_;   // the sinks' exact keys and values; set by packed_format()
  std::map<int64_t, std::map<int64_t, std::set<int64_t>>> requests_;  // request -> layer -> sink positions
};

Status make_rotatekv(const std::string& json, std::unique_ptr<Compressor>* out) {
  ParamReader p(json);
  const auto bits = static_cast<int>(p.integer("bits", 2, 2, 8));
  // The reference's defaults: clip 0.8 for 2 bits, 1.0 for 3 and 4 (utils.py).
  const double clip = p.number("clip_ratio", bits == 2 ? 0.8 : 1.0, 0.05, 1.0);
  const int64_t group = p.integer("group_size", 0, 0, 1 << 16);
  const int64_t sink_entries = p.integer("sink_entries", 20, 0, 1 << 16);
  const std::string calibration = calibration_path(p, "VERICACHE_ROTATEKV_CALIBRATION");
  VC_RETURN_IF_ERROR(p.finish());
  VC_RETURN_IF_ERROR(check_bit_width(bits));
  *out = std::make_unique<RotateKv>(bits, clip, group, sink_entries, calibration);
  return Status();
}

}  // namespace
}  // namespace vericache::plugin

VC_EXPORT_COMPRESSOR("rotatekv",
                     "RotateKV: Walsh-Hadamard rotated keys (before RoPE, calibrated channel order) and values, per-token "
                     "group quantization with clipping, massive-activation sinks in full precision (ZunhaiSu/RotateKV); "
                     "parameters: calibration (file from vericache calibrate), bits (2), clip_ratio (0.8 at 2 bits, else "
                     "1), group_size (0: head_dim), sink_entries (20)",
                     vericache::CompressorFamily::kQuantization, vericache::CompressionMode::kOnline,
                     vericache::kAllScenarios, vericache::plugin::make_rotatekv)
