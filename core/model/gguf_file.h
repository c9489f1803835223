// GGUF model files: header, metadata, tensor directory.
//
// Format (versions 2 and 3; all integers little-endian):
//   magic "GGUF" | u32 version | u64 tensor_count | u64 metadata_count
//   metadata_count x { string key | u32 value_type | value }
//   tensor_count  x { string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset }
//   padding to `general.alignment` (default 32) | tensor data
// A string is u64 length + bytes (no terminator). An array value is u32 element_type | u64 count |
// elements, and may nest. Tensor dims are in ggml order: dims[0] is the contiguous dimension, so
// a weight matrix [out_features, in_features] is stored with dims = {in_features, out_features}.
// Tensor offsets count from the start of the data section and are multiples of the alignment.
//
// Ownership: GgufFile owns a read-only mapping of the file; GgufTensorInfo::data points into it
// and stays valid while the GgufFile lives (moving it keeps the pointers valid).
// Thread-safety: immutable after open(); concurrent reads are safe.
// Failure: open() validates the whole header and directory (magic, version, every length and
// count against the file size, tensor types, shapes, offsets and alignment) and returns an error
// naming the file and the problem; it never reads out of bounds.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include <vericache/status.h>

#include "model/ggml_types.h"
#include "util/mapped_file.h"

namespace vericache {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

const char* gguf_value_type_name(GgufValueType type);

struct GgufValue;
using GgufArray = std::vector<GgufValue>;

// One metadata value. Unsigned integers are held as uint64_t, signed ones as int64_t, floats as
// double (float32 values convert exactly); `type` keeps the type written in the file.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType element_type = GgufValueType::kUint8;  // arrays only
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> data;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] is contiguous
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;        // from the start of the data section
  int64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping
};

class GgufFile {
 public:
  static Result<GgufFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return file_.size(); }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(const std::string& key) const;

  // Typed getters. NotFound names the missing key; Corruption names a key of the wrong type or an
  // integer that does not fit. get_int accepts any integer type, get_float float32/float64.
  Result<int64_t> get_int(const std::string& key) const;
  Result<double> get_float(const std::string& key) const;
  Result<bool> get_bool(const std::string& key) const;
  Result<std::string> get_string(const std::string& key) const;
  Result<std::vector<std::string>> get_string_array(const std::string& key) const;
  Result<std::vector<int64_t>> get_int_array(const std::string& key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const GgufTensorInfo* find_tensor(const std::string& name) const;

 private:
  MappedFile file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::unordered_map<std::string, size_t> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;

  friend class GgufParser;
};

}  // namespace vericache
