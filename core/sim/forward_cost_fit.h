// The cost of one forward on a machine where it is not bytes / bandwidth alone (a CPU), fitted to
// measured forwards:
//   t = requests * request_s + further_rows * row_s + bytes * seconds_per_byte
// requests: the items in the forward (each one's first row); further_rows: the rows beyond each
// item's first (a verify's drafts); bytes: what the forward reads (weights and every item's cache).
// The fit is weighted least squares in relative error (each sample weighs weight / seconds^2, so
// a 30 ms draft forward counts as much as a 300 ms verify) with every cost >= 0: the best fit over
// the subsets of the three terms whose solution has no negative cost; all zero when none has.
// bench-reload calibrates the simulator's CPU profile with it, the checklist Eq. 3's constants.
//
// Thread-safety: pure function.
#pragma once

#include <vector>

namespace vericache::sim {

struct ForwardSample {
  double requests = 0, further_rows = 0, bytes = 0, seconds = 0;
  double weight = 1;  // e.g. the number of forwards a sample stands for
};

struct ForwardCosts {
  double request_s = 0, row_s = 0, seconds_per_byte = 0;
  double predict(double requests, double further_rows, double bytes) const {
    return requests * request_s + further_rows * row_s + bytes * seconds_per_byte;
  }
};

ForwardCosts fit_forward_costs(const std::vector<ForwardSample>& samples);

}  // namespace vericache::sim
