// Running the draft-verify engine to completion and comparing its output with full-KV greedy
// decoding: what the conformance kit's lossless rule and the checklist's acceptance and
// end-to-end steps both measure.
//
// Ownership: borrows the model and the compressor in `options`. Thread-safety: one call at a time
// per model. Failure: the engine's or the Generator's own errors (a compressor failure is not one:
// it is reported per request in EngineResult::compressor_failure).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/draft_verify_engine.h"
#include "engine/engine_pools.h"
#include "engine/generator.h"

namespace vericache {

// How one request's output differs from its reference: the one comparison every lossless check
// makes — tokens and finish reason (diff_output) for run --check, the conformance kit and the
// checklist; tokens only (diff_tokens) for bench-engine, whose requests ignore EOS and run to their
// token count, so their finish reasons cannot differ.
struct OutputDiff {
  int64_t mismatched_tokens = 0;  // positions whose token differs; each position only one output has counts
  int64_t first_mismatch = -1;    // the first such position; -1 when the tokens agree
  bool finish_differs = false;    // the finish reasons differ (always false for a tokens-only diff)

  bool identical() const { return mismatched_tokens == 0 && !finish_differs; }
  // Mismatches to report: the differing tokens, or 1 when only the finish reason differs.
  int64_t mismatches() const { return mismatched_tokens > 0 ? mismatched_tokens : (finish_differs ? 1 : 0); }
};
OutputDiff diff_tokens(std::span<const int32_t> got, std::span<const int32_t> want);
// Tokens and finish reason.
OutputDiff diff_output(const GenerationResult& got, const GenerationResult& want);

struct FullKvComparison {
  std::vector<EngineResult> results;  // by request, in the order of `requests`
  RequestMetrics totals;
  std::vector<OutputDiff> diffs;      // per request: tokens and finish reason against the reference
};

// Full-KV greedy decoding of `requests` (Generator, all in one batch): the reference. `stats`
// (optional) receives the Generator's counts and times.
Result<std::vector<GenerationResult>> full_kv_reference(const LlamaModel& model, std::span<const GenerationRequest> requests,
                                                        int64_t page_size = 16, GenerationStats* stats = nullptr);

// Runs `requests` on a DraftVerifyEngine with `options` (pools sized to hold them all at once, or as
// `pools` overrides: requests then wait for pages) and compares every request's tokens and finish
// reason with `reference` (full_kv_reference of the same requests).
Result<FullKvComparison> compare_with_full_kv(const LlamaModel& model, const EngineOptions& options,
                                              std::span<const GenerationRequest> requests,
                                              const std::vector<GenerationResult>& reference, int64_t page_size = 16,
                                              const PoolOverrides& pools = {});

}  // namespace vericache
