// Expected Attention (Devoto et al., "Expected Attention: KV Cache Compression by Estimating
// Attention from Future Queries Distribution", 2025), as kvpress's ExpectedAttentionPress
// computes it. Future queries are modelled as a Gaussian: the mean and covariance of the prompt's
// pre-RoPE queries (sink tokens excluded), rotated by the RoPE rotation averaged over the next
// `n_future_positions` positions after the true cache length. A key's score is the softmax over
// non-sink keys of  mu'.k / sqrt(d) + k' Sigma' k / (2d)  (the log of E[exp(q.k / sqrt(d))]),
// averaged over the query group and multiplied by ||v|| (plus epsilon first); sinks are kept.
//
// Pre-RoPE queries are linear in the attention input x (q_j = W_Q,j x), so observe() only keeps
// the running mean and covariance of x over the prompt (float64, [d_model] and [d_model, d_model]
// per layer and request); compress() maps them through W_Q: mu_j = W_Q,j E[x],
// Sigma_j = W_Q,j Cov[x] W_Q,j^T.
#include <ATen/ATen.h>

#include <cmath>
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

// Per request: the attention inputs' moments, per layer.
using LayerMoments = std::vector<RunningMoments>;

class ExpectedAttention : public TokenScorer<LayerMoments> {
 public:
  explicit ExpectedAttention(Options o) : TokenScorer("expected_attention", CompressionMode::kOffline), o_(o) {}

 protected:
  Status observe(const RequestRows& rows, LayerMoments& moments) override {
    // Rows of sink positions are left out of the statistics.
    const at::Tensor use = rows.positions >= o_.n_sink;
    const at::Tensor x = rows.hidden.to(at::kCPU, at::kFloat).index({use});
    if (x.size(0) == 0) return Status();
    if (moments.size() <= static_cast<size_t>(rows.layer)) moments.resize(rows.layer + 1);
    moments[rows.layer].add(x);
    return Status();
  }

  Status attach_impl(const ModelShape& model) override {
    shape_ = model;
    return Status();
  }

  // The moments observe() keeps: per layer a float64 mean [d_model] and M2 [d_model, d_model],
  // whatever the prompt's length (about 80 MB per request on SmolLM2, 0.5 GB on Qwen2.5-Coder 1.5B).
  int64_t state_bytes(int64_t /*n*/) const override {
    return shape_.n_layers * (shape_.d_model + shape_.d_model * shape_.d_model) * static_cast<int64_t>(sizeof(double));
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
      VC_ASSIGN_OR_RETURN(at::Tensor wq, model.weight("blk." + std::to_string(l) + ".attn_q.weight"));  // [nh*hd, d]
      const at::Tensor wq64 = wq.to(at::kDouble);
      const at::Tensor& mean_x = m.mean;
      at::Tensor mu = at::matmul(wq64, mean_x).view({nh, hd});                              // pre-RoPE mean per head
      // Models with a query bias (qwen2): E[W x + b] = W E[x] + b, as q_proj computes it in kvpress.
      if (auto bq = model.weight("blk." + std::to_string(l) + ".attn_q.bias"); bq.ok()) {
        mu += bq->to(at::kDouble).view({nh, hd});
      }
      const at::Tensor rmu = at::matmul(mu, avg_rotation.t()).to(at::kFloat);              // [nh, hd]

      const at::Tensor keys = layer_keys(full_kv, l).narrow(1, o_.n_sink, n - o_.n_sink);  // [nkv, m, hd]
      const at::Tensor values = layer_values(full_kv, l).narrow(1, o_.n_sink, n - o_.n_sink);
      const at::Tensor keys_g = keys.repeat_interleave(group, 0);                          // [nh, m, hd]
      at::Tensor z = at::matmul(keys_g, rmu.unsqueeze(2)).squeeze(2) / std::sqrt(static_cast<double>(hd));
      if (o_.use_covariance) {
        const at::Tensor cov_x = m.covariance();  // biased, as kvpress
        const at::Tensor w3 = wq64.view({nh, hd, -1});
        const at::Tensor cov = at::matmul(at::matmul(w3, cov_x), w3.transpose(1, 2));      // [nh, hd, hd]
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
  Options o_;
  ModelShape shape_;
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
