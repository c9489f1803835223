// KVzip's scoring by context reconstruction (Kim et al., "KVzip: Query-Agnostic KV Cache
// Compression with Context Reconstruction", 2025), as kvpress's KVzipPress computes it. Shared by
// the kvzip plugin and `vericache train-kvzap` (the KVzap surrogate's teacher).
//
// The context [context_start, n) of a request's prompt is cut into chunks of `chunk_size`. For
// chunk i the model runs, after the full cache and without keeping its KV,
//   "\n\nRepeat the previous context exactly."                        (i = 0)
//   "\n\nRepeat the part of the previous context exactly, starting with" + last 8 tokens of chunk i-1
// followed by the chat template's assistant header and the chunk itself, at positions n, n+1, ...
// In every layer the pass's post-RoPE queries attend (softmax, float32) over a sub-sampled key set:
// the first min(n_sink, chunk start) cached keys, the chunk's cached keys and the pass's own keys
// (causal). A chunk token's score for KV head h is the max over h's query group and over all pass
// rows. KVzip+ (`plus`) multiplies each weight by ||W_O,j v_t|| / ||x_r||.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <vericache/compressor.h>
#include <vericache/kv_view.h>

namespace vericache::kvzip {

struct ScoringOptions {
  int64_t n_sink = 4;          // cached keys always in the sub-sampled softmax
  int64_t chunk_size = 2048;   // context tokens reconstructed per pass
  int64_t context_start = 4;   // first scored position; earlier positions score 0
  bool plus = false;           // KVzip+ normalisation
};

// Scores of every position of the request's full cache: [n_layers] float32 [n_kv_heads, n];
// positions before context_start score 0. Errors: InvalidArgument when the passes would run past
// the model's context; whatever run_without_keeping reports.
Status score_context(const KvCacheView& full_kv, ModelAccess& model, const ScoringOptions& options,
                     std::vector<at::Tensor>* scores);

}  // namespace vericache::kvzip
