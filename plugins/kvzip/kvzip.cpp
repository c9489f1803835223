// KVzip as a VeriCache compressor: scores from kvzip_scorer.h, then the kept set.
//
// The contract keeps the same count for every KV head of a layer (counts free across layers).
// allocation "global" (default) follows kvpress's layerwise=False as closely as that allows: the
// L * H * k highest scores over all layers and heads (k = floor(c * n)) decide each layer's share,
// which becomes that layer's per-head count (largest remainders, total exactly L * k); each head
// then keeps its top tokens. allocation "uniform" keeps k per head in every layer (like the
// original's pair-uniform level). The first n_sink positions are always kept; positions in
// [n_sink, context_start) too with keep_prefix (the original keeps the whole system prompt), or
// they score 0 and go first without it (kvpress).
#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include <vericache/plugin_abi.h>
#include <vericache/token_scorer.h>

#include "../common/plugin_support.h"
#include "kvzip_scorer.h"

namespace vericache::plugin {
namespace {

// Per-layer per-head counts summing to n_layers * per_layer, in proportion to where the globally
// highest scores fall; each count within [lowest, n].
std::vector<int64_t> global_allocation(const std::vector<at::Tensor>& scores, int64_t per_layer, int64_t lowest) {
  const auto layers = static_cast<int64_t>(scores.size());
  const int64_t heads = scores[0].size(0), n = scores[0].size(1);
  const int64_t total = layers * per_layer;
  const at::Tensor all = at::stack(scores).reshape({-1});
  const at::Tensor top = std::get<1>(at::topk(all, total * heads));
  const at::Tensor per = at::bincount(at::floor_divide(top, heads * n), {}, layers);
  std::vector<int64_t> count(layers);
  std::vector<std::pair<double, int64_t>> remainder;
  int64_t assigned = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const double share = static_cast<double>(per[l].item<int64_t>()) / static_cast<double>(heads);
    count[l] = static_cast<int64_t>(std::floor(share));
    assigned += count[l];
    remainder.push_back({share - std::floor(share), l});
  }
  std::sort(remainder.begin(), remainder.end(), [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  for (int64_t i = 0; assigned < total; ++i, ++assigned) ++count[remainder[i % layers].second];
  // Clamp into [lowest, n] and move the difference to layers that have room.
  for (int64_t& c : count) c = std::clamp(c, lowest, n);
  int64_t sum = std::accumulate(count.begin(), count.end(), int64_t{0});
  for (int64_t l = 0; sum > total && l < layers; ++l) {
    const int64_t take = std::min(sum - total, count[l] - lowest);
    count[l] -= take;
    sum -= take;
  }
  for (int64_t l = 0; sum < total && l < layers; ++l) {
    const int64_t give = std::min(total - sum, n - count[l]);
    count[l] += give;
    sum += give;
  }
  return count;
}

class Kvzip : public TokenScorer<> {
 public:
  Kvzip(kvzip::ScoringOptions options, bool global, bool keep_prefix)
      : TokenScorer("kvzip", CompressionMode::kOffline), options_(options), global_(global), keep_prefix_(keep_prefix) {}

 protected:
  Status score(const KvCacheView& full_kv, ModelAccess& model, NoState&, std::vector<at::Tensor>* scores) override {
    return kvzip::score_context(full_kv, model, options_, scores);
  }

  ProtectedTokens protected_tokens(int64_t n) const override {
    return {std::min(keep_prefix_ ? std::max(options_.n_sink, options_.context_start) : options_.n_sink, n), 0};
  }

  std::vector<int64_t> layer_budgets(const std::vector<at::Tensor>& scores, int64_t keep,
                                     int64_t protected_count) const override {
    return global_ ? global_allocation(scores, keep, protected_count) : std::vector<int64_t>(scores.size(), keep);
  }

 private:
  kvzip::ScoringOptions options_;
  bool global_;
  bool keep_prefix_;
};

Status make_kvzip(const std::string& json, std::unique_ptr<Compressor>* out) {
  ParamReader p(json);
  kvzip::ScoringOptions o;
  o.n_sink = p.integer("n_sink", o.n_sink, 0, 1 << 20);
  o.chunk_size = p.integer("chunk_size", o.chunk_size, 16, 1 << 20);
  o.context_start = p.integer("context_start", o.n_sink, 0, 1 << 30);
  o.plus = p.boolean("kvzip_plus", false);
  const bool keep_prefix = p.boolean("keep_prefix", true);
  const std::string allocation = p.text("allocation", "global", {"global", "uniform"});
  VC_RETURN_IF_ERROR(p.finish());
  *out = std::make_unique<Kvzip>(o, allocation == "global", keep_prefix);
  return Status();
}

}  // namespace
}  // namespace vericache::plugin

VC_EXPORT_COMPRESSOR("kvzip",
                     "KVzip context-reconstruction scoring (kvpress KVzipPress); parameters: n_sink (4), chunk_size "
                     "(2048), context_start (n_sink), keep_prefix (true), kvzip_plus (false), allocation (global | uniform)",
                     vericache::CompressorFamily::kTokenDropping, vericache::CompressionMode::kOffline,
                     vericache::kAllScenarios, vericache::plugin::make_kvzip)
