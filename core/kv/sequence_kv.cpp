#include "kv/sequence_kv.h"

#include <algorithm>

#include "util/check.h"

namespace vericache {

int64_t SequenceKv::pages_held() const {
  int64_t n = 0;
  for (const auto& t : tables_) n += static_cast<int64_t>(t.size());
  return n;
}

int64_t SequenceKv::pages_needed(const KvPageSpec& spec, int64_t n) const {
  int64_t needed = 0;
  for (size_t l = 0; l < tables_.size(); ++l) {
    needed += std::max<int64_t>(0, spec.pages_for(lengths_[l] + n) - static_cast<int64_t>(tables_[l].size()));
  }
  return needed;
}

Status SequenceKv::reserve(PagePool& pool, int64_t n) {
  VC_CHECK(n >= 0, "reserve: negative slot count");
  const KvPageSpec& spec = pool.spec();
  VC_CHECK(spec.n_layers == n_layers(), "reserve: pool and sequence disagree on the layer count");
  const int64_t needed = pages_needed(spec, n);
  if (needed > pool.num_free()) {
    return Status::out_of_pages("KV page pool exhausted: " + std::to_string(needed) + " pages needed, " +
                                std::to_string(pool.num_free()) + " of " + std::to_string(pool.num_pages()) + " free");
  }
  for (size_t l = 0; l < tables_.size(); ++l) {
    const int64_t missing = spec.pages_for(lengths_[l] + n) - static_cast<int64_t>(tables_[l].size());
    if (missing > 0) VC_CHECK(pool.allocate(missing, &tables_[l]).ok(), "reserve: pool refused counted pages");
  }
  return Status();
}

void SequenceKv::advance(int64_t n) {
  for (int64_t& len : lengths_) len += n;
}

void SequenceKv::truncate(PagePool& pool, int64_t length) {
  VC_CHECK(length >= 0, "truncate: negative length");
  const int64_t page_size = pool.spec().page_size;
  for (size_t l = 0; l < tables_.size(); ++l) {
    lengths_[l] = std::min(lengths_[l], length);
    const auto keep = static_cast<size_t>((lengths_[l] + page_size - 1) / page_size);
    if (tables_[l].size() > keep) {
      pool.release(std::span<const int32_t>(tables_[l]).subspan(keep));
      tables_[l].resize(keep);
    }
  }
}

void SequenceKv::release(PagePool& pool) {
  for (auto& t : tables_) {
    pool.release(t);
    t.clear();
  }
  std::fill(lengths_.begin(), lengths_.end(), 0);
}

KvCacheView SequenceKv::view(PagePool& pool) const {
  const KvPageSpec& spec = pool.spec();
  KvCacheView v;
  v.layout = KvLayout{spec.n_layers, spec.n_kv_heads, spec.head_dim, spec.page_size};
  v.k_pages = pool.k_pages();
  v.v_pages = pool.v_pages();
  for (const auto& t : tables_) v.block_tables.emplace_back(t);
  v.lengths = lengths_;
  return v;
}

}  // namespace vericache
