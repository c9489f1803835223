#include "sim/profiles.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace vericache::sim {
namespace {

namespace fs = std::filesystem;

bool is_path(const std::string& s) {
  return s.find('/') != std::string::npos || (s.size() > 5 && s.compare(s.size() - 5, 5, ".json") == 0);
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

Result<nlohmann::json> read_profile(const std::string& name_or_path, const std::string& profile_dir,
                                    const std::string& kind, std::string* path) {
  *path = is_path(name_or_path) ? name_or_path : profile_dir + "/" + kind + "/" + name_or_path + ".json";
  std::error_code ec;
  if (!fs::is_regular_file(*path, ec)) {
    if (is_path(name_or_path)) return Status::not_found(*path + ": no such profile file");
    return Status::not_found("no " + kind + " profile named '" + name_or_path +
                             "' (known: " + join(profile_names(profile_dir, kind)) + "; or give a .json path)");
  }
  std::ifstream in(*path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::invalid_argument(*path + ": not a JSON object");
  return j;
}

// j[key] as a string / as a finite number in [min, max] / as a whole number in [1, max].
Status get_string(const nlohmann::json& j, const std::string& path, const char* key, std::string* out) {
  if (!j.contains(key) || !j[key].is_string()) {
    return Status::invalid_argument(path + ": '" + key + "' must be a string");
  }
  *out = j[key].get<std::string>();
  return Status();
}

Status get_number(const nlohmann::json& j, const std::string& path, const char* key, double min, double max,
                  double* out) {
  if (!j.contains(key) || !j[key].is_number()) {
    return Status::invalid_argument(path + ": '" + key + "' must be a number");
  }
  const double v = j[key].get<double>();
  if (!std::isfinite(v) || v < min || v > max) {
    return Status::invalid_argument(path + ": '" + key + "' = " + std::to_string(v) + " is out of range [" +
                                    std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  *out = v;
  return Status();
}

Status get_count(const nlohmann::json& j, const std::string& path, const char* key, int64_t max, int64_t* out) {
  double v = 0;
  VC_RETURN_IF_ERROR(get_number(j, path, key, 1, static_cast<double>(max), &v));
  if (v != std::floor(v)) return Status::invalid_argument(path + ": '" + key + "' must be a whole number");
  *out = static_cast<int64_t>(v);
  return Status();
}

}  // namespace

std::vector<std::string> profile_names(const std::string& profile_dir, const std::string& kind) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(profile_dir + "/" + kind, ec)) {
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

Result<HardwareProfile> load_hardware_profile(const std::string& name_or_path, const std::string& profile_dir) {
  std::string path;
  VC_ASSIGN_OR_RETURN(nlohmann::json j, read_profile(name_or_path, profile_dir, "hardware", &path));
  HardwareProfile p;
  double memory_gb = 0, memory_gb_s = 0, link_gb_s = 0;
  VC_RETURN_IF_ERROR(get_string(j, path, "name", &p.name));
  VC_RETURN_IF_ERROR(get_string(j, path, "description", &p.description));
  VC_RETURN_IF_ERROR(get_string(j, path, "source", &p.source));
  VC_RETURN_IF_ERROR(get_number(j, path, "memory_gb", 0.001, 1e6, &memory_gb));
  VC_RETURN_IF_ERROR(get_number(j, path, "memory_bandwidth_gb_s", 0.001, 1e6, &memory_gb_s));
  VC_RETURN_IF_ERROR(get_number(j, path, "link_bandwidth_gb_s", 0.001, 1e6, &link_gb_s));
  p.memory_bytes = memory_gb * 1e9;
  p.memory_bandwidth = memory_gb_s * 1e9;
  p.link_bandwidth = link_gb_s * 1e9;
  if (j.contains("forward_overhead_ms")) {
    VC_RETURN_IF_ERROR(get_number(j, path, "forward_overhead_ms", 0, 1e6, &p.forward_overhead_s));
    p.forward_overhead_s /= 1e3;
  }
  if (j.contains("request_us")) {
    VC_RETURN_IF_ERROR(get_number(j, path, "request_us", 0, 1e9, &p.request_s));
    p.request_s /= 1e6;
  }
  if (j.contains("verify_row_us")) {
    VC_RETURN_IF_ERROR(get_number(j, path, "verify_row_us", 0, 1e9, &p.verify_row_s));
    p.verify_row_s /= 1e6;
  }
  return p;
}

Result<ModelShapeProfile> load_model_shape(const std::string& name_or_path, const std::string& profile_dir) {
  std::string path;
  VC_ASSIGN_OR_RETURN(nlohmann::json j, read_profile(name_or_path, profile_dir, "models", &path));
  ModelShapeProfile p;
  VC_RETURN_IF_ERROR(get_string(j, path, "name", &p.name));
  VC_RETURN_IF_ERROR(get_string(j, path, "description", &p.description));
  VC_RETURN_IF_ERROR(get_string(j, path, "source", &p.source));
  VC_RETURN_IF_ERROR(get_count(j, path, "layers", 4096, &p.layers));
  VC_RETURN_IF_ERROR(get_count(j, path, "kv_heads", 4096, &p.kv_heads));
  VC_RETURN_IF_ERROR(get_count(j, path, "head_dim", 65536, &p.head_dim));
  VC_RETURN_IF_ERROR(get_number(j, path, "kv_bytes_per_value", 0.125, 8, &p.kv_bytes_per_value));
  VC_RETURN_IF_ERROR(get_number(j, path, "parameters", 1, 1e15, &p.parameters));
  if (j.contains("weight_bytes")) {
    VC_RETURN_IF_ERROR(get_number(j, path, "weight_bytes", 1, 1e16, &p.weight_bytes));
  } else {
    double per_parameter = 0;
    VC_RETURN_IF_ERROR(get_number(j, path, "weight_bytes_per_parameter", 0.01, 8, &per_parameter));
    p.weight_bytes = p.parameters * per_parameter;
  }
  return p;
}

}  // namespace vericache::sim
