#include "sim/acceptance_model.h"

#include <algorithm>
#include <string>

namespace vericache::sim {

Result<std::vector<double>> acceptance_by_position(std::span<const WindowSample> windows, int64_t min_reached) {
  int64_t longest = 0;
  for (size_t i = 0; i < windows.size(); ++i) {
    const WindowSample& w = windows[i];
    if (w.drafted < 0 || w.accepted < 0 || w.accepted > w.drafted) {
      return Status::invalid_argument("acceptance: window " + std::to_string(i) + " accepted " +
                                      std::to_string(w.accepted) + " of " + std::to_string(w.drafted) + " drafts");
    }
    longest = std::max(longest, w.drafted);
  }
  if (longest == 0) return Status::invalid_argument("acceptance: no window drafted a token");
  // reached[k]: windows whose draft k + 1 was checked; rejected[k]: those that rejected it.
  std::vector<int64_t> reached(longest, 0), rejected(longest, 0);
  for (const WindowSample& w : windows) {
    const int64_t checked = std::min(w.accepted + 1, w.drafted);
    for (int64_t k = 0; k < checked; ++k) ++reached[k];
    if (w.accepted < w.drafted) ++rejected[w.accepted];
  }
  std::vector<double> alphas;
  int64_t k = 0;
  for (; k < longest && reached[k] >= min_reached; ++k) {
    alphas.push_back(1.0 - static_cast<double>(rejected[k]) / static_cast<double>(reached[k]));
  }
  int64_t tail_reached = 0, tail_rejected = 0;
  for (int64_t j = k; j < longest; ++j) {
    tail_reached += reached[j];
    tail_rejected += rejected[j];
  }
  if (tail_reached > 0) {
    alphas.push_back(1.0 - static_cast<double>(tail_rejected) / static_cast<double>(tail_reached));
  } else if (alphas.empty()) {
    alphas.push_back(1.0);
  }
  return alphas;
}

double expected_accepted_by_position(std::span<const double> alphas, int64_t x) {
  double reach = 1, sum = 0;
  for (int64_t k = 0; k < x && !alphas.empty(); ++k) {
    reach *= alphas[std::min<size_t>(static_cast<size_t>(k), alphas.size() - 1)];
    sum += reach;
  }
  return sum;
}

}  // namespace vericache::sim
