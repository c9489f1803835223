// Fitting KVQuant's per-layer calibration (plugins/kvquant/kvquant_calibration.h) from a layer's
// calibration keys and values: the percentile key ranges, and for each bit width the NUQ datatype by
// 1-D k-means over the normalized inlier entries, with its Q-Norm terms.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "kvquant/kvquant_calibration.h"

namespace vericache::cli {

// `keys` (before RoPE) and `values`: float32 CPU [tokens, n_kv_heads * head_dim], tokens >= 2.
// `outlier_fraction` in [0, 0.5): the share of entries kept aside as outliers (key ranges at its
// half-tail percentiles, outlier_capacity per token for values). Deterministic.
kvquant::Layer fit_kvquant_layer(const at::Tensor& keys, const at::Tensor& values, double outlier_fraction);

// 1-D weighted k-means with 2^bits centroids over `weights` of the equal-width bins that split
// [-1, 1] (Lloyd's iterations from the weighted quantiles, at most 50 of them, as the reference's
// sklearn call caps them), then Q-Norm: the terms that give the rounded entries the mean and
// standard deviation of the binned ones. Centroids come out strictly increasing.
kvquant::Datatype fit_datatype(const std::vector<double>& weights, int bits);

}  // namespace vericache::cli
