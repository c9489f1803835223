// Running the draft-verify engine in tests: the full-KV reference, one engine run to completion,
// and the token-for-token comparison every lossless test makes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/draft_verify_engine.h"
#include "engine/generator.h"

namespace vericache::testing {

// Full-KV greedy decoding of `requests` with the Generator: the reference.
std::vector<GenerationResult> full_kv(const LlamaModel& m, const std::vector<GenerationRequest>& requests);

struct EngineRun {
  std::vector<EngineResult> results;  // by request id
  RequestMetrics totals;
  int64_t max_queued = 0;
  int64_t steps = 0;
};

// Runs `requests` to completion. Pools of 0 pages are sized to hold every request at once. Fails
// the test when a step fails or pages leak.
EngineRun run_engine(const LlamaModel& m, const EngineOptions& options, const std::vector<GenerationRequest>& requests,
                     int64_t device_pages = 0, int64_t host_pages = 0);

// Every request's tokens and finish reason equal the reference's.
void expect_identical(const EngineRun& run, const std::vector<GenerationResult>& reference, const std::string& label);

// The prompts of datasets/lossless_prompts at `prompts` (0-39 medium, 40-49 of 2K+ tokens) in one
// batch, 24 tokens each: every bundled plugin (bundled_plugins(): token droppers at c = 0.25, KVzap
// with a small surrogate trained on `m`; quantizers at their default bits, RotateKV and KVQuant
// calibrated on `m`) and each draft length of `xs` gives output identical to full-KV decoding, with
// no compressor failure. Prints the acceptance of each run, labelled with `model_label`.
inline const std::vector<int> kMediumAndLongPrompts = {0, 3, 40};
void expect_every_plugin_lossless(const LlamaModel& m, const std::string& model_label, const std::vector<int64_t>& xs,
                                  const std::vector<int>& prompts = kMediumAndLongPrompts);

}  // namespace vericache::testing
