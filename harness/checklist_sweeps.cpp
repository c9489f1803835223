// vericache checklist, step 2's sweeps at the chosen x: c, temperature and context (checklist_steps.h).
#include <chrono>

#include "bench_support.h"
#include "checklist_steps.h"

namespace vericache::cli {

// Beyond the paper (part of step 2): acceptance at the chosen x as c falls (greedy; every run
// checked against full-KV decoding like the others) and as the temperature rises (sampled, seeded;
// their tokens follow the full-KV sampling distribution, which the engine tests check, so they are
// not compared here), with the decode tokens/s of each run on this machine.
Result<Sweeps> ratio_and_temperature_sweeps(const Setup& s, int64_t x, const std::vector<double>& ratios,
                                            const std::vector<double>& temperatures, int64_t max_tokens,
                                            const std::vector<GenerationRequest>& greedy,
                                            const std::vector<GenerationResult>& reference, Trace& trace) {
  Sweeps out;
  const auto start = std::chrono::steady_clock::now();
  const auto total = static_cast<int64_t>(ratios.size() + temperatures.size());
  std::string by_ratio, by_temperature;
  for (int64_t i = 0; i < total; ++i) {
    const bool sweep_ratio = i < static_cast<int64_t>(ratios.size());
    const double ratio = sweep_ratio ? ratios[i] : s.ratio;
    const double temperature = sweep_ratio ? 0.0 : temperatures[i - ratios.size()];
    EngineRun run;
    const std::vector<GenerationRequest> requests = sweep_ratio ? greedy : engine_requests(s.prompts, max_tokens, temperature);
    // For a sampled run the reference only sizes the comparison; its mismatches are not read.
    VC_ASSIGN_OR_RETURN(const FullKvComparison result, run_engine(s, ratio, x, DraftPolicyOptions{}, requests, reference, &run));
    int64_t tokens = 0, mismatches = 0, failed = 0;
    for (size_t p = 0; p < requests.size(); ++p) {
      tokens += static_cast<int64_t>(result.results[p].generation.tokens.size());
      mismatches += result.diffs[p].mismatches();
      failed += result.results[p].compressor_failure.empty() ? 0 : 1;
    }
    const double decode_seconds = run.decode_seconds();
    const double tok_s = decode_seconds > 0 ? static_cast<double>(tokens - static_cast<int64_t>(requests.size())) / decode_seconds : 0;
    const double gamma = result.totals.acceptance_rate(), accepted = result.totals.mean_acceptance_length();
    if (sweep_ratio) {
      trace["ratio_sweep/ratio"].push_back(ratio);
      trace["ratio_sweep/x"].push_back(static_cast<double>(x));
      trace["ratio_sweep/gamma"].push_back(gamma);
      trace["ratio_sweep/mean_accepted"].push_back(accepted);
      trace["ratio_sweep/tokens"].push_back(static_cast<double>(tokens));
      trace["ratio_sweep/mismatches"].push_back(static_cast<double>(mismatches));
      trace["ratio_sweep/compressor_failures"].push_back(static_cast<double>(failed));
      trace["ratio_sweep/tok_s"].push_back(tok_s);
      out.all_identical = out.all_identical && mismatches == 0;
      by_ratio += (by_ratio.empty() ? "" : ", ") + fmt("%g", ratio) + ": " + fmt("%.3f", gamma) +
                  (failed ? " (" + std::to_string(failed) + " requests' compressor failed)" : "");
    } else {
      trace["temperature_sweep/temperature"].push_back(temperature);
      trace["temperature_sweep/ratio"].push_back(ratio);
      trace["temperature_sweep/x"].push_back(static_cast<double>(x));
      trace["temperature_sweep/gamma"].push_back(gamma);
      trace["temperature_sweep/mean_accepted"].push_back(accepted);
      trace["temperature_sweep/tokens"].push_back(static_cast<double>(tokens));
      trace["temperature_sweep/tok_s"].push_back(tok_s);
      trace["temperature_sweep/compressor_failures"].push_back(static_cast<double>(failed));
      by_temperature += (by_temperature.empty() ? "" : ", ") + fmt("%g", temperature) + ": " + fmt("%.3f", gamma);
    }
    progress("2. Sweeps (c, T)", i + 1, total, start);
  }
  if (!by_ratio.empty()) {
    out.summary += "; at x = " + std::to_string(x) + ", gamma by c " + by_ratio +
                   (out.all_identical ? " (every run identical)" : " (a run differs from full-KV decoding)");
  }
  if (!by_temperature.empty()) out.summary += "; gamma by temperature (sampled) " + by_temperature;
  return out;
}

// Beyond the paper (part of step 2): acceptance at (c, x) against context length: per context N,
// `prompts` prompts of N tokens, the corpus's consecutive stretches [jN, (j + 1)N), run together
// (greedy, checked against full-KV decoding); gamma pooled over them and per prompt.
Result<Sweeps> context_sweep(const Setup& s, const std::vector<int32_t>& corpus, const std::vector<int64_t>& contexts,
                             int64_t prompts, int64_t x, int64_t max_tokens, Trace& trace) {
  Sweeps out;
  const LlamaModel& m = *s.model;
  const auto start = std::chrono::steady_clock::now();
  std::string by_context;
  for (size_t i = 0; i < contexts.size(); ++i) {
    Setup one = s;
    one.prompts.clear();
    for (int64_t j = 0; j < prompts; ++j) {
      const std::vector<int32_t> stretch(corpus.begin() + j * contexts[i], corpus.end());
      VC_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, bench_prompt(m, stretch, contexts[i], ""));
      one.prompts.push_back(std::move(prompt));
    }
    const std::vector<GenerationRequest> requests = engine_requests(one.prompts, max_tokens, 0.0);
    VC_ASSIGN_OR_RETURN(const std::vector<GenerationResult> reference, full_kv_reference(m, requests));
    EngineRun run;
    VC_ASSIGN_OR_RETURN(const FullKvComparison result, run_engine(s, s.ratio, x, DraftPolicyOptions{}, requests, reference, &run));
    int64_t mismatches = 0, tokens = 0, failed = 0;
    std::string failures;
    for (int64_t j = 0; j < prompts; ++j) {
      const EngineResult& r = result.results[j];
      mismatches += result.diffs[j].mismatches();
      tokens += static_cast<int64_t>(r.generation.tokens.size());
      // A compressor that fails leaves the request on full KV (still lossless, nothing drafted): said, not hidden.
      if (!r.compressor_failure.empty()) {
        ++failed;
        if (failures.empty()) failures = r.compressor_failure;
      }
      double drafted = 0, accepted = 0;
      for (const WindowRecord& w : run.windows) {
        if (w.request_id != r.request_id) continue;
        drafted += static_cast<double>(w.drafted);
        accepted += static_cast<double>(w.accepted);
      }
      trace["context_sweep_prompt/context"].push_back(static_cast<double>(contexts[i]));
      trace["context_sweep_prompt/prompt"].push_back(static_cast<double>(j));
      trace["context_sweep_prompt/gamma"].push_back(drafted > 0 ? accepted / drafted : 0.0);
      trace["context_sweep_prompt/mismatches"].push_back(static_cast<double>(result.diffs[j].mismatches()));
    }
    const double decode_seconds = run.decode_seconds();
    const double gamma = result.totals.acceptance_rate();
    trace["context_sweep/context"].push_back(static_cast<double>(contexts[i]));
    trace["context_sweep/prompt_tokens"].push_back(static_cast<double>(requests[0].prompt.size()));
    trace["context_sweep/prompts"].push_back(static_cast<double>(prompts));
    trace["context_sweep/ratio"].push_back(s.ratio);
    trace["context_sweep/x"].push_back(static_cast<double>(x));
    trace["context_sweep/gamma"].push_back(gamma);
    trace["context_sweep/mean_accepted"].push_back(result.totals.mean_acceptance_length());
    trace["context_sweep/tokens"].push_back(static_cast<double>(tokens));
    trace["context_sweep/mismatches"].push_back(static_cast<double>(mismatches));
    trace["context_sweep/compressor_failures"].push_back(static_cast<double>(failed));
    trace["context_sweep/tok_s"].push_back(decode_seconds > 0 ? static_cast<double>(tokens - prompts) / decode_seconds : 0.0);
    out.all_identical = out.all_identical && mismatches == 0;
    by_context += (by_context.empty() ? "" : ", ") + std::to_string(contexts[i]) + ": " + fmt("%.3f", gamma) +
                  (failed ? " (" + std::to_string(failed) + " requests' compressor failed: " + failures + ")" : "");
    progress("2. Contexts", static_cast<int64_t>(i + 1), static_cast<int64_t>(contexts.size()), start);
  }
  if (!by_context.empty()) {
    out.summary = "; gamma by context (tokens, " + (prompts == 1 ? std::string("1 prompt") : std::to_string(prompts) + " prompts each") +
                  ") " + by_context +
                  (out.all_identical ? " (every run identical)" : " (a run differs from full-KV decoding)");
  }
  return out;
}

}  // namespace vericache::cli
