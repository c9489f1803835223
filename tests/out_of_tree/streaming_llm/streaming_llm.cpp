// StreamingLLM (Xiao et al., "Efficient Streaming Language Models with Attention Sinks", ICLR 2024)
// as a VeriCache compressor: keep the first `sinks` tokens and the most recent ones, the same set
// for every head. The example of a plugin built outside the tree against the installed package, on
// the TokenScorer base: it only says how tokens score and which are protected; the base keeps the
// top floor(c * n).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <vericache/plugin_abi.h>
#include <vericache/token_scorer.h>

namespace {

class StreamingLlm : public vericache::TokenScorer<> {
 public:
  explicit StreamingLlm(int64_t sinks) : TokenScorer("streaming_llm", vericache::CompressionMode::kOffline), sinks_(sinks) {}

 protected:
  // Newer tokens score higher: the top floor(c * n) is the recent window, in every layer and head.
  vericache::Status score(const vericache::KvCacheView& kv, vericache::ModelAccess&, vericache::NoState&,
                          std::vector<at::Tensor>* scores) override {
    scores->assign(kv.layout.n_layers, at::arange(kv.lengths[0], at::kFloat).expand({kv.layout.n_kv_heads, -1}));
    return {};
  }
  // The attention sinks: kept before any scored token.
  vericache::ProtectedTokens protected_tokens(int64_t) const override { return {sinks_, 0}; }

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
