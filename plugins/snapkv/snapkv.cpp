// SnapKV (Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", 2024), as
// kvpress's SnapKVPress computes it: the last `window_size` prompt queries vote (softmax in
// float32, causal inside the window, mean over the window) for the earlier keys; the votes are
// smoothed with an average pool of `kernel_size` and averaged over each KV head's query group; the
// window itself is always kept. Offline: the window queries are recorded by update() during the
// prefill, compress() scores after it.
#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <vector>

#include <vericache/plugin_abi.h>

#include "../common/plugin_support.h"

namespace vericache::plugin {
namespace {

class SnapKv : public CompressorBase {
 public:
  SnapKv(int64_t window, int64_t kernel)
      : CompressorBase("snapkv", CompressorFamily::kTokenDropping, CompressionMode::kOffline, kAllScenarios),
        window_(window),
        kernel_(kernel) {}

 protected:
  // Keeps the post-RoPE queries of each request's last `window_` prompt rows, per layer.
  Status update_impl(const LayerActivations& acts, std::vector<LayerDrops>*) override {
    for (size_t i = 0; i < acts.request_ids.size(); ++i) {
      const int64_t begin = acts.row_offsets[i], end = acts.row_offsets[i + 1];
      if (end == begin) continue;
      std::vector<at::Tensor>& layers = windows_[acts.request_ids[i]];
      if (layers.size() <= static_cast<size_t>(acts.layer)) layers.resize(acts.layer + 1);
      at::Tensor rows = acts.q.narrow(0, begin, end - begin).to(at::kCPU, at::kFloat);
      at::Tensor& w = layers[acts.layer];
      w = w.defined() ? at::cat({w, rows}) : rows.clone();
      if (w.size(0) > window_) w = w.narrow(0, w.size(0) - window_, window_).clone();
    }
    return Status();
  }

  Status compress_impl(const KvCacheView& full_kv, double ratio, ModelAccess& model, CompressedKV* out) override {
    const ModelShape& shape = model.shape();
    const auto found = windows_.find(model.request_id());
    const int64_t n = full_kv.lengths[0];
    if (n <= window_) {
      return Status::invalid_argument("the prompt (" + std::to_string(n) + " tokens) must be longer than the observation window (" +
                                      std::to_string(window_) + "); lower 'window_size'");
    }
    if (found == windows_.end() || static_cast<int64_t>(found->second.size()) != shape.n_layers) {
      return Status::internal("no window queries recorded: the runtime must report the prefill through update()");
    }
    const int64_t group = shape.n_heads / shape.n_kv_heads, hd = shape.head_dim, nkv = shape.n_kv_heads;
    const int64_t prefix = n - window_;
    out->kept.clear();
    for (int64_t l = 0; l < shape.n_layers; ++l) {
      const at::Tensor& q = found->second[l];  // [window, n_heads, hd]
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
      at::Tensor scores = votes.mean(1);                                                  // [nkv, prefix]
      const float top = scores.max().item<float>() + 1.0f;
      scores = at::cat({scores, at::full({nkv, window_}, top, scores.options())}, 1);
      out->kept.push_back(top_k_sorted(scores, kept_count(n, ratio)));
    }
    return Status();
  }

  void release_impl(int64_t request_id) override { windows_.erase(request_id); }

 private:
  int64_t window_;
  int64_t kernel_;
  std::map<int64_t, std::vector<at::Tensor>> windows_;  // request id -> per layer [<= window, n_heads, hd]
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
