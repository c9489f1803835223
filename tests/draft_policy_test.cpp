// The draft policies' decisions (engine/draft_policy.h): the goodput window against hand-computed
// rates, the tiers' moves, the confidence stop, goodput's fallback to 0 and its probes. That the
// engine stays lossless under each policy is engine_test.cpp's (DraftPolicies.*).
#include <gtest/gtest.h>

#include <vector>

#include "engine/draft_policy.h"

namespace vericache {
namespace {

TEST(DraftPolicy, ParsesEveryNameItPrints) {
  for (DraftPolicyKind k :
       {DraftPolicyKind::kFixed, DraftPolicyKind::kConfidence, DraftPolicyKind::kTiers, DraftPolicyKind::kGoodput}) {
    ASSERT_TRUE(parse_draft_policy(draft_policy_name(k)).has_value());
    EXPECT_EQ(*parse_draft_policy(draft_policy_name(k)), k);
  }
  EXPECT_FALSE(parse_draft_policy("adaptive").has_value());
}

TEST(GoodputWindow, MatchesTheBestRateComputedByHand) {
  // Draft steps cost 1, a verify 4 plus 0.5 per further row. alpha = 0.8 at every position:
  // rate(w) = (1 + sum_{k=1..w} 0.8^k) / (w + 4 + 0.5 w).
  const WindowCosts costs{1.0, 4.0, 0.5, 0.0};
  const std::vector<double> alphas{0.8};
  int64_t best = 0;
  double best_rate = 1.0 / 4.0, expected = 0, reach = 1;
  for (int64_t w = 1; w <= 16; ++w) {
    reach *= 0.8;
    expected += reach;
    const double rate = (1 + expected) / (w + 4.0 + 0.5 * w);
    if (rate > best_rate) best_rate = rate, best = w;
  }
  ASSERT_GT(best, 0);
  EXPECT_EQ(goodput_window(alphas, costs, 16), best);
  // A margin: the best window drafts only while its rate is at least (1 + margin) x window 0's.
  const double gain = best_rate * 4.0;  // over window 0's rate of 1/4
  EXPECT_EQ(goodput_window(alphas, costs, 16, 0.99 * (gain - 1)), best);
  EXPECT_EQ(goodput_window(alphas, costs, 16, 1.01 * (gain - 1)), 0);
  // Drafts that are never accepted: decode on the full cache (window 0).
  EXPECT_EQ(goodput_window(std::vector<double>{0.0}, costs, 16), 0);
  // Every draft accepted and drafting free: the longest window.
  EXPECT_EQ(goodput_window(std::vector<double>{1.0}, WindowCosts{0.0, 4.0, 0.0, 0.0}, 16), 16);
  // Nothing fitted: the longest window.
  EXPECT_EQ(goodput_window(alphas, WindowCosts{}, 16), 16);
}

TEST(GoodputWindow, CountsTheCopyTheDraftingDoesNotHide) {
  // A copy of 10 behind draft steps of 1: windows shorter than 10 wait for it.
  const WindowCosts costs{1.0, 1.0, 0.0, 10.0};
  EXPECT_DOUBLE_EQ(costs.seconds(0), 11.0);
  EXPECT_DOUBLE_EQ(costs.seconds(4), 11.0);
  EXPECT_DOUBLE_EQ(costs.seconds(12), 13.0);
  // With half the drafts accepted, drafting while the copy runs is free: never window 0.
  EXPECT_GT(goodput_window(std::vector<double>{0.5}, costs, 16), 0);
}

TEST(DraftPolicy, TiersClimbOnAcceptanceAndFallOnRejection) {
  DraftPolicyOptions o;
  o.kind = DraftPolicyKind::kTiers;
  o.tier_smoothing = 1.0;  // the newest window alone
  DraftPolicy p(o, 25, 0);
  DraftPolicyState s;
  EXPECT_EQ(p.next_window(s, {}), 4);
  p.observe_window(s, 4, 4);
  EXPECT_EQ(p.next_window(s, {}), 8);
  p.observe_window(s, 8, 8);
  EXPECT_EQ(p.next_window(s, {}), 16);
  p.observe_window(s, 16, 16);
  EXPECT_EQ(p.next_window(s, {}), 25);
  p.observe_window(s, 25, 25);
  EXPECT_EQ(p.next_window(s, {}), 25);  // the top tier is x
  p.observe_window(s, 25, 15);          // 0.6: between the thresholds, stays
  EXPECT_EQ(p.next_window(s, {}), 25);
  p.observe_window(s, 25, 2);
  EXPECT_EQ(p.next_window(s, {}), 16);
  for (int i = 0; i < 6; ++i) p.observe_window(s, p.next_window(s, {}), 0);
  EXPECT_EQ(p.next_window(s, {}), 1);  // the bottom tier: tiers never stop drafting
}

TEST(DraftPolicy, ConfidenceStopsBelowItsThresholdOnly) {
  DraftPolicyOptions o;
  o.kind = DraftPolicyKind::kConfidence;
  o.min_confidence = 0.6;
  const DraftPolicy p(o, 8, 0);
  EXPECT_EQ(p.next_window({}, {}), 8);
  EXPECT_TRUE(p.stops_window(0.59));
  EXPECT_FALSE(p.stops_window(0.6));
  o.kind = DraftPolicyKind::kFixed;
  EXPECT_FALSE(DraftPolicy(o, 8, 0).stops_window(0.0));  // only the confidence policy stops windows
}

// Forwards whose seconds follow request_s = 1 ms per item and 1 ns per byte read.
// Goodput, probing with windows of 3 after 5 tokens at 0 (the interval doubling up to 30).
DraftPolicyOptions goodput_options() {
  DraftPolicyOptions o;
  o.kind = DraftPolicyKind::kGoodput;
  o.probe_every = 5;
  o.probe_every_max = 30;
  o.probe_length = 3;
  return o;
}
constexpr double kWeightBytes = 1e7;

void observe_linear_forwards(DraftPolicy& p, double weight_bytes) {
  for (int i = 0; i < 64; ++i) {
    const int64_t items = 1 + i % 3, further = (i % 4) * 3;
    const double cache = 1e5 * (1 + i % 5);
    p.observe_forward(items, further, cache, items * 1e-3 + (weight_bytes + cache) * 1e-9);
  }
}

TEST(DraftPolicy, GoodputFallsBackToFullKvAndProbesAgain) {
  const double weights = kWeightBytes;
  DraftPolicy p(goodput_options(), 16, weights);
  DraftPolicyState s;
  const RequestReads reads{1e6, 4e6, false};
  EXPECT_EQ(p.next_window(s, reads), 3);  // nothing fitted yet: a probe
  observe_linear_forwards(p, weights);
  const WindowCosts c = p.costs_for(reads);
  // The weights' share is theirs divided by the last forward's items (1 here).
  EXPECT_NEAR(c.draft_step_s, 1e-3 + (weights + 1e6) * 1e-9, 1e-6);
  EXPECT_NEAR(c.verify_s, 1e-3 + (weights + 4e6) * 1e-9, 1e-6);
  EXPECT_NEAR(c.verify_row_s, 0.0, 1e-6);
  EXPECT_EQ(p.next_window(s, reads), 3);  // no window seen yet: a probe
  // Every draft rejected: decode on the full cache, then a probe after probe_every such tokens.
  for (int i = 0; i < 10; ++i) p.observe_window(s, 3, 0);
  EXPECT_EQ(p.next_window(s, reads), 0);
  for (int i = 0; i < 4; ++i) {
    p.observe_window(s, 0, 0);
    EXPECT_EQ(p.next_window(s, reads), 0);
  }
  p.observe_window(s, 0, 0);
  EXPECT_EQ(p.next_window(s, reads), 3);
  // Each probe that leads straight back to 0 doubles the interval: 10, 20, then the cap of 30.
  for (int64_t interval : {10, 20, 30, 30}) {
    p.observe_window(s, 3, 0);  // the probe, rejected
    for (int64_t i = 0; i < interval; ++i) {
      EXPECT_EQ(p.next_window(s, reads), 0) << interval << " " << i;
      p.observe_window(s, 0, 0);
    }
    EXPECT_EQ(p.next_window(s, reads), 3) << interval;
  }
  // Windows that accept everything: the longest window pays, and the interval is the options' again.
  for (int i = 0; i < 40; ++i) p.observe_window(s, 16, 16);
  EXPECT_EQ(p.next_window(s, reads), 16);
  EXPECT_EQ(s.probe_every, 0);
}

TEST(DraftPolicy, GoodputDoesNotProbeWhereEvenPerfectDraftsCannotPay) {
  const DraftPolicyOptions o = goodput_options();
  DraftPolicy p(o, 16, kWeightBytes);
  DraftPolicyState s;
  // A draft step reads as much as a verify (15 ms each): a window of w costs (w + 1) x 15 ms for at
  // most w + 1 tokens, never better than window 0's 1 token in 15 ms.
  const RequestReads same{4e6, 4e6, false};
  EXPECT_EQ(p.next_window(s, same), 3);  // nothing fitted yet: a probe
  observe_linear_forwards(p, kWeightBytes);
  EXPECT_EQ(p.next_window(s, same), 0);  // no window seen, yet no probe
  for (int64_t i = 0; i < o.probe_every_max; ++i) {
    EXPECT_EQ(p.next_window(s, same), 0) << i;  // past probe_every: still none
    p.observe_window(s, 0, 0);
  }
  EXPECT_EQ(p.next_window(s, same), 3);  // the longest interval's probe refreshes the costs
  // A draft step that reads a quarter of the bytes: drafting could pay, so the usual rules (no
  // window seen yet: a probe).
  EXPECT_EQ(p.next_window(DraftPolicyState{}, RequestReads{1e6, 4e6, false}), 3);
}

TEST(DraftPolicy, GoodputWindowsGrowAtMostTwofoldBeyondTheLongestSeen) {
  DraftPolicy p(goodput_options(), 16, kWeightBytes);
  observe_linear_forwards(p, kWeightBytes);
  DraftPolicyState s;
  const RequestReads reads{1e6, 4e6, false};  // drafting pays when drafts are accepted
  EXPECT_EQ(p.next_window(s, reads), 3);     // no window seen: a probe
  p.observe_window(s, 3, 3);                 // every draft accepted: alpha = 1 extrapolated
  EXPECT_EQ(p.next_window(s, reads), 6);     // not 16
  p.observe_window(s, 6, 6);
  EXPECT_EQ(p.next_window(s, reads), 12);
  p.observe_window(s, 12, 12);
  EXPECT_EQ(p.next_window(s, reads), 16);  // x
}

TEST(DraftPolicy, TestWindowsOverrideEveryPolicy) {
  DraftPolicyOptions o;
  o.kind = DraftPolicyKind::kGoodput;
  o.test_windows = {0, 5};
  DraftPolicy p(o, 8, 0);
  DraftPolicyState s;
  EXPECT_EQ(p.next_window(s, {}), 0);
  p.observe_window(s, 0, 0);
  EXPECT_EQ(p.next_window(s, {}), 5);
  p.observe_window(s, 5, 1);
  EXPECT_EQ(p.next_window(s, {}), 0);
}

}  // namespace
}  // namespace vericache
