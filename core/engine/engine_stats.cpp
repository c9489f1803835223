#include "engine/engine_stats.h"

#include <algorithm>

namespace vericache {

void RequestMetrics::add(const RequestMetrics& o) {
  prompt_tokens += o.prompt_tokens;
  generated_tokens += o.generated_tokens;
  drafts += o.drafts;
  draft_tokens += o.draft_tokens;
  accepted_tokens += o.accepted_tokens;
  const size_t n = std::max(drafted_per_position.size(), o.drafted_per_position.size());
  drafted_per_position.resize(n, 0);
  accepted_per_position.resize(n, 0);
  for (size_t i = 0; i < o.drafted_per_position.size(); ++i) {
    drafted_per_position[i] += o.drafted_per_position[i];
    accepted_per_position[i] += o.accepted_per_position[i];
  }
  verify_windows += o.verify_windows;
  draft_steps += o.draft_steps;
  transfer_bytes += o.transfer_bytes;
  prefill_seconds += o.prefill_seconds;
  draft_seconds += o.draft_seconds;
  verify_seconds += o.verify_seconds;
  transfer_wait_seconds += o.transfer_wait_seconds;
  full_kv_slots += o.full_kv_slots;
  resident_kv_slots += o.resident_kv_slots;
  full_kv_bytes += o.full_kv_bytes;
  resident_kv_bytes += o.resident_kv_bytes;
}

void RequestMetrics::add_window(int64_t drafted, int64_t accepted) {
  ++verify_windows;
  if (drafted == 0) return;
  ++drafts;
  draft_tokens += drafted;
  accepted_tokens += accepted;
  if (static_cast<int64_t>(drafted_per_position.size()) < drafted) {
    drafted_per_position.resize(drafted, 0);
    accepted_per_position.resize(drafted, 0);
  }
  for (int64_t i = 0; i < drafted; ++i) ++drafted_per_position[i];
  for (int64_t i = 0; i < accepted; ++i) ++accepted_per_position[i];
}

}  // namespace vericache
