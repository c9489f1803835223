// The libtorch forward: any device, any floating dtype (bf16 on a GPU). Norms, RoPE and the
// residual stream are float32; projections run in the model dtype. On a GPU, projections, RMSNorm,
// K/V writes and attention use our CUDA kernels (kernels/cuda_ops.h), each output row computed the
// same way whatever the number of rows (cuBLAS and torch's reductions choose their algorithm by
// shape, so a verify forward could round differently from one-row decoding); elsewhere K/V are
// written with index_put_ and attention gathers each request's K/V from its pages and calls
// scaled_dot_product_attention with a causal mask that starts at the request's cached length.
#include <ATen/ATen.h>
#include <ATen/TensorIndexing.h>

#include "model/llama_model.h"

#if VC_WITH_CUDA
#include "kernels/cuda_ops.h"
#endif

namespace vericache {
namespace {

using at::indexing::Slice;

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
#if VC_WITH_CUDA
  if (x.is_cuda()) return cuda::invariant_rms_norm_tensor(x, weight, eps);
#endif
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
}

at::Tensor project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = {}) {
#if VC_WITH_CUDA
  if (x.is_cuda()) return cuda::invariant_linear_tensor(x, w, bias);
#endif
  return at::linear(x, w, bias);
}

// x: [rows, heads, head_dim] float32; cos/sin: [rows, head_dim / 2]. Rotates adjacent channel pairs.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto pairs = x.unflatten(-1, {-1, 2});
  const at::Tensor x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);
  const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  return at::stack({x0 * c - x1 * s, x1 * c + x0 * s}, -1).flatten(-2);
}

// Per-forward index tables for one layer (all int64 on the model's device).
struct LayerIndex {
  at::Tensor slot_page;       // [rows] page receiving each new token's K/V
  at::Tensor slot_offset;     // [rows] offset within that page
  at::Tensor pages;           // the requests' pages, concatenated
  at::Tensor row_page_start;  // [rows] where each row's request's pages start in `pages`
  at::Tensor row_len;         // [rows] slots each row attends to (itself included)
  std::vector<int64_t> page_begin;  // host copy: request i's pages start at page_begin[i]
  int64_t max_len = 0;
};

// Attention by gathering each request's K/V and calling scaled_dot_product_attention.
at::Tensor attention_by_gather(const at::Tensor& q, const PagePool& pool, const LayerIndex& index,
                               std::span<const ForwardItem> batch, const std::vector<int64_t>& begin,
                               int64_t layer, double scale) {
  const int64_t nh = q.size(1), hd = q.size(2), nkv = pool.spec().n_kv_heads, ps = pool.spec().page_size;
  const auto i64 = at::TensorOptions().dtype(at::kLong).device(q.device());
  std::vector<at::Tensor> outs;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t n = begin[i + 1] - begin[i];
    if (n == 0) continue;
    const int64_t cached = batch[i].kv->length(layer), len = cached + n;
    const at::Tensor my_pages = index.pages.narrow(0, index.page_begin[i], index.page_begin[i + 1] - index.page_begin[i]);
    const int64_t np = my_pages.size(0);
    const at::Tensor keys =
        pool.k_pages().index_select(0, my_pages).permute({1, 0, 3, 2}).reshape({nkv, np * ps, hd}).narrow(1, 0, len);
    const at::Tensor values =
        pool.v_pages().index_select(0, my_pages).permute({1, 0, 2, 3}).reshape({nkv, np * ps, hd}).narrow(1, 0, len);
    const at::Tensor query = q.narrow(0, begin[i], n).transpose(0, 1);  // [nh, n, hd]
    const at::Tensor mask = at::arange(0, len, i64).unsqueeze(0) <= at::arange(cached, len, i64).unsqueeze(1);
    const at::Tensor out = at::scaled_dot_product_attention(
        query.unsqueeze(0), keys.repeat_interleave(nh / nkv, 0).unsqueeze(0),
        values.repeat_interleave(nh / nkv, 0).unsqueeze(0), mask, 0.0, false, scale);
    outs.push_back(out.squeeze(0).transpose(0, 1).reshape({n, nh * hd}));
  }
  return at::cat(outs, 0);
}

}  // namespace

Status LlamaModel::forward_torch(std::span<const ForwardItem> batch, const std::vector<int64_t>& begin,
                                 PagePool& pool, at::Tensor* logits, const LayerObserver& observer) const {
  const LlamaConfig& c = config_;
  const int64_t hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads;
  const int64_t rows = begin.back(), layers = c.n_layers, ps = pool.spec().page_size;
  const at::Device dev = options_.device;
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
#if VC_WITH_CUDA
  const bool cuda_kernels = dev.is_cuda();
#else
  const bool cuda_kernels = false;
#endif

  std::vector<int64_t> tokens(rows), positions(rows);
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t t = 0; t < batch[i].tokens.size(); ++t) {
      tokens[begin[i] + t] = batch[i].tokens[t];
      positions[begin[i] + t] = batch[i].positions[t];
    }
  }
  // Index tables are built on the host for all layers, then copied to the device once.
  at::Tensor slot_page = at::empty({layers, rows}, i64), slot_offset = at::empty({layers, rows}, i64);
  at::Tensor row_page_start = at::empty({layers, rows}, i64), row_len = at::empty({layers, rows}, i64);
  std::vector<LayerIndex> index(layers);
  int64_t max_pages = 1;
  for (int64_t l = 0; l < layers; ++l) {
    index[l].page_begin.assign(batch.size() + 1, 0);
    for (size_t i = 0; i < batch.size(); ++i) {
      index[l].page_begin[i + 1] = index[l].page_begin[i] + static_cast<int64_t>(batch[i].kv->block_table(l).size());
    }
    max_pages = std::max(max_pages, index[l].page_begin.back());
  }
  at::Tensor pages = at::zeros({layers, max_pages}, i64);
  for (int64_t l = 0; l < layers; ++l) {
    int64_t* sp = slot_page[l].data_ptr<int64_t>();
    int64_t* so = slot_offset[l].data_ptr<int64_t>();
    int64_t* rs = row_page_start[l].data_ptr<int64_t>();
    int64_t* rl = row_len[l].data_ptr<int64_t>();
    int64_t* pg = pages[l].data_ptr<int64_t>();
    for (size_t i = 0; i < batch.size(); ++i) {
      const SequenceKv& kv = *batch[i].kv;
      const std::vector<int32_t>& table = kv.block_table(l);
      for (int64_t t = 0; t < begin[i + 1] - begin[i]; ++t) {
        const int64_t slot = kv.length(l) + t, r = begin[i] + t;
        sp[r] = table[slot / ps];
        so[r] = slot % ps;
        rs[r] = index[l].page_begin[i];
        rl[r] = slot + 1;
        index[l].max_len = std::max(index[l].max_len, slot + 1);
      }
      std::copy(table.begin(), table.end(), pg + index[l].page_begin[i]);
    }
  }
  slot_page = slot_page.to(dev);
  slot_offset = slot_offset.to(dev);
  row_page_start = row_page_start.to(dev);
  row_len = row_len.to(dev);
  pages = pages.to(dev);
  for (int64_t l = 0; l < layers; ++l) {
    index[l].slot_page = slot_page[l];
    index[l].slot_offset = slot_offset[l];
    index[l].row_page_start = row_page_start[l];
    index[l].row_len = row_len[l];
    index[l].pages = pages[l];
  }
  const at::Tensor token_ids = at::from_blob(tokens.data(), {rows}, i64).to(dev);
  const at::Tensor pos = at::from_blob(positions.data(), {rows}, i64).to(dev);
  const at::Tensor cos = rope_cos_.index_select(0, pos), sin = rope_sin_.index_select(0, pos);

  at::Tensor& k_pages = pool.k_pages();  // [P, nkv, hd, ps]
  at::Tensor& v_pages = pool.v_pages();  // [P, nkv, ps, hd]
  at::Tensor x = token_embedding_.tensor.index_select(0, token_ids).to(at::kFloat);  // residual stream [rows, d]
  for (int64_t l = 0; l < layers; ++l) {
    const Layer& L = layers_[l];
    const LayerIndex& ix = index[l];
    const at::Tensor qkv =
        project(rms_norm(x, L.attn_norm, c.rms_norm_eps).to(options_.dtype), L.wqkv.tensor, L.bqkv).to(at::kFloat);
    const at::Tensor q = apply_rope(qkv.narrow(1, 0, nh * hd).view({rows, nh, hd}), cos, sin).to(options_.dtype);
    const at::Tensor k = apply_rope(qkv.narrow(1, nh * hd, nkv * hd).view({rows, nkv, hd}), cos, sin).to(options_.dtype);
    const at::Tensor v = qkv.narrow(1, (nh + nkv) * hd, nkv * hd).view({rows, nkv, hd}).to(options_.dtype);
    at::Tensor attention;
#if VC_WITH_CUDA
    if (cuda_kernels) {
      cuda::write_kv_pages_tensor(k, v, ix.slot_page, ix.slot_offset, k_pages, v_pages);
      attention = cuda::paged_attention_tensor(q, k_pages, v_pages, ix.pages, ix.row_page_start, ix.row_len,
                                               ix.max_len, scale)
                      .view({rows, nh * hd});
    }
#endif
    if (!cuda_kernels) {
      k_pages.index_put_({ix.slot_page, Slice(), Slice(), ix.slot_offset}, k);
      v_pages.index_put_({ix.slot_page, Slice(), ix.slot_offset, Slice()}, v);
      attention = attention_by_gather(q, pool, ix, batch, begin, l, scale);
    }
    if (observer) {
      std::vector<int64_t> request_ids(batch.size()), cache_lengths(batch.size());
      for (size_t i = 0; i < batch.size(); ++i) {
        request_ids[i] = batch[i].request_id;
        cache_lengths[i] = batch[i].kv->length(l);
      }
      LayerActivations acts;
      acts.layer = l;
      acts.residual = x;
      acts.hidden = rms_norm(x, L.attn_norm, c.rms_norm_eps);
      acts.q = q;
      acts.k = k;
      acts.v = v;
      acts.positions = pos;
      acts.row_offsets = begin;
      acts.request_ids = request_ids;
      acts.cache_lengths = cache_lengths;
      const Status s = observer(acts);
      if (!s.ok()) return s;
    }
    x = x + project(attention, L.wo.tensor).to(at::kFloat);
    const at::Tensor gate_up = project(rms_norm(x, L.ffn_norm, c.rms_norm_eps).to(options_.dtype), L.w_gate_up.tensor);
    const at::Tensor act = at::silu(gate_up.narrow(1, 0, c.d_ff)) * gate_up.narrow(1, c.d_ff, c.d_ff);
    x = x + project(act, L.w_down.tensor).to(at::kFloat);
  }
  const std::vector<int64_t> out_rows = logit_rows(batch, begin);
  if (out_rows.empty()) {
    *logits = at::empty({0, c.vocab_size}, at::kFloat);
    return Status();
  }
  const at::Tensor selected = x.index_select(0, at::tensor(out_rows, i64).to(dev));
  const at::Tensor h = rms_norm(selected, output_norm_, c.rms_norm_eps).to(options_.dtype);
  *logits = project(h, output_.tensor).to(at::kFloat).to(at::kCPU).contiguous();
  return Status();
}

}  // namespace vericache
