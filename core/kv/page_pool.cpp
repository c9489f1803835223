#include "kv/page_pool.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "util/check.h"

namespace vericache {

Result<PagePool> PagePool::create(const KvPageSpec& spec, int64_t num_pages, at::ScalarType dtype, at::Device device) {
  if (spec.page_size <= 0 || spec.page_size % 16 != 0) {
    return Status::invalid_argument("KV page size must be a positive multiple of 16, got " +
                                    std::to_string(spec.page_size));
  }
  if (num_pages <= 0 || num_pages > (int64_t{1} << 31) - 1) {
    return Status::invalid_argument("KV page count must be between 1 and 2^31-1, got " + std::to_string(num_pages));
  }
  PagePool pool;
  pool.spec_ = spec;
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  try {
    pool.k_pages_ = at::empty({num_pages, spec.n_kv_heads, spec.head_dim, spec.page_size}, options);
    pool.v_pages_ = at::empty({num_pages, spec.n_kv_heads, spec.page_size, spec.head_dim}, options);
  } catch (const c10::Error& e) {
    return Status::out_of_pages("cannot allocate " + std::to_string(num_pages) + " KV pages (" +
                                std::to_string(num_pages * pool.page_bytes()) + " bytes) on " + device.str() +
                                ": " + e.what_without_backtrace());
  }
  pool.in_use_.assign(num_pages, false);
  pool.free_.reserve(num_pages);
  for (int64_t p = num_pages - 1; p >= 0; --p) pool.free_.push_back(static_cast<int32_t>(p));
  return pool;
}

int64_t PagePool::page_bytes() const {
  const int64_t elements = 2 * spec_.n_kv_heads * spec_.head_dim * spec_.page_size;
  return elements * static_cast<int64_t>(k_pages_.defined() ? k_pages_.element_size() : 4);
}

Status PagePool::allocate(int64_t n, std::vector<int32_t>* pages) {
  if (n > num_free()) {
    return Status::out_of_pages("KV page pool exhausted: " + std::to_string(n) + " pages needed, " +
                                std::to_string(num_free()) + " of " + std::to_string(num_pages()) + " free");
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = free_.back();
    free_.pop_back();
    in_use_[p] = true;
    pages->push_back(p);
  }
  return Status();
}

void PagePool::release(std::span<const int32_t> pages) {
  for (int32_t p : pages) {
    VC_CHECK(p >= 0 && p < num_pages() && in_use_[p], "releasing a KV page that is not in use");
    in_use_[p] = false;
    free_.push_back(p);
  }
}

}  // namespace vericache
