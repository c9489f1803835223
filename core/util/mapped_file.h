// A read-only memory mapping of a whole file.
//
// Ownership: MappedFile owns the mapping; data() stays valid until the object is destroyed, and
// moving the object keeps the address. Thread-safety: immutable after open(), safe to read from
// many threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <vericache/status.h>

namespace vericache {

class MappedFile {
 public:
  // Maps `path`. Fails with NotFound when it does not exist, IOError when it cannot be read or
  // mapped, InvalidArgument when it is a directory or not a regular file (a FIFO would block the
  // open forever). An empty file maps to size() == 0.
  static Result<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace vericache
