#include "sim/forward_cost_fit.h"

#include <cmath>

namespace vericache::sim {

ForwardCosts fit_forward_costs(const std::vector<ForwardSample>& samples, FitTerms terms) {
  // Terms 0..3: requests, further rows, bytes, the per-forward constant.
  auto term = [](const ForwardSample& s, int k) {
    return k == 0 ? s.requests : k == 1 ? s.further_rows : k == 2 ? s.bytes : 1.0;
  };
  auto weight = [](const ForwardSample& s) { return s.seconds > 0 ? s.weight / (s.seconds * s.seconds) : 0.0; };
  ForwardCosts best;
  double best_residual = 0;
  for (const ForwardSample& s : samples) best_residual += weight(s) * s.seconds * s.seconds;
  const int n_terms = terms == FitTerms::kPerForward ? 4 : 3;
  for (int mask = 1; mask < (1 << n_terms); ++mask) {
    std::vector<int> used;
    for (int k = 0; k < n_terms; ++k) {
      if (mask & (1 << k)) used.push_back(k);
    }
    const size_t n = used.size();
    // Normal equations A c = y over the terms scaled to unit weighted norm (A's diagonal is 1), solved
    // by symmetric elimination: each pivot is what is left of its term once the terms before it
    // are fitted (1: independent of them, 0: collinear). Below 1e-6 the samples cannot tell the
    // term from the others, or so nearly that its cost would be fitted to noise: the subset is skipped.
    std::vector<double> norm(n, 0.0);
    for (const ForwardSample& s : samples) {
      for (size_t i = 0; i < n; ++i) norm[i] += weight(s) * term(s, used[i]) * term(s, used[i]);
    }
    bool singular = false;
    for (size_t i = 0; i < n; ++i) {
      singular = singular || !(norm[i] > 0);
      norm[i] = std::sqrt(norm[i]);
    }
    if (singular) continue;
    std::vector<std::vector<double>> a(n, std::vector<double>(n + 1, 0.0));
    for (const ForwardSample& s : samples) {
      for (size_t i = 0; i < n; ++i) {
        const double ti = term(s, used[i]) / norm[i];
        for (size_t j = 0; j < n; ++j) a[i][j] += weight(s) * ti * term(s, used[j]) / norm[j];
        a[i][n] += weight(s) * ti * s.seconds;
      }
    }
    for (size_t col = 0; col < n && !singular; ++col) {
      if (a[col][col] < 1e-6) {
        singular = true;
        break;
      }
      for (size_t row = 0; row < n; ++row) {
        if (row == col) continue;
        const double f = a[row][col] / a[col][col];
        for (size_t k = col; k <= n; ++k) a[row][k] -= f * a[col][k];
      }
    }
    if (singular) continue;
    double c[4] = {0, 0, 0, 0};
    bool negative = false;
    for (size_t i = 0; i < n; ++i) {
      c[used[i]] = a[i][n] / a[i][i] / norm[i];
      negative = negative || c[used[i]] < 0;
    }
    if (negative) continue;
    double residual = 0;
    for (const ForwardSample& s : samples) {
      const double e = s.seconds - (c[0] * s.requests + c[1] * s.further_rows + c[2] * s.bytes + c[3]);
      residual += weight(s) * e * e;
    }
    if (residual < best_residual) {
      best_residual = residual;
      best = ForwardCosts{c[0], c[1], c[2], c[3]};
    }
  }
  return best;
}

}  // namespace vericache::sim
