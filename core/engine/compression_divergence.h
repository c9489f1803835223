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

#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "model/llama_model.h"

namespace vericache {

struct DivergenceStep {
  int32_t token = 0;         // the full-KV greedy token fed at this step
  double kl = 0;             // KL(p_full || p_compressed) of the next token, in nats, temperature 1
  bool same_argmax = false;  // the compressed cache's greedy next token is the full-KV one
};

// `full` and `compressed` hold the same prompt of `start` tokens (the compressed one after
// compression: its slots carry their own positions); `first_token` is the full-KV greedy token
// after the prompt. Step i feeds token t_i at position start + i to each cache in a one-token
// forward, compares the two next-token distributions, and takes t_{i+1} = argmax of the full-KV
// logits. An online compressor (`online`, nullptr for none) sees the compressed cache's forwards at
// kept fraction `ratio` and its drops are applied, as in the engine.
// Both caches grow by `steps` tokens: their pools must have room (OutOfPages otherwise). Forward
// and compressor failures are returned; the caches are then left as far as they got.
Result<std::vector<DivergenceStep>> divergence_along_full_kv_greedy(const LlamaModel& model, PagePool& full_pool,
                                                                    SequenceKv& full, PagePool& compressed_pool,
                                                                    SequenceKv& compressed, int32_t first_token,
                                                                    int64_t start, int64_t steps,
                                                                    Compressor* online = nullptr, double ratio = 1.0);

// KL(p || q) in nats of the softmax distributions of two logit rows of length `vocab`, in double.
double kl_divergence_of_logits(const float* p_logits, const float* q_logits, int64_t vocab);

}  // namespace vericache
