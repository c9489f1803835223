// Generator: full-KV autoregressive generation for a batch of requests — the baseline VeriCache
// must reproduce token for token.
//
// Prompts are prefilled in chunks (all requests batched, each chunk at most `prefill_chunk`
// tokens per request); then every step decodes one token for each unfinished request in one
// batched forward. Each request stops at an end-of-generation token (unless ignore_eos), after
// max_new_tokens, at the model's context length, or when the token callback says so.
//
// With a compressor (GeneratorOptions::compressor) each request decodes on its compressed cache
// alone — lossy by itself; this is the draft side VeriCache's verifier will check. Offline
// compressors see every prefill layer through update(), then compress() after the request's
// prefill (its cache is compacted into fewer pages); online ones see every forward and their
// drops are applied after it. New tokens continue from the uncompressed length (RoPE positions).
// Quantizers see every forward through update() too; each forward's committed whole blocks are
// packed (pack_front), and attention reads the packed slots through the quantizer's unpack().
//
// Ownership: borrows the model, the page pool and the compressor; every page it takes is returned before
// generate() returns, also on failure. Thread-safety: one generate() at a time per pool.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <vericache/status.h>

#include <vericache/compressor.h>

#include "engine/sampler.h"
#include "model/llama_model.h"

namespace vericache {

struct GenerationRequest {
  std::vector<int32_t> prompt;       // at least one token
  int64_t max_new_tokens = 64;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;     // empty: the tokenizer's end-of-generation tokens
  bool ignore_eos = false;           // generate exactly max_new_tokens (benchmarks)
};

enum class FinishReason { kEndOfGeneration, kLength, kContext, kStopped };
const char* finish_reason_name(FinishReason reason);  // "eos", "length", "context", "stop"

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated tokens; the end-of-generation token is not included
  FinishReason finish = FinishReason::kLength;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t decode_steps = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  double compress_seconds = 0;   // offline compress() + compaction, inside prefill_seconds
  int64_t full_kv_slots = 0;     // sum over requests and layers of the uncompressed cache length
  int64_t resident_kv_slots = 0; // the same for what each cache holds at the end (packed slots included)
  int64_t full_kv_bytes = 0;     // the uncompressed caches' bytes (the pool's float slots)
  int64_t resident_kv_bytes = 0; // what each cache holds at the end: float slots and packed pages
};

// Called after each generated token with the request index; returning false stops that request
// (FinishReason::kStopped, the token kept).
using TokenCallback = std::function<bool(size_t request, int32_t token)>;

struct GeneratorOptions {
  int64_t prefill_chunk = 512;
  Compressor* compressor = nullptr;  // borrowed, already attach()ed to the model; nullptr: full cache
  double ratio = 1.0;                // the kept fraction c the compressor runs at
};

class Generator {
 public:
  Generator(const LlamaModel& model, PagePool& pool, GeneratorOptions options = {})
      : model_(model), pool_(pool), options_(options) {}

  // InvalidArgument for an empty prompt or one that fills the context; OutOfPages when the pool
  // cannot hold the batch (size it with pages_needed()).
  Result<std::vector<GenerationResult>> generate(std::span<const GenerationRequest> requests,
                                                 const TokenCallback& on_token = {}, GenerationStats* stats = nullptr);

  // Pages a pool needs to run `requests` to completion, with room for `extra_slots` more slots in
  // one request at a time (the forwards an offline compressor runs without keeping their KV).
  static int64_t pages_needed(const LlamaModel& model, int64_t page_size, std::span<const GenerationRequest> requests,
                              int64_t extra_slots = 0);

 private:
  const LlamaModel& model_;
  PagePool& pool_;
  GeneratorOptions options_;
};

}  // namespace vericache
