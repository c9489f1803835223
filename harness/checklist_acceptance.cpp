// vericache checklist, step 2: acceptance at each draft length, and the engine runs steps 2-4 share
// (checklist_steps.h).
#include <ATen/ATen.h>

#include <chrono>

#include "checklist_steps.h"

namespace vericache::cli {

std::vector<GenerationRequest> engine_requests(const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens,
                                               double temperature) {
  std::vector<GenerationRequest> requests;
  for (size_t p = 0; p < prompts.size(); ++p) {
    GenerationRequest r;
    r.prompt = prompts[p];
    r.max_new_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.seed = p + 1;
    requests.push_back(r);
  }
  return requests;
}

void EngineRun::on_token_logits(int64_t request, int64_t position, std::span<const float> logits) {
  if (reference == nullptr || request < 0 || request >= static_cast<int64_t>(reference->size())) return;
  const at::Tensor& full = (*reference)[request];
  const int64_t k = position - static_cast<int64_t>(setup->prompts[request].size());
  if (k < 0 || k >= full.size(0)) return;  // past full-KV decoding's end (a stop the engine runs over)
  const at::Tensor ours =
      at::from_blob(const_cast<float*>(logits.data()), {static_cast<int64_t>(logits.size())}, at::kFloat)
          .to(at::kDouble)
          .log_softmax(-1);
  const at::Tensor p = full[k];
  kls.push_back({request, position, (p.exp() * (p - ours)).sum().item<double>()});
}

Result<FullKvComparison> run_engine(const Setup& s, double ratio, int64_t x, const DraftPolicyOptions& policy,
                                    const std::vector<GenerationRequest>& requests,
                                    const std::vector<GenerationResult>& reference, EngineRun* run,
                                    const PoolOverrides& pools, const TestFault& fault) {
  EngineOptions options;
  options.compressor = s.compressor;
  options.ratio = ratio;
  options.draft_length = x;
  options.draft_policy = policy;
  options.sink = run;
  options.test_fault = fault;
  return compare_with_full_kv(*s.model, options, requests, reference, 16, pools);
}

// Step 2: fixed windows at every x against full-KV greedy decoding; gamma(x, c) per run. (Its
// verdict's baseline comparison and sweeps are added by the caller.)
Result<AcceptanceRuns> acceptance(const Setup& s, const std::vector<int64_t>& xs,
                                  const std::vector<GenerationRequest>& requests,
                                  const std::vector<GenerationResult>& reference, Trace& trace) {
  bool all_identical = true;
  std::string gammas;
  AcceptanceRuns out;
  out.runs.reserve(xs.size());
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t x = xs[i];
    EngineRun& engine_run = out.runs.emplace_back();
    engine_run.x = x;
    VC_ASSIGN_OR_RETURN(const FullKvComparison run,
                        run_engine(s, s.ratio, x, DraftPolicyOptions{}, requests, reference, &engine_run));
    const RequestMetrics& totals = run.totals;
    engine_run.totals = totals;
    int64_t mismatches = 0, tokens = 0;
    bool failed = false;
    for (size_t p = 0; p < requests.size(); ++p) {
      mismatches += run.diffs[p].mismatches();
      failed = failed || !run.results[p].compressor_failure.empty();
      tokens += static_cast<int64_t>(run.results[p].generation.tokens.size());
    }
    for (const WindowRecord& w : engine_run.windows) {
      trace["acceptance/x"].push_back(static_cast<double>(x));
      trace["acceptance/request"].push_back(static_cast<double>(w.request_id));
      trace["acceptance/drafted"].push_back(static_cast<double>(w.drafted));
      trace["acceptance/accepted"].push_back(static_cast<double>(w.accepted));
    }
    for (size_t pos = 0; pos < totals.drafted_per_position.size(); ++pos) {
      trace["acceptance_position/x"].push_back(static_cast<double>(x));
      trace["acceptance_position/position"].push_back(static_cast<double>(pos));
      trace["acceptance_position/drafted"].push_back(static_cast<double>(totals.drafted_per_position[pos]));
      trace["acceptance_position/accepted"].push_back(static_cast<double>(totals.accepted_per_position[pos]));
    }
    const double gamma = totals.acceptance_rate();
    engine_run.gamma = gamma;
    for (const StepRecord& st : engine_run.decode_steps) {
      trace["iterations/x"].push_back(static_cast<double>(x));
      trace["iterations/seconds"].push_back(st.seconds);
      trace["iterations/draft_items"].push_back(static_cast<double>(st.draft_items));
      trace["iterations/verify_items"].push_back(static_cast<double>(st.verify_items));
      trace["iterations/rows"].push_back(static_cast<double>(st.rows));
      trace["iterations/kv_slots_read"].push_back(static_cast<double>(st.kv_slots_read));
    }
    trace["acceptance_summary/x"].push_back(static_cast<double>(x));
    trace["acceptance_summary/gamma"].push_back(gamma);
    trace["acceptance_summary/mean_accepted"].push_back(totals.mean_acceptance_length());
    trace["acceptance_summary/tokens"].push_back(static_cast<double>(tokens));
    trace["acceptance_summary/mismatches"].push_back(static_cast<double>(mismatches));
    all_identical = all_identical && mismatches == 0 && !failed;
    gammas += (gammas.empty() ? "" : ", ") + std::to_string(x) + ": " + fmt("%.3f", gamma);
    progress("2. Acceptance", static_cast<int64_t>(i + 1), static_cast<int64_t>(xs.size()), start);
  }
  out.verdict = Verdict{2, "Acceptance", all_identical ? 1 : 0,
                        "gamma(x, c = " + fmt("%g", s.ratio) + ") for x = " + gammas +
                            (all_identical ? "; every run identical to full-KV decoding" : "; a run differs from full-KV decoding")};
  return out;
}

}  // namespace vericache::cli
