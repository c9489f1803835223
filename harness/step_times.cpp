#include "step_times.h"

namespace vericache::cli {

void StepTimes::on_step(const StepRecord& s) {
  const int64_t tokens = pending_tokens_;  // on_window() ran for this step's windows before on_step()
  pending_tokens_ = 0;
  if (s.prefill_items > 0) return;
  stall_seconds += s.stall_seconds;
  const bool whole_batch = full_batch > 0 && s.draft_items + s.verify_items == full_batch;
  if (s.verify_items > 0) {
    verify_seconds += s.seconds;
    ++verify_steps;
    if (s.draft_items == 0 && s.rows == s.verify_items) {
      fallback_seconds += s.seconds;
      ++fallback_steps;
    } else if (s.draft_items == 0 && (full_batch == 0 || whole_batch)) {
      verify_only_seconds += s.seconds;
      ++verify_only_steps;
    }
  } else {
    draft_seconds += s.seconds;
    ++draft_steps;
  }
  if (whole_batch) {
    full_batch_seconds += s.seconds;
    full_batch_tokens += tokens;
  }
}

}  // namespace vericache::cli
