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
  DraftPolicy p(o, 25);
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
  const DraftPolicy p(o, 8);
  EXPECT_EQ(p.next_window({}, {}), 8);
  EXPECT_TRUE(p.stops_window(0.59));
  EXPECT_FALSE(p.stops_window(0.6));
  o.kind = DraftPolicyKind::kFixed;
  EXPECT_FALSE(DraftPolicy(o, 8).stops_window(0.0));  // only the confidence policy stops windows
}

// Forwards whose seconds follow 10 ms per forward (the weights), 1 ms per item and 1 ns per cache
// byte read. Goodput, probing with windows of 3 after 5 tokens at 0 (the interval doubling up to 30).
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

// A request's first window, in place: 0 (its cost is plain decoding), so the fit sees a forward
// on KV_full without drafts. Over a link a window of 0 would cost a copy: a probe instead.
DraftPolicyState after_first_window(DraftPolicy& p, const RequestReads& reads) {
  DraftPolicyState s;
  EXPECT_EQ(p.next_window(s, reads), 0);
  EXPECT_EQ(p.next_window(s, RequestReads{reads.comp_bytes, reads.full_bytes, true}), p.options().probe_length);
  p.observe_window(s, 0, 0);
  return s;
}

TEST(DraftPolicy, GoodputFallsBackToFullKvAndProbesAgain) {
  const double weights = kWeightBytes;
  DraftPolicy p(goodput_options(), 16);
  const RequestReads reads{1e6, 4e6, false};
  DraftPolicyState s = after_first_window(p, reads);
  EXPECT_EQ(p.next_window(s, reads), 3);  // nothing fitted yet: a probe
  observe_linear_forwards(p, weights);
  const WindowCosts c = p.costs_for(reads);
  // The per-forward cost is shared by the last forward's items (1 here).
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
  DraftPolicy p(o, 16);
  // A draft step reads as much as a verify (15 ms each): a window of w costs (w + 1) x 15 ms for at
  // most w + 1 tokens, never better than window 0's 1 token in 15 ms.
  const RequestReads same{4e6, 4e6, false};
  DraftPolicyState s = after_first_window(p, same);
  EXPECT_EQ(p.next_window(s, same), 3);  // nothing fitted yet: a probe
  observe_linear_forwards(p, kWeightBytes);
  EXPECT_EQ(p.next_window(s, same), 0);  // no window seen, yet no probe
  for (int64_t i = 1; i < o.probe_every_max; ++i) {  // the first window was one of them
    EXPECT_EQ(p.next_window(s, same), 0) << i;  // past probe_every: still none
    p.observe_window(s, 0, 0);
  }
  EXPECT_EQ(p.next_window(s, same), 3);  // the longest interval's probe refreshes the costs
  // A draft step that reads a quarter of the bytes: drafting could pay, so the usual rules (no
  // window seen yet: a probe).
  const RequestReads less{1e6, 4e6, false};
  EXPECT_EQ(p.next_window(after_first_window(p, less), less), 3);
}

// The engine's first forwards at batch 1, 8K-like: a forward costs 4 ms, 0.1 ns per cache byte
// and 3.5 ms per further row; KV_comp is a quarter of KV_full. Drafts (KV_comp, one row) and
// verifies (KV_full, more rows) alone fit exactly with a draft step as dear as a decode step
// (request 8.6 ms, row 8.1 ms), which rules drafting out for the next probe_every_max tokens: the
// first window, at 0, is what tells the costs apart. Both cases are checked.
TEST(DraftPolicy, GoodputTellsItsCostsApartFromTheFirstWindowAndOneProbe) {
  const double full = 1.84e8, comp = 4.6e7;
  auto seconds = [](double rows, double bytes) { return 4e-3 + rows * 3.5e-3 + bytes * 1e-10; };
  const RequestReads reads{comp, full, false};
  // The engine's first forwards: the first window's unless skipped, then a probe of 3 drafts, all accepted.
  auto after_probe = [&](DraftPolicy& p, DraftPolicyState& s, bool first_window) {
    if (first_window) p.observe_forward(1, 0, full, seconds(0, full));
    p.observe_window(s, 0, 0);
    const int64_t w = p.next_window(s, reads);
    EXPECT_EQ(w, 3);  // nothing fitted: a probe
    for (int64_t i = 0; i < w; ++i) p.observe_forward(1, 0, comp, seconds(0, comp));
    p.observe_forward(1, w, full, seconds(static_cast<double>(w), full));
    p.observe_window(s, w, w);
  };
  DraftPolicy p(goodput_options(), 16);
  DraftPolicyState s;
  ASSERT_EQ(p.next_window(s, reads), 0);  // the first window decodes on KV_full
  after_probe(p, s, true);
  const WindowCosts c = p.costs_for(reads);
  EXPECT_NEAR(c.draft_step_s, seconds(0, comp), 1e-9);
  EXPECT_NEAR(c.verify_s, seconds(0, full), 1e-9);
  EXPECT_NEAR(c.verify_row_s, 3.5e-3, 1e-9);
  EXPECT_EQ(p.next_window(s, reads), 6);  // drafting pays: twice the probe
  // Without that window's forward: a verify priced as a draft step, and no drafting.
  DraftPolicy blind(goodput_options(), 16);
  DraftPolicyState t;
  after_probe(blind, t, false);
  const WindowCosts wrong = blind.costs_for(reads);
  EXPECT_NEAR(wrong.verify_s, seconds(0, comp), 1e-9);  // 8.6 ms, where a decode step takes 22.4
  EXPECT_NEAR(wrong.draft_step_s, seconds(0, comp), 1e-9);
  EXPECT_NEAR(wrong.verify_row_s, 8.1e-3, 1e-9);
  EXPECT_EQ(blind.next_window(t, reads), 0);
}

TEST(DraftPolicy, GoodputWindowsGrowAtMostTwofoldBeyondTheLongestSeen) {
  DraftPolicy p(goodput_options(), 16);
  observe_linear_forwards(p, kWeightBytes);
  const RequestReads reads{1e6, 4e6, false};  // drafting pays when drafts are accepted
  DraftPolicyState s = after_first_window(p, reads);
  EXPECT_EQ(p.next_window(s, reads), 3);  // no window seen: a probe
  p.observe_window(s, 3, 3);              // every draft accepted: alpha = 1 extrapolated
  EXPECT_EQ(p.next_window(s, reads), 6);  // not 16
  p.observe_window(s, 6, 6);
  EXPECT_EQ(p.next_window(s, reads), 12);
  p.observe_window(s, 12, 12);
  EXPECT_EQ(p.next_window(s, reads), 16);  // x
}

TEST(DraftPolicy, TestWindowsOverrideEveryPolicy) {
  DraftPolicyOptions o;
  o.kind = DraftPolicyKind::kGoodput;
  o.test_windows = {0, 5};
  DraftPolicy p(o, 8);
  DraftPolicyState s;
  EXPECT_EQ(p.next_window(s, {}), 0);
  p.observe_window(s, 0, 0);
  EXPECT_EQ(p.next_window(s, {}), 5);
  p.observe_window(s, 5, 1);
  EXPECT_EQ(p.next_window(s, {}), 0);
}

}  // namespace
}  // namespace vericache
