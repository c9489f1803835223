// PagePool: the physical KV storage, a fixed number of equal pages with a free list.
//
// A page holds `page_size` token slots of one layer, for all KV heads, keys and values:
//   k_pages(): [num_pages, n_kv_heads, head_dim, page_size]   keys transposed within a page, so
//              16 consecutive slots of one channel are contiguous (CPU attention reads them as a vector)
//   v_pages(): [num_pages, n_kv_heads, page_size, head_dim]
// Keys are stored after RoPE. Which page belongs to which request and layer is recorded in block
// tables (SequenceKv), never in the pool; plugins receive both and read pages directly.
//
// Ownership: the pool owns the page tensors; page ids handed out stay valid until released.
// Thread-safety: not thread-safe; one engine thread owns a pool. Failure: allocate() returns
// OutOfPages and changes nothing when fewer pages are free than asked for (back-pressure).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <vericache/status.h>

namespace vericache {

struct KvPageSpec {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t page_size = 16;  // slots per page; a multiple of 16

  // Pages needed to hold `slots` slots of one layer.
  int64_t pages_for(int64_t slots) const { return (slots + page_size - 1) / page_size; }
};

class PagePool {
 public:
  // InvalidArgument for a page size that is not a positive multiple of 16 or a non-positive page
  // count; OutOfPages (with the byte count) when the storage cannot be allocated.
  static Result<PagePool> create(const KvPageSpec& spec, int64_t num_pages, at::ScalarType dtype, at::Device device);

  const KvPageSpec& spec() const { return spec_; }
  int64_t num_pages() const { return static_cast<int64_t>(in_use_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  // Bytes of one page (keys and values).
  int64_t page_bytes() const;

  // Appends `n` page ids to `pages`; all or nothing.
  Status allocate(int64_t n, std::vector<int32_t>* pages);
  // Returns pages to the free list. Releasing a page that is not in use is a bug (checked).
  void release(std::span<const int32_t> pages);

  at::Tensor& k_pages() { return k_pages_; }
  at::Tensor& v_pages() { return v_pages_; }
  const at::Tensor& k_pages() const { return k_pages_; }
  const at::Tensor& v_pages() const { return v_pages_; }

 private:
  KvPageSpec spec_;
  at::Tensor k_pages_;
  at::Tensor v_pages_;
  std::vector<int32_t> free_;  // a stack: the most recently freed page is reused first
  std::vector<bool> in_use_;
};

}  // namespace vericache
