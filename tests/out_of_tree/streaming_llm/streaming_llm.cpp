// StreamingLLM (Xiao et al., "Efficient Streaming Language Models with Attention Sinks", ICLR 2024)
// as a VeriCache compressor: keep the first `sinks` tokens and the most recent ones, the same set
// for every head. The example of a plugin built outside the tree against the installed package.
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include <vericache/plugin_abi.h>

namespace {

class StreamingLlm : public vericache::CompressorBase {
 public:
  explicit StreamingLlm(int64_t sinks)
      : CompressorBase("streaming_llm", vericache::CompressorFamily::kTokenDropping,
                       vericache::CompressionMode::kOffline, vericache::kAllScenarios),
        sinks_(sinks) {}

 protected:
  vericache::Status compress_impl(const vericache::KvCacheView& full_kv, double ratio, vericache::ModelAccess&,
                                  vericache::CompressedKV* out) override {
    out->kept.clear();
    for (int64_t layer = 0; layer < full_kv.layout.n_layers; ++layer) {
      const int64_t n = full_kv.lengths[layer];
      const int64_t keep = std::clamp<int64_t>(static_cast<int64_t>(std::floor(static_cast<double>(n) * ratio)), 1, n);
      const int64_t sinks = std::min(sinks_, keep);
      const at::Tensor kept = at::cat({at::arange(0, sinks, at::kLong), at::arange(n - (keep - sinks), n, at::kLong)});
      out->kept.push_back(kept.unsqueeze(0).expand({full_kv.layout.n_kv_heads, keep}).contiguous());
    }
    return vericache::Status();
  }

 private:
  int64_t sinks_;
};

vericache::Status make_streaming_llm(const std::string& json_params, std::unique_ptr<vericache::Compressor>* out) {
  const auto params = nlohmann::json::parse(json_params.empty() ? "{}" : json_params, nullptr, false);
  if (params.is_discarded() || !params.is_object()) {
    return vericache::Status::invalid_argument("parameters must be a JSON object");
  }
  int64_t sinks = 4;
  for (const auto& [key, value] : params.items()) {
    if (key != "sinks") return vericache::Status::invalid_argument("unknown parameter '" + key + "' (known: sinks)");
    if (!value.is_number_integer() || value.get<int64_t>() < 0) {
      return vericache::Status::invalid_argument("'sinks' must be a non-negative integer, got " + value.dump());
    }
    sinks = value.get<int64_t>();
  }
  *out = std::make_unique<StreamingLlm>(sinks);
  return vericache::Status();
}

}  // namespace

VC_EXPORT_COMPRESSOR("streaming_llm", "attention sinks + recent window (StreamingLLM); parameters: sinks (4)",
                     vericache::CompressorFamily::kTokenDropping, vericache::CompressionMode::kOffline,
                     vericache::kAllScenarios, make_streaming_llm)
