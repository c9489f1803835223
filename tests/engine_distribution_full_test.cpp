// The slow suite's statistical test of the draft-verify engine at T > 0 (engine_distribution_support.h
// says how): the whole grid — ExpectedAttention at c = 0.1 and KIVI at 2 bits, T = 0.3, 0.7 and 1.0,
// sampled and argmax drafts — with 1,500 seeded requests per configuration, each of the 36
// statistics at level 1e-4 (any false alarm in the suite: below 0.4%) and able to find an effect
// size w >= 0.25 with probability >= 0.99; and the two test-only faults, which it must reject.
// Run by harness/bench/slow_suite.sh; its latest result: results/slow_suite_cpu.md.
#include <gtest/gtest.h>

#include "engine_distribution_support.h"
#include "test_support.h"

namespace vericache {
namespace {

constexpr int64_t kRuns = 1500;
constexpr double kAlpha = 1e-4;
constexpr double kDetectableW = 0.25;
const double kTemperatures[] = {0.3, 0.7, 1.0};
const testing::SamplingCompressor kCompressors[] = {
    {"expected_attention", "{}", 0.1}, {"kivi", R"({"bits": 2, "group_size": 32, "residual_length": 32})", 1.0}};

testing::EngineSamplingCheck& check() {
  static testing::EngineSamplingCheck c(*testing::default_model(), kRuns, kAlpha);
  return c;
}

TEST(EngineDistributionFull, EveryCompressorTemperatureAndDraftMode) {
  ASSERT_NE(testing::default_model(), nullptr);
  for (const auto& c : kCompressors)
    for (DraftSampling mode : {DraftSampling::kSampled, DraftSampling::kArgmax})
      for (const auto& r : check().run(c, mode, kTemperatures)) testing::expect_follows_full_kv(r, kDetectableW);
}

TEST(EngineDistributionFull, FailsWhenTheEngineIsWrong) {
  ASSERT_NE(testing::default_model(), nullptr);
  testing::expect_every_fault_rejected(check(), kCompressors[0], kTemperatures);
}

}  // namespace
}  // namespace vericache
