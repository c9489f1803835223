#include "statistics_support.h"

#include <algorithm>
#include <cmath>

namespace vericache::testing {
namespace {

// Regularized lower incomplete gamma P(a, x) by its series (x < a + 1).
double gamma_p_series(double a, double x) {
  double term = 1.0 / a, sum = term;
  for (int k = 1; k < 10000; ++k) {
    term *= x / (a + k);
    sum += term;
    if (std::fabs(term) < std::fabs(sum) * 1e-16) break;
  }
  return sum * std::exp(-x + a * std::log(x) - std::lgamma(a));
}

// Regularized upper incomplete gamma Q(a, x) by Lentz's continued fraction (x >= a + 1).
double gamma_q_fraction(double a, double x) {
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-16) break;
  }
  return std::exp(-x + a * std::log(x) - std::lgamma(a)) * h;
}

double gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  return x < a + 1.0 ? 1.0 - gamma_p_series(a, x) : gamma_q_fraction(a, x);
}

}  // namespace

double chi_square_survival(double x, int dof) { return gamma_q(0.5 * dof, 0.5 * x); }

double chi_square_critical(double alpha, int dof) {
  double lo = 0, hi = dof + 10.0;
  while (chi_square_survival(hi, dof) > alpha) hi *= 2;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (chi_square_survival(mid, dof) > alpha ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double noncentral_chi_square_survival(double x, int dof, double lambda) {
  // A Poisson(lambda / 2) mixture of central chi-squares with dof + 2j degrees of freedom, summed
  // outwards from the Poisson mode until the weights are negligible.
  const double half = 0.5 * lambda;
  const int mode = static_cast<int>(half);
  auto weight = [&](int j) { return std::exp(-half + j * std::log(std::max(half, 1e-300)) - std::lgamma(j + 1.0)); };
  double sum = 0;
  for (int j = mode; j < mode + 100000; ++j) {
    const double w = lambda > 0 ? weight(j) : (j == 0 ? 1.0 : 0.0);
    sum += w * chi_square_survival(x, dof + 2 * j);
    if (w < 1e-17 && j > half) break;
  }
  for (int j = mode - 1; j >= 0 && lambda > 0; --j) {
    const double w = weight(j);
    sum += w * chi_square_survival(x, dof + 2 * j);
    if (w < 1e-17) break;
  }
  return std::min(sum, 1.0);
}

double chi_square_power(double w, int64_t n, int dof, double alpha) {
  return noncentral_chi_square_survival(chi_square_critical(alpha, dof), dof, static_cast<double>(n) * w * w);
}

double detectable_effect(int64_t n, int dof, double alpha, double power) {
  double lo = 0, hi = 10;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (chi_square_power(mid, n, dof, alpha) < power ? lo : hi) = mid;
  }
  return hi;
}

GoodnessOfFit goodness_of_fit(const std::map<Outcome, int64_t>& counts, const std::map<Outcome, double>& expected,
                              int64_t n) {
  GoodnessOfFit g;
  struct Cell {
    double observed = 0, expected = 0;
  };
  std::vector<Cell> cells;
  Cell pooled;
  for (const auto& [outcome, p] : expected) {
    const double e = p * static_cast<double>(n);
    const auto it = counts.find(outcome);
    const double o = it == counts.end() ? 0.0 : static_cast<double>(it->second);
    Cell& cell = e < 5 ? pooled : cells.emplace_back();
    cell.observed += o;
    cell.expected += e;
  }
  for (const auto& [outcome, c] : counts) {
    if (!expected.count(outcome)) g.outside_support += c;
  }
  // The pooled cell stands alone only when it is itself expected 5 times or more; a smaller one
  // joins the smallest regular cell (one stray sample in a cell expected 0.1 times would otherwise
  // dominate chi2 far beyond the stated level). Samples in cells of zero expected mass cannot happen
  // under the expected distribution.
  if (pooled.expected <= 0) {
    g.outside_support += static_cast<int64_t>(pooled.observed);
  } else if (pooled.expected >= 5 || cells.empty()) {
    cells.push_back(pooled);
  } else {
    Cell& smallest = *std::min_element(cells.begin(), cells.end(),
                                       [](const Cell& a, const Cell& b) { return a.expected < b.expected; });
    smallest.observed += pooled.observed;
    smallest.expected += pooled.expected;
  }
  for (const Cell& c : cells) g.chi2 += (c.observed - c.expected) * (c.observed - c.expected) / c.expected;
  g.dof = std::max(static_cast<int>(cells.size()) - 1, 1);
  g.p_value = g.outside_support > 0 ? 0.0 : chi_square_survival(g.chi2, g.dof);
  g.effect_size = std::sqrt(std::max(0.0, g.chi2 - g.dof) / static_cast<double>(n));
  return g;
}

}  // namespace vericache::testing
