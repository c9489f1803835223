// SequenceKv: one request's KV cache as block tables over a PagePool, one table per layer.
//
// Slot i of layer l lives in page block_table(l)[i / page_size] at offset i % page_size. Every
// layer has its own table and length, so a compressed cache may keep a different number of
// tokens per layer; the full cache keeps the same length everywhere.
//
// Life cycle of one forward: reserve(n) makes room for n slots in every layer (allocating pages),
// the model writes the new K/V at slots length(l) .. length(l)+n-1, then advance(n) commits them.
// truncate() is the explicit rollback: it keeps a prefix and frees whole pages past it.
//
// Ownership: a SequenceKv holds page ids, not storage; the caller must release() it into the same
// pool before the pool is destroyed (checked in debug use by the pool's in-use bits).
// Thread-safety: not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include <vericache/kv_view.h>
#include <vericache/status.h>

#include "kv/page_pool.h"

namespace vericache {

class SequenceKv {
 public:
  SequenceKv() = default;
  explicit SequenceKv(int64_t n_layers) : tables_(n_layers), lengths_(n_layers, 0) {}

  int64_t n_layers() const { return static_cast<int64_t>(tables_.size()); }
  int64_t length(int64_t layer) const { return lengths_[layer]; }
  const std::vector<int32_t>& block_table(int64_t layer) const { return tables_[layer]; }
  int64_t pages_held() const;

  // Pages reserve(n) would take from the pool.
  int64_t pages_needed(const KvPageSpec& spec, int64_t n) const;
  // Room for n more slots in every layer; all or nothing (OutOfPages leaves the sequence as it was).
  Status reserve(PagePool& pool, int64_t n);
  // Commits n reserved slots in every layer.
  void advance(int64_t n);
  // Keeps the first `length` slots of every layer (no-op for a layer already shorter) and
  // returns the pages past them to the pool.
  void truncate(PagePool& pool, int64_t length);
  // Returns every page to the pool; the sequence becomes empty.
  void release(PagePool& pool);

  // The pass-through view a plugin reads (see vericache/kv_view.h); borrows this and the pool.
  KvCacheView view(PagePool& pool) const;

 private:
  std::vector<std::vector<int32_t>> tables_;
  std::vector<int64_t> lengths_;
};

}  // namespace vericache
