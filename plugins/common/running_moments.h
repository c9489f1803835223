// Mean and centred second moment of rows seen in batches (ExpectedAttention's statistics of the
// prompt's pre-RoPE queries, one set per attention head). Each batch is centred on its own mean
// before its product is formed (no cancellation), and batches are merged in float64 (Chan et al.'s
// parallel update): M2 = M2_a + M2_b + d d^T n_a n_b / n.
// Rows may come in independent groups: x [rows, d] keeps one mean and M2, x [groups, rows, d] one
// per group (mean [groups, d], M2 [groups, d, d]); every batch must have the same groups.
// Header-only (compiled into each plugin). Not part of the installed contract.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace vericache::plugin {

struct RunningMoments {
  int64_t count = 0;
  at::Tensor mean;  // [..., d] float64
  at::Tensor m2;    // [..., d, d] float64, sum of (x - mean)(x - mean)^T

  // Adds the rows of x [rows, d] or [groups, rows, d] (any floating type).
  void add(const at::Tensor& x) {
    const int64_t rows = x.size(-2);
    const auto nb = static_cast<double>(rows);
    const at::Tensor x64 = x.to(at::kDouble);
    const at::Tensor mean_b = x64.mean(-2);
    const at::Tensor centred = x64 - mean_b.unsqueeze(-2);
    const at::Tensor m2_b = at::matmul(centred.transpose(-1, -2), centred);
    if (count == 0) {
      mean = mean_b;
      m2 = m2_b;
    } else {
      const auto na = static_cast<double>(count), n = na + nb;
      const at::Tensor delta = mean_b - mean;
      m2 = m2 + m2_b + delta.unsqueeze(-1) * delta.unsqueeze(-2) * (na * nb / n);
      mean = mean + delta * (nb / n);
    }
    count += rows;
  }
  // The biased covariance M2 / count.
  at::Tensor covariance() const { return m2 / static_cast<double>(count); }
  // Bytes held: mean and M2 of `groups` groups of dimension d.
  static int64_t bytes(int64_t groups, int64_t d) {
    return groups * (d + d * d) * static_cast<int64_t>(sizeof(double));
  }
};

}  // namespace vericache::plugin
