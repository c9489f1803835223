#include "kv/page_pool.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>

#include "util/check.h"

#if VC_WITH_CUDA
#include <ATen/Context.h>
#endif

namespace vericache {

const char* page_kind_name(PageKind kind) { return kind == PageKind::kResident ? "resident" : "transient"; }

Result<PagePool> PagePool::create(const KvPageSpec& spec, int64_t num_pages, at::ScalarType dtype, at::Device device) {
  return create(spec, PagePoolOptions{num_pages, 0, dtype, device, false});
}

Result<PagePool> PagePool::create(const KvPageSpec& spec, const PagePoolOptions& o) {
  if (spec.page_size <= 0 || spec.page_size % 16 != 0) {
    return Status::invalid_argument("KV page size must be a positive multiple of 16, got " +
                                    std::to_string(spec.page_size));
  }
  const int64_t num_pages = o.resident_pages + o.transient_pages;
  if (o.resident_pages < 0 || o.transient_pages < 0 || num_pages <= 0 || num_pages > (int64_t{1} << 31) - 1) {
    return Status::invalid_argument("KV page count must be between 1 and 2^31-1, got " + std::to_string(num_pages));
  }
  PagePool pool;
  pool.spec_ = spec;
  pool.resident_ = o.resident_pages;
  auto options = at::TensorOptions().dtype(o.dtype).device(o.device);
#if VC_WITH_CUDA
  if (o.pinned && o.device.is_cpu() && at::hasCUDA()) options = options.pinned_memory(true);
#endif
  try {
    pool.k_pages_ = at::empty({num_pages, spec.n_kv_heads, spec.head_dim, spec.page_size}, options);
    pool.v_pages_ = at::empty({num_pages, spec.n_kv_heads, spec.page_size, spec.head_dim}, options);
  } catch (const c10::Error&) {
    // ATen's text ("[enforce fail at alloc_cpu.cpp...]") is kept out: the size is what the user can act on.
    char size[32];
    std::snprintf(size, sizeof(size), "%.2f GiB", static_cast<double>(num_pages * pool.page_bytes()) / (1 << 30));
    return Status::out_of_pages("cannot allocate the KV cache: " + std::to_string(num_pages) + " pages of " +
                                std::to_string(spec.page_size) + " tokens, " + size + " on " + o.device.str() +
                                " (not enough memory; fewer requests, tokens or pages need less)");
  }
  pool.in_use_.assign(num_pages, false);
  for (int64_t p = num_pages - 1; p >= 0; --p) {
    pool.free_[static_cast<int>(pool.kind_of(static_cast<int32_t>(p)))].push_back(static_cast<int32_t>(p));
  }
  return pool;
}

int64_t PagePool::page_bytes() const {
  const int64_t elements = 2 * spec_.n_kv_heads * spec_.head_dim * spec_.page_size;
  return elements * static_cast<int64_t>(k_pages_.defined() ? k_pages_.element_size() : 4);
}

Status PagePool::allocate(int64_t n, std::vector<int32_t>* pages, PageKind kind) {
  std::vector<int32_t>& free = free_[static_cast<int>(kind)];
  if (n > num_free(kind)) {
    const std::string what = kind == PageKind::kResident && num_pages(PageKind::kTransient) == 0
                                 ? "KV page pool"
                                 : std::string("KV page pool (") + page_kind_name(kind) + " pages)";
    return Status::out_of_pages(what + " exhausted: " + std::to_string(n) + " pages needed, " +
                                std::to_string(num_free(kind)) + " of " + std::to_string(num_pages(kind)) + " free");
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = free.back();
    free.pop_back();
    in_use_[p] = true;
    pages->push_back(p);
  }
  int64_t& peak = peak_[static_cast<int>(kind)];
  peak = std::max(peak, num_pages(kind) - num_free(kind));
  return Status();
}

void PagePool::release(std::span<const int32_t> pages) {
  for (int32_t p : pages) {
    VC_CHECK(p >= 0 && p < num_pages() && in_use_[p], "releasing a KV page that is not in use");
    in_use_[p] = false;
    free_[static_cast<int>(kind_of(p))].push_back(p);
  }
}

}  // namespace vericache
