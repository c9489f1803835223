// Sampling: greedy ties, seeded determinism, top-k / top-p sets and the drawn frequencies.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/sampler.h"

namespace vericache {
namespace {

TEST(Sampler, GreedyTakesTheLowestIdOnTies) {
  const std::vector<float> logits{1.0f, 3.0f, 3.0f, -2.0f};
  EXPECT_EQ(argmax(logits.data(), 4), 1);
  Rng rng(1);
  EXPECT_EQ(select_token(logits.data(), 4, SamplingParams{}, rng), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i)) * 3.0f;
  const SamplingParams p{0.8, 50, 0.95, 42};
  Rng a(p.seed), b(p.seed), c(p.seed + 1);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 200; ++i) {
    ta.push_back(select_token(logits.data(), 1000, p, a));
    tb.push_back(select_token(logits.data(), 1000, p, b));
    tc.push_back(select_token(logits.data(), 1000, p, c));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Sampler, TopKAndTopPKeepTheRightSets) {
  const std::vector<float> logits{std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingDistribution d = make_distribution(logits.data(), 4, SamplingParams{1.0, 2, 1.0, 0});
  EXPECT_EQ(d.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(d.probs[0], 0.625, 1e-6);
  d = make_distribution(logits.data(), 4, SamplingParams{1.0, 0, 0.79, 0});
  EXPECT_EQ(d.ids, (std::vector<int32_t>{0, 1}));
  d = make_distribution(logits.data(), 4, SamplingParams{1.0, 0, 0.81, 0});
  EXPECT_EQ(d.ids, (std::vector<int32_t>{0, 1, 2}));
  d = make_distribution(logits.data(), 4, SamplingParams{1.0, 0, 1.0, 0});
  EXPECT_NEAR(d.probs[3], 0.05, 1e-6);
}

TEST(Sampler, DrawsFollowTheTemperedDistribution) {
  const std::vector<float> logits{0.0f, 1.0f, 2.0f, 0.5f};
  const double t = 0.7;
  std::vector<double> expected(4);
  double z = 0;
  for (int i = 0; i < 4; ++i) z += (expected[i] = std::exp(logits[i] / t));
  Rng rng(123);
  const int draws = 200000;
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) ++counts[select_token(logits.data(), 4, SamplingParams{t, 0, 1.0, 0}, rng)];
  double chi2 = 0;
  for (int i = 0; i < 4; ++i) {
    const double e = draws * expected[i] / z;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  EXPECT_LT(chi2, 16.27);  // chi-square, 3 degrees of freedom, p = 0.001
}

}  // namespace
}  // namespace vericache
