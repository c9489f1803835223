// Acceptance measured by the engine, as the simulator draws it: the probability that draft k + 1
// of a window is accepted given that drafts 1..k were (k = 0, 1, ...), estimated from verify
// windows the engine ran. A window of d drafts that accepted a < d shows a rejection at draft a + 1
// after a acceptances; one that accepted all d says only that the first rejection comes later
// (censored), as in a survival (Kaplan-Meier) estimate:
//
//   alpha_k = 1 - (windows rejected at draft k + 1) / (windows that reached draft k + 1)
//
// Positions reached by fewer than `min_reached` windows share one pooled estimate: the last
// entry, which holds for every later position too. With every alpha_k equal this is the geometric
// model of a single alpha.
//
// Thread-safety: pure functions. Failure: InvalidArgument naming the first bad window (accepted
// outside [0, drafted]) or when no window drafted anything.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <vericache/status.h>

namespace vericache::sim {

struct WindowSample {
  int64_t drafted = 0;
  int64_t accepted = 0;
};

// alpha_k for k = 0 .. K - 1; the last entry is the pooled estimate of positions K - 1 and on.
Result<std::vector<double>> acceptance_by_position(std::span<const WindowSample> windows, int64_t min_reached = 30);

// Expected accepted drafts of a window of x under `alphas` (as above): sum over k = 1..x of the
// product of alpha_0 .. alpha_{k-1}. Divided by x it is Eq. 3's gamma.
double expected_accepted_by_position(std::span<const double> alphas, int64_t x);

}  // namespace vericache::sim
