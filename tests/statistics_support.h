// Statistics for the sampling tests: chi-square goodness of fit with exact critical values, and
// the power of that test against a stated effect size (noncentral chi-square).
//
// Effect size is Cohen's w = sqrt(sum_i (p1_i - p0_i)^2 / p0_i) between the distribution the test
// expects (p0) and the one the samples come from (p1); with n samples the test statistic follows a
// noncentral chi-square with noncentrality n * w^2 (asymptotically).
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace vericache::testing {

// P(X > x) for X ~ chi-square with `dof` degrees of freedom (regularized upper incomplete gamma).
double chi_square_survival(double x, int dof);
// The x with chi_square_survival(x, dof) == alpha.
double chi_square_critical(double alpha, int dof);
// P(X > x) for X ~ noncentral chi-square(dof, lambda).
double noncentral_chi_square_survival(double x, int dof, double lambda);
// The probability that the goodness-of-fit test at level `alpha` with `dof` degrees of freedom
// rejects when n samples come from a distribution at effect size w from the expected one.
double chi_square_power(double w, int64_t n, int dof, double alpha);
// The smallest effect size the test detects with probability >= `power` (bisection on w).
double detectable_effect(int64_t n, int dof, double alpha, double power);

using Outcome = std::vector<int32_t>;  // a token, or a tuple of tokens

struct GoodnessOfFit {
  double chi2 = 0;
  int dof = 0;
  double p_value = 1;
  int64_t outside_support = 0;  // samples of outcomes with expected probability 0
  double effect_size = 0;       // w estimated from the sample: sqrt(max(0, chi2 - dof) / n)
};

// Pearson's test of `counts` (n samples in all) against `expected` probabilities; cells expected
// fewer than 5 times are pooled into one cell, which joins the smallest other cell when it is
// itself expected fewer than 5 times. An outcome outside `expected`, or in cells of zero expected
// mass, is counted in outside_support and makes p_value 0 (it cannot happen under the expected
// distribution).
GoodnessOfFit goodness_of_fit(const std::map<Outcome, int64_t>& counts, const std::map<Outcome, double>& expected,
                              int64_t n);

}  // namespace vericache::testing
