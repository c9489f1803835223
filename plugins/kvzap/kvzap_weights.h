// The KVzap surrogate's weights file: what `vericache train-kvzap` writes and the kvzap plugin
// reads. One JSON object, versioned:
//   {"format": "vericache-kvzap", "version": 1, "kind": "linear",
//    "model": {"name", "fingerprint", "n_layers", "d_model", "n_kv_heads"},
//    "layers": [{"weight": [[d_model floats] x n_kv_heads], "bias": [n_kv_heads floats]}, ...],
//    "training": {...free-form record of how it was made...}}
// Per layer, the predicted log KVzip+ score of a token is weight . x + bias, x the layer's
// attention input (after the RMSNorm).
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include <vericache/compressor.h>

namespace vericache::kvzap {

inline constexpr const char* kFormat = "vericache-kvzap";
inline constexpr int kVersion = 1;

struct SurrogateWeights {
  std::string model_name;
  std::string fingerprint;
  std::vector<at::Tensor> weight;  // [n_layers] float32 [n_kv_heads, d_model]
  std::vector<at::Tensor> bias;    // [n_layers] float32 [n_kv_heads]
};

inline nlohmann::json to_json(const SurrogateWeights& w, const ModelShape& shape, const nlohmann::json& training) {
  nlohmann::json layers = nlohmann::json::array();
  for (size_t l = 0; l < w.weight.size(); ++l) {
    const at::Tensor wt = w.weight[l].contiguous(), b = w.bias[l].contiguous();
    nlohmann::json rows = nlohmann::json::array();
    for (int64_t h = 0; h < wt.size(0); ++h) {
      rows.push_back(std::vector<float>(wt[h].data_ptr<float>(), wt[h].data_ptr<float>() + wt.size(1)));
    }
    layers.push_back({{"weight", rows}, {"bias", std::vector<float>(b.data_ptr<float>(), b.data_ptr<float>() + b.numel())}});
  }
  return {{"format", kFormat},
          {"version", kVersion},
          {"kind", "linear"},
          {"model",
           {{"name", shape.name}, {"fingerprint", shape.fingerprint}, {"n_layers", shape.n_layers},
            {"d_model", shape.d_model}, {"n_kv_heads", shape.n_kv_heads}}},
          {"layers", layers},
          {"training", training}};
}

// Reads and checks a weights file against `shape`: NotFound / Corruption / InvalidArgument with
// what to do about it.
inline Result<SurrogateWeights> load_weights(const std::string& path, const ModelShape& shape) {
  std::ifstream in(path);
  if (!in) return Status::not_found("cannot read surrogate weights '" + path + "'; make them with 'vericache train-kvzap --out " + path + "'");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  const std::string what = "surrogate weights '" + path + "'";
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kFormat) {
    return Status::corruption(what + " is not a " + std::string(kFormat) + " JSON file");
  }
  if (j.value("version", 0) != kVersion) {
    return Status::not_supported(what + " has version " + std::to_string(j.value("version", 0)) + "; this build reads version " +
                                 std::to_string(kVersion) + " (retrain with vericache train-kvzap)");
  }
  SurrogateWeights w;
  try {
    const nlohmann::json& m = j.at("model");
    w.model_name = m.at("name").get<std::string>();
    w.fingerprint = m.at("fingerprint").get<std::string>();
    if (w.fingerprint != shape.fingerprint) {
      return Status::invalid_argument(what + " were trained for model '" + w.model_name + "' (fingerprint " + w.fingerprint +
                                      "), not this one ('" + shape.name + "', fingerprint " + shape.fingerprint +
                                      "); train weights for it with vericache train-kvzap");
    }
    const nlohmann::json& layers = j.at("layers");
    if (static_cast<int64_t>(layers.size()) != shape.n_layers) return Status::corruption(what + ": wrong number of layers");
    for (const nlohmann::json& layer : layers) {
      const auto rows = layer.at("weight").get<std::vector<std::vector<float>>>();
      const auto bias = layer.at("bias").get<std::vector<float>>();
      if (static_cast<int64_t>(rows.size()) != shape.n_kv_heads || static_cast<int64_t>(bias.size()) != shape.n_kv_heads) {
        return Status::corruption(what + ": a layer does not have one row per KV head");
      }
      at::Tensor wt = at::empty({shape.n_kv_heads, shape.d_model}, at::kFloat);
      for (int64_t h = 0; h < shape.n_kv_heads; ++h) {
        if (static_cast<int64_t>(rows[h].size()) != shape.d_model) return Status::corruption(what + ": a row is not d_model long");
        std::copy(rows[h].begin(), rows[h].end(), wt[h].data_ptr<float>());
      }
      w.weight.push_back(wt);
      w.bias.push_back(at::tensor(bias, at::kFloat));
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::corruption(what + ": " + e.what());
  }
  return w;
}

}  // namespace vericache::kvzap
