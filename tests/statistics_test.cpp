// The sampling tests' statistics against published values: chi-square critical values (NIST/SEMATECH
// table), the power of a one-degree test (a two-sided z-test: P(|Z + sqrt(lambda)| > z)), and
// goodness of fit on samples from the expected distribution and from a different one.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/sampler.h"
#include "statistics_support.h"

namespace vericache::testing {
namespace {

TEST(Statistics, ChiSquareCriticalValuesMatchTheTables) {
  EXPECT_NEAR(chi_square_critical(0.05, 1), 3.841, 1e-3);
  EXPECT_NEAR(chi_square_critical(0.001, 1), 10.828, 1e-3);
  EXPECT_NEAR(chi_square_critical(0.001, 10), 29.588, 1e-3);
  EXPECT_NEAR(chi_square_critical(0.01, 30), 50.892, 1e-3);
  EXPECT_NEAR(chi_square_critical(0.001, 100), 149.449, 1e-3);
  EXPECT_NEAR(chi_square_survival(3.841459, 1), 0.05, 1e-6);
}

TEST(Statistics, PowerOfOneDegreeEqualsTheTwoSidedZTest) {
  // With dof 1 the statistic is (Z + sqrt(lambda))^2: power = P(Z > z - d) + P(Z < -z - d).
  const double z = 1.959964;
  auto normal_tail = [](double x) { return 0.5 * std::erfc(x / std::sqrt(2.0)); };
  for (double d : {0.5, 1.0, 2.0, 3.0}) {
    const double want = normal_tail(z - d) + normal_tail(z + d);
    EXPECT_NEAR(noncentral_chi_square_survival(z * z, 1, d * d), want, 1e-6) << d;
  }
  EXPECT_NEAR(noncentral_chi_square_survival(10.0, 4, 0.0), chi_square_survival(10.0, 4), 1e-12);
  // More samples find smaller effects.
  EXPECT_LT(detectable_effect(4000, 5, 1e-4, 0.99), detectable_effect(1000, 5, 1e-4, 0.99));
  EXPECT_NEAR(chi_square_power(detectable_effect(1500, 5, 1e-4, 0.99), 1500, 5, 1e-4), 0.99, 1e-6);
}

TEST(Statistics, GoodnessOfFitAcceptsTheTruthAndRejectsAnotherDistribution) {
  const std::map<Outcome, double> expected = {{{0}, 0.5}, {{1}, 0.3}, {{2}, 0.15}, {{3}, 0.05}};
  const std::vector<float> truth = {0.5f, 0.3f, 0.15f, 0.05f}, other = {0.45f, 0.3f, 0.2f, 0.05f};
  auto sample = [](const std::vector<float>& p, int64_t n) {
    std::map<Outcome, int64_t> counts;
    Rng rng(7);
    for (int64_t i = 0; i < n; ++i) {
      const double u = rng.uniform();
      double c = 0;
      int32_t k = 0;
      while (k + 1 < static_cast<int32_t>(p.size()) && u >= c + p[k]) c += p[k++];
      ++counts[{k}];
    }
    return counts;
  };
  const GoodnessOfFit same = goodness_of_fit(sample(truth, 20000), expected, 20000);
  EXPECT_EQ(same.dof, 3);
  EXPECT_GT(same.p_value, 1e-4);
  const GoodnessOfFit shifted = goodness_of_fit(sample(other, 20000), expected, 20000);
  EXPECT_LT(shifted.p_value, 1e-4);
  // The effect size of that shift: sqrt(0.05^2/0.5 + 0.05^2/0.15) = 0.149; estimated within 0.03.
  EXPECT_NEAR(shifted.effect_size, 0.149, 0.03);
  // An outcome the expected distribution cannot produce rejects outright.
  std::map<Outcome, int64_t> outside = sample(truth, 1000);
  ++outside[{9}];
  const GoodnessOfFit impossible = goodness_of_fit(outside, expected, 1001);
  EXPECT_EQ(impossible.outside_support, 1);
  EXPECT_EQ(impossible.p_value, 0.0);
}

// A rare cell (expected 0.1 times) with one sample must not decide the test: it joins the smallest
// other cell. A sample in a cell of zero probability is outside the support.
TEST(Statistics, ARarelyExpectedCellJoinsAnotherAndZeroMassIsOutsideTheSupport) {
  const std::map<Outcome, double> expected = {{{0}, 0.5}, {{1}, 0.4999}, {{2}, 0.0001}};
  const std::map<Outcome, int64_t> one_stray = {{{0}, 500}, {{1}, 499}, {{2}, 1}};
  const GoodnessOfFit rare = goodness_of_fit(one_stray, expected, 1000);
  EXPECT_EQ(rare.dof, 1);
  EXPECT_GT(rare.p_value, 0.5);  // alone, the rare cell would add (1 - 0.1)^2 / 0.1 = 8.1 to chi2
  const std::map<Outcome, double> with_zero = {{{0}, 0.5}, {{1}, 0.5}, {{2}, 0.0}};
  const GoodnessOfFit zero = goodness_of_fit(one_stray, with_zero, 1000);
  EXPECT_EQ(zero.outside_support, 1);
  EXPECT_EQ(zero.p_value, 0.0);
}

}  // namespace
}  // namespace vericache::testing
