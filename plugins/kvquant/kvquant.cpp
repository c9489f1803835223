// KVQuant (Hooper et al., "KVQuant: Towards 10 Million Context Length LLM Inference with KV Cache
// Quantization", NeurIPS 2024), as SqueezeAILab/KVQuant quantizes: keys before RoPE, per channel
// against calibrated ranges; values per token; both rounded to a non-uniform datatype (NUQ) fitted
// per layer by k-means at calibration; the entries farthest out kept in float16 as sparse outliers
// (dense-and-sparse); the first tokens kept in full precision. At read RoPE is applied at each
// slot's own position. kvquant_calibration.h holds the normalizations; README.md the page layout
// and the deviations.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <vericache/plugin_abi.h>

#include "../common/exact_slots.h"
#include "../common/packed_bits.h"
#include "../common/plugin_support.h"
#include "../common/rope.h"
#include "kvquant_calibration.h"

namespace vericache::plugin {
namespace {

// A sparse outlier: channel (0xFFFF: unused entry) and its float16 value.
struct Outlier {
  uint16_t channel;
  c10::Half value;
};
static_assert(sizeof(Outlier) == 4, "uint16 channel and float16 value");
constexpr uint16_t kNoOutlier = 0xFFFF;

// One packed page of P slots, N = H * d channels per token, b bits, `capacity` outliers per token
// for keys and again for values; every slot's data is within its page:
//   key codes       [P][N] b bits each, the key before RoPE, heads in order
//   value codes     [P][N] b bits each
//   value ranges    [P] (zero, half) float16
//   key outliers    [P][capacity] Outlier
//   value outliers  [P][capacity] Outlier
struct PageLayout {
  int64_t slots = 0, heads = 0, dim = 0, channels = 0, capacity = 0;
  int bits = 0;
  int64_t value_codes = 0, ranges = 0, key_outliers = 0, value_outliers = 0, bytes = 0;  // byte offsets, size

  PageLayout(int64_t page_size, int64_t n_kv_heads, int64_t head_dim, int64_t outliers, int b)
      : slots(page_size), heads(n_kv_heads), dim(head_dim), channels(n_kv_heads * head_dim), capacity(outliers), bits(b) {
    value_codes = packed_code_bytes(slots * channels, bits);
    ranges = 2 * value_codes;
    key_outliers = ranges + 4 * slots;
    value_outliers = key_outliers + 4 * slots * capacity;
    bytes = value_outliers + 4 * slots * capacity;
  }
};

class KvQuant : public CompressorBase {
 public:
  KvQuant(int bits, bool qnorm, int64_t first_tokens, std::string calibration)
      : CompressorBase("kvquant", CompressorFamily::kQuantization, CompressionMode::kOnline, kAllScenarios,
                       DecodeRows::kIgnored),  // no update(): the runtime packs the slots
        bits_(bits),
        qnorm_(qnorm),
        first_tokens_(first_tokens),
        calibration_path_(std::move(calibration)) {}

 protected:
  Status attach_impl(const ModelShape& model) override {
    VC_ASSIGN_OR_RETURN(calibration_, kvquant::load_calibration(calibration_path_, model));
    rope_.emplace(model.rope_freq_base, model.head_dim);
    return Status();
  }

  Result<PackedFormat> packed_format_impl(const KvLayout& layout) override {
    const int64_t channels = layout.n_kv_heads * layout.head_dim;
    if (channels > kNoOutlier) {
      return Status::invalid_argument("more than 65535 channels per token (n_kv_heads * head_dim = " +
                                      std::to_string(channels) + ")");
    }
    layout_.emplace(layout.page_size, layout.n_kv_heads, layout.head_dim,
                    kvquant::outlier_capacity(calibration_.outlier_fraction, channels), bits_);
    exact_.emplace(layout.n_kv_heads, layout.head_dim, layout.page_size);
    // Key ranges are static: no residual window, a page is packed once it is committed.
    return PackedFormat{bits_, layout_->bytes, layout.page_size};
  }

  Status pack_impl(int64_t layer, const at::Tensor& k, const at::Tensor& v, PackedPages& dest) override {
    const PageLayout& L = *layout_;
    const kvquant::Layer& cal = calibration_.layers[layer];
    const kvquant::Datatype& key_type = cal.key_types.at(bits_);
    const kvquant::Datatype& value_type = cal.value_types.at(bits_);
    const auto n_pages = static_cast<int64_t>(dest.pages.size());
    const float* kp = k.data_ptr<float>();  // [pages][H][d][P]
    const float* vp = v.data_ptr<float>();  // [pages][H][P][d]
    const at::Tensor positions = dest.positions.contiguous();  // [H, slots]; every head of a slot holds one token
    const int64_t* pos = positions.data_ptr<int64_t>();
    uint8_t* storage = dest.storage.data_ptr<uint8_t>();

    at::parallel_for(0, n_pages, 1, [&](int64_t p0, int64_t p1) {
      std::vector<float> key(L.channels), value(L.channels), normalized(L.channels);
      std::vector<float> cos(rope_->pairs()), sin(rope_->pairs());
      for (int64_t j = p0; j < p1; ++j) {
        uint8_t* page = storage + static_cast<int64_t>(dest.pages[j]) * L.bytes;
        std::memset(page, 0, L.ranges);  // codes are OR-ed in
        for (int64_t t = 0; t < L.slots; ++t) {
          const int64_t slot = j * L.slots + t;
          rope_->angles(pos[slot], cos.data(), sin.data());
          for (int64_t h = 0; h < L.heads; ++h) {
            for (int64_t c = 0; c < L.dim; ++c) {
              key[h * L.dim + c] = kp[((j * L.heads + h) * L.dim + c) * L.slots + t];
              value[h * L.dim + c] = vp[((j * L.heads + h) * L.slots + t) * L.dim + c];
            }
            rope_->rotate(&key[h * L.dim], cos.data(), sin.data(), /*inverse=*/true);
          }
          for (int64_t c = 0; c < L.channels; ++c) normalized[c] = kvquant::normalized_key(key[c], cal, c);
          for (int64_t c = 0; c < L.channels; ++c) put_code(page, t * L.channels + c, bits_, key_type.code(normalized[c]));
          write_outliers(page + L.key_outliers, t, kvquant::key_outliers(normalized.data(), L.channels, L.capacity), key);

          const kvquant::ValueRange range = kvquant::value_range(value.data(), L.channels, L.capacity);
          std::memcpy(page + L.ranges + 4 * t, &range.zero, 2);
          std::memcpy(page + L.ranges + 4 * t + 2, &range.half, 2);
          for (int64_t c = 0; c < L.channels; ++c) {
            put_code(page + L.value_codes, t * L.channels + c, bits_, value_type.code(range.normalized(value[c])));
          }
          write_outliers(page + L.value_outliers, t, range.outliers, value);
        }
      }
    });
    for (int64_t slot = 0; slot < n_pages * L.slots; ++slot) {
      if (pos[slot] < first_tokens_) exact_->keep(dest.request_id, layer, pos[slot], kp, vp, slot);
    }
    return Status();
  }

  Status unpack_impl(int64_t layer, const PackedPages& src, at::Tensor& k, at::Tensor& v) override {
    const PageLayout& L = *layout_;
    const kvquant::Layer& cal = calibration_.layers[layer];
    const kvquant::Datatype& key_type = cal.key_types.at(bits_);
    const kvquant::Datatype& value_type = cal.value_types.at(bits_);
    std::vector<float> key_levels(size_t{1} << bits_), value_levels(size_t{1} << bits_);
    for (uint32_t i = 0; i < key_levels.size(); ++i) {
      key_levels[i] = key_type.level(i, qnorm_);
      value_levels[i] = value_type.level(i, qnorm_);
    }
    std::vector<float> key_zero(L.channels), key_half(L.channels);
    for (int64_t c = 0; c < L.channels; ++c) {
      key_zero[c] = (cal.key_upper[c] + cal.key_lower[c]) / 2;
      key_half[c] = (cal.key_upper[c] - cal.key_lower[c]) / 2;
    }
    const auto n_pages = static_cast<int64_t>(src.pages.size());
    const uint8_t* storage = src.storage.data_ptr<uint8_t>();
    const at::Tensor positions = src.positions.contiguous();  // [H, slots]
    const int64_t* pos = positions.data_ptr<int64_t>();
    float* kp = k.data_ptr<float>();
    float* vp = v.data_ptr<float>();
    at::parallel_for(0, n_pages, 1, [&](int64_t p0, int64_t p1) {
      std::vector<float> key(L.channels), value(L.channels);
      std::vector<float> cos(rope_->pairs()), sin(rope_->pairs());
      for (int64_t j = p0; j < p1; ++j) {
        const uint8_t* page = storage + static_cast<int64_t>(src.pages[j]) * L.bytes;
        for (int64_t t = 0; t < L.slots; ++t) {
          const int64_t slot = j * L.slots + t;
          for (int64_t c = 0; c < L.channels; ++c) {
            key[c] = key_levels[get_code(page, t * L.channels + c, bits_)] * key_half[c] + key_zero[c];
          }
          read_outliers(page + L.key_outliers, t, key.data());
          kvquant::ValueRange range;
          std::memcpy(&range.zero, page + L.ranges + 4 * t, 2);
          std::memcpy(&range.half, page + L.ranges + 4 * t + 2, 2);
          for (int64_t c = 0; c < L.channels; ++c) {
            value[c] = range.value(value_levels[get_code(page + L.value_codes, t * L.channels + c, bits_)]);
          }
          read_outliers(page + L.value_outliers, t, value.data());
          rope_->angles(pos[slot], cos.data(), sin.data());
          for (int64_t h = 0; h < L.heads; ++h) {
            rope_->rotate(&key[h * L.dim], cos.data(), sin.data(), /*inverse=*/false);
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
    if (exact_) exact_->forget(request_id);
  }

 private:
  // Slot t's outliers (channels into x), float16, the unused entries marked.
  void write_outliers(uint8_t* region, int64_t t, const std::vector<int32_t>& channels, const std::vector<float>& x) const {
    for (int64_t i = 0; i < layout_->capacity; ++i) {
      const Outlier o = i < static_cast<int64_t>(channels.size())
                            ? Outlier{static_cast<uint16_t>(channels[i]), c10::Half(x[channels[i]])}
                            : Outlier{kNoOutlier, c10::Half(0.0f)};
      std::memcpy(region + 4 * (t * layout_->capacity + i), &o, sizeof o);
    }
  }
  void read_outliers(const uint8_t* region, int64_t t, float* x) const {
    for (int64_t i = 0; i < layout_->capacity; ++i) {
      Outlier o;
      std::memcpy(&o, region + 4 * (t * layout_->capacity + i), sizeof o);
      if (o.channel != kNoOutlier) x[o.channel] = static_cast<float>(o.value);
    }
  }

  int bits_;
  bool qnorm_;
  int64_t first_tokens_;
  std::string calibration_path_;
  kvquant::Calibration calibration_;
  std::optional<Rope> rope_;
  std::optional<PageLayout> layout_;  // set by packed_format()
  std::optional<ExactSlots> exact_;   // the first tokens' exact keys and values; set by packed_format()
};

Status make_kvquant(const std::string& json, std::unique_ptr<Compressor>* out) {
  ParamReader p(json);
  const auto bits = static_cast<int>(p.integer("bits", 4, 2, 8));
  // Q-Norm: the reference uses it for its 2-bit configurations.
  const bool qnorm = p.boolean("qnorm", bits == 2);
  // The reference's LWM checkpoints keep the first 5 tokens in float16 (lwm/README.md).
  const int64_t first_tokens = p.integer("first_tokens", 5, 0, 1 << 20);
  const std::string calibration = calibration_path(p, "VERICACHE_KVQUANT_CALIBRATION");
  VC_RETURN_IF_ERROR(p.finish());
  VC_RETURN_IF_ERROR(check_bit_width(bits));
  *out = std::make_unique<KvQuant>(bits, qnorm, first_tokens, calibration);
  return Status();
}

}  // namespace
}  // namespace vericache::plugin

VC_EXPORT_COMPRESSOR("kvquant",
                     "KVQuant: keys before RoPE per channel against calibrated ranges, values per token, both rounded to "
                     "a per-layer non-uniform datatype (k-means), 1% dense-and-sparse float16 outliers, the first tokens "
                     "in full precision (SqueezeAILab/KVQuant); parameters: calibration (file from vericache calibrate), "
                     "bits (4), qnorm (true at 2 bits), first_tokens (5)",
                     vericache::CompressorFamily::kQuantization, vericache::CompressionMode::kOnline,
                     vericache::kAllScenarios, vericache::plugin::make_kvquant)
