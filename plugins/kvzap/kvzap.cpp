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

#include <cstdlib>
#include <string>

#include <vericache/plugin_abi.h>
#include <vericache/token_scorer.h>

#include "../common/plugin_support.h"
#include "kvzap_weights.h"

namespace vericache::plugin {
namespace {

class Kvzap : public TokenScorer<> {
 public:
  Kvzap(std::string weights_path, int64_t window)
      : TokenScorer("kvzap", CompressionMode::kOnline), path_(std::move(weights_path)), window_(window) {}

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

  // The surrogate's prediction of each new token's log KVzip+ score, per KV head.
  Result<at::Tensor> score_rows(const RequestRows& rows, NoState&) override {
    if (weights_.weight.empty()) return Status::internal("update() before attach()");
    const at::Tensor x = rows.hidden.to(at::kCPU, at::kFloat);
    return at::addmm(weights_.bias[rows.layer], x, weights_.weight[rows.layer].t());  // [rows, H]
  }

  int64_t recent_window() const override { return window_; }

 private:
  std::string path_;
  int64_t window_;
  kvzap::SurrogateWeights weights_;
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
