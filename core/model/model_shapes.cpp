#include "model/model_shapes.h"

#include "util/printable.h"

namespace vericache {
namespace {

NamedShape llama_shape(std::string name, std::string description, int64_t layers, int64_t d_model, int64_t d_ff,
                       int64_t heads, int64_t kv_heads, int64_t context, int64_t vocab, double rope_base, bool tied) {
  LlamaConfig c;
  c.architecture = "llama";
  c.name = name;
  c.n_layers = layers;
  c.d_model = d_model;
  c.d_ff = d_ff;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = d_model / heads;
  c.context_length = context;
  c.vocab_size = vocab;
  c.rope_freq_base = rope_base;
  c.rms_norm_eps = 1e-5;
  return NamedShape{std::move(name), std::move(description), c, tied};
}

}  // namespace

const std::vector<NamedShape>& named_shapes() {
  // Values from the models' published configs. Llama-3.1's RoPE scaling is left out: it changes
  // the rotation angles, not the cost of a forward.
  static const std::vector<NamedShape> shapes = {
      llama_shape("llama-3.1-8b", "Llama-3.1-8B (32 layers, d_model 4096, d_ff 14336, GQA 32/8, vocab 128256)", 32, 4096,
                  14336, 32, 8, 131072, 128256, 500000.0, false),
      llama_shape("smollm2-135m", "SmolLM2-135M (30 layers, d_model 576, d_ff 1536, GQA 9/3, vocab 49152)", 30, 576, 1536,
                  9, 3, 8192, 49152, 100000.0, true),
  };
  return shapes;
}

Result<NamedShape> find_named_shape(const std::string& name) {
  std::string known;
  for (const NamedShape& s : named_shapes()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  return Status::not_found("unknown model shape " + printable(name) + "; known shapes: " + known);
}

}  // namespace vericache
