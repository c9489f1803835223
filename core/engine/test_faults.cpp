#include "engine/test_faults.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include "engine/sampler.h"

namespace vericache {
namespace {

constexpr const char* kForms =
    "expected perturb_verify_row:REQUEST:POSITION (POSITION >= 1), draft_probs_from_next_row or target_from_next_row";

bool parse_int(const std::string& s, int64_t* out) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, *out);
  return ec == std::errc() && p == end;
}

}  // namespace

Result<TestFault> parse_test_fault(const std::string& text) {
  TestFault f;
  if (text == "draft_probs_from_next_row") {
    f.kind = TestFaultKind::kDraftProbsFromNextRow;
    return f;
  }
  if (text == "target_from_next_row") {
    f.kind = TestFaultKind::kTargetFromNextRow;
    return f;
  }
  const std::string prefix = "perturb_verify_row:";
  if (text.rfind(prefix, 0) == 0) {
    const std::string rest = text.substr(prefix.size());
    const size_t colon = rest.find(':');
    if (colon != std::string::npos && parse_int(rest.substr(0, colon), &f.request) &&
        parse_int(rest.substr(colon + 1), &f.output_position) && f.request >= 0 && f.output_position >= 1) {
      f.kind = TestFaultKind::kPerturbVerifyRow;
      return f;
    }
  }
  return Status::invalid_argument("test fault '" + text + "': " + kForms);
}

std::string describe_test_fault(const TestFault& fault) {
  switch (fault.kind) {
    case TestFaultKind::kNone:
      return "none";
    case TestFaultKind::kPerturbVerifyRow:
      return "perturb_verify_row:" + std::to_string(fault.request) + ":" + std::to_string(fault.output_position);
    case TestFaultKind::kDraftProbsFromNextRow:
      return "draft_probs_from_next_row";
    case TestFaultKind::kTargetFromNextRow:
      return "target_from_next_row";
    case TestFaultKind::kSkipCompCatchUp:
      return "skip_comp_catch_up (tests only)";
  }
  return "unknown";
}

const float* apply_verify_row_fault(const TestFault& fault, int64_t request_id, int64_t first_output, int64_t x,
                                    int64_t vocab, const float* rows, std::vector<float>* scratch) {
  if (fault.kind != TestFaultKind::kPerturbVerifyRow || fault.request != request_id) return rows;
  const int64_t i = fault.output_position - first_output;
  if (i < 0 || i > x) return rows;
  scratch->assign(rows, rows + (x + 1) * vocab);
  float* row = scratch->data() + i * vocab;
  row[argmax(row, vocab)] = std::numeric_limits<float>::lowest();
  return scratch->data();
}

void apply_draft_probs_fault(const TestFault& fault, std::vector<std::vector<float>>* draft_probs) {
  if (fault.kind != TestFaultKind::kDraftProbsFromNextRow) return;
  for (size_t i = 0; i + 1 < draft_probs->size(); ++i) (*draft_probs)[i] = (*draft_probs)[i + 1];
}

void apply_target_fault(const TestFault& fault, std::vector<std::vector<float>>* target_probs) {
  if (fault.kind != TestFaultKind::kTargetFromNextRow) return;
  for (size_t i = 0; i + 1 < target_probs->size(); ++i) (*target_probs)[i] = (*target_probs)[i + 1];
}

}  // namespace vericache
