// Test-only faults the draft-verify engine can be told to make, so that tests can show their
// checks fail when the engine is wrong (a check that cannot fail proves nothing).
//
// Never set outside tests. The tests set EngineOptions::test_fault directly; `vericache run` takes
// one only from the environment variable VERICACHE_TEST_FAULT (parse_test_fault's format), is silent
// about it in --help and says on stderr that the run is faulted.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <vericache/status.h>

namespace vericache {

enum class TestFaultKind {
  kNone,
  // One verify row's logits lose their largest entry (it becomes the lowest float): the row that
  // decides output token `output_position` (>= 1; token 0 comes from the prefill) of request
  // `request`, in every window that computes it. Greedy output then differs at that position.
  kPerturbVerifyRow,
  // Sampled drafts (T > 0): q of draft i is taken from draft i + 1's row (the last keeps its own),
  // every window of every request: the acceptance ratio p/q is computed against the wrong q.
  kDraftProbsFromNextRow,
  // T > 0: p of draft i is taken from verify row i + 1 (row x keeps its own), every window of
  // every request: drafts are judged against the next position's full-KV distribution.
  kTargetFromNextRow,
  // KV_comp left behind by windows of no drafts is never caught up: the next window drafts on a
  // compressed cache missing the tokens decoded on the full cache (tests only; not parsed).
  kSkipCompCatchUp,
};

struct TestFault {
  TestFaultKind kind = TestFaultKind::kNone;
  int64_t request = -1;          // kPerturbVerifyRow only
  int64_t output_position = -1;  // kPerturbVerifyRow only
};

// "perturb_verify_row:REQUEST:POSITION", "draft_probs_from_next_row" or "target_from_next_row".
// InvalidArgument naming the accepted forms.
Result<TestFault> parse_test_fault(const std::string& text);
// The form parse_test_fault reads, for messages.
std::string describe_test_fault(const TestFault& fault);

// kPerturbVerifyRow: `rows` holds a window's x + 1 verify rows of `vocab` logits of request
// `request_id`, row 0 deciding output token `first_output`. Returns `rows`, or a perturbed copy in
// `*scratch` when the fault hits this window.
const float* apply_verify_row_fault(const TestFault& fault, int64_t request_id, int64_t first_output, int64_t x,
                                    int64_t vocab, const float* rows, std::vector<float>* scratch);

// kDraftProbsFromNextRow / kTargetFromNextRow: shifts the window's q (or p) rows by one.
void apply_draft_probs_fault(const TestFault& fault, std::vector<std::vector<float>>* draft_probs);
void apply_target_fault(const TestFault& fault, std::vector<std::vector<float>>* target_probs);

}  // namespace vericache
