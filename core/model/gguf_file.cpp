#include "model/gguf_file.h"

#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "util/printable.h"

namespace vericache {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint32_t kMaxDims = 4;              // GGML_MAX_DIMS
constexpr int kMaxArrayNesting = 8;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

bool is_valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

}  // namespace

const char* gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: return "uint8";
    case GgufValueType::kInt8: return "int8";
    case GgufValueType::kUint16: return "uint16";
    case GgufValueType::kInt16: return "int16";
    case GgufValueType::kUint32: return "uint32";
    case GgufValueType::kInt32: return "int32";
    case GgufValueType::kFloat32: return "float32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kUint64: return "uint64";
    case GgufValueType::kInt64: return "int64";
    case GgufValueType::kFloat64: return "float64";
  }
  return "unknown";
}

// Bounds-checked reading of the header and directory. Every failure names the file, the offset
// and what was being read.
class GgufParser {
 public:
  GgufParser(const uint8_t* data, size_t size, std::string path) : data_(data), size_(size), path_(std::move(path)) {}

  Status parse(GgufFile* out) {
    uint32_t magic = 0;
    if (size_ < 4) return error("file is " + std::to_string(size_) + " bytes, too short for a GGUF header");
    VC_RETURN_IF_ERROR(read_pod(&magic, "magic"));
    if (magic != kGgufMagic) {
      return Status::corruption(path_ + ": not a GGUF file (magic " + hex32(magic) + ", expected 0x46554747 \"GGUF\")");
    }
    uint32_t version = 0;
    VC_RETURN_IF_ERROR(read_pod(&version, "version"));
    if (version != 2 && version != 3) {
      return Status::not_supported(path_ + ": GGUF version " + std::to_string(version) + " is not supported (2 and 3 are)");
    }
    out->version_ = version;
    uint64_t tensor_count = 0, kv_count = 0;
    VC_RETURN_IF_ERROR(read_pod(&tensor_count, "tensor count"));
    VC_RETURN_IF_ERROR(read_pod(&kv_count, "metadata count"));
    // Each entry needs at least 8 bytes; larger counts cannot fit in the file.
    if (kv_count > size_ / 8 || tensor_count > size_ / 8) {
      return error("metadata count " + std::to_string(kv_count) + " / tensor count " + std::to_string(tensor_count) +
                   " cannot fit in a " + std::to_string(size_) + "-byte file");
    }

    for (uint64_t i = 0; i < kv_count; ++i) {
      std::string key;
      VC_RETURN_IF_ERROR(read_string(&key, "metadata key #" + std::to_string(i)));
      uint32_t type = 0;
      VC_RETURN_IF_ERROR(read_pod(&type, "type of metadata " + printable(key)));
      GgufValue value;
      VC_RETURN_IF_ERROR(read_value(type, &value, key, "value of metadata " + printable(key), 0));
      if (out->metadata_index_.count(key) != 0) return error("duplicate metadata key " + printable(key));
      out->metadata_index_[key] = out->metadata_.size();
      out->metadata_.emplace_back(std::move(key), std::move(value));
    }

    if (const GgufValue* a = out->find("general.alignment")) {
      const auto* v = std::get_if<uint64_t>(&a->data);
      if (v == nullptr || *v == 0 || (*v & (*v - 1)) != 0) {
        return Status::corruption(path_ + ": general.alignment must be a power-of-two unsigned integer");
      }
      out->alignment_ = *v;
    }

    for (uint64_t i = 0; i < tensor_count; ++i) {
      GgufTensorInfo t;
      VC_RETURN_IF_ERROR(read_string(&t.name, "name of tensor #" + std::to_string(i)));
      VC_RETURN_IF_ERROR(read_tensor_info(&t));
      if (out->tensor_index_.count(t.name) != 0) return error("duplicate tensor " + printable(t.name));
      out->tensor_index_[t.name] = out->tensors_.size();
      out->tensors_.push_back(std::move(t));
    }

    const uint64_t data_start = (pos_ + out->alignment_ - 1) / out->alignment_ * out->alignment_;
    if (tensor_count > 0 && data_start > size_) {
      return Status::corruption(path_ + ": truncated: tensor data would start at byte " + std::to_string(data_start) +
                                " but the file has " + std::to_string(size_) + " bytes");
    }
    const uint64_t data_size = data_start <= size_ ? size_ - data_start : 0;
    for (GgufTensorInfo& t : out->tensors_) {
      if (t.offset % out->alignment_ != 0) {
        return Status::corruption(path_ + ": tensor " + printable(t.name) + " offset " + std::to_string(t.offset) +
                                  " is not a multiple of the alignment " + std::to_string(out->alignment_));
      }
      if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
        return Status::corruption(path_ + ": truncated: tensor " + printable(t.name) + " needs bytes [" +
                                  std::to_string(data_start + t.offset) + ", " +
                                  std::to_string(data_start + t.offset + t.n_bytes) + ") but the file has " +
                                  std::to_string(size_) + " bytes");
      }
      t.data = data_ + data_start + t.offset;
    }
    return Status();
  }

 private:
  Status error(const std::string& what) const { return Status::corruption(path_ + ": " + what); }

  Status truncated(const std::string& what, uint64_t need) const {
    return Status::corruption(path_ + ": truncated: reading " + what + " at byte " + std::to_string(pos_) +
                              " needs " + std::to_string(need) + " bytes, the file has " + std::to_string(size_));
  }

  template <typename T>
  Status read_pod(T* v, const std::string& what) {
    if (size_ - pos_ < sizeof(T)) return truncated(what, sizeof(T));
    std::memcpy(v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status();
  }

  Status read_string(std::string* s, const std::string& what) {
    uint64_t len = 0;
    VC_RETURN_IF_ERROR(read_pod(&len, "length of " + what));
    if (len > size_ - pos_) return truncated(what, len);
    s->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return Status();
  }

  // `what` names the value in error messages; it is built once per key because an array (the
  // Qwen vocabulary) holds hundreds of thousands of elements.
  Status read_value(uint32_t type, GgufValue* v, const std::string& key, const std::string& what, int depth) {
    if (!is_valid_value_type(type)) {
      return error("metadata " + printable(key) + " has unknown value type " + std::to_string(type));
    }
    v->type = static_cast<GgufValueType>(type);
    switch (v->type) {
      case GgufValueType::kUint8: return read_int<uint8_t, uint64_t>(v, what);
      case GgufValueType::kInt8: return read_int<int8_t, int64_t>(v, what);
      case GgufValueType::kUint16: return read_int<uint16_t, uint64_t>(v, what);
      case GgufValueType::kInt16: return read_int<int16_t, int64_t>(v, what);
      case GgufValueType::kUint32: return read_int<uint32_t, uint64_t>(v, what);
      case GgufValueType::kInt32: return read_int<int32_t, int64_t>(v, what);
      case GgufValueType::kUint64: return read_int<uint64_t, uint64_t>(v, what);
      case GgufValueType::kInt64: return read_int<int64_t, int64_t>(v, what);
      case GgufValueType::kFloat32: {
        float f = 0;
        VC_RETURN_IF_ERROR(read_pod(&f, what));
        v->data = static_cast<double>(f);
        return Status();
      }
      case GgufValueType::kFloat64: {
        double f = 0;
        VC_RETURN_IF_ERROR(read_pod(&f, what));
        v->data = f;
        return Status();
      }
      case GgufValueType::kBool: {
        uint8_t b = 0;
        VC_RETURN_IF_ERROR(read_pod(&b, what));
        if (b > 1) return error("metadata " + printable(key) + " is a bool with value " + std::to_string(b));
        v->data = b != 0;
        return Status();
      }
      case GgufValueType::kString: {
        std::string s;
        VC_RETURN_IF_ERROR(read_string(&s, what));
        v->data = std::move(s);
        return Status();
      }
      case GgufValueType::kArray: {
        if (depth >= kMaxArrayNesting) return error("metadata " + printable(key) + " nests arrays too deeply");
        uint32_t element_type = 0;
        uint64_t count = 0;
        VC_RETURN_IF_ERROR(read_pod(&element_type, "element type of " + what));
        VC_RETURN_IF_ERROR(read_pod(&count, "length of " + what));
        if (!is_valid_value_type(element_type)) {
          return error("metadata " + printable(key) + " is an array of unknown value type " + std::to_string(element_type));
        }
        // Every element takes at least one byte.
        if (count > size_ - pos_) return truncated(what + " (" + std::to_string(count) + " elements)", count);
        v->element_type = static_cast<GgufValueType>(element_type);
        GgufArray items(count);
        for (uint64_t i = 0; i < count; ++i) {
          VC_RETURN_IF_ERROR(read_value(element_type, &items[i], key, what, depth + 1));
        }
        v->data = std::move(items);
        return Status();
      }
    }
    return error("unreachable value type");
  }

  template <typename Stored, typename Held>
  Status read_int(GgufValue* v, const std::string& what) {
    Stored x{};
    VC_RETURN_IF_ERROR(read_pod(&x, what));
    v->data = static_cast<Held>(x);
    return Status();
  }

  Status read_tensor_info(GgufTensorInfo* t) {
    uint32_t n_dims = 0;
    VC_RETURN_IF_ERROR(read_pod(&n_dims, "rank of tensor " + printable(t->name)));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return error("tensor " + printable(t->name) + " has rank " + std::to_string(n_dims) + " (1 to 4 allowed)");
    }
    t->n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      VC_RETURN_IF_ERROR(read_pod(&dim, "shape of tensor " + printable(t->name)));
      if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / t->n_elements)) {
        return error("tensor " + printable(t->name) + " has invalid dimension " + std::to_string(dim));
      }
      t->dims.push_back(static_cast<int64_t>(dim));
      t->n_elements *= static_cast<int64_t>(dim);
    }
    uint32_t type = 0;
    VC_RETURN_IF_ERROR(read_pod(&type, "type of tensor " + printable(t->name)));
    const GgmlTypeInfo* info = ggml_type_info(type);
    if (info == nullptr) {
      return Status::not_supported(path_ + ": tensor " + printable(t->name) + " has unknown ggml type " + std::to_string(type));
    }
    t->type = info->type;
    if (t->dims[0] % info->block_elements != 0) {
      return error("tensor " + printable(t->name) + " row length " + std::to_string(t->dims[0]) + " is not a multiple of the " +
                   info->name + " block size " + std::to_string(info->block_elements));
    }
    const uint64_t blocks = static_cast<uint64_t>(t->n_elements / info->block_elements);
    if (blocks > std::numeric_limits<uint64_t>::max() / info->block_bytes) {
      return error("tensor " + printable(t->name) + " is too large");
    }
    t->n_bytes = blocks * info->block_bytes;
    return read_pod(&t->offset, "offset of tensor " + printable(t->name));
  }

  const uint8_t* data_;
  size_t size_;
  std::string path_;
  size_t pos_ = 0;
};

Result<GgufFile> GgufFile::open(const std::string& path) {
  VC_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  GgufFile file;
  file.file_ = std::move(mapped);
  GgufParser parser(file.file_.data(), file.file_.size(), path);
  VC_RETURN_IF_ERROR(parser.parse(&file));
  return file;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Status missing_key(const std::string& path, const std::string& key) {
  return Status::not_found(path + ": missing metadata key " + printable(key));
}

Status wrong_type(const std::string& path, const std::string& key, const GgufValue& v, const char* expected) {
  return Status::corruption(path + ": metadata " + printable(key) + " is " + gguf_value_type_name(v.type) + ", expected " +
                            expected);
}

bool is_integer(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kUint16:
    case GgufValueType::kInt16: case GgufValueType::kUint32: case GgufValueType::kInt32:
    case GgufValueType::kUint64: case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

// An integer value as int64_t; false when it does not fit.
bool as_int64(const GgufValue& v, int64_t* out) {
  if (const auto* u = std::get_if<uint64_t>(&v.data)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(*u);
    return true;
  }
  if (const auto* i = std::get_if<int64_t>(&v.data)) {
    *out = *i;
    return true;
  }
  return false;
}

}  // namespace

Result<int64_t> GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing_key(path(), key);
  int64_t out = 0;
  if (!is_integer(v->type)) return wrong_type(path(), key, *v, "an integer");
  if (!as_int64(*v, &out)) return Status::corruption(path() + ": metadata " + printable(key) + " does not fit in int64");
  return out;
}

Result<double> GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing_key(path(), key);
  const auto* f = std::get_if<double>(&v->data);
  if (f == nullptr) return wrong_type(path(), key, *v, "a float");
  return *f;
}

Result<bool> GgufFile::get_bool(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing_key(path(), key);
  const auto* b = std::get_if<bool>(&v->data);
  if (b == nullptr) return wrong_type(path(), key, *v, "a bool");
  return *b;
}

Result<std::string> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing_key(path(), key);
  const auto* s = std::get_if<std::string>(&v->data);
  if (s == nullptr) return wrong_type(path(), key, *v, "a string");
  return *s;
}

Result<std::vector<std::string>> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing_key(path(), key);
  const auto* a = std::get_if<GgufArray>(&v->data);
  if (a == nullptr || v->element_type != GgufValueType::kString) {
    return wrong_type(path(), key, *v, "an array of strings");
  }
  std::vector<std::string> out;
  out.reserve(a->size());
  for (const GgufValue& item : *a) out.push_back(std::get<std::string>(item.data));
  return out;
}

Result<std::vector<int64_t>> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return missing_key(path(), key);
  const auto* a = std::get_if<GgufArray>(&v->data);
  if (a == nullptr || !is_integer(v->element_type)) return wrong_type(path(), key, *v, "an array of integers");
  std::vector<int64_t> out(a->size());
  for (size_t i = 0; i < a->size(); ++i) {
    if (!as_int64((*a)[i], &out[i])) {
      return Status::corruption(path() + ": metadata " + printable(key) + " has an element that does not fit in int64");
    }
  }
  return out;
}

}  // namespace vericache
