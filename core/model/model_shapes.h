// Named model shapes for random-weights models: the hyper-parameters of a published model without
// its weights, so timing runs can use a paper-relevant size (Llama-3.1-8B) that no file here holds.
// A model built from one (LlamaModel::with_random_weights) produces meaningless tokens: timing only.
#pragma once

#include <string>
#include <vector>

#include <vericache/status.h>

#include "model/llama_config.h"

namespace vericache {

struct NamedShape {
  std::string name;          // "llama-3.1-8b"
  std::string description;   // "Llama-3.1-8B (32 layers, d_model 4096, GQA 32/8, vocab 128256)"
  LlamaConfig config;        // architecture "llama"; config.name is `name`
  bool tied_embeddings = false;
};

// The shapes known by name, in a stable order.
const std::vector<NamedShape>& named_shapes();

// NotFound "unknown model shape 'X'; known shapes: a, b" for a name not in named_shapes().
Result<NamedShape> find_named_shape(const std::string& name);

}  // namespace vericache
