// LlamaConfig: the hyper-parameters of a Llama-family model (architectures llama and qwen2), read
// from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>

#include <vericache/status.h>

#include "model/gguf_file.h"

namespace vericache {

// The longest context a model file may declare: the RoPE tables are sized by it at load.
constexpr int64_t kMaxContextLength = 1 << 18;

struct LlamaConfig {
  std::string architecture;  // general.architecture: "llama" or "qwen2"
  std::string name;          // general.name, "" when absent
  int64_t n_layers = 0;
  int64_t d_model = 0;       // embedding_length
  int64_t d_ff = 0;          // feed_forward_length
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;      // d_model / n_heads
  int64_t context_length = 0;
  int64_t vocab_size = 0;
  double rope_freq_base = 10000.0;
  double rms_norm_eps = 1e-5;
  // qwen2: the Q, K and V projections have biases.
  bool attention_bias = false;
  // How the file's Q/K rows pair channels for RoPE. llama GGUF files store Q/K permuted so RoPE
  // rotates adjacent channels (2i, 2i+1); qwen2 files keep Hugging Face's order, where RoPE rotates
  // channel i with i + head_dim / 2. The loader permutes such rows into the adjacent order, so one
  // RoPE serves both and compressors see one layout (vericache/compressor.h).
  bool rope_pairs_halves = false;

  // Reads `<arch>.*` keys (arch llama or qwen2). Corruption for a value out of its range (one line
  // naming the key and the range) or a block_count that differs from the layers the file holds.
  // NotSupported for another architecture, RoPE scaling, or a shape the kernels cannot run
  // (head_dim not 64 or 128, more than 16 query heads per KV head).
  static Result<LlamaConfig> from_gguf(const GgufFile& file);

  // Parameters, counting tied embeddings once.
  int64_t parameter_count(bool tied_embeddings) const;
};

}  // namespace vericache
