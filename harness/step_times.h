// StepTimes: what a benchmark learns from the engine's step records (StatsSink), the decode steps
// split by what each forward carried and the steady state of a full batch.
// Thread-safety: the engine thread only (as every StatsSink).
#pragma once

#include <cstdint>

#include "engine/engine_stats.h"

namespace vericache::cli {

// Engine step durations split by what the forward carried (prefill steps are left out): a step
// with any verify window counts as a verify step. With `full_batch` set, also the steady state: the
// tokens committed and the seconds spent in steps that carried every one of the batch's requests
// (a static batch ends with a tail where requests that finished early leave the batch part empty;
// continuous batching would refill it, so the steady state is the rate a full batch of B runs at).
class StepTimes : public StatsSink {
 public:
  void on_step(const StepRecord& s) override;
  void on_window(const WindowRecord& w) override { pending_tokens_ += w.accepted + 1; }
  int64_t full_batch = 0;  // requests in the batch (0: no steady-state accounting)
  double draft_seconds = 0, verify_seconds = 0, stall_seconds = 0;
  int64_t draft_steps = 0, verify_steps = 0;
  // Of the verify steps, those where every request decoded one token on KV_full (no drafts in the
  // step): the cost of an adaptive policy's fallback against plain full-KV decoding.
  double fallback_seconds = 0;
  int64_t fallback_steps = 0;
  // Of the verify steps, those that carried verify windows only, at least one with drafts (no
  // request drafting in the same forward), and with `full_batch` set every request of the batch:
  // what verifying a full batch costs, apart from steps it shares and from the tail.
  double verify_only_seconds = 0;
  int64_t verify_only_steps = 0;
  // Steps that carried all `full_batch` requests: their seconds and the tokens they committed.
  double full_batch_seconds = 0;
  int64_t full_batch_tokens = 0;
  double draft_ms() const { return mean_ms(draft_seconds, draft_steps); }
  double verify_ms() const { return mean_ms(verify_seconds, verify_steps); }
  double fallback_ms() const { return mean_ms(fallback_seconds, fallback_steps); }
  double verify_only_ms() const { return mean_ms(verify_only_seconds, verify_only_steps); }
  double decode_seconds() const { return draft_seconds + verify_seconds; }
  // Tokens per second (every request's) while the batch was full; 0 when no step was.
  double full_batch_tok_s() const {
    return full_batch_seconds > 0 ? static_cast<double>(full_batch_tokens) / full_batch_seconds : 0.0;
  }

 private:
  static double mean_ms(double seconds, int64_t steps) {
    return steps ? 1e3 * seconds / static_cast<double>(steps) : 0.0;
  }
  int64_t pending_tokens_ = 0;  // committed by the windows of the step being recorded
};

}  // namespace vericache::cli
