#include "model/llama_model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "model/ggml_dequant.h"
#include "util/check.h"
#include "util/thread_pool.h"

namespace vericache {
namespace {

// A GGUF weight as a float32 tensor in PyTorch order (GGUF dims reversed), after checking its
// shape against what the config implies.
Result<at::Tensor> load_tensor(const GgufFile& file, const std::string& name, std::vector<int64_t> torch_shape) {
  const GgufTensorInfo* info = file.find_tensor(name);
  if (info == nullptr) return Status::not_found(file.path() + ": missing tensor '" + name + "'");
  std::vector<int64_t> found(info->dims.rbegin(), info->dims.rend());
  if (found != torch_shape) {
    auto str = [](const std::vector<int64_t>& s) {
      std::string out = "[";
      for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
      return out + "]";
    };
    return Status::corruption(file.path() + ": tensor '" + name + "' has shape " + str(found) + ", expected " +
                              str(torch_shape));
  }
  at::Tensor t = at::empty(torch_shape, at::kFloat);
  Status s = dequantize(info->type, info->data, info->n_elements, t.data_ptr<float>());
  if (!s.ok()) return s.with_context(file.path() + ": tensor '" + name + "'");
  return t;
}

// Columns are handed to threads in groups of this many, so column tiles stay whole.
constexpr int64_t kColumnGroup = 8;

void parallel_linear(const cpu::KernelTable& k, const float* x, int64_t ldx, int64_t m, int64_t kdim,
                     const at::Tensor& w, float* y, int64_t ldy) {
  const int64_t n = w.size(0);
  const float* wp = w.data_ptr<float>();
  ThreadPool::global().parallel_for((n + kColumnGroup - 1) / kColumnGroup, 1, [&](int64_t g0, int64_t g1) {
    k.linear(x, ldx, m, kdim, wp, g0 * kColumnGroup, std::min(n, g1 * kColumnGroup), y, ldy);
  });
}

void parallel_rms_norm(const cpu::KernelTable& k, const float* x, int64_t rows, int64_t d, const at::Tensor& w,
                       float eps, float* y) {
  const float* wp = w.data_ptr<float>();
  ThreadPool::global().parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) k.rms_norm(x + r * d, d, wp, eps, y + r * d);
  });
}

}  // namespace

Result<std::unique_ptr<LlamaModel>> LlamaModel::load(const std::string& path) {
  VC_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  model->path_ = path;
  VC_ASSIGN_OR_RETURN(model->config_, LlamaConfig::from_gguf(file));
  VC_ASSIGN_OR_RETURN(model->tokenizer_, Tokenizer::from_gguf(file));
  if (model->tokenizer_.vocab_size() != model->config_.vocab_size) {
    return Status::corruption(path + ": tokenizer has " + std::to_string(model->tokenizer_.vocab_size()) +
                              " tokens but the embedding has " + std::to_string(model->config_.vocab_size) + " rows");
  }
  auto chat = ChatTemplate::from_gguf(file);
  if (chat.ok()) {
    model->chat_template_ = std::move(chat).value();
  } else {
    model->chat_template_status_ = chat.status();
  }
  VC_RETURN_IF_ERROR(model->load_weights(file));
  model->build_rope_table();
  model->kernels_ = &cpu::best_kernels();
  return model;
}

Status LlamaModel::load_weights(const GgufFile& file) {
  const LlamaConfig& c = config_;
  const int64_t d = c.d_model, hd = c.head_dim, kv = c.n_kv_heads * hd;
  std::map<std::string, int> type_counts;
  for (const GgufTensorInfo& t : file.tensors()) {
    if (t.dims.size() == 2) ++type_counts[ggml_type_name(t.type)];
  }
  for (const auto& [name, count] : type_counts) {
    if (weight_type_.empty() || count > type_counts[weight_type_]) weight_type_ = name;
  }

  VC_ASSIGN_OR_RETURN(token_embedding_, load_tensor(file, "token_embd.weight", {c.vocab_size, d}));
  VC_ASSIGN_OR_RETURN(output_norm_, load_tensor(file, "output_norm.weight", {d}));
  tied_embeddings_ = file.find_tensor("output.weight") == nullptr;
  if (tied_embeddings_) {
    output_ = token_embedding_;
  } else {
    VC_ASSIGN_OR_RETURN(output_, load_tensor(file, "output.weight", {c.vocab_size, d}));
  }
  layers_.resize(c.n_layers);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer& L = layers_[l];
    VC_ASSIGN_OR_RETURN(L.attn_norm, load_tensor(file, p + "attn_norm.weight", {d}));
    VC_ASSIGN_OR_RETURN(at::Tensor wq, load_tensor(file, p + "attn_q.weight", {c.n_heads * hd, d}));
    VC_ASSIGN_OR_RETURN(at::Tensor wk, load_tensor(file, p + "attn_k.weight", {kv, d}));
    VC_ASSIGN_OR_RETURN(at::Tensor wv, load_tensor(file, p + "attn_v.weight", {kv, d}));
    L.wqkv = at::cat({wq, wk, wv}, 0);
    VC_ASSIGN_OR_RETURN(L.wo, load_tensor(file, p + "attn_output.weight", {d, c.n_heads * hd}));
    VC_ASSIGN_OR_RETURN(L.ffn_norm, load_tensor(file, p + "ffn_norm.weight", {d}));
    VC_ASSIGN_OR_RETURN(at::Tensor gate, load_tensor(file, p + "ffn_gate.weight", {c.d_ff, d}));
    VC_ASSIGN_OR_RETURN(at::Tensor up, load_tensor(file, p + "ffn_up.weight", {c.d_ff, d}));
    L.w_gate_up = at::cat({gate, up}, 0);
    VC_ASSIGN_OR_RETURN(L.w_down, load_tensor(file, p + "ffn_down.weight", {d, c.d_ff}));
  }
  return Status();
}

// cos/sin of pos * inv_freq[i], computed with the same float32 libtorch operations as the
// Hugging Face Llama rotary embedding, so positions agree with the reference to the last bit.
void LlamaModel::build_rope_table() {
  const int64_t half = config_.head_dim / 2;
  const at::Tensor exponents = at::arange(0, config_.head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(config_.head_dim);
  const at::Tensor inv_freq = 1.0 / at::pow(config_.rope_freq_base, exponents);
  const at::Tensor positions = at::arange(0, config_.context_length, at::kLong).to(at::kFloat);
  const at::Tensor angles = positions.unsqueeze(1) * inv_freq.unsqueeze(0);  // [context, half]
  rope_cos_ = angles.cos().contiguous();
  rope_sin_ = angles.sin().contiguous();
  VC_CHECK(rope_cos_.size(1) == half, "rope table width");
}

Result<ChatTemplate> LlamaModel::chat_template() const {
  if (chat_template_) return *chat_template_;
  return chat_template_status_;
}

KvPageSpec LlamaModel::kv_page_spec(int64_t page_size) const {
  return KvPageSpec{config_.n_layers, config_.n_kv_heads, config_.head_dim, page_size};
}

Result<PagePool> LlamaModel::make_page_pool(int64_t page_size, int64_t num_pages) const {
  return PagePool::create(kv_page_spec(page_size), num_pages, at::kFloat, at::kCPU);
}

Status LlamaModel::validate(std::span<const ForwardItem> batch, const PagePool& pool) const {
  const KvPageSpec& spec = pool.spec();
  if (spec.n_layers != config_.n_layers || spec.n_kv_heads != config_.n_kv_heads || spec.head_dim != config_.head_dim) {
    return Status::invalid_argument("forward: the KV page pool was made for another model shape");
  }
  if (pool.k_pages().scalar_type() != at::kFloat || !pool.k_pages().device().is_cpu()) {
    return Status::invalid_argument("forward: the CPU model needs a float32 CPU page pool");
  }
  int64_t pages_needed = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardItem& item = batch[i];
    const std::string where = "forward: request " + std::to_string(i) + ": ";
    if (item.kv == nullptr || item.kv->n_layers() != config_.n_layers) {
      return Status::invalid_argument(where + "needs a KV cache with " + std::to_string(config_.n_layers) + " layers");
    }
    if (item.tokens.size() != item.positions.size()) {
      return Status::invalid_argument(where + std::to_string(item.tokens.size()) + " tokens but " +
                                      std::to_string(item.positions.size()) + " positions");
    }
    for (int32_t t : item.tokens) {
      if (!tokenizer_.is_valid(t)) {
        return Status::invalid_argument(where + "token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                        std::to_string(config_.vocab_size) + ")");
      }
    }
    for (int32_t p : item.positions) {
      if (p < 0 || p >= config_.context_length) {
        return Status::invalid_argument(where + "position " + std::to_string(p) + " is outside the model's context of " +
                                        std::to_string(config_.context_length) + " tokens");
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (batch[j].kv == item.kv) return Status::invalid_argument(where + "shares its KV cache with request " + std::to_string(j));
    }
    pages_needed += item.kv->pages_needed(spec, static_cast<int64_t>(item.tokens.size()));
  }
  if (pages_needed > pool.num_free()) {
    return Status::out_of_pages("KV page pool exhausted: the batch needs " + std::to_string(pages_needed) + " pages, " +
                                std::to_string(pool.num_free()) + " of " + std::to_string(pool.num_pages()) + " free");
  }
  return Status();
}

Status LlamaModel::forward(std::span<const ForwardItem> batch, PagePool& pool, at::Tensor* logits) const {
  VC_RETURN_IF_ERROR(validate(batch, pool));
  const LlamaConfig& c = config_;
  const cpu::KernelTable& k = *kernels_;
  const int64_t d = c.d_model, hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads, dff = c.d_ff;
  const int64_t q_width = nh * hd, qkv_width = (nh + 2 * nkv) * hd;
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Token rows of all requests, concatenated; begin[i] is request i's first row.
  std::vector<int64_t> begin(batch.size() + 1, 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    begin[i + 1] = begin[i] + static_cast<int64_t>(batch[i].tokens.size());
    VC_CHECK(batch[i].kv->reserve(pool, static_cast<int64_t>(batch[i].tokens.size())).ok(), "validated reservation");
  }
  const int64_t rows = begin.back();

  std::vector<float> x(rows * d), h(rows * d), qkv(rows * qkv_width), attn(rows * q_width);
  std::vector<float> gate_up(rows * 2 * dff), act(rows * dff), proj(rows * d);
  std::vector<int32_t> positions(rows);
  const float* embedding = token_embedding_.data_ptr<float>();
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t t = 0; t < batch[i].tokens.size(); ++t) {
      const int64_t r = begin[i] + static_cast<int64_t>(t);
      std::copy_n(embedding + static_cast<int64_t>(batch[i].tokens[t]) * d, d, x.data() + r * d);
      positions[r] = batch[i].positions[t];
    }
  }

  // Attention work: (request, KV head, tile of new rows). Tiles bound the per-item work so
  // prefill spreads over threads; they do not change any result.
  struct AttentionWork {
    int64_t item, kv_head, row0, row1;
  };
  constexpr int64_t kRowTile = 16;
  std::vector<AttentionWork> work;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t n = begin[i + 1] - begin[i];
    for (int64_t g = 0; g < nkv; ++g)
      for (int64_t r = 0; r < n; r += kRowTile) work.push_back({static_cast<int64_t>(i), g, r, std::min(n, r + kRowTile)});
  }

  const float* cos_table = rope_cos_.data_ptr<float>();
  const float* sin_table = rope_sin_.data_ptr<float>();
  float* k_pages = pool.k_pages().data_ptr<float>();
  float* v_pages = pool.v_pages().data_ptr<float>();
  const int64_t ps = pool.spec().page_size;

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const Layer& L = layers_[l];
    parallel_rms_norm(k, x.data(), rows, d, L.attn_norm, eps, h.data());
    parallel_linear(k, h.data(), d, rows, d, L.wqkv, qkv.data(), qkv_width);

    // RoPE on Q and K heads (pairs of adjacent channels), then K/V into the pages.
    ThreadPool::global().parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* cs = cos_table + positions[r] * (hd / 2);
        const float* sn = sin_table + positions[r] * (hd / 2);
        float* row = qkv.data() + r * qkv_width;
        for (int64_t head = 0; head < nh + nkv; ++head) {
          float* v = row + head * hd;
          for (int64_t i = 0; i < hd / 2; ++i) {
            const float x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = x0 * cs[i] - x1 * sn[i];
            v[2 * i + 1] = x1 * cs[i] + x0 * sn[i];
          }
        }
      }
    });
    for (size_t i = 0; i < batch.size(); ++i) {
      const SequenceKv& kv = *batch[i].kv;
      const std::vector<int32_t>& table = kv.block_table(l);
      for (int64_t t = 0; t < begin[i + 1] - begin[i]; ++t) {
        const int64_t slot = kv.length(l) + t;
        const int64_t page = table[slot / ps], off = slot % ps;
        const float* row = qkv.data() + (begin[i] + t) * qkv_width;
        for (int64_t g = 0; g < nkv; ++g) {
          const float* kr = row + q_width + g * hd;
          const float* vr = row + q_width + nkv * hd + g * hd;
          float* kp = k_pages + ((page * nkv + g) * hd) * ps + off;
          for (int64_t e = 0; e < hd; ++e) kp[e * ps] = kr[e];
          std::copy_n(vr, hd, v_pages + ((page * nkv + g) * ps + off) * hd);
        }
      }
    }

    ThreadPool::global().parallel_for(static_cast<int64_t>(work.size()), 1, [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1; ++w) {
        const AttentionWork& job = work[w];
        const SequenceKv& kv = *batch[job.item].kv;
        cpu::PagedAttentionArgs a;
        a.q = qkv.data() + begin[job.item] * qkv_width;
        a.q_row_stride = qkv_width;
        a.out = attn.data() + begin[job.item] * q_width;
        a.out_row_stride = q_width;
        a.k_pages = k_pages;
        a.v_pages = v_pages;
        a.block_table = kv.block_table(l).data();
        a.page_size = ps;
        a.n_heads = nh;
        a.n_kv_heads = nkv;
        a.head_dim = hd;
        a.cached_len = kv.length(l);
        a.n_rows = begin[job.item + 1] - begin[job.item];
        a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
        k.attention(a, job.kv_head, job.row0, job.row1);
      }
    });

    parallel_linear(k, attn.data(), q_width, rows, q_width, L.wo, proj.data(), d);
    for (int64_t e = 0; e < rows * d; ++e) x[e] += proj[e];

    parallel_rms_norm(k, x.data(), rows, d, L.ffn_norm, eps, h.data());
    parallel_linear(k, h.data(), d, rows, d, L.w_gate_up, gate_up.data(), 2 * dff);
    ThreadPool::global().parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* g = gate_up.data() + r * 2 * dff;
        k.silu_mul(g, g + dff, dff, act.data() + r * dff);
      }
    });
    parallel_linear(k, act.data(), dff, rows, dff, L.w_down, proj.data(), d);
    for (int64_t e = 0; e < rows * d; ++e) x[e] += proj[e];
  }

  std::vector<int64_t> logit_rows;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (begin[i + 1] == begin[i]) continue;
    if (batch[i].logits == LogitRows::kLast) logit_rows.push_back(begin[i + 1] - 1);
    if (batch[i].logits == LogitRows::kAll)
      for (int64_t r = begin[i]; r < begin[i + 1]; ++r) logit_rows.push_back(r);
  }
  const int64_t n_out = static_cast<int64_t>(logit_rows.size());
  std::vector<float> final_h(n_out * d);
  for (int64_t j = 0; j < n_out; ++j) {
    k.rms_norm(x.data() + logit_rows[j] * d, d, output_norm_.data_ptr<float>(), eps, final_h.data() + j * d);
  }
  *logits = at::empty({n_out, c.vocab_size}, at::kFloat);
  if (n_out > 0) parallel_linear(k, final_h.data(), d, n_out, d, output_, logits->data_ptr<float>(), c.vocab_size);

  for (size_t i = 0; i < batch.size(); ++i) batch[i].kv->advance(begin[i + 1] - begin[i]);
  return Status();
}

}  // namespace vericache
