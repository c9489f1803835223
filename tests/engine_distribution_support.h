// The statistical test of the draft-verify engine at T > 0 (engine_distribution_test.cpp in CI,
// engine_distribution_full_test.cpp in the slow suite): seeded requests through DraftVerifyEngine
// itself — drafts sampled from, or the argmax of, the compressed cache's own rows; q and p taken
// from the engine's own logits — and the frequencies of their first 2, 3 and 4 generated tokens
// tested against the exact full-KV sampling distribution.
//
// Requests: one prompt (datasets/lossless_prompts, prompt 7, no chat template), prefilled once and
// handed to every request (add_prefilled) with the compressor's kept set; 4 tokens each
// (ignore_eos), x = 2 (tokens 2-3 drafted in the first window, token 4 its bonus or a later
// window's), temperature T, no top-k or top-p (every token of the vocabulary can be drawn: a wrong
// q then biases the output instead of being rejected outright), seeds 0 .. runs - 1.
//
// The exact distribution: the Generator's sampler (make_distribution) on full-KV logits after the
// prompt and each prefix of the output (teacher-forced forwards over the prompt's full cache:
// bitwise the logits full-KV decoding computes, the kernels being row-count invariant). Every
// prefix full-KV sampling produces with probability >= 5 / runs is a cell; all rarer prefixes of
// that length form one more cell with the rest of the mass. Cell probabilities are exact products.
//
// Statistics: Pearson's chi-square of tokens 1-2, 1-3 and 1-4 at level alpha each; the power
// against effect size w (Cohen's w) from the noncentral chi-square (statistics_support.h).
// Thread-safety: one thread; the model must not be used by anything else meanwhile.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "engine/draft_verify_engine.h"
#include "statistics_support.h"

namespace vericache::testing {

// A compressor the test runs: a token dropper at a strong ratio, or a quantizer (ratio 1).
struct SamplingCompressor {
  std::string name, params;
  double ratio;
};

struct SamplingConfig {
  SamplingCompressor compressor;
  DraftSampling mode;
  double temperature;
};

struct StatisticResult {
  std::string name;  // "tokens 1-2", "tokens 1-3", "tokens 1-4"
  GoodnessOfFit fit;
  double w99 = 0;    // the effect size this statistic finds with probability 0.99
  bool rejected = false;
};

struct SamplingResult {
  std::string label;
  double acceptance = 0;  // the engine's acceptance rate over these requests
  int64_t drafted = 0, accepted = 0;
  std::vector<StatisticResult> statistics;
  int rejected() const;
};

class EngineSamplingCheck {
 public:
  // Prefills the prompt on `model` (the default model) once.
  EngineSamplingCheck(const LlamaModel& model, int64_t runs, double alpha);
  ~EngineSamplingCheck();

  // Runs `runs` seeded requests per temperature of `temperatures` through the engine with this
  // compressor, draft mode, test fault and draft policy, then tests each temperature's outputs.
  // Prints a line per temperature. Test failures (not the statistics' verdicts) for broken set-up.
  std::vector<SamplingResult> run(const SamplingCompressor& compressor, DraftSampling mode,
                                  std::span<const double> temperatures, const TestFault& fault = {},
                                  const DraftPolicyOptions& policy = {});

  int64_t runs() const { return runs_; }
  double alpha() const { return alpha_; }

 private:
  struct State;
  const LlamaModel& model_;
  int64_t runs_;
  double alpha_;
  std::unique_ptr<State> state_;
};

// Asserts (gtest) that every statistic of `r` passes at the check's level and finds effect size
// `w` with probability >= 0.99, and that drafts were both accepted and rejected.
void expect_follows_full_kv(const SamplingResult& r, double w);

// Runs `compressor` through `check` with each test-only fault of engine/test_faults.h that a wrong
// engine could have — q of each draft from the next draft's row (sampled drafts), p from the next
// verify row (argmax drafts) — at each temperature, and asserts (gtest) that some statistic rejects.
void expect_every_fault_rejected(EngineSamplingCheck& check, const SamplingCompressor& compressor,
                                 std::span<const double> temperatures);

}  // namespace vericache::testing
