// The draft-verify engine itself at T > 0 against full-KV sampling, CI's share
// (engine_distribution_support.h says how): 500 seeded requests per configuration, a token dropper
// at a strong ratio (ExpectedAttention, c = 0.1) with sampled drafts at T = 1.0 and a quantizer at
// 2 bits (KIVI) with argmax drafts at T = 0.7; each of the three statistics at level 1e-4 and able
// to find an effect size w >= 0.4 with probability >= 0.99. The whole grid (both compressors, T =
// 0.3, 0.7, 1.0, both draft modes, 1,500 requests each) is the slow suite's
// (engine_distribution_full_test.cpp).
//
// That the test can fail: FailsWhenTheEngineIsWrong runs it on an engine with a test-only fault
// (engine/test_faults.h) — q of each draft taken from the next draft's row (sampled drafts), and p
// of each draft taken from the next verify row (argmax drafts) — and asserts that it rejects both.
#include <gtest/gtest.h>

#include "engine_distribution_support.h"
#include "test_support.h"

namespace vericache {
namespace {

constexpr int64_t kRuns = 500;
constexpr double kAlpha = 1e-4;
constexpr double kDetectableW = 0.4;
const testing::SamplingCompressor kTokenDropper{"expected_attention", "{}", 0.1};
const testing::SamplingCompressor kQuantizer{"kivi", R"({"bits": 2, "group_size": 32, "residual_length": 32})", 1.0};

testing::EngineSamplingCheck& check() {
  static testing::EngineSamplingCheck c(*testing::default_model(), kRuns, kAlpha);
  return c;
}

TEST(EngineDistribution, SampledOutputFollowsTheFullKvDistribution) {
  ASSERT_NE(testing::default_model(), nullptr);
  const double t1 = 1.0, t07 = 0.7;
  for (const auto& r : check().run(kTokenDropper, DraftSampling::kSampled, {&t1, 1}))
    testing::expect_follows_full_kv(r, kDetectableW);
  for (const auto& r : check().run(kQuantizer, DraftSampling::kArgmax, {&t07, 1}))
    testing::expect_follows_full_kv(r, kDetectableW);
}

// Windows of uneven length chosen per request: a scripted 1, 0, 2 drafts (0: a token decoded on the
// full cache) under the confidence policy, which also stops windows at drafts below p = 0.1.
TEST(EngineDistribution, AdaptiveWindowsKeepTheDistribution) {
  ASSERT_NE(testing::default_model(), nullptr);
  DraftPolicyOptions policy;
  policy.kind = DraftPolicyKind::kConfidence;
  policy.min_confidence = 0.1;
  policy.test_windows = {1, 0, 2};
  const double t1 = 1.0;
  for (const auto& r : check().run(kTokenDropper, DraftSampling::kSampled, {&t1, 1}, {}, policy))
    testing::expect_follows_full_kv(r, kDetectableW);
}

TEST(EngineDistribution, FailsWhenTheEngineIsWrong) {
  ASSERT_NE(testing::default_model(), nullptr);
  const double t = 1.0;
  testing::expect_every_fault_rejected(check(), kTokenDropper, {&t, 1});
}

}  // namespace
}  // namespace vericache
