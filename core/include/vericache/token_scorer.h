// TokenScorer: the base of a token-dropping compressor that only scores tokens (kvpress's
// ScorerPress). The plugin says how tokens score; the base does the rest of the contract: each
// request's rows of the activations, per-request state, protected tokens, the per-layer budget and
// the top-k per (layer, KV head).
//
// Offline (CompressionMode::kOffline): observe() sees each request's rows of every prefill layer;
// after the prefill, score() gives every position of the request's full cache a score per (layer,
// KV head). Each head keeps the protected tokens (protected_tokens(): the first and the last few)
// and then its highest scores, floor(c * n) tokens in all (at least one); layer_budgets() may move
// counts between layers (KVzip's global allocation), keeping the same count for every head of a
// layer. Ties fall as at::topk breaks them.
// Online (CompressionMode::kOnline): score_rows() scores each new token of a layer as its forward
// returns; the base holds the scores and drops, after every layer of every forward, the
// lowest-scoring tokens outside the `recent_window()` newest until each head keeps
// max(floor(c * T), min(T, window)), T the request's uncompressed length (ties: older first).
//
// State: a `State` (default-constructible) per request id, made on first use (state()), dropped
// by release(). Header-only: it compiles into the plugin, so nothing here crosses the boundary.
// Thread-safety: as any compressor (one thread at a time). Exceptions become Status values
// (CompressorBase).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <vericache/compressor.h>
#include <vericache/kv_view.h>
#include <vericache/plugin_abi.h>

namespace vericache {

// Tokens kept per KV head of a layer of n tokens at kept fraction c: floor(n * c), at least 1.
// kvpress computes max(1, int(n * (1 - compression_ratio))) with compression_ratio = 1 - c, which
// can land one lower when 1 - (1 - c) is inexact (c = 0.1, n = 30 gives 2 there, 3 here); the
// epsilon keeps products such as 0.3 * 10 = 2.9999999999999996 at 3.
inline int64_t kept_count(int64_t n, double ratio) {
  return std::clamp<int64_t>(static_cast<int64_t>(std::floor(static_cast<double>(n) * ratio + 1e-9)), 1, n);
}

// The k highest-scoring positions of every row of `scores` [n_kv_heads, n], sorted increasing
// (the contract's order).
inline at::Tensor top_k_sorted(const at::Tensor& scores, int64_t k) {
  return std::get<0>(at::sort(std::get<1>(at::topk(scores, k, /*dim=*/1)), /*dim=*/1)).contiguous();
}

// Keys or values of one layer of a cache view as a dense float32 CPU tensor
// [n_kv_heads, length, head_dim], in slot order (a full cache: position order).
inline at::Tensor layer_pages(const KvCacheView& view, int64_t layer, bool keys) {
  const int64_t n = view.lengths[layer], ps = view.layout.page_size, hd = view.layout.head_dim;
  const int64_t nkv = view.layout.n_kv_heads;
  const auto& table = view.block_tables[layer];
  const at::Tensor& storage = keys ? view.k_pages : view.v_pages;
  const at::Tensor pages = at::tensor(std::vector<int64_t>(table.begin(), table.end()), at::kLong).to(storage.device());
  const int64_t np = pages.size(0);
  // Keys are stored transposed within a page ([hd, ps]), values not ([ps, hd]).
  const at::Tensor slots = keys ? storage.index_select(0, pages).permute({1, 0, 3, 2})
                                : storage.index_select(0, pages).permute({1, 0, 2, 3});
  return slots.reshape({nkv, np * ps, hd}).narrow(1, 0, n).to(at::kCPU, at::kFloat).contiguous();
}
inline at::Tensor layer_keys(const KvCacheView& view, int64_t layer) { return layer_pages(view, layer, true); }
inline at::Tensor layer_values(const KvCacheView& view, int64_t layer) { return layer_pages(view, layer, false); }

// One request's rows of one layer's forward (views of LayerActivations, valid during the call).
struct RequestRows {
  int64_t request_id = 0;
  int64_t layer = 0;
  double ratio = 1.0;        // the kept fraction c the request runs at
  int64_t cache_length = 0;  // the request's slots in this layer before this forward
  at::Tensor residual;       // [rows, d_model] the layer's input
  at::Tensor hidden;         // [rows, d_model] the attention input (after RMSNorm)
  at::Tensor q;              // [rows, n_heads, head_dim] after RoPE
  at::Tensor k;              // [rows, n_kv_heads, head_dim] after RoPE
  at::Tensor v;              // [rows, n_kv_heads, head_dim]
  at::Tensor positions;      // [rows] int64, CPU
};

// Tokens every head keeps before any scored one: the first `first` and the last `last` positions.
struct ProtectedTokens {
  int64_t first = 0;
  int64_t last = 0;
};

struct NoState {};

template <typename State = NoState>
class TokenScorer : public CompressorBase {
 public:
  TokenScorer(std::string name, CompressionMode mode, uint32_t scenarios = kAllScenarios)
      : CompressorBase(std::move(name), CompressorFamily::kTokenDropping, mode, scenarios) {}

 protected:
  // Offline: what the prefill shows (default: nothing).
  virtual Status observe(const RequestRows& /*rows*/, State& /*state*/) { return Status(); }
  // Offline: scores of every position of the request's full cache, [n_layers] float32
  // [n_kv_heads, n] (any device); higher is kept first. Protected positions' scores are ignored.
  virtual Status score(const KvCacheView& /*full_kv*/, ModelAccess& /*model*/, State& /*state*/,
                       std::vector<at::Tensor>* /*scores*/) {
    return Status::not_supported(name() + ": no offline score()");
  }
  // Offline: the protected tokens of a prompt of n tokens (default: none).
  virtual ProtectedTokens protected_tokens(int64_t /*n*/) const { return {}; }
  // Offline: tokens per KV head of each layer, given every layer's scores (protected positions
  // already above every other score) and `keep` = kept_count(n, c). Default: `keep` everywhere.
  virtual std::vector<int64_t> layer_budgets(const std::vector<at::Tensor>& scores, int64_t keep,
                                             int64_t /*protected_count*/) const {
    return std::vector<int64_t>(scores.size(), keep);
  }
  // Online: scores of the rows' tokens, float32 [rows, n_kv_heads] (any device).
  virtual Result<at::Tensor> score_rows(const RequestRows& /*rows*/, State& /*state*/) {
    return Status::not_supported(name() + ": no online score_rows()");
  }
  // Online: the newest tokens that are never dropped.
  virtual int64_t recent_window() const { return 0; }

  // This request's state, made on first use.
  State& state(int64_t request_id) { return states_[request_id]; }
  bool has_state(int64_t request_id) const { return states_.count(request_id) > 0; }

  Status update_impl(const LayerActivations& acts, std::vector<LayerDrops>* drops) final {
    const at::Tensor positions = acts.positions.to(at::kCPU);
    for (size_t i = 0; i < acts.request_ids.size(); ++i) {
      const int64_t begin = acts.row_offsets[i], end = acts.row_offsets[i + 1];
      if (end == begin) continue;
      RequestRows rows;
      rows.request_id = acts.request_ids[i];
      rows.layer = acts.layer;
      rows.ratio = i < acts.ratios.size() ? acts.ratios[i] : 1.0;
      rows.cache_length = i < acts.cache_lengths.size() ? acts.cache_lengths[i] : 0;
      rows.residual = acts.residual.narrow(0, begin, end - begin);
      rows.hidden = acts.hidden.narrow(0, begin, end - begin);
      rows.q = acts.q.narrow(0, begin, end - begin);
      rows.k = acts.k.narrow(0, begin, end - begin);
      rows.v = acts.v.narrow(0, begin, end - begin);
      rows.positions = positions.narrow(0, begin, end - begin);
      if (mode() == CompressionMode::kOffline) {
        VC_RETURN_IF_ERROR(observe(rows, state(rows.request_id)));
      } else {
        VC_RETURN_IF_ERROR(drop_online(rows, drops));
      }
    }
    return Status();
  }

  // score(), checked: one float32 CPU [n_kv_heads, n] tensor per layer.
  Status score_tokens_impl(const KvCacheView& full_kv, ModelAccess& model, std::vector<at::Tensor>* scores) final {
    const int64_t n = full_kv.lengths[0], layers = full_kv.layout.n_layers, heads = full_kv.layout.n_kv_heads;
    VC_RETURN_IF_ERROR(score(full_kv, model, state(model.request_id()), scores));
    if (static_cast<int64_t>(scores->size()) != layers) {
      return Status::internal(name() + ": score() gave " + std::to_string(scores->size()) + " layers, the cache has " +
                              std::to_string(layers));
    }
    for (at::Tensor& s : *scores) {
      if (s.dim() != 2 || s.size(0) != heads || s.size(1) != n) {
        return Status::internal(name() + ": score() must give [" + std::to_string(heads) + ", " + std::to_string(n) +
                                "] per layer");
      }
      s = s.to(at::kCPU, at::kFloat).contiguous();
    }
    return Status();
  }

  Status compress_impl(const KvCacheView& full_kv, double ratio, ModelAccess& model, CompressedKV* out) final {
    const int64_t n = full_kv.lengths[0], layers = full_kv.layout.n_layers;
    std::vector<at::Tensor> scores;
    VC_RETURN_IF_ERROR(score_tokens_impl(full_kv, model, &scores));
    float top = -INFINITY;
    for (const at::Tensor& s : scores) top = std::max(top, s.max().item<float>());
    // Protected positions score above every other score of every layer.
    const ProtectedTokens p = protected_tokens(n);
    const int64_t first = std::clamp<int64_t>(p.first, 0, n), last = std::clamp<int64_t>(p.last, 0, n - first);
    for (at::Tensor& s : scores) {
      s.narrow(1, 0, first).fill_(top + 1.0f);
      s.narrow(1, n - last, last).fill_(top + 1.0f);
    }
    const int64_t keep = kept_count(n, ratio);
    const std::vector<int64_t> budgets = layer_budgets(scores, keep, std::min(first + last, keep));
    out->kept.clear();
    for (int64_t l = 0; l < layers; ++l) out->kept.push_back(top_k_sorted(scores[l], budgets[l]));
    return Status();
  }

  void release_impl(int64_t request_id) final {
    states_.erase(request_id);
    held_.erase(request_id);
  }

  // The budget the base enforces: offline kept_count(n, c) per layer (layer_budgets() moves counts
  // between layers but keeps their sum), online max(kept_count(n, c), min(n, recent_window())) per
  // layer once the prefill is seen; plus state_bytes(n).
  Status footprint_impl(int64_t n, double ratio, int64_t n_layers, RequestFootprint* out) final {
    const int64_t per_layer = mode() == CompressionMode::kOffline
                                  ? kept_count(n, ratio)
                                  : std::max(kept_count(n, ratio), std::min(n, recent_window()));
    out->max_kept_slots = n_layers * per_layer;
    out->state_bytes = state_bytes(n);
    return Status();
  }
  // The plugin's own per-request memory for an n-token prompt (its State), in bytes. Default 0.
  virtual int64_t state_bytes(int64_t /*n*/) const { return 0; }

 private:
  struct HeldToken {
    int64_t position;
    float score;
  };

  Status drop_online(const RequestRows& rows, std::vector<LayerDrops>* drops) {
    VC_ASSIGN_OR_RETURN(at::Tensor scored, score_rows(rows, state(rows.request_id)));
    scored = scored.to(at::kCPU, at::kFloat).contiguous();
    const int64_t count_rows = rows.positions.size(0), heads = rows.k.size(1);
    if (scored.dim() != 2 || scored.size(0) != count_rows || scored.size(1) != heads) {
      return Status::internal(name() + ": score_rows() must give [" + std::to_string(count_rows) + ", " +
                              std::to_string(heads) + "]");
    }
    auto& layers = held_[rows.request_id];
    if (layers.size() <= static_cast<size_t>(rows.layer)) layers.resize(rows.layer + 1);
    std::vector<std::vector<HeldToken>>& held = layers[rows.layer];
    if (held.empty()) held.resize(heads);
    const int64_t* pos = rows.positions.data_ptr<int64_t>();
    const float* s = scored.data_ptr<float>();
    for (int64_t r = 0; r < count_rows; ++r) {
      for (int64_t h = 0; h < heads; ++h) held[h].push_back({pos[r], s[r * heads + h]});
    }
    const int64_t seen = pos[count_rows - 1] + 1;  // the uncompressed length
    const int64_t window = recent_window();
    const int64_t target = std::max(kept_count(seen, rows.ratio), std::min(seen, window));
    const auto count = static_cast<int64_t>(held[0].size());
    if (count <= target) return Status();
    const int64_t n_drop = count - target;
    at::Tensor dropped = at::empty({heads, n_drop}, at::kLong);
    int64_t* out = dropped.data_ptr<int64_t>();
    for (int64_t h = 0; h < heads; ++h) {
      // Candidates: outside the recent window, lowest score first (ties: older first).
      std::vector<HeldToken>& tokens = held[h];
      std::vector<size_t> order;
      for (size_t t = 0; t < tokens.size(); ++t) {
        if (tokens[t].position < seen - window) order.push_back(t);
      }
      std::partial_sort(order.begin(), order.begin() + n_drop, order.end(), [&](size_t a, size_t b) {
        return tokens[a].score != tokens[b].score ? tokens[a].score < tokens[b].score
                                                  : tokens[a].position < tokens[b].position;
      });
      std::vector<bool> gone(tokens.size(), false);
      for (int64_t j = 0; j < n_drop; ++j) {
        gone[order[j]] = true;
        out[h * n_drop + j] = tokens[order[j]].position;
      }
      std::vector<HeldToken> kept;
      for (size_t t = 0; t < tokens.size(); ++t) {
        if (!gone[t]) kept.push_back(tokens[t]);
      }
      tokens.swap(kept);
    }
    drops->push_back(LayerDrops{rows.request_id, rows.layer, dropped});
    return Status();
  }

  std::map<int64_t, State> states_;
  std::map<int64_t, std::vector<std::vector<std::vector<HeldToken>>>> held_;  // request -> [layer][head], position order
};

}  // namespace vericache
