// Acceptance by position in the window, estimated from the engine's verify windows
// (sim/acceptance_model.h), and the simulator drawing from it.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "sim/acceptance_model.h"
#include "sim/simulator.h"
#include "sim/throughput_model.h"

namespace vericache::sim {
namespace {

// Worked by hand: draft 1 reached by all four windows, rejected by one; draft 2 reached by three
// ({4,1}, {4,4}, {2,2}), rejected by {4,1}; drafts 3 and 4 reached by {4,4} alone.
TEST(AcceptanceModel, CountsRejectionsAmongTheWindowsThatReachedEachDraft) {
  const std::vector<WindowSample> windows{{4, 1}, {4, 4}, {2, 2}, {3, 0}};
  auto each = acceptance_by_position(windows, 1);
  ASSERT_TRUE(each.ok()) << each.status().message();
  ASSERT_EQ(each->size(), 4u);
  EXPECT_DOUBLE_EQ((*each)[0], 0.75);
  EXPECT_DOUBLE_EQ((*each)[1], 2.0 / 3.0);
  EXPECT_DOUBLE_EQ((*each)[2], 1.0);
  EXPECT_DOUBLE_EQ((*each)[3], 1.0);
  // Drafts reached by fewer than 3 windows are pooled into the last entry.
  auto pooled = acceptance_by_position(windows, 3);
  ASSERT_TRUE(pooled.ok());
  ASSERT_EQ(pooled->size(), 3u);
  EXPECT_DOUBLE_EQ((*pooled)[0], 0.75);
  EXPECT_DOUBLE_EQ((*pooled)[1], 2.0 / 3.0);
  EXPECT_DOUBLE_EQ((*pooled)[2], 1.0);
}

// Windows of random lengths (every one censored at its length) drawn from a known position
// profile: the estimate recovers it.
TEST(AcceptanceModel, RecoversAKnownProfileFromCensoredWindows) {
  const std::vector<double> truth{0.6, 0.8, 0.9, 0.95};  // 0.95 from draft 4 on
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> length(1, 16);
  std::vector<WindowSample> windows;
  for (int i = 0; i < 40000; ++i) {
    WindowSample w{length(rng), 0};
    while (w.accepted < w.drafted &&
           std::bernoulli_distribution(truth[std::min<size_t>(w.accepted, truth.size() - 1)])(rng))
      ++w.accepted;
    windows.push_back(w);
  }
  auto est = acceptance_by_position(windows);
  ASSERT_TRUE(est.ok());
  ASSERT_GE(est->size(), 10u);
  for (size_t k = 0; k < est->size(); ++k) {
    EXPECT_NEAR((*est)[k], truth[std::min(k, truth.size() - 1)], 0.02) << "draft " << k + 1;
  }
  EXPECT_NEAR(expected_accepted_by_position(*est, 8), expected_accepted_by_position(truth, 8), 0.1);
}

SimulationConfig small_machine() {
  SimulationConfig c;
  c.weight_bytes = 1e9;
  c.kv_bytes_per_token = 1e5;
  c.context = 10000;
  c.hbm_bandwidth = 1e12;
  c.link_bandwidth = 5e10;
  c.memory_bytes = 8e10;
  c.batch = 4;
  c.requests = 8;
  c.output_tokens = 200;
  c.alpha = 0.9;
  c.draft_length = 8;
  c.window = 32;
  return c;
}

TEST(AcceptanceModel, ConstantProfileIsTheGeometricModel) {
  const std::vector<double> constant{0.9};
  EXPECT_NEAR(expected_accepted_by_position(constant, 12), gamma_for_alpha(0.9, 12) * 12, 1e-12);
  // The simulator draws the same tokens from alpha = 0.9 and from the profile {0.9}.
  SimulationConfig c = small_machine();
  auto by_alpha = simulate(c);
  c.alpha = 0.1;  // ignored: the profile takes precedence
  c.position_alphas = constant;
  auto by_profile = simulate(c);
  ASSERT_TRUE(by_alpha.ok() && by_profile.ok());
  EXPECT_EQ(by_alpha->iterations, by_profile->iterations);
  EXPECT_EQ(by_alpha->verifies, by_profile->verifies);
  EXPECT_DOUBLE_EQ(by_alpha->seconds, by_profile->seconds);
}

TEST(AcceptanceModel, BadWindowsAreNamedErrors) {
  const std::vector<WindowSample> bad{{4, 1}, {4, 5}};
  auto r = acceptance_by_position(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "acceptance: window 1 accepted 5 of 4 drafts");
  const std::vector<WindowSample> empty{{0, 0}};
  EXPECT_EQ(acceptance_by_position(empty).status().message(), "acceptance: no window drafted a token");
  SimulationConfig c = small_machine();
  c.position_alphas = {0.5, 1.5};
  EXPECT_EQ(simulate(c).status().message(), "simulate: every position's alpha must be in [0, 1]");
}

}  // namespace
}  // namespace vericache::sim
