// Expected Attention (Devoto et al., "Expected Attention: KV Cache Compression by Estimating
// Attention from Future Queries Distribution", 2025), as kvpress's ExpectedAttentionPress
// computes it. Future queries are modelled as a Gaussian: the mean and covariance of the prompt's
// pre-RoPE queries (sink tokens excluded), rotated by the RoPE rotation averaged over the next
// `n_future_positions` positions after the true cache length. A key's score is the softmax over
// non-sink keys of  mu'.k / sqrt(d) + k' Sigma' k / (2d)  (the log of E[exp(q.k / sqrt(d))]),
// averaged over the query group and multiplied by ||v|| (plus epsilon first); sinks are kept.
//
// observe() undoes RoPE on the forward's queries (the model's own, bias included) and keeps, per
// layer and head, the running mean [head_dim] and covariance [head_dim, head_dim] of the pre-RoPE
// queries over the prompt (float64): what the formula reads, n_heads * head_dim^2 doubles per
// layer (about 9 MB per request on SmolLM2, 44 MB on Qwen2.5-Coder 1.5B).
#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <vector>

#include <vericache/plugin_abi.h>
#include <vericache/token_scorer.h>

#include "../common/plugin_support.h"
#include "../common/rope.h"
#include "../common/running_moments.h"

namespace vericache::plugin {
namespace {

struct Options {
  int64_t n_future_positions = 512;
  int64_t n_sink = 4;
  bool use_covariance = true;
  bool use_vnorm = true;
  double epsilon = 0.0;
};

// Per request: the pre-RoPE queries' moments, per layer (groups = heads).
using LayerMoments = std::vector<RunningMoments>;

class ExpectedAttention : public TokenScorer<LayerMoments> {
 public:
  explicit ExpectedAttention(Options o) : TokenScorer("expected_attention", CompressionMode::kOffline), o_(o) {}

 protected:
  Status observe(const RequestRows& rows, LayerMoments& moments) override {
    if (!rope_) return Status::internal("expected_attention: observe() before attach()");
    // Rows of sink positions are left out of the statistics.
    const at::Tensor use = rows.positions >= o_.n_sink;
    // [m, nh, hd] after RoPE; index() copies, so the rows can be rotated back in place.
    at::Tensor q = rows.q.to(at::kCPU, at::kFloat).index({use}).contiguous();
    const at::Tensor positions = rows.positions.index({use});
    const int64_t m = q.size(0);
    if (m == 0) return Status();
    if (moments.size() <= static_cast<size_t>(rows.layer)) moments.resize(rows.layer + 1);
    unrotate(q, positions);
    moments[rows.layer].add(q.transpose(0, 1));  // [nh, m, hd]
    return Status();
  }

  Status attach_impl(const ModelShape& model) override {
    shape_ = model;
    rope_.emplace(model.rope_freq_base, model.head_dim);
    return Status();
  }

  // The moments observe() keeps: per layer and head a float64 mean and M2, whatever the prompt's length.
  int64_t state_bytes(int64_t /*n*/) const override {
    return shape_.n_layers * RunningMoments::bytes(shape_.n_heads, shape_.head_dim);
  }

  // Sinks are kept.
  ProtectedTokens protected_tokens(int64_t) const override { return {o_.n_sink, 0}; }

  Status score(const KvCacheView& full_kv, ModelAccess& model, LayerMoments& moments,
               std::vector<at::Tensor>* scores) override {
    const ModelShape& shape = model.shape();
    const int64_t n = full_kv.lengths[0], nkv = shape.n_kv_heads, hd = shape.head_dim, nh = shape.n_heads;
    const int64_t group = nh / nkv;
    if (n <= o_.n_sink) {
      return Status::invalid_argument("the prompt (" + std::to_string(n) + " tokens) must be longer than n_sink (" +
                                      std::to_string(o_.n_sink) + ")");
    }
    if (static_cast<int64_t>(moments.size()) != shape.n_layers) {
      return Status::internal("no query statistics recorded: the runtime must report the prefill through update()");
    }
    const at::Tensor avg_rotation = mean_rotation(model, n, o_.n_future_positions, hd);  // [hd, hd]
    for (int64_t l = 0; l < shape.n_layers; ++l) {
      const RunningMoments& m = moments[l];
      if (m.mean.size(0) != nh) return Status::internal("query statistics of another head count");
      const at::Tensor rmu = at::matmul(m.mean, avg_rotation.t()).to(at::kFloat);          // [nh, hd]

      const at::Tensor keys = layer_keys(full_kv, l).narrow(1, o_.n_sink, n - o_.n_sink);  // [nkv, m, hd]
      const at::Tensor values = layer_values(full_kv, l).narrow(1, o_.n_sink, n - o_.n_sink);
      const at::Tensor keys_g = keys.repeat_interleave(group, 0);                          // [nh, m, hd]
      at::Tensor z = at::matmul(keys_g, rmu.unsqueeze(2)).squeeze(2) / std::sqrt(static_cast<double>(hd));
      if (o_.use_covariance) {
        const at::Tensor cov = m.covariance();  // [nh, hd, hd], biased, as kvpress
        const at::Tensor rcov = at::matmul(at::matmul(avg_rotation, cov), avg_rotation.t()).to(at::kFloat);
        z += (at::matmul(keys_g, rcov) * keys_g).sum(-1) / static_cast<double>(hd) / 2.0;
      }
      at::Tensor s = at::softmax(z, -1).view({nkv, group, -1}).mean(1);                     // [nkv, m]
      if (o_.use_vnorm) s = (s + o_.epsilon) * values.norm(2, -1);
      scores->push_back(at::cat({at::zeros({nkv, o_.n_sink}), s}, 1));                     // [nkv, n]
    }
    return Status();
  }

 private:
  // Undoes RoPE in place on q [m, nh, hd] (contiguous float32, rotated at `positions` [m]).
  void unrotate(at::Tensor& q, const at::Tensor& positions) const {
    const int64_t m = q.size(0), heads = q.size(1), hd = q.size(2);
    float* data = q.data_ptr<float>();
    const at::Tensor p = positions.to(at::kLong).contiguous();
    std::vector<float> cos(rope_->pairs()), sin(rope_->pairs());
    for (int64_t r = 0; r < m; ++r) {
      rope_->angles(p.data_ptr<int64_t>()[r], cos.data(), sin.data());
      for (int64_t h = 0; h < heads; ++h) rope_->rotate(data + (r * heads + h) * hd, cos.data(), sin.data(), true);
    }
  }

  Options o_;
  ModelShape shape_;
  std::optional<Rope> rope_;
};

Status make_expected_attention(const std::string& json, std::unique_ptr<Compressor>* out) {
  ParamReader p(json);
  Options o;
  o.n_future_positions = p.integer("n_future_positions", o.n_future_positions, 1, 1 << 20);
  o.n_sink = p.integer("n_sink", o.n_sink, 0, 1 << 20);
  o.use_covariance = p.boolean("use_covariance", o.use_covariance);
  o.use_vnorm = p.boolean("use_vnorm", o.use_vnorm);
  o.epsilon = p.number("epsilon", o.epsilon, 0.0, 1e6);
  VC_RETURN_IF_ERROR(p.finish());
  *out = std::make_unique<ExpectedAttention>(o);
  return Status();
}

}  // namespace
}  // namespace vericache::plugin

VC_EXPORT_COMPRESSOR("expected_attention",
                     "Expected Attention, Gaussian model of future queries (kvpress ExpectedAttentionPress); parameters: "
                     "n_future_positions (512), n_sink (4), use_covariance (true), use_vnorm (true), epsilon (0)",
                     vericache::CompressorFamily::kTokenDropping, vericache::CompressionMode::kOffline,
                     vericache::kAllScenarios, vericache::plugin::make_expected_attention)
