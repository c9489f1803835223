// KVzap (NVIDIA kvpress, "KVzap", 2025): a per-layer surrogate predicts, from a token's attention
// input alone, the log of its KVzip+ score; tokens are evicted online, during prefill and decode,
// once they leave a window of recent tokens. The surrogate is the "linear" kind (ridge regression,
// kvpress's KVzap-linear), fitted by `vericache train-kvzap` with our KVzip+ as the teacher.
//
// Eviction follows the kept-fraction contract instead of DMS's threshold: after every layer's
// forward each KV head of a request keeps max(floor(c * T), min(T, window)) tokens, T the
// request's uncompressed length, evicting its lowest-predicted tokens outside the window (kvpress's
// registry calls this top-k variant kvzap_mlp_head). A threshold would give every head its own
// count, which the contract (same count for every head of a layer) does not allow.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <vector>

#include <vericache/plugin_abi.h>

#include "../common/plugin_support.h"
#include "kvzap_weights.h"

namespace vericache::plugin {
namespace {

struct HeldToken {
  int64_t position;
  float score;
};

class Kvzap : public CompressorBase {
 public:
  Kvzap(std::string weights_path, int64_t window)
      : CompressorBase("kvzap", CompressorFamily::kTokenDropping, CompressionMode::kOnline, kAllScenarios),
        path_(std::move(weights_path)),
        window_(window) {}

 protected:
  Status attach_impl(const ModelShape& shape) override {
    if (path_.empty()) {
      return Status::invalid_argument(
          "no surrogate weights: make them with 'vericache train-kvzap --out kvzap.json', then pass "
          "--params '{\"weights\": \"kvzap.json\"}' (or set VERICACHE_KVZAP_WEIGHTS)");
    }
    VC_ASSIGN_OR_RETURN(weights_, kvzap::load_weights(path_, shape));
    return Status();
  }

  Status update_impl(const LayerActivations& acts, std::vector<LayerDrops>* drops) override {
    if (weights_.weight.empty()) return Status::internal("update() before attach()");
    const int64_t l = acts.layer;
    const at::Tensor positions = acts.positions.to(at::kCPU);
    for (size_t i = 0; i < acts.request_ids.size(); ++i) {
      const int64_t begin = acts.row_offsets[i], end = acts.row_offsets[i + 1];
      if (end == begin) continue;
      const double ratio = i < acts.ratios.size() ? acts.ratios[i] : 1.0;
      const at::Tensor x = acts.hidden.narrow(0, begin, end - begin).to(at::kCPU, at::kFloat);
      const at::Tensor predicted = at::addmm(weights_.bias[l], x, weights_.weight[l].t()).contiguous();  // [rows, H]
      const int64_t heads = predicted.size(1);
      std::vector<std::vector<HeldToken>>& held = state_[acts.request_ids[i]].resize_layers(weights_.weight.size(), heads)[l];
      const int64_t* pos = positions.data_ptr<int64_t>() + begin;
      const float* s = predicted.data_ptr<float>();
      for (int64_t r = 0; r < end - begin; ++r) {
        for (int64_t h = 0; h < heads; ++h) held[h].push_back({pos[r], s[r * heads + h]});
      }
      const int64_t seen = pos[end - begin - 1] + 1;  // the uncompressed length
      const int64_t target = std::max(kept_count(seen, ratio), std::min(seen, window_));
      const auto count = static_cast<int64_t>(held[0].size());
      if (count <= target) continue;
      const int64_t n_drop = count - target;
      at::Tensor dropped = at::empty({heads, n_drop}, at::kLong);
      for (int64_t h = 0; h < heads; ++h) {
        // Candidates: outside the recent window, lowest predicted score first (ties: older first).
        std::vector<HeldToken>& tokens = held[h];
        std::vector<size_t> order;
        for (size_t t = 0; t < tokens.size(); ++t) {
          if (tokens[t].position < seen - window_) order.push_back(t);
        }
        std::partial_sort(order.begin(), order.begin() + n_drop, order.end(), [&](size_t a, size_t b) {
          return tokens[a].score != tokens[b].score ? tokens[a].score < tokens[b].score : tokens[a].position < tokens[b].position;
        });
        std::vector<bool> gone(tokens.size(), false);
        for (int64_t j = 0; j < n_drop; ++j) {
          gone[order[j]] = true;
          dropped[h][j] = tokens[order[j]].position;
        }
        std::vector<HeldToken> kept;
        for (size_t t = 0; t < tokens.size(); ++t) {
          if (!gone[t]) kept.push_back(tokens[t]);
        }
        tokens.swap(kept);
      }
      drops->push_back(LayerDrops{acts.request_ids[i], l, dropped});
    }
    return Status();
  }

  void release_impl(int64_t request_id) override { state_.erase(request_id); }

 private:
  struct RequestState {
    std::vector<std::vector<std::vector<HeldToken>>> layers;  // [layer][head] held tokens, position order
    std::vector<std::vector<std::vector<HeldToken>>>& resize_layers(size_t n_layers, int64_t heads) {
      if (layers.empty()) layers.assign(n_layers, std::vector<std::vector<HeldToken>>(heads));
      return layers;
    }
  };

  std::string path_;
  int64_t window_;
  kvzap::SurrogateWeights weights_;
  std::map<int64_t, RequestState> state_;
};

Status make_kvzap(const std::string& json, std::unique_ptr<Compressor>* out) {
  ParamReader p(json);
  const char* env = std::getenv("VERICACHE_KVZAP_WEIGHTS");
  const std::string weights = p.text("weights", env != nullptr ? env : "");
  const int64_t window = p.integer("window", 128, 0, 1 << 20);
  VC_RETURN_IF_ERROR(p.finish());
  *out = std::make_unique<Kvzap>(weights, window);
  return Status();
}

}  // namespace
}  // namespace vericache::plugin

VC_EXPORT_COMPRESSOR("kvzap",
                     "KVzap learned surrogate of KVzip+ (linear), online eviction; parameters: weights (file from "
                     "vericache train-kvzap; default $VERICACHE_KVZAP_WEIGHTS), window (128)",
                     vericache::CompressorFamily::kTokenDropping, vericache::CompressionMode::kOnline,
                     vericache::kAllScenarios, vericache::plugin::make_kvzap)
