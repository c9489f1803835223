// SnapKV (Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", 2024), as
// kvpress's SnapKVPress computes it: the last `window_size` prompt queries vote (softmax in
// float32, causal inside the window, mean over the window) for the earlier keys; the votes are
// smoothed with an average pool of `kernel_size` and averaged over each KV head's query group; the
// window itself is always kept. Offline, on TokenScorer: the window queries are recorded during the
// prefill (observe), the scores computed after it (score).
#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include <vericache/plugin_abi.h>
#include <vericache/token_scorer.h>

#include "../common/plugin_support.h"

namespace vericache::plugin {
namespace {

// Per request: each layer's post-RoPE queries of the last `window_size` prompt rows.
using WindowQueries = std::vector<at::Tensor>;  // [layer] [<= window, n_heads, hd]

class SnapKv : public TokenScorer<WindowQueries> {
 public:
  SnapKv(int64_t window, int64_t kernel)
      : TokenScorer("snapkv", CompressionMode::kOffline), window_(window), kernel_(kernel) {}

 protected:
  Status observe(const RequestRows& rows, WindowQueries& windows) override {
    if (windows.size() <= static_cast<size_t>(rows.layer)) windows.resize(rows.layer + 1);
    const at::Tensor q = rows.q.to(at::kCPU, at::kFloat);
    at::Tensor& w = windows[rows.layer];
    w = w.defined() ? at::cat({w, q}) : q.clone();
    if (w.size(0) > window_) w = w.narrow(0, w.size(0) - window_, window_).clone();
    return Status();
  }

  // The window itself is always kept.
  ProtectedTokens protected_tokens(int64_t) const override { return {0, window_}; }

  Status score(const KvCacheView& full_kv, ModelAccess& model, WindowQueries& windows,
               std::vector<at::Tensor>* scores) override {
    const ModelShape& shape = model.shape();
    const int64_t n = full_kv.lengths[0];
    if (n <= window_) {
      return Status::invalid_argument("the prompt (" + std::to_string(n) + " tokens) must be longer than the observation window (" +
                                      std::to_string(window_) + "); lower 'window_size'");
    }
    if (static_cast<int64_t>(windows.size()) != shape.n_layers) {
      return Status::internal("no window queries recorded: the runtime must report the prefill through update()");
    }
    const int64_t group = shape.n_heads / shape.n_kv_heads, hd = shape.head_dim, nkv = shape.n_kv_heads;
    const int64_t prefix = n - window_;
    for (int64_t l = 0; l < shape.n_layers; ++l) {
      const at::Tensor& q = windows[l];  // [window, n_heads, hd]
      if (q.size(0) != window_) return Status::internal("fewer window queries recorded than the window size");
      const at::Tensor keys = layer_keys(full_kv, l);                                     // [nkv, n, hd]
      const at::Tensor qh = q.permute({1, 0, 2}).reshape({nkv, group * window_, hd});    // grouped by KV head
      at::Tensor logits = at::matmul(qh, keys.transpose(1, 2)).view({nkv, group, window_, n}) / std::sqrt(static_cast<double>(hd));
      // Window row r (position prefix + r) sees keys up to its own position.
      const at::Tensor future = at::arange(n, at::kLong).unsqueeze(0) > (at::arange(window_, at::kLong) + prefix).unsqueeze(1);
      logits.masked_fill_(future, -INFINITY);
      const at::Tensor attn = at::softmax(logits, -1).narrow(-1, 0, prefix);               // [nkv, g, window, prefix]
      at::Tensor votes = attn.mean(2).reshape({nkv * group, 1, prefix});
      votes = at::avg_pool1d(votes, {kernel_}, {1}, {kernel_ / 2}).view({nkv, group, -1}).narrow(-1, 0, prefix);
      scores->push_back(at::cat({votes.mean(1), at::zeros({nkv, window_})}, 1));          // [nkv, n]
    }
    return Status();
  }

 private:
  int64_t window_;
  int64_t kernel_;
};

Status make_snapkv(const std::string& json, std::unique_ptr<Compressor>* out) {
  ParamReader p(json);
  const int64_t window = p.integer("window_size", 64, 1, 1 << 20);
  const int64_t kernel = p.integer("kernel_size", 5, 1, 1023);
  VC_RETURN_IF_ERROR(p.finish());
  if (kernel % 2 == 0) return Status::invalid_argument("'kernel_size' must be odd (the pooling keeps the length), got " + std::to_string(kernel));
  *out = std::make_unique<SnapKv>(window, kernel);
  return Status();
}

}  // namespace
}  // namespace vericache::plugin

VC_EXPORT_COMPRESSOR("snapkv",
                     "SnapKV observation-window voting (kvpress SnapKVPress); parameters: window_size (64), kernel_size (5)",
                     vericache::CompressorFamily::kTokenDropping, vericache::CompressionMode::kOffline,
                     vericache::kAllScenarios, vericache::plugin::make_snapkv)
