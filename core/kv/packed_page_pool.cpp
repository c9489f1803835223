#include "kv/packed_page_pool.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "util/check.h"

namespace vericache {

Result<PackedPagePool> PackedPagePool::create(int64_t num_pages, int64_t bytes_per_page) {
  if (bytes_per_page < 1) {
    return Status::invalid_argument("packed KV pages need at least one byte, got " + std::to_string(bytes_per_page));
  }
  if (num_pages <= 0 || num_pages > (int64_t{1} << 31) - 1) {
    return Status::invalid_argument("packed KV page count must be between 1 and 2^31-1, got " +
                                    std::to_string(num_pages));
  }
  PackedPagePool pool;
  try {
    pool.storage_ = at::empty({num_pages, bytes_per_page}, at::kByte);
  } catch (const c10::Error&) {
    char size[32];
    std::snprintf(size, sizeof(size), "%.2f GiB", static_cast<double>(num_pages * bytes_per_page) / (1 << 30));
    return Status::out_of_pages("cannot allocate the packed KV cache: " + std::to_string(num_pages) + " pages, " + size +
                                " (not enough memory; fewer requests, tokens or pages need less)");
  }
  pool.in_use_.assign(num_pages, false);
  for (int64_t p = num_pages - 1; p >= 0; --p) pool.free_.push_back(static_cast<int32_t>(p));
  return pool;
}

Status PackedPagePool::allocate(int64_t n, std::vector<int32_t>* pages) {
  if (n > num_free()) {
    return Status::out_of_pages("packed KV page pool exhausted: " + std::to_string(n) + " pages needed, " +
                                std::to_string(num_free()) + " of " + std::to_string(num_pages()) + " free");
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = free_.back();
    free_.pop_back();
    in_use_[p] = true;
    pages->push_back(p);
  }
  peak_ = std::max(peak_, num_pages() - num_free());
  return Status();
}

void PackedPagePool::release(std::span<const int32_t> pages) {
  for (int32_t p : pages) {
    VC_CHECK(p >= 0 && p < num_pages() && in_use_[p], "releasing a packed KV page that is not in use");
    in_use_[p] = false;
    free_.push_back(p);
  }
}

}  // namespace vericache
