// PagePool: the physical KV storage, a fixed number of equal pages of two kinds, each kind with its
// own free list and budget:
//   kResident   pages that stay allocated while their request lives: compressed caches (KV_comp),
//               and any cache of a plain full-KV run;
//   kTransient  pages that hold a full cache (KV_full) only for a verify window, filled by the
//               transfer engine and freed right after. Separate lists mean transient churn never
//               fragments or starves the resident pages.
// A page holds `page_size` token slots of one layer, for all KV heads, keys and values:
//   k_pages(): [num_pages, n_kv_heads, head_dim, page_size]   keys transposed within a page, so
//              16 consecutive slots of one channel are contiguous (CPU attention reads them as a vector)
//   v_pages(): [num_pages, n_kv_heads, page_size, head_dim]
// Page ids [0, resident pages) are resident, the rest transient. Keys are stored after RoPE. Which
// page belongs to which request and layer is recorded in block tables (SequenceKv), never in the
// pool; plugins receive both and read pages directly.
//
// Ownership: the pool owns the page tensors; page ids handed out stay valid until released.
// Thread-safety: not thread-safe; one engine thread owns a pool (the transfer engine's worker only
// writes pages the engine has allocated to it). Failure: allocate() returns OutOfPages and changes
// nothing when fewer pages of the kind are free than asked for (back-pressure).
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

enum class PageKind { kResident = 0, kTransient = 1 };
const char* page_kind_name(PageKind kind);  // "resident", "transient"

struct PagePoolOptions {
  int64_t resident_pages = 0;
  int64_t transient_pages = 0;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  // CPU pools only: page-locked host memory, so a CUDA copy stream can read it asynchronously.
  // Ignored (ordinary memory) when no CUDA device is present.
  bool pinned = false;
};

class PagePool {
 public:
  // InvalidArgument for a page size that is not a positive multiple of 16 or a page count outside
  // [1, 2^31-1] (resident + transient); OutOfPages (with the byte count) when the storage cannot
  // be allocated.
  static Result<PagePool> create(const KvPageSpec& spec, const PagePoolOptions& options);
  // A pool of resident pages only.
  static Result<PagePool> create(const KvPageSpec& spec, int64_t num_pages, at::ScalarType dtype, at::Device device);

  const KvPageSpec& spec() const { return spec_; }
  int64_t num_pages() const { return static_cast<int64_t>(in_use_.size()); }
  int64_t num_pages(PageKind kind) const { return kind == PageKind::kResident ? resident_ : num_pages() - resident_; }
  int64_t num_free(PageKind kind = PageKind::kResident) const {
    return static_cast<int64_t>(free_[static_cast<int>(kind)].size());
  }
  // The most pages of `kind` in use at once since the pool was created.
  int64_t peak_in_use(PageKind kind) const { return peak_[static_cast<int>(kind)]; }
  PageKind kind_of(int32_t page) const { return page < resident_ ? PageKind::kResident : PageKind::kTransient; }
  // Bytes of one page (keys and values).
  int64_t page_bytes() const;

  // Appends `n` page ids of `kind` to `pages`; all or nothing.
  Status allocate(int64_t n, std::vector<int32_t>* pages, PageKind kind = PageKind::kResident);
  // Returns pages to their kind's free list. Releasing a page that is not in use is a bug (checked).
  void release(std::span<const int32_t> pages);

  at::Tensor& k_pages() { return k_pages_; }
  at::Tensor& v_pages() { return v_pages_; }
  const at::Tensor& k_pages() const { return k_pages_; }
  const at::Tensor& v_pages() const { return v_pages_; }

 private:
  KvPageSpec spec_;
  int64_t resident_ = 0;
  at::Tensor k_pages_;
  at::Tensor v_pages_;
  std::vector<int32_t> free_[2];  // per kind, a stack: the most recently freed page is reused first
  std::vector<bool> in_use_;
  int64_t peak_[2] = {0, 0};
};

}  // namespace vericache
