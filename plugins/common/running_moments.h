// Mean and centred second moment of rows seen in batches (ExpectedAttention's statistics of the
// prompt's attention inputs). Each batch is centred on its own mean before its product is formed
// (float32, no cancellation), and batches are merged in float64 (Chan et al.'s parallel update):
// M2 = M2_a + M2_b + d d^T n_a n_b / n.
// Header-only (compiled into each plugin). Not part of the installed contract.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace vericache::plugin {

struct RunningMoments {
  int64_t count = 0;
  at::Tensor mean;  // [d] float64
  at::Tensor m2;    // [d, d] float64, sum of (x - mean)(x - mean)^T

  // Adds the rows of x [rows, d] (float32).
  void add(const at::Tensor& x) {
    const auto nb = static_cast<double>(x.size(0));
    const at::Tensor mean_b = x.mean(0);
    const at::Tensor centred = x - mean_b;
    const at::Tensor m2_b = at::matmul(centred.t(), centred).to(at::kDouble);
    if (count == 0) {
      mean = mean_b.to(at::kDouble);
      m2 = m2_b;
    } else {
      const auto na = static_cast<double>(count), n = na + nb;
      const at::Tensor delta = mean_b.to(at::kDouble) - mean;
      m2 = m2 + m2_b + at::outer(delta, delta) * (na * nb / n);
      mean = mean + delta * (nb / n);
    }
    count += x.size(0);
  }
  // The biased covariance M2 / count.
  at::Tensor covariance() const { return m2 / static_cast<double>(count); }
};

}  // namespace vericache::plugin
