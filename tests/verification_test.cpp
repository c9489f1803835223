// Verification of draft windows (engine/verification.h): greedy prefix acceptance, and speculative
// sampling whose output must follow the target distribution exactly — checked here on synthetic
// distributions with a chi-square goodness-of-fit test (the real-model test is in engine_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/verification.h"

namespace vericache {
namespace {

// Chi-square critical values at significance 0.001 for 1..10 degrees of freedom.
constexpr double kChi2Critical001[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59};

double chi_square(const std::vector<int64_t>& observed, const std::vector<double>& expected_probs, int64_t n) {
  double chi2 = 0;
  for (size_t i = 0; i < observed.size(); ++i) {
    const double e = expected_probs[i] * static_cast<double>(n);
    if (e > 0) chi2 += (observed[i] - e) * (observed[i] - e) / e;
  }
  return chi2;
}

TEST(Verification, GreedyAcceptsTheMatchingPrefixThenCorrects) {
  const int64_t vocab = 5;
  // Row i's argmax: 3, 1, 4, 0.
  const std::vector<float> rows = {0, 0, 0, 9, 0, /**/ 0, 9, 0, 0, 0, /**/ 0, 0, 0, 0, 9, /**/ 9, 0, 0, 0, 0};
  WindowVerdict v = verify_greedy(std::vector<int32_t>{3, 1, 2}, rows.data(), vocab);
  EXPECT_EQ(v.accepted, 2);
  EXPECT_EQ(v.next, 4);  // the correction
  v = verify_greedy(std::vector<int32_t>{3, 1, 4}, rows.data(), vocab);
  EXPECT_EQ(v.accepted, 3);
  EXPECT_EQ(v.next, 0);  // the bonus
  v = verify_greedy(std::vector<int32_t>{2, 1, 4}, rows.data(), vocab);
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 3);
  v = verify_greedy(std::vector<int32_t>{}, rows.data(), vocab);
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next, 3);  // no draft: one plain decoding step
}

TEST(Verification, DenseDistributionMatchesTheSampler) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, -1.0f, 2.5f, 0.0f};
  SamplingParams params{0.7, 3, 0.95, 0};
  const std::vector<float> dense = dense_distribution(logits.data(), 6, params);
  const SamplingDistribution sparse = make_distribution(logits.data(), 6, params);
  double total = 0;
  for (float p : dense) total += p;
  EXPECT_NEAR(total, 1.0, 1e-6);
  for (size_t i = 0; i < sparse.ids.size(); ++i)
    EXPECT_FLOAT_EQ(dense[sparse.ids[i]], static_cast<float>(sparse.probs[i]));
  int nonzero = 0;
  for (float p : dense) nonzero += p > 0 ? 1 : 0;
  EXPECT_EQ(nonzero, static_cast<int>(sparse.ids.size()));
  // Without top-k and top-p the dense softmax skips the sort: the same probabilities.
  const SamplingParams plain{0.7, 0, 1.0, 0};
  const std::vector<float> all = dense_distribution(logits.data(), 6, plain);
  const SamplingDistribution all_sparse = make_distribution(logits.data(), 6, plain);
  ASSERT_EQ(all_sparse.ids.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(all[all_sparse.ids[i]], static_cast<float>(all_sparse.probs[i]));
}

// One window of x = 1 over fixed distributions: the first output token must follow p whatever q
// is, for sampled drafts (q from its own logits) and argmax drafts (q one-hot).
TEST(Verification, SampledWindowOutputFollowsTheTargetDistribution) {
  const int64_t vocab = 6, n = 200000;
  const std::vector<float> target = {0.5f, 2.0f, 1.5f, -0.5f, 1.0f, 0.2f, /* bonus row */ 1, 1, 1, 1, 1, 1};
  const std::vector<float> draft = {1.8f, 0.3f, 1.6f, 0.9f, -1.0f, 0.0f};
  for (double temperature : {0.3, 0.7, 1.0}) {
    for (DraftSampling mode : {DraftSampling::kSampled, DraftSampling::kArgmax}) {
      const SamplingParams params{temperature, 0, 1.0, 0};
      const std::vector<float> p = dense_distribution(target.data(), vocab, params);
      const std::vector<float> q = dense_distribution(draft.data(), vocab, params);
      const std::vector<std::vector<float>> rows{p, dense_distribution(target.data() + vocab, vocab, params)};
      std::vector<int64_t> counts(vocab, 0);
      int64_t accepted = 0;
      Rng rng(7), draft_rng(11);
      for (int64_t i = 0; i < n; ++i) {
        const int32_t d = mode == DraftSampling::kArgmax ? argmax(draft.data(), vocab) : sample_dense(q, draft_rng);
        const std::vector<std::vector<float>> qs{q};
        const WindowVerdict v = verify_sampled(std::vector<int32_t>{d}, qs, mode, rows, rng);
        accepted += v.accepted;
        ++counts[v.accepted == 1 ? d : v.next];
      }
      std::vector<double> expected(p.begin(), p.end());
      const double chi2 = chi_square(counts, expected, n);
      EXPECT_LT(chi2, kChi2Critical001[vocab - 1]) << "T=" << temperature << " " << draft_sampling_name(mode);
      // Acceptance is sum_t min(p, q) for sampled drafts and p(argmax q) for argmax drafts.
      double expected_acceptance = 0;
      for (int64_t t = 0; t < vocab; ++t) expected_acceptance += std::min(p[t], q[t]);
      if (mode == DraftSampling::kArgmax) expected_acceptance = p[argmax(draft.data(), vocab)];
      EXPECT_NEAR(static_cast<double>(accepted) / n, expected_acceptance, 0.01);
    }
  }
}

TEST(Verification, TopKAppliesToBothDistributions) {
  // With top-k 2 the output never leaves the target's two most likely tokens, even when the draft
  // distribution puts its mass elsewhere.
  const int64_t vocab = 4;
  const std::vector<float> target = {3.0f, 2.9f, 0.0f, -1.0f, 0, 0, 0, 0};
  const std::vector<float> draft = {-1.0f, 0.0f, 3.0f, 2.9f};
  const SamplingParams params{1.0, 2, 1.0, 0};
  const std::vector<float> q = dense_distribution(draft.data(), vocab, params);
  const std::vector<std::vector<float>> rows{dense_distribution(target.data(), vocab, params),
                                             dense_distribution(target.data() + vocab, vocab, params)};
  Rng rng(1), draft_rng(2);
  for (int i = 0; i < 2000; ++i) {
    const int32_t d = sample_dense(q, draft_rng);
    const std::vector<std::vector<float>> qs{q};
    const WindowVerdict v = verify_sampled(std::vector<int32_t>{d}, qs, DraftSampling::kSampled, rows, rng);
    EXPECT_EQ(v.accepted, 0);  // p(d) = 0 for every draft q can produce
    EXPECT_TRUE(v.next == 0 || v.next == 1) << v.next;
  }
}

}  // namespace
}  // namespace vericache
