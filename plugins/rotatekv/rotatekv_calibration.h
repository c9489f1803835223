// RotateKV's calibrated key-channel order and the key transform it is computed on: what
// `vericache calibrate --compressor rotatekv` writes and the rotatekv plugin reads.
//
// The transform of one key (one token, all KV heads): RoPE undone at the token's position (the
// plugin sees keys after RoPE; RotateKV quantizes them before), then a normalized Walsh-Hadamard
// rotation of each group of `head_group` consecutive KV heads (head_group * head_dim channels). The
// calibrated order sorts the n_kv_heads * head_dim rotated channels by their signed sum over the
// calibration tokens, ascending; the cached key is rotated[order[j]] for j = 0 .. N-1.
//
// The file, one JSON object, versioned:
//   {"format": "vericache-calibration", "compressor": "rotatekv", "version": 1,
//    "model": {"name", "fingerprint", "n_layers", "n_kv_heads", "head_dim"},
//    "head_group": G, "layers": [{"key_order": [N ints]}, ...],
//    "calibration": {...free-form record of how it was made...}}
// Header-only (compiled into the plugin and the command line). Not part of the installed contract.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <vericache/compressor.h>

#include "../common/calibration_file.h"
#include "../common/rope.h"

namespace vericache::rotatekv {

inline const plugin::CalibrationKind kCalibration{"rotatekv", "RotateKV", 1, "VERICACHE_ROTATEKV_CALIBRATION"};

// The largest of 4 (the reference's head_group_num), 2 and 1 that divides n_kv_heads.
inline int64_t default_head_group(int64_t n_kv_heads) { return n_kv_heads % 4 == 0 ? 4 : n_kv_heads % 2 == 0 ? 2 : 1; }

// In place: x <- H x / sqrt(n) for the Sylvester-ordered Hadamard matrix H of size n (a power of
// two). Orthogonal and its own inverse.
inline void walsh_hadamard(float* x, int64_t n) {
  for (int64_t half = 1; half < n; half *= 2) {
    for (int64_t i = 0; i < n; i += 2 * half) {
      for (int64_t j = i; j < i + half; ++j) {
        const float a = x[j], b = x[j + half];
        x[j] = a + b;
        x[j + half] = a - b;
      }
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

// Keys of `rows` tokens, after RoPE at `positions` ([rows, n_kv_heads, head_dim] float32 CPU
// contiguous), transformed in place: RoPE undone, then each group of `head_group` heads rotated.
inline void rotate_keys_before_rope(float* keys, const int64_t* positions, int64_t rows, int64_t n_kv_heads,
                                    int64_t head_dim, int64_t head_group, const plugin::Rope& rope) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = keys + r * n_kv_heads * head_dim;
    for (int64_t h = 0; h < n_kv_heads; ++h) rope.rotate(row + h * head_dim, positions[r], /*inverse=*/true);
    for (int64_t g = 0; g < n_kv_heads; g += head_group) walsh_hadamard(row + g * head_dim, head_group * head_dim);
  }
}

struct Calibration {
  int64_t head_group = 1;
  std::vector<std::vector<int32_t>> key_order;  // [n_layers][n_kv_heads * head_dim], a permutation
};

inline nlohmann::json to_json(const Calibration& c, const ModelShape& shape, const nlohmann::json& record) {
  nlohmann::json j = plugin::calibration_header(kCalibration, shape);
  j["head_group"] = c.head_group;
  j["layers"] = nlohmann::json::array();
  for (const std::vector<int32_t>& order : c.key_order) j["layers"].push_back({{"key_order", order}});
  j["calibration"] = record;
  return j;
}

// Reads and checks a calibration file against `shape` (plugin::read_calibration_file's errors, and
// Corruption for a bad head group or key order).
inline Result<Calibration> load_calibration(const std::string& path, const ModelShape& shape) {
  VC_ASSIGN_OR_RETURN(const nlohmann::json j, plugin::read_calibration_file(kCalibration, path, shape));
  const std::string what = "calibration file '" + path + "'";
  Calibration c;
  try {
    c.head_group = j.at("head_group").get<int64_t>();
    const int64_t n = shape.n_kv_heads * shape.head_dim;
    const int64_t width = c.head_group * shape.head_dim;
    if (c.head_group < 1 || shape.n_kv_heads % c.head_group != 0 || (width & (width - 1)) != 0) {
      return Status::corruption(what + ": head_group " + std::to_string(c.head_group) +
                                " must divide the KV heads and give a power-of-two rotation");
    }
    for (const nlohmann::json& layer : j.at("layers")) {
      std::vector<int32_t> order = layer.at("key_order").get<std::vector<int32_t>>();
      std::vector<bool> seen(n, false);
      bool permutation = static_cast<int64_t>(order.size()) == n;
      for (int32_t i : order) {
        permutation = permutation && i >= 0 && i < n && !seen[i];
        if (permutation) seen[i] = true;
      }
      if (!permutation) {
        return Status::corruption(what + ": a layer's key_order is not a permutation of " + std::to_string(n) + " channels");
      }
      c.key_order.push_back(std::move(order));
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::corruption(what + ": " + e.what());
  }
  return c;
}

}  // namespace vericache::rotatekv
