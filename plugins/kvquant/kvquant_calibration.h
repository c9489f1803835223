// KVQuant's calibrated quantities and the normalizations they are fitted on: what
// `vericache calibrate --compressor kvquant` writes and the kvquant plugin reads. Both sides call
// the same functions here, so the datatype is fitted on exactly what the plugin will round.
//
// A token's keys and values are taken over all N = n_kv_heads * head_dim channels of a layer (the
// reference quantizes the k_proj / v_proj outputs), keys before RoPE.
//   Keys, per channel c (static): calibrated range [lower_c, upper_c], the outlier-fraction
//     percentiles of the calibration keys (0.5% and 99.5% for the default 1%); normalized
//     k~ = (k - zero_c) / half_c with zero = (upper + lower) / 2, half = (upper - lower) / 2.
//   Values, per token (dynamic): the `outlier_capacity` entries farthest from the token's median
//     are outliers; zero and half from the min and max of the rest, stored as float16.
//   Datatype (NUQ), per layer, for keys and for values, per bit width b: 2^b centroids in [-1, 1]
//     from 1-D k-means over the calibration's normalized inlier entries; a code is the nearest
//     centroid. Q-Norm: norm_scale and norm_offset make the rounded entries' mean and standard
//     deviation those of the unrounded ones (level = centroid * norm_scale + norm_offset).
//
// The file, one JSON object, versioned:
//   {"format": "vericache-calibration", "compressor": "kvquant", "version": 1,
//    "model": {"name", "fingerprint", "n_layers", "n_kv_heads", "head_dim"},
//    "outlier_fraction": f,
//    "layers": [{"key_lower": [N], "key_upper": [N],
//                "key_types": {"2": {"centroids": [4], "norm_scale": s, "norm_offset": o}, "3": ..., "4": ..., "8": ...},
//                "value_types": {...}}, ...],
//    "calibration": {...free-form record of how it was made...}}
// Header-only (compiled into the plugin and the command line). Not part of the installed contract.
#pragma once

#include <c10/util/Half.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include <vericache/compressor.h>

#include "../common/calibration_file.h"

namespace vericache::kvquant {

inline const plugin::CalibrationKind kCalibration{"kvquant", "KVQuant", 1, "VERICACHE_KVQUANT_CALIBRATION"};
inline constexpr int kBitWidths[] = {2, 3, 4, 8};

// Outlier entries kept per token (for keys, and again for values) out of `channels`: the fraction
// rounded up, so the default 1% keeps 2 of SmolLM2's 192 channels.
inline int64_t outlier_capacity(double fraction, int64_t channels) {
  return fraction <= 0 ? 0 : static_cast<int64_t>(std::ceil(fraction * static_cast<double>(channels) - 1e-9));
}

struct Datatype {
  std::vector<float> centroids;  // 2^b, strictly increasing, in [-1, 1]
  float norm_scale = 1.0f;
  float norm_offset = 0.0f;

  // The centroid nearest x (the lower one on a tie).
  uint32_t code(float x) const {
    const auto above = std::lower_bound(centroids.begin(), centroids.end(), x);
    if (above == centroids.begin()) return 0;
    if (above == centroids.end()) return static_cast<uint32_t>(centroids.size() - 1);
    const auto i = static_cast<uint32_t>(above - centroids.begin());
    return x - centroids[i - 1] <= *above - x ? i - 1 : i;
  }
  float level(uint32_t code, bool qnorm) const {
    return qnorm ? centroids[code] * norm_scale + norm_offset : centroids[code];
  }
};

struct Layer {
  std::vector<float> key_lower, key_upper;  // [N]
  std::map<int, Datatype> key_types, value_types;  // by bit width
};

struct Calibration {
  double outlier_fraction = 0.01;
  std::vector<Layer> layers;
};

// Channel c of a key before RoPE, normalized by the calibrated range (0 for an empty range).
inline float normalized_key(float k, const Layer& layer, int64_t c) {
  const float zero = (layer.key_upper[c] + layer.key_lower[c]) / 2, half = (layer.key_upper[c] - layer.key_lower[c]) / 2;
  return half > 0 ? (k - zero) / half : 0.0f;
}

// A token's key outliers: among the channels whose normalized key lies outside [-1, 1], the
// `capacity` farthest out (lower channel first on a tie), in that order.
inline std::vector<int32_t> key_outliers(const float* normalized, int64_t n, int64_t capacity) {
  std::vector<int32_t> out;
  for (int32_t c = 0; c < n; ++c) {
    if (std::abs(normalized[c]) > 1.0f) out.push_back(c);
  }
  const auto farther = [&](int32_t a, int32_t b) {
    const float da = std::abs(normalized[a]), db = std::abs(normalized[b]);
    return da != db ? da > db : a < b;
  };
  const auto keep = std::min<int64_t>(capacity, static_cast<int64_t>(out.size()));
  std::partial_sort(out.begin(), out.begin() + keep, out.end(), farther);
  out.resize(keep);
  return out;
}

// A token's value range: the `capacity` entries farthest from the token's median (the lower middle
// entry) are outliers; zero and half, float16, from the min and max of the others.
struct ValueRange {
  c10::Half zero;
  c10::Half half;
  std::vector<int32_t> outliers;

  float normalized(float x) const {
    const float h = static_cast<float>(half);
    return h > 0 ? (x - static_cast<float>(zero)) / h : 0.0f;
  }
  float value(float level) const { return level * static_cast<float>(half) + static_cast<float>(zero); }
};

inline ValueRange value_range(const float* x, int64_t n, int64_t capacity) {
  std::vector<float> sorted(x, x + n);
  std::nth_element(sorted.begin(), sorted.begin() + (n - 1) / 2, sorted.end());
  const float median = sorted[(n - 1) / 2];
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const auto farther = [&](int32_t a, int32_t b) {
    const float da = std::abs(x[a] - median), db = std::abs(x[b] - median);
    return da != db ? da > db : a < b;
  };
  const int64_t keep = std::min(capacity, n - 1);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), farther);
  ValueRange r;
  r.outliers.assign(order.begin(), order.begin() + keep);
  float lo = INFINITY, hi = -INFINITY;
  for (int64_t i = keep; i < n; ++i) {
    lo = std::min(lo, x[order[i]]);
    hi = std::max(hi, x[order[i]]);
  }
  r.zero = c10::Half((hi + lo) / 2);
  r.half = c10::Half((hi - lo) / 2);
  return r;
}

inline nlohmann::json to_json(const Datatype& d) {
  return {{"centroids", d.centroids}, {"norm_scale", d.norm_scale}, {"norm_offset", d.norm_offset}};
}

inline nlohmann::json to_json(const Calibration& c, const ModelShape& shape, const nlohmann::json& record) {
  nlohmann::json j = plugin::calibration_header(kCalibration, shape);
  j["outlier_fraction"] = c.outlier_fraction;
  j["layers"] = nlohmann::json::array();
  for (const Layer& layer : c.layers) {
    nlohmann::json keys = nlohmann::json::object(), values = nlohmann::json::object();
    for (const auto& [bits, d] : layer.key_types) keys[std::to_string(bits)] = to_json(d);
    for (const auto& [bits, d] : layer.value_types) values[std::to_string(bits)] = to_json(d);
    j["layers"].push_back({{"key_lower", layer.key_lower}, {"key_upper", layer.key_upper}, {"key_types", keys},
                           {"value_types", values}});
  }
  j["calibration"] = record;
  return j;
}

// Reads and checks a calibration file against `shape` (plugin::read_calibration_file's errors, and
// Corruption for a range or datatype of the wrong size or order).
inline Result<Calibration> load_calibration(const std::string& path, const ModelShape& shape) {
  VC_ASSIGN_OR_RETURN(const nlohmann::json j, plugin::read_calibration_file(kCalibration, path, shape));
  const std::string what = "calibration file '" + path + "'";
  Calibration c;
  try {
    c.outlier_fraction = j.at("outlier_fraction").get<double>();
    const auto n = static_cast<size_t>(shape.n_kv_heads * shape.head_dim);
    for (const nlohmann::json& entry : j.at("layers")) {
      Layer layer;
      layer.key_lower = entry.at("key_lower").get<std::vector<float>>();
      layer.key_upper = entry.at("key_upper").get<std::vector<float>>();
      if (layer.key_lower.size() != n || layer.key_upper.size() != n) {
        return Status::corruption(what + ": a layer's key range does not have " + std::to_string(n) + " channels");
      }
      for (const auto& [kind, types] : {std::pair("key", &layer.key_types), std::pair("value", &layer.value_types)}) {
        for (int bits : kBitWidths) {
          const nlohmann::json& d = entry.at(std::string(kind) + "_types").at(std::to_string(bits));
          Datatype t{d.at("centroids").get<std::vector<float>>(), d.at("norm_scale").get<float>(),
                     d.at("norm_offset").get<float>()};
          const bool increasing = std::adjacent_find(t.centroids.begin(), t.centroids.end(),
                                                     [](float a, float b) { return !(a < b); }) == t.centroids.end();
          if (t.centroids.size() != (size_t{1} << bits) || !increasing) {
            return Status::corruption(what + ": a layer's " + std::to_string(bits) + "-bit " + kind + " datatype is not " +
                                      std::to_string(1 << bits) + " increasing centroids");
          }
          (*types)[bits] = std::move(t);
        }
      }
      c.layers.push_back(std::move(layer));
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::corruption(what + ": " + e.what());
  }
  return c;
}

}  // namespace vericache::kvquant
