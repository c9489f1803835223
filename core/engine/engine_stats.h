// What the draft–verify engine measures, per request and overall, with vLLM's definitions of
// speculative-decoding metrics (vllm/v1/spec_decode/metrics.py):
//   drafts                 verify windows that carried at least one drafted token
//   draft_tokens           drafted tokens verified
//   accepted_tokens        drafted tokens accepted
//   mean acceptance length 1 + accepted_tokens / drafts   (the correction or bonus token included)
//   acceptance rate γ      accepted_tokens / draft_tokens
//   per-position rate      accepted_per_position[i] / drafted_per_position[i]
// Times come from the engine's Clock: each forward's duration is added, for every request in it,
// to the time of the phase that request was in (prefill, draft or verify); prefill time includes
// compression. Summed over requests, these times exceed the wall time of batched runs.
// Thread-safety: plain values; a StatsSink is called from the engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace vericache {

struct RequestMetrics {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t drafts = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  std::vector<int64_t> drafted_per_position;   // [i]: windows with a draft at position i
  std::vector<int64_t> accepted_per_position;  // [i]: of those, accepted
  int64_t verify_windows = 0;                  // verify forwards, also those with no draft (the last token)
  int64_t draft_steps = 0;                     // draft forwards this request took part in
  int64_t transfer_bytes = 0;                  // KV_full bytes moved into transient pages for verification
  double prefill_seconds = 0;
  double draft_seconds = 0;
  double verify_seconds = 0;
  double transfer_wait_seconds = 0;  // verify windows held back waiting for their KV_full copy
  int64_t full_kv_slots = 0;         // uncompressed cache length summed over layers, at the end
  int64_t resident_kv_slots = 0;     // compressed cache slots summed over layers, at the end
  // Bytes those slots take: float slots at the page dtype, packed slots at their packed page's bytes.
  int64_t full_kv_bytes = 0;
  int64_t resident_kv_bytes = 0;

  double mean_acceptance_length() const {
    return drafts > 0 ? 1.0 + static_cast<double>(accepted_tokens) / static_cast<double>(drafts) : 0.0;
  }
  // Drafts per verify window, windows of none included: what an adaptive draft policy chose on average.
  double mean_window() const {
    return verify_windows > 0 ? static_cast<double>(draft_tokens) / static_cast<double>(verify_windows) : 0.0;
  }
  double acceptance_rate() const {
    return draft_tokens > 0 ? static_cast<double>(accepted_tokens) / static_cast<double>(draft_tokens) : 0.0;
  }
  // Adds every counter and time of `other` (per-position vectors element-wise).
  void add(const RequestMetrics& other);
  // Counts one verify window of `drafted` tokens of which the first `accepted` were accepted (a
  // window of 0 drafts counts as a verify window only).
  void add_window(int64_t drafted, int64_t accepted);
};

// One engine step: one batched forward.
struct StepRecord {
  double start_seconds = 0;
  double seconds = 0;
  int64_t prefill_items = 0;
  int64_t draft_items = 0;
  int64_t verify_items = 0;
  int64_t rows = 0;          // token rows in the forward
  int64_t prefill_rows = 0;  // of those, prompt tokens
  // Cache slots the forward's attention reads: each item's cache length (packed slots included)
  // plus its new rows, summed over items and layers.
  int64_t kv_slots_read = 0;
  double stall_seconds = 0;  // with a scheduler: waiting, before the forward, for copies due now
};

// One verified window of one request.
struct WindowRecord {
  int64_t request_id = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
};

// Receives the engine's records as they happen (traces, progress). Default: ignores them.
class StatsSink {
 public:
  virtual ~StatsSink() = default;
  virtual void on_step(const StepRecord&) {}
  virtual void on_window(const WindowRecord&) {}
  // The logits that chose the token committed at `position` (the prompt's last row for the first
  // token, else the verify row that accepted or corrected it): vocab_size floats, valid during the
  // call only. Lets a caller compare VeriCache's distributions with full-KV decoding's.
  virtual void on_token_logits(int64_t /*request_id*/, int64_t /*position*/, std::span<const float> /*logits*/) {}
  // The compressed-cache logits that chose the draft for `position` (vocab_size floats, valid
  // during the call only): what drafting saw, for comparing KV_comp states.
  virtual void on_draft_logits(int64_t /*request_id*/, int64_t /*position*/, std::span<const float> /*logits*/) {}
};

}  // namespace vericache
