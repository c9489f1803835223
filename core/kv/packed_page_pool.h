// PackedPagePool: byte pages that hold a quantizer's packed KV slots (see PackedFormat in
// vericache/compressor.h). A packed page holds `page_size` slots of one layer, every KV head, keys
// and values, in `bytes_per_page` bytes laid out as the quantizer's PackedFormat says (its own
// layout, or a standard one the fused attention kernel reads); the pool only allocates, hands out
// and frees pages, and counts the bytes. Which page belongs to which request
// and layer is recorded in SequenceKv's packed tables.
//
// Ownership: the pool owns its storage; page ids stay valid until released.
// Thread-safety: not thread-safe (one engine thread owns a pool).
// Failure: allocate() returns OutOfPages and changes nothing when too few pages are free.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <ATen/core/Tensor.h>
#include <vericache/status.h>

namespace vericache {

class PackedPagePool {
 public:
  // InvalidArgument for bytes_per_page < 1 or a page count outside [1, 2^31-1]; OutOfPages (with
  // the byte count) when the storage cannot be allocated. CPU memory.
  static Result<PackedPagePool> create(int64_t num_pages, int64_t bytes_per_page);

  int64_t num_pages() const { return static_cast<int64_t>(in_use_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t peak_in_use() const { return peak_; }
  int64_t bytes_per_page() const { return storage_.defined() ? storage_.size(1) : 0; }

  // Appends `n` page ids to `pages`; all or nothing.
  Status allocate(int64_t n, std::vector<int32_t>* pages);
  // Returns pages to the free list. Releasing a page that is not in use is a bug (checked).
  void release(std::span<const int32_t> pages);

  // uint8 [num_pages, bytes_per_page].
  at::Tensor& storage() { return storage_; }
  const at::Tensor& storage() const { return storage_; }

 private:
  at::Tensor storage_;
  std::vector<int32_t> free_;  // a stack: the most recently freed page is reused first
  std::vector<bool> in_use_;
  int64_t peak_ = 0;
};

}  // namespace vericache
