// StreamingLLM (Xiao et al., "Efficient Streaming Language Models with Attention Sinks", ICLR 2024)
// as a VeriCache compressor: keep the first `sinks` tokens and the most recent ones, the same set
// for every head. The example of a plugin built outside the tree against the installed package, on
// the TokenScorer base: it only says how tokens score; the base keeps the top floor(c * n).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <vericache/plugin_abi.h>
#include <vericache/token_scorer.h>

namespace {

class StreamingLlm : public vericache::TokenScorer<> {
 public:
  explicit StreamingLlm(int64_t sinks) : TokenScorer("streaming_llm", vericache::CompressionMode::kOffline), sinks_(sinks) {}

 protected:
  // Newer tokens score higher, and the sinks higher still (the earliest first).
  vericache::Status score(const vericache::KvCacheView& full_kv, vericache::ModelAccess&, vericache::NoState&,
                          std::vector<at::Tensor>* scores) override {
    const int64_t n = full_kv.lengths[0];
    const at::Tensor position = at::arange(n, at::kFloat);
    const at::Tensor score = at::where(position < sinks_, 2 * n - position, position);
    for (int64_t layer = 0; layer < full_kv.layout.n_layers; ++layer) {
      scores->push_back(score.unsqueeze(0).expand({full_kv.layout.n_kv_heads, n}));
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
