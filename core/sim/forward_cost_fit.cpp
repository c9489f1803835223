#include "sim/forward_cost_fit.h"

#include <cmath>
#include <utility>

namespace vericache::sim {

ForwardCosts fit_forward_costs(const std::vector<ForwardSample>& samples) {
  auto term = [](const ForwardSample& s, int k) { return k == 0 ? s.requests : k == 1 ? s.further_rows : s.bytes; };
  auto weight = [](const ForwardSample& s) { return s.seconds > 0 ? s.weight / (s.seconds * s.seconds) : 0.0; };
  ForwardCosts best;
  double best_residual = 0;
  for (const ForwardSample& s : samples) best_residual += weight(s) * s.seconds * s.seconds;
  for (int mask = 1; mask < 8; ++mask) {
    std::vector<int> used;
    for (int k = 0; k < 3; ++k) {
      if (mask & (1 << k)) used.push_back(k);
    }
    const size_t n = used.size();
    // Normal equations A c = y, solved by Gaussian elimination with partial pivoting.
    std::vector<std::vector<double>> a(n, std::vector<double>(n + 1, 0.0));
    for (const ForwardSample& s : samples) {
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < n; ++j) a[i][j] += weight(s) * term(s, used[i]) * term(s, used[j]);
        a[i][n] += weight(s) * term(s, used[i]) * s.seconds;
      }
    }
    bool singular = false;
    for (size_t col = 0; col < n && !singular; ++col) {
      size_t pivot = col;
      for (size_t row = col + 1; row < n; ++row) {
        if (std::abs(a[row][col]) > std::abs(a[pivot][col])) pivot = row;
      }
      std::swap(a[col], a[pivot]);
      if (std::abs(a[col][col]) < 1e-30) singular = true;
      for (size_t row = 0; row < n && !singular; ++row) {
        if (row == col) continue;
        const double f = a[row][col] / a[col][col];
        for (size_t k = col; k <= n; ++k) a[row][k] -= f * a[col][k];
      }
    }
    if (singular) continue;
    double c[3] = {0, 0, 0};
    bool negative = false;
    for (size_t i = 0; i < n; ++i) {
      c[used[i]] = a[i][n] / a[i][i];
      negative = negative || c[used[i]] < 0;
    }
    if (negative) continue;
    double residual = 0;
    for (const ForwardSample& s : samples) {
      const double e = s.seconds - (c[0] * s.requests + c[1] * s.further_rows + c[2] * s.bytes);
      residual += weight(s) * e * e;
    }
    if (residual < best_residual) {
      best_residual = residual;
      best = ForwardCosts{c[0], c[1], c[2]};
    }
  }
  return best;
}

}  // namespace vericache::sim
