// The part every quantizer's calibration file shares: the header that says which compressor,
// which format version and which model's weights (by fingerprint) it was made for, and the
// refusals, each naming the command that makes the right file.
// Header-only (compiled into each plugin and the command line). Not part of the installed contract.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include <vericache/compressor.h>

namespace vericache::plugin {

inline constexpr const char* kCalibrationFormat = "vericache-calibration";

struct CalibrationKind {
  std::string compressor;  // "kvquant"
  std::string title;       // "KVQuant", in messages
  int version = 0;
  std::string env_var;     // the variable a path may also come from
};

inline std::string calibrate_command(const CalibrationKind& kind, const std::string& path) {
  return "vericache calibrate --compressor " + kind.compressor + " --out " + path;
}

// The header written first in every file: {"format", "compressor", "version", "model": {...}}.
inline nlohmann::json calibration_header(const CalibrationKind& kind, const ModelShape& shape) {
  return {{"format", kCalibrationFormat},
          {"compressor", kind.compressor},
          {"version", kind.version},
          {"model",
           {{"name", shape.name}, {"fingerprint", shape.fingerprint}, {"n_layers", shape.n_layers},
            {"n_kv_heads", shape.n_kv_heads}, {"head_dim", shape.head_dim}}}};
}

// Reads `path` and checks its header against `kind` and `shape`: NotFound (no path, unreadable),
// Corruption (not such a file), NotSupported (another version), InvalidArgument (another model).
// Every message says which command makes the right file.
inline Result<nlohmann::json> read_calibration_file(const CalibrationKind& kind, const std::string& path,
                                                    const ModelShape& shape) {
  const std::string remedy = "; make one with '" + calibrate_command(kind, path) + "'";
  if (path.empty()) {
    const std::string file = kind.compressor + ".json";
    return Status::not_found("no calibration file: make one with '" + calibrate_command(kind, file) +
                             "', then pass --params '{\"calibration\": \"" + file + "\"}' (or set " + kind.env_var + ")");
  }
  std::ifstream in(path);
  if (!in) return Status::not_found("cannot read calibration file '" + path + "'" + remedy);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  const std::string what = "calibration file '" + path + "'";
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kCalibrationFormat ||
      j.value("compressor", "") != kind.compressor) {
    return Status::corruption(what + " is not a " + kind.title + " " + kCalibrationFormat + " JSON file" + remedy);
  }
  if (j.value("version", 0) != kind.version) {
    return Status::not_supported(what + " has version " + std::to_string(j.value("version", 0)) + "; this build reads version " +
                                 std::to_string(kind.version) + remedy);
  }
  const nlohmann::json model = j.value("model", nlohmann::json::object());
  const std::string name = model.value("name", ""), fingerprint = model.value("fingerprint", "");
  if (fingerprint != shape.fingerprint) {
    return Status::invalid_argument(what + " was made for model '" + name + "' (fingerprint " + fingerprint +
                                    "), not this one ('" + shape.name + "', fingerprint " + shape.fingerprint + ")" + remedy +
                                    " --model <this model>");
  }
  if (!j.contains("layers") || !j["layers"].is_array() || static_cast<int64_t>(j["layers"].size()) != shape.n_layers) {
    return Status::corruption(what + ": wrong number of layers");
  }
  return j;
}

}  // namespace vericache::plugin
