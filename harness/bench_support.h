// What the benchmark subcommands (bench-engine, bench-acceptance) share: the compressor list, the
// prompt text, and one prefill per context that every compressor observes.
//
// Ownership: everything is borrowed for the call. Thread-safety: the engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <vericache/compressor.h>
#include <vericache/status.h>

#include "engine/draft_verify_engine.h"
#include "engine/engine_stats.h"
#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "model/llama_model.h"
#include "step_times.h"

namespace vericache::cli {

// Seconds on the steady clock.
double now_seconds();

// Loads each comma-separated name of `names` with its NAME=JSON entry of `params` ({} when it has
// none) and attaches it to `model`. InvalidArgument for an empty list, a malformed NAME=JSON, an
// entry for a compressor not in the list, or an online token dropper (the benchmarks compress once
// after the prefill; quantizers pack as the engine does); a plugin's own refusal is returned as it is.
Result<std::vector<std::shared_ptr<Compressor>>> load_offline_compressors(const std::string& names,
                                                                          const std::vector<std::string>& params,
                                                                          const LlamaModel& model);

// InvalidArgument naming the first context C of `contexts` for which C + `decode_tokens` + a verify
// window of `window` tokens does not fit in the model's context.
Status check_contexts_fit(const LlamaModel& model, const std::vector<int64_t>& contexts, int64_t decode_tokens,
                          int64_t window);

// The token ids (no chat template, no BOS) of the text in `text_files`: one path or several joined
// by commas, each a plain text file or a prompt set (.json, harness/prompt_set.h: its prompts' texts
// in order), joined by blank lines. The prompt of context C is its first C tokens (or, for distinct
// requests, the i-th stretch of C tokens). InvalidArgument "<files> has N tokens, fewer than the K
// the prompts need" when the text holds fewer than `tokens_needed` tokens.
Result<std::vector<int32_t>> bench_corpus(const LlamaModel& model, const std::string& text_files, int64_t tokens_needed);

// The prompt of context `context` cut from `corpus`: its first `context` tokens when `question` is
// empty; otherwise a chat-template user message "<question>\n\n<text>" whose text is the opening of
// the corpus cut so that the whole prompt holds about `context` tokens (re-tokenizing the cut text
// can move the count by a token or two).
Result<std::vector<int32_t>> bench_prompt(const LlamaModel& model, const std::vector<int32_t>& corpus, int64_t context,
                                          const std::string& question);

// Prefills `prompt` into the empty `kv` in forwards of `chunk` tokens, every layer of each handed to
// every compressor's update() (drops are ignored: offline compressors return none). `next_logits`
// receives the logits after the prompt (vocab_size floats).
Status prefill_observed(const LlamaModel& model, PagePool& pool, SequenceKv& kv, std::span<const int32_t> prompt,
                        int64_t chunk, std::span<const std::shared_ptr<Compressor>> compressors, double ratio,
                        std::vector<float>* next_logits);

// One prefilled prompt: its cache (pages of a base pool shared by all prompts) and the logits
// after it (vocab_size floats). Borrowed.
struct PrefilledPrompt {
  const SequenceKv* kv = nullptr;
  std::span<const float> next_logits;
};

// Full-KV greedy decoding of the prefilled `prompts` (all in `base_pool`) as one batch, one token
// per request per forward, `decode_tokens` tokens each (the first from its `next_logits`).
// tokens[i] is prompt i's output. Prompts that share a cache must decode identically (a batch-
// invariance check): Internal otherwise.
struct FullKvDecode {
  std::vector<std::vector<int32_t>> tokens;
  double seconds = 0;  // the decode forwards (decode_tokens - 1 of them)
  double step_ms() const;
  double tok_s() const;  // every request's tokens after the first, per second
};
Result<FullKvDecode> decode_full_kv(const LlamaModel& model, std::span<const PrefilledPrompt> prompts,
                                    const PagePool& base_pool, int64_t decode_tokens, int64_t page_size);

// Positions where an engine result's tokens differ from want[request_id] (a missing token counts),
// summed over the results. The engine numbers its requests 0, 1, ... in the order they were added.
int64_t count_mismatches(const std::vector<EngineResult>& results, const std::vector<std::vector<int32_t>>& want);

}  // namespace vericache::cli
