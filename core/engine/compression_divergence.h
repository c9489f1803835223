// How far decoding on a compressed cache drifts from full-KV decoding, one step at a time. Both
// caches are teacher forced along the full-KV greedy continuation, so every step compares the two
// next-token distributions after the same tokens: the per-step KL the compressor papers report,
// and the quantity that decides how many drafted tokens verification accepts.
//
// Ownership: everything is borrowed for the call. Thread-safety: the engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include <vericache/compressor.h>

#include "engine/compression.h"
#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "model/llama_model.h"

namespace vericache {

struct DivergenceStep {
  int32_t token = 0;         // the full-KV greedy token fed at this step
  double kl = 0;             // KL(p_full || p_compressed) of the next token, in nats, temperature 1
  bool same_argmax = false;  // the compressed cache's greedy next token is the full-KV one
};

// The full-KV greedy continuation of a prompt: the tokens fed and the next-token logits after each.
struct GreedyReference {
  std::vector<int32_t> tokens;  // [steps]: t_0 = the first token after the prompt, t_{i+1} = argmax of row i
  std::vector<float> logits;    // [steps * vocab], row-major: row i is the distribution after t_i
};

// `full` holds a prompt of `start` tokens; `first_token` is the full-KV greedy token after it.
// Step i feeds t_i at position start + i in a one-token forward and takes t_{i+1} = argmax of its
// logits. Computed once per prompt, it is the reference every compressed cache is compared with.
// `full` grows by `steps` tokens: its pool must have room (OutOfPages otherwise). Forward failures
// are returned; the cache is then left as far as it got.
Result<GreedyReference> full_kv_greedy_reference(const LlamaModel& model, PagePool& full_pool, SequenceKv& full,
                                                 int32_t first_token, int64_t start, int64_t steps);

// `compressed` holds the prompt of `start` tokens after compression (its slots carry their own
// positions). Step i feeds reference.tokens[i] at position start + i in a one-token forward and
// compares the next-token distribution with reference row i. An online compressor (`online`,
// nullptr for none) sees the forwards at kept fraction `ratio` and its drops are applied, as in the
// engine. A quantizer's cache (`packing`; pack it with pack_front() before the call) reads its
// packed slots and packs each block as it is completed, as the engine does with committed tokens.
// `compressed` grows by reference.tokens.size() tokens; failures as above.
Result<std::vector<DivergenceStep>> divergence_along(const LlamaModel& model, const GreedyReference& reference,
                                                     PagePool& compressed_pool, SequenceKv& compressed, int64_t start,
                                                     Compressor* online = nullptr, double ratio = 1.0,
                                                     const Packing* packing = nullptr);

// Both of the above for one compressed cache: `full` and `compressed` hold the same prompt.
Result<std::vector<DivergenceStep>> divergence_along_full_kv_greedy(const LlamaModel& model, PagePool& full_pool,
                                                                    SequenceKv& full, PagePool& compressed_pool,
                                                                    SequenceKv& compressed, int32_t first_token,
                                                                    int64_t start, int64_t steps,
                                                                    Compressor* online = nullptr, double ratio = 1.0,
                                                                    const Packing* packing = nullptr);

// KL(p || q) in nats of the softmax distributions of two logit rows of length `vocab`, in double.
double kl_divergence_of_logits(const float* p_logits, const float* q_logits, int64_t vocab);

}  // namespace vericache
