// The cost of one forward on a machine where it is not bytes / bandwidth alone (a CPU), fitted to
// measured forwards:
//   t = forward_s + requests * request_s + further_rows * row_s + bytes * seconds_per_byte
// requests: the items in the forward (each one's first row); further_rows: the rows beyond each
// item's first (a verify's drafts); bytes: what the forward reads. forward_s, a constant per
// forward, is fitted only when asked (FitTerms::kPerForward): Eq. 3's callers count the weights'
// bytes in `bytes` and read the bandwidth off them, so for them the constant stays 0; the draft
// policy counts only cache bytes and lets forward_s carry the weights (with the weights inside
// `bytes`, one bandwidth had to price both the weights and the cache, and at a fixed batch the
// fit could not tell a per-request cost from a per-byte one).
// The fit is weighted least squares in relative error (each sample weighs weight / seconds^2, so
// a 30 ms draft forward counts as much as a 300 ms verify) with every cost >= 0: the best fit over
// the subsets of the terms whose solution has no negative cost; all zero when none has. Terms the
// samples cannot tell apart (collinear columns) are never fitted together.
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
  double forward_s = 0;  // per forward; 0 unless fitted with FitTerms::kPerForward
  double predict(double requests, double further_rows, double bytes) const {
    return forward_s + requests * request_s + further_rows * row_s + bytes * seconds_per_byte;
  }
};

enum class FitTerms {
  kPerRequest,  // request_s, row_s, seconds_per_byte (forward_s = 0)
  kPerForward,  // forward_s too
};

ForwardCosts fit_forward_costs(const std::vector<ForwardSample>& samples, FitTerms terms = FitTerms::kPerRequest);

}  // namespace vericache::sim
