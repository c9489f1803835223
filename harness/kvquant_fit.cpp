#include "kvquant_fit.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

namespace vericache::cli {
namespace {

constexpr int64_t kBins = 1 << 14;

// The bin of x in [-1, 1] among kBins equal bins.
int64_t bin_of(float x) {
  return std::clamp<int64_t>(static_cast<int64_t>(std::floor((static_cast<double>(x) + 1.0) / 2.0 * kBins)), 0, kBins - 1);
}
double bin_center(int64_t i) { return -1.0 + (static_cast<double>(i) + 0.5) * 2.0 / kBins; }

// Keeps c strictly increasing inside [-1, 1] with at least one bin width between neighbours.
void make_increasing(std::vector<float>* c) {
  const auto gap = static_cast<float>(2.0 / kBins);
  const auto n = static_cast<int64_t>(c->size());
  for (int64_t j = 1; j < n; ++j) (*c)[j] = std::max((*c)[j], (*c)[j - 1] + gap);
  (*c)[n - 1] = std::min((*c)[n - 1], 1.0f);
  for (int64_t j = n - 2; j >= 0; --j) (*c)[j] = std::min((*c)[j], (*c)[j + 1] - gap);
}

// The value of the q-quantile of each column of `sorted` (sorted along dim 0), interpolated
// linearly between order statistics as numpy.percentile does.
std::vector<float> column_quantile(const at::Tensor& sorted, double q) {
  const int64_t n = sorted.size(0);
  const double at_rank = q * static_cast<double>(n - 1);
  const auto below = static_cast<int64_t>(std::floor(at_rank));
  const int64_t above = std::min(below + 1, n - 1);
  const double frac = at_rank - static_cast<double>(below);
  const at::Tensor lo = sorted[below].to(at::kDouble), hi = sorted[above].to(at::kDouble);
  const at::Tensor v = (lo + (hi - lo) * frac).to(at::kFloat).contiguous();
  return std::vector<float>(v.data_ptr<float>(), v.data_ptr<float>() + v.numel());
}

}  // namespace

kvquant::Datatype fit_datatype(const std::vector<double>& weights, int bits) {
  const int64_t k = int64_t{1} << bits;
  double total = 0;
  for (double w : weights) total += w;
  kvquant::Datatype d;
  d.centroids.resize(k);
  // Start from the weighted quantiles at (j + 1/2) / k.
  double seen = 0;
  int64_t j = 0;
  for (int64_t i = 0; i < kBins && j < k; ++i) {
    seen += weights[i];
    while (j < k && seen >= (static_cast<double>(j) + 0.5) / static_cast<double>(k) * total) {
      d.centroids[j++] = static_cast<float>(bin_center(i));
    }
  }
  for (; j < k; ++j) d.centroids[j] = 1.0f;
  make_increasing(&d.centroids);

  std::vector<uint32_t> assigned(kBins);
  for (int iteration = 0; iteration < 50; ++iteration) {
    std::vector<double> mass(k, 0.0), moment(k, 0.0);
    for (int64_t i = 0; i < kBins; ++i) {
      assigned[i] = d.code(static_cast<float>(bin_center(i)));
      mass[assigned[i]] += weights[i];
      moment[assigned[i]] += weights[i] * bin_center(i);
    }
    float moved = 0;
    for (int64_t c = 0; c < k; ++c) {
      if (mass[c] <= 0) continue;  // an empty cluster keeps its centroid
      const auto next = static_cast<float>(moment[c] / mass[c]);
      moved = std::max(moved, std::abs(next - d.centroids[c]));
      d.centroids[c] = next;
    }
    make_increasing(&d.centroids);
    if (moved < 1e-7f) break;
  }

  // Q-Norm (mean m, standard deviation s; 1: the binned entries, 2: rounded to their centroids).
  double m1 = 0, m2 = 0, q1 = 0, q2 = 0;
  for (int64_t i = 0; i < kBins; ++i) {
    const double x = bin_center(i), y = d.centroids[d.code(static_cast<float>(x))];
    m1 += weights[i] * x;
    m2 += weights[i] * y;
    q1 += weights[i] * x * x;
    q2 += weights[i] * y * y;
  }
  if (total > 0) {
    m1 /= total, m2 /= total, q1 /= total, q2 /= total;
    const double s1 = std::sqrt(std::max(0.0, q1 - m1 * m1)), s2 = std::sqrt(std::max(0.0, q2 - m2 * m2));
    if (s2 > 0) {
      d.norm_scale = static_cast<float>(s1 / s2);
      d.norm_offset = static_cast<float>(m1 - m2 * s1 / s2);
    }
  }
  return d;
}

kvquant::Layer fit_kvquant_layer(const at::Tensor& keys, const at::Tensor& values, double outlier_fraction) {
  const int64_t tokens = keys.size(0), n = keys.size(1);
  kvquant::Layer layer;
  const at::Tensor sorted = std::get<0>(keys.sort(0));
  layer.key_upper = column_quantile(sorted, 1.0 - outlier_fraction / 2);
  layer.key_lower = column_quantile(sorted, outlier_fraction / 2);

  std::vector<double> key_bins(kBins, 0.0), value_bins(kBins, 0.0);
  const at::Tensor k = keys.contiguous(), v = values.contiguous();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const int64_t capacity = kvquant::outlier_capacity(outlier_fraction, n);
  std::vector<bool> outlier(n);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < n; ++c) {
      const float x = kvquant::normalized_key(kp[t * n + c], layer, c);
      if (std::abs(x) <= 1.0f) key_bins[bin_of(x)] += 1;
    }
    const kvquant::ValueRange range = kvquant::value_range(vp + t * n, n, capacity);
    std::fill(outlier.begin(), outlier.end(), false);
    for (int32_t c : range.outliers) outlier[c] = true;
    for (int64_t c = 0; c < n; ++c) {
      if (!outlier[c]) value_bins[bin_of(range.normalized(vp[t * n + c]))] += 1;
    }
  }
  for (int bits : kvquant::kBitWidths) {
    layer.key_types[bits] = fit_datatype(key_bins, bits);
    layer.value_types[bits] = fit_datatype(value_bins, bits);
  }
  return layer;
}

}  // namespace vericache::cli
