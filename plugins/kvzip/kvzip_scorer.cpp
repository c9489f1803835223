#include "kvzip_scorer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "../common/plugin_support.h"

namespace vericache::kvzip {

namespace {

// The pass tokens for chunk [begin, end) (chunk index `index`).
std::vector<int32_t> repeat_prompt(ModelAccess& model, std::span<const int32_t> prompt, const std::vector<int32_t>& header,
                                   int64_t index, int64_t begin, int64_t end, int64_t previous_begin) {
  std::vector<int32_t> ids;
  if (index == 0) {
    ids = model.tokenize("\n\nRepeat the previous context exactly.");
  } else {
    ids = model.tokenize("\n\nRepeat the part of the previous context exactly, starting with");
    const int64_t from = std::max(previous_begin, begin - 8);
    ids.insert(ids.end(), prompt.begin() + from, prompt.begin() + begin);
  }
  ids.insert(ids.end(), header.begin(), header.end());
  ids.insert(ids.end(), prompt.begin() + begin, prompt.begin() + end);
  return ids;
}

}  // namespace

Status score_context(const KvCacheView& full_kv, ModelAccess& model, const ScoringOptions& options,
                     std::vector<at::Tensor>* scores) {
  const ModelShape& shape = model.shape();
  const std::span<const int32_t> prompt = model.prompt();
  const int64_t n = full_kv.lengths[0], nkv = shape.n_kv_heads, hd = shape.head_dim;
  const int64_t group = shape.n_heads / nkv;
  if (static_cast<int64_t>(prompt.size()) != n) {
    return Status::internal("the prompt has " + std::to_string(prompt.size()) + " tokens, the cache " + std::to_string(n));
  }
  const int64_t start = std::min(options.context_start, n);
  scores->assign(shape.n_layers, at::Tensor());
  for (at::Tensor& s : *scores) s = at::zeros({nkv, n}, at::kFloat);
  std::vector<at::Tensor> wo(shape.n_layers);
  if (options.plus) {
    for (int64_t l = 0; l < shape.n_layers; ++l) {
      VC_ASSIGN_OR_RETURN(at::Tensor w, model.weight("blk." + std::to_string(l) + ".attn_output.weight"));
      wo[l] = w.view({w.size(0), shape.n_heads, hd}).permute({1, 0, 2}).contiguous();  // [n_heads, d_model, hd]
    }
  }
  const std::vector<int32_t> header = model.tokenize(model.assistant_header());
  int64_t previous_begin = start;
  for (int64_t begin = start, index = 0; begin < n; begin += options.chunk_size, ++index) {
    const int64_t end = std::min(n, begin + options.chunk_size), len = end - begin;
    const std::vector<int32_t> ids = repeat_prompt(model, prompt, header, index, begin, end, previous_begin);
    previous_begin = begin;
    const auto m = static_cast<int64_t>(ids.size());
    if (n + m > shape.context_length) {
      return Status::invalid_argument("the reconstruction pass needs " + std::to_string(n + m) +
                                      " positions, the model has " + std::to_string(shape.context_length) +
                                      "; lower 'chunk_size'");
    }
    std::vector<int32_t> positions(m);
    for (int64_t i = 0; i < m; ++i) positions[i] = static_cast<int32_t>(n + i);
    const int64_t sink = std::min(options.n_sink, begin);
    const at::Tensor causal = at::arange(m, at::kLong).unsqueeze(0) > at::arange(m, at::kLong).unsqueeze(1);  // [m, m]
    auto observe = [&](const LayerActivations& acts) -> Status {
      const int64_t l = acts.layer;
      const at::Tensor keys = layer_keys(full_kv, l);  // [nkv, n, hd]
      const at::Tensor pass_k = acts.k.to(at::kCPU, at::kFloat).permute({1, 0, 2});  // [nkv, m, hd]
      const at::Tensor sub = at::cat({keys.narrow(1, 0, sink), keys.narrow(1, begin, len), pass_k}, 1);
      // Query heads of one KV head stacked: one batched GEMM per KV head, no broadcast copies.
      const at::Tensor q = acts.q.to(at::kCPU, at::kFloat).permute({1, 0, 2}).reshape({nkv, group * m, hd});
      at::Tensor logits = at::bmm(q, sub.transpose(1, 2)).mul_(1.0 / std::sqrt(static_cast<double>(hd))).view({nkv, group, m, -1});
      logits.narrow(3, sink + len, m).masked_fill_(causal, -INFINITY);
      at::Tensor attn = at::softmax(logits, -1).narrow(3, sink, len);  // [nkv, g, m, len]
      if (options.plus) {
        const at::Tensor x_norm = acts.hidden.to(at::kCPU, at::kFloat).norm(2, -1);  // [m]
        const at::Tensor v = layer_values(full_kv, l).narrow(1, begin, len).repeat_interleave(group, 0);  // [n_heads, len, hd]
        const at::Tensor wov = at::matmul(v, wo[l].transpose(1, 2)).norm(2, -1).view({nkv, group, 1, len});
        attn = attn / x_norm.view({1, 1, m, 1}) * wov;
      }
      (*scores)[l].narrow(1, begin, len).copy_(attn.amax({1, 2}));  // max over the group and the pass rows
      return Status();
    };
    VC_RETURN_IF_ERROR(model.run_without_keeping(ids, positions, observe));
  }
  return Status();
}

}  // namespace vericache::kvzip
