#include "model/llama_config.h"

#include <cstdio>

#include "util/printable.h"

namespace vericache {
namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

}  // namespace

Result<LlamaConfig> LlamaConfig::from_gguf(const GgufFile& file) {
  const std::string& path = file.path();
  LlamaConfig c;
  VC_ASSIGN_OR_RETURN(c.architecture, file.get_string("general.architecture"));
  if (c.architecture != "llama" && c.architecture != "qwen2") {
    return Status::not_supported(path + ": architecture " + printable(c.architecture) +
                                 " is not supported (llama and qwen2 are)");
  }
  c.attention_bias = c.architecture == "qwen2";
  c.rope_pairs_halves = c.architecture == "qwen2";
  if (auto name = file.get_string("general.name"); name.ok()) c.name = *name;
  const std::string a = c.architecture + ".";
  VC_ASSIGN_OR_RETURN(c.n_layers, file.get_int(a + "block_count"));
  VC_ASSIGN_OR_RETURN(c.d_model, file.get_int(a + "embedding_length"));
  VC_ASSIGN_OR_RETURN(c.d_ff, file.get_int(a + "feed_forward_length"));
  VC_ASSIGN_OR_RETURN(c.n_heads, file.get_int(a + "attention.head_count"));
  c.n_kv_heads = c.n_heads;
  if (file.find(a + "attention.head_count_kv") != nullptr) {
    VC_ASSIGN_OR_RETURN(c.n_kv_heads, file.get_int(a + "attention.head_count_kv"));
  }
  VC_ASSIGN_OR_RETURN(c.context_length, file.get_int(a + "context_length"));
  VC_ASSIGN_OR_RETURN(c.rms_norm_eps, file.get_float(a + "attention.layer_norm_rms_epsilon"));
  if (file.find(a + "rope.freq_base") != nullptr) {
    VC_ASSIGN_OR_RETURN(c.rope_freq_base, file.get_float(a + "rope.freq_base"));
  }
  if (const GgufValue* scaling = file.find(a + "rope.scaling.type")) {
    const auto* s = std::get_if<std::string>(&scaling->data);
    if (s == nullptr || (*s != "none" && !s->empty())) {
      return Status::not_supported(path + ": RoPE scaling " + (s ? printable(*s) : std::string("?")) + " is not supported");
    }
  }
  const GgufTensorInfo* embd = file.find_tensor("token_embd.weight");
  if (embd == nullptr) return Status::not_found(path + ": missing tensor 'token_embd.weight'");
  c.vocab_size = embd->dims.size() == 2 ? embd->dims[1] : 0;
  if (file.find(a + "vocab_size") != nullptr) {
    VC_ASSIGN_OR_RETURN(int64_t v, file.get_int(a + "vocab_size"));
    if (v != c.vocab_size) {
      return Status::corruption(path + ": " + a + "vocab_size is " + std::to_string(v) + " but token_embd.weight has " +
                                std::to_string(c.vocab_size) + " rows");
    }
  }

  // Every value is checked before anything is sized by it (a huge context_length would size the
  // RoPE tables at load to gigabytes).
  auto in_range = [&](double v, const char* key, double lo, double hi) -> Status {
    if (!(v >= lo && v <= hi)) {
      return Status::corruption(path + ": metadata '" + a + key + "' = " + number(v) + " is out of range [" +
                                number(lo) + ", " + number(hi) + "]");
    }
    return Status();
  };
  VC_RETURN_IF_ERROR(in_range(c.n_layers, "block_count", 1, 1024));
  VC_RETURN_IF_ERROR(in_range(c.d_model, "embedding_length", 1, 65536));
  VC_RETURN_IF_ERROR(in_range(c.d_ff, "feed_forward_length", 1, 1 << 20));
  VC_RETURN_IF_ERROR(in_range(c.n_heads, "attention.head_count", 1, 1024));
  VC_RETURN_IF_ERROR(in_range(c.n_kv_heads, "attention.head_count_kv", 1, c.n_heads));
  VC_RETURN_IF_ERROR(in_range(c.context_length, "context_length", 1, kMaxContextLength));
  VC_RETURN_IF_ERROR(in_range(c.rms_norm_eps, "attention.layer_norm_rms_epsilon", 1e-12, 0.1));
  VC_RETURN_IF_ERROR(in_range(c.rope_freq_base, "rope.freq_base", 1, 1e9));
  if (c.vocab_size < 1 || c.vocab_size > (1 << 22)) {
    return Status::corruption(path + ": token_embd.weight has " + std::to_string(c.vocab_size) +
                              " rows; a vocabulary of 1 to 4194304 tokens is expected");
  }
  // The layers the file holds must be the layers block_count names: no fewer, and none ignored.
  if (file.find_tensor("blk." + std::to_string(c.n_layers - 1) + ".attn_q.weight") == nullptr ||
      file.find_tensor("blk." + std::to_string(c.n_layers) + ".attn_q.weight") != nullptr) {
    int64_t present = 0;
    while (file.find_tensor("blk." + std::to_string(present) + ".attn_q.weight") != nullptr) ++present;
    return Status::corruption(path + ": metadata '" + a + "block_count' = " + std::to_string(c.n_layers) +
                              " but the file has attention weights for " + std::to_string(present) +
                              " layers (blk.N.attn_q.weight)");
  }
  c.head_dim = c.d_model / c.n_heads;
  if (file.find(a + "rope.dimension_count") != nullptr) {
    VC_ASSIGN_OR_RETURN(int64_t rope_dim, file.get_int(a + "rope.dimension_count"));
    if (rope_dim != c.head_dim) {
      return Status::not_supported(path + ": rope.dimension_count " + std::to_string(rope_dim) + " differs from head_dim " +
                                   std::to_string(c.head_dim) + "; only RoPE over the whole head is supported");
    }
  }
  if (c.head_dim != 64 && c.head_dim != 128) {
    return Status::not_supported(path + ": head_dim " + std::to_string(c.head_dim) +
                                 " is not supported by the CPU kernels (64 and 128 are)");
  }
  if (c.n_heads / c.n_kv_heads > 16) {
    return Status::not_supported(path + ": more than 16 query heads per KV head is not supported");
  }
  return c;
}

int64_t LlamaConfig::parameter_count(bool tied_embeddings) const {
  const int64_t kv = n_kv_heads * head_dim;
  const int64_t per_layer = 2 * d_model + d_model * d_model * 2 + 2 * d_model * kv + 3 * d_model * d_ff;
  return n_layers * per_layer + d_model + vocab_size * d_model * (tied_embeddings ? 1 : 2);
}

}  // namespace vericache
