// Hardware and model-shape profiles for the throughput model and the simulator: small JSON files
// (profiles/hardware/*.json, profiles/models/*.json in the source tree), picked by name or path.
// Sizes are in decimal GB (1e9 bytes) and bandwidths in GB/s, as the paper writes them; every
// profile says where its numbers come from ("source").
//
// Failure: NotFound for an unknown name (listing the known ones) or a missing file;
// InvalidArgument naming the file and key for malformed JSON, a missing key or a value out of range.
// Thread-safety: pure functions (they read files).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <vericache/status.h>

namespace vericache::sim {

struct HardwareProfile {
  std::string name;
  std::string description;
  std::string source;
  double memory_bytes = 0;           // device memory (HBM) capacity
  double memory_bandwidth = 0;       // bytes/s a forward streams from device memory (BW_hbm)
  double link_bandwidth = 0;         // bytes/s host -> device for KV_full reloads (BW_inter)
  // Optional ("forward_overhead_ms", "request_us", "verify_row_us"; 0 when absent), for machines
  // (a CPU) where a forward is not bytes / bandwidth alone: a fixed cost per forward, a cost per
  // request in it (its first row), and a cost per further row of a verify (its drafts).
  double forward_overhead_s = 0;
  double request_s = 0;
  double verify_row_s = 0;
};

struct ModelShapeProfile {
  std::string name;
  std::string description;
  std::string source;
  int64_t layers = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  double kv_bytes_per_value = 2;  // 2 for bf16 / fp16, 4 for float32
  double parameters = 0;
  double weight_bytes = 0;        // M: parameters x bytes per parameter, or given in the file
  // K and V of every layer for one token.
  double kv_bytes_per_token() const {
    return 2.0 * static_cast<double>(layers * kv_heads * head_dim) * kv_bytes_per_value;
  }
};

// `name_or_path`: a file path (anything with a '/' or ending in .json), else the file
// `<profile_dir>/hardware/<name>.json` (or models/).
Result<HardwareProfile> load_hardware_profile(const std::string& name_or_path, const std::string& profile_dir);
Result<ModelShapeProfile> load_model_shape(const std::string& name_or_path, const std::string& profile_dir);
// Names of the profiles in <profile_dir>/hardware (or models), sorted.
std::vector<std::string> profile_names(const std::string& profile_dir, const std::string& kind);

}  // namespace vericache::sim
