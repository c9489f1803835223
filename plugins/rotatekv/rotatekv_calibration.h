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

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <vericache/compressor.h>

namespace vericache::rotatekv {

inline constexpr const char* kFormat = "vericache-calibration";
inline constexpr const char* kCompressor = "rotatekv";
inline constexpr int kVersion = 1;

// The command that makes a calibration file at `path` (quoted in every refusal).
inline std::string calibrate_command(const std::string& path) {
  return "vericache calibrate --compressor rotatekv --out " + path;
}

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

// cos and sin of position * inv_freq[i] for i < head_dim / 2, as the model's RoPE table computes
// them (float32: inv_freq = 1 / base^(2i / head_dim)). Pairs (2i, 2i + 1) rotate by that angle.
class Rope {
 public:
  Rope(double base, int64_t head_dim) : half_(head_dim / 2) {
    const at::Tensor exponents = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(head_dim);
    const at::Tensor inv = 1.0 / at::pow(base, exponents);
    inv_freq_.assign(inv.data_ptr<float>(), inv.data_ptr<float>() + half_);
  }
  // x (one head, head_dim floats) after RoPE at `position` -> before it (inverse = true), or back.
  void rotate(float* x, int64_t position, bool inverse) const {
    const float sign = inverse ? -1.0f : 1.0f;
    for (int64_t i = 0; i < half_; ++i) {
      const float angle = static_cast<float>(position) * inv_freq_[i];
      const float c = std::cos(angle), s = sign * std::sin(angle);
      const float a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * c - b * s;
      x[2 * i + 1] = a * s + b * c;
    }
  }

 private:
  int64_t half_;
  std::vector<float> inv_freq_;
};

// Keys of `rows` tokens, after RoPE at `positions` ([rows, n_kv_heads, head_dim] float32 CPU
// contiguous), transformed in place: RoPE undone, then each group of `head_group` heads rotated.
inline void rotate_keys_before_rope(float* keys, const int64_t* positions, int64_t rows, int64_t n_kv_heads,
                                    int64_t head_dim, int64_t head_group, const Rope& rope) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = keys + r * n_kv_heads * head_dim;
    for (int64_t h = 0; h < n_kv_heads; ++h) rope.rotate(row + h * head_dim, positions[r], /*inverse=*/true);
    for (int64_t g = 0; g < n_kv_heads; g += head_group) walsh_hadamard(row + g * head_dim, head_group * head_dim);
  }
}

struct Calibration {
  std::string model_name;
  std::string fingerprint;
  int64_t head_group = 1;
  std::vector<std::vector<int32_t>> key_order;  // [n_layers][n_kv_heads * head_dim], a permutation
};

inline nlohmann::json to_json(const Calibration& c, const ModelShape& shape, const nlohmann::json& record) {
  nlohmann::json layers = nlohmann::json::array();
  for (const std::vector<int32_t>& order : c.key_order) layers.push_back({{"key_order", order}});
  return {{"format", kFormat},
          {"compressor", kCompressor},
          {"version", kVersion},
          {"model",
           {{"name", shape.name}, {"fingerprint", shape.fingerprint}, {"n_layers", shape.n_layers},
            {"n_kv_heads", shape.n_kv_heads}, {"head_dim", shape.head_dim}}},
          {"head_group", c.head_group},
          {"layers", layers},
          {"calibration", record}};
}

// Reads and checks a calibration file against `shape`: NotFound / Corruption / NotSupported /
// InvalidArgument, each saying which command makes the right file.
inline Result<Calibration> load_calibration(const std::string& path, const ModelShape& shape) {
  const std::string remedy = "; make one with '" + calibrate_command(path) + "'";
  if (path.empty()) {
    return Status::not_found("no calibration file: make one with '" + calibrate_command("rotatekv.json") +
                             "', then pass --params '{\"calibration\": \"rotatekv.json\"}' (or set "
                             "VERICACHE_ROTATEKV_CALIBRATION)");
  }
  std::ifstream in(path);
  if (!in) return Status::not_found("cannot read calibration file '" + path + "'" + remedy);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  const std::string what = "calibration file '" + path + "'";
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kFormat || j.value("compressor", "") != kCompressor) {
    return Status::corruption(what + " is not a RotateKV " + std::string(kFormat) + " JSON file" + remedy);
  }
  if (j.value("version", 0) != kVersion) {
    return Status::not_supported(what + " has version " + std::to_string(j.value("version", 0)) + "; this build reads version " +
                                 std::to_string(kVersion) + remedy);
  }
  Calibration c;
  try {
    const nlohmann::json& m = j.at("model");
    c.model_name = m.at("name").get<std::string>();
    c.fingerprint = m.at("fingerprint").get<std::string>();
    if (c.fingerprint != shape.fingerprint) {
      return Status::invalid_argument(what + " was made for model '" + c.model_name + "' (fingerprint " + c.fingerprint +
                                      "), not this one ('" + shape.name + "', fingerprint " + shape.fingerprint + ")" +
                                      remedy + " --model <this model>");
    }
    c.head_group = j.at("head_group").get<int64_t>();
    const int64_t n = shape.n_kv_heads * shape.head_dim;
    const int64_t width = c.head_group * shape.head_dim;
    if (c.head_group < 1 || shape.n_kv_heads % c.head_group != 0 || (width & (width - 1)) != 0) {
      return Status::corruption(what + ": head_group " + std::to_string(c.head_group) +
                                " must divide the KV heads and give a power-of-two rotation");
    }
    const nlohmann::json& layers = j.at("layers");
    if (static_cast<int64_t>(layers.size()) != shape.n_layers) return Status::corruption(what + ": wrong number of layers");
    for (const nlohmann::json& layer : layers) {
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
