#include "engine/window_verdict.h"

#include <algorithm>
#include <vector>

#include "engine/test_faults.h"
#include "util/check.h"

namespace vericache {

WindowVerdict judge_window(EngineRequest& r, const float* rows, int64_t vocab, const EngineOptions& options) {
  const int64_t x = static_cast<int64_t>(r.drafts.size());
  // Row 0 decides the output token after the last committed one.
  std::vector<float> faulted_rows;
  const int64_t first_output = r.committed + 1 - static_cast<int64_t>(r.req.prompt.size());
  rows = apply_verify_row_fault(options.test_fault, r.id, first_output, x, vocab, rows, &faulted_rows);
  if (r.req.sampling.greedy()) return verify_greedy(r.drafts, rows, vocab);
  std::vector<std::vector<float>> target(x + 1);
  for (int64_t i = 0; i <= x; ++i) target[i] = dense_distribution(rows + i * vocab, vocab, r.req.sampling);
  apply_target_fault(options.test_fault, &target);
  apply_draft_probs_fault(options.test_fault, &r.draft_probs);
  return verify_sampled(r.drafts, r.draft_probs, options.draft_sampling, target, r.rng);
}

void refill_comp(EngineRequest& r, PagePool& device, PagePool& host, int64_t end) {
  const Status s = r.comp.append_range(device, r.full, host, r.comp_end, end - r.comp_end);
  VC_CHECK(s.ok(), "refilling KV_comp: the admission reservation did not hold");
  r.comp_end = end;
}

void roll_back(EngineRequest& r, int64_t accepted, PagePool& device, PagePool& host, bool transfer, DraftKv draft_kv,
               bool defer_comp_refill) {
  const int64_t old = r.committed, end = old + accepted + 1;
  if (transfer) {
    // The verify forward wrote into the transient copy: carry the committed rows to the host store.
    const Status s = r.full.append_range(host, r.staged, device, old, end - old);
    VC_CHECK(s.ok(), "writing back verified K/V: the admission reservation did not hold");
    r.staged.release(device);
    r.ticket = 0;
  } else {
    r.full.truncate(host, end);
  }
  if (r.full_only || defer_comp_refill) return;
  r.comp_end = std::min(r.comp_end, draft_kv == DraftKv::kVerified ? old : end);
  r.comp.truncate_positions(device, r.comp_end);
  refill_comp(r, device, host, end);
}

}  // namespace vericache
