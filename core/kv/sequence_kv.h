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
// Compression: compact() keeps, per (layer, KV head), only the slots of the kept positions, moved
// to the front in position order, and frees the pages past the new length (resident bytes really
// shrink); drop() removes positions one layer at a time (online compressors). From then on the
// sequence is "compressed": each slot records its original position per KV head, new tokens are
// appended with the positions the forward ran them at (the uncompressed length onwards).
//
// Quantization: a quantizer's cache keeps its oldest slots of each layer packed, in pages of a
// PackedPagePool, ahead of its float slots. move_front_to_packed() hands a whole number of leading
// float pages over to packed pages the caller has filled (engine/compression.h: pack_front). Every
// float-slot call here (length, block_table, truncate, positions, ...) counts float slots only;
// total_length() counts both. Packed slots are committed tokens: rollback never reaches them.
//
// Copies between caches (append_range, assign_kept) may cross pools and devices: they build the
// compressed cache from the full one after prefill, and carry verified K/V from the full cache
// into the compressed one after a verify window.
//
// Ownership: a SequenceKv holds page ids, not storage; the caller must release() it into the same
// pool before the pool is destroyed (checked in debug use by the pool's in-use bits).
// Thread-safety: not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <ATen/core/Tensor.h>

#include <vericache/kv_view.h>
#include <vericache/status.h>

#include "kv/packed_page_pool.h"
#include "kv/page_pool.h"

namespace vericache {

class SequenceKv {
 public:
  SequenceKv() = default;
  // A cache whose pages come from `kind` pages of its pool.
  explicit SequenceKv(int64_t n_layers, PageKind kind = PageKind::kResident)
      : tables_(n_layers), lengths_(n_layers, 0), kind_(kind) {}

  PageKind page_kind() const { return kind_; }
  int64_t n_layers() const { return static_cast<int64_t>(tables_.size()); }
  int64_t length(int64_t layer) const { return lengths_[layer]; }
  const std::vector<int32_t>& block_table(int64_t layer) const { return tables_[layer]; }
  int64_t pages_held() const;

  // Pages reserve(n) would take from the pool.
  int64_t pages_needed(const KvPageSpec& spec, int64_t n) const;
  // Room for n more slots in every layer; all or nothing (OutOfPages leaves the sequence as it was).
  Status reserve(PagePool& pool, int64_t n);
  // Commits n reserved slots in every layer. A compressed sequence needs the tokens' positions.
  void advance(int64_t n);
  void advance(std::span<const int32_t> positions);
  // Keeps the first `length` slots of every layer (no-op for a layer already shorter) and
  // returns the pages past them to the pool.
  void truncate(PagePool& pool, int64_t length);
  // The same with a length per layer (a compressed sequence's layers differ).
  void truncate(PagePool& pool, const std::vector<int64_t>& lengths);
  const std::vector<int64_t>& lengths() const { return lengths_; }
  // Returns every page to the pool; the sequence becomes empty.
  void release(PagePool& pool);

  // Original position of slot `slot` of `layer` for KV head `head` (the slot itself in a full cache).
  int64_t position(int64_t layer, int64_t head, int64_t slot) const {
    return compressed() ? slot_positions_[layer][head][slot] : slot;
  }
  // Rollback by position: removes, in every layer, the slots at the end holding positions >= `end`
  // (tokens appended after the kept set, e.g. rejected drafts) and frees emptied pages. Every head
  // of a layer must hold the same tail (checked: a violation is a bug).
  void truncate_positions(PagePool& pool, int64_t end);
  // Appends slots [first, first + count) of every layer of `src` (in `src_pool`, any device) to this
  // cache in `pool`, with their positions. A full cache may only continue where it ends
  // (src position first == length, checked). OutOfPages (nothing changed) when `pool` lacks room.
  Status append_range(PagePool& pool, const SequenceKv& src, const PagePool& src_pool, int64_t first, int64_t count);
  // Fills this empty cache with the kept positions of the full cache `src`: in every layer l and
  // KV head h the K/V of positions kept[l][h, :] (int64 [n_kv_heads, n_kept(l)], rows strictly
  // increasing, below src's length: check with check_compressed_kv first). The cache becomes
  // compressed. OutOfPages (nothing changed) when `pool` lacks room.
  Status assign_kept(PagePool& pool, const SequenceKv& src, const PagePool& src_pool, const std::vector<at::Tensor>& kept);
  // Whether slots carry their own positions (after compact(), drop() or make_compressed()).
  bool compressed() const { return !slot_positions_.empty(); }
  // Makes a full cache's slots carry their positions (each slot its own index), as packing needs;
  // nothing moves. A no-op on a compressed cache.
  void make_compressed(int64_t n_kv_heads);
  // Original position of every slot of `layer` for KV head `head` (length(layer) entries).
  // Only for a compressed sequence.
  const std::vector<int64_t>& slot_positions(int64_t layer, int64_t head) const {
    return slot_positions_[layer][head];
  }
  // Keeps, in every layer l and KV head h, exactly the positions kept[l][h, :] (int64
  // [n_kv_heads, n_kept(l)], each row strictly increasing, every position currently held; check
  // with check_compressed_kv first — a violation here is a bug). Frees the pages past the new length.
  void compact(PagePool& pool, const std::vector<at::Tensor>& kept);
  // Removes `positions` (int64 [n_kv_heads, n], the same count for every head) from `layer` and
  // frees emptied pages. InvalidArgument names a position the head does not hold (or holds twice).
  Status drop(PagePool& pool, int64_t layer, const at::Tensor& positions);

  // The pass-through view a plugin reads (see vericache/kv_view.h); borrows this and the pool.
  // Float slots only.
  KvCacheView view(PagePool& pool) const;

  // Packed slots of `layer` (they precede its float slots), their pages and original positions.
  int64_t packed_length(int64_t layer) const { return packed_.empty() ? 0 : packed_[layer].length; }
  const std::vector<int32_t>& packed_table(int64_t layer) const;
  at::Tensor packed_positions(int64_t layer) const;  // int64 [n_kv_heads, packed_length(layer)]
  int64_t total_length(int64_t layer) const { return packed_length(layer) + length(layer); }
  int64_t packed_pages_held() const;
  // Moves the first `packed_pages.size()` float pages of `layer` (whole pages of held slots of a
  // compressed sequence) to the end of the packed part: `packed_pages` (filled by the caller with
  // those slots, in order) join the packed table with the slots' positions, the float pages return
  // to `pool` and the remaining float slots move to the front (whole pages: nothing is copied).
  void move_front_to_packed(PagePool& pool, int64_t layer, std::span<const int32_t> packed_pages);
  // Returns every packed page to `packed`; release() checks this was done first.
  void release_packed(PackedPagePool& packed);

 private:
  std::vector<std::vector<int32_t>> tables_;
  std::vector<int64_t> lengths_;
  // Compressed only: [n_layers][n_kv_heads][slot] original position; empty for a full cache.
  std::vector<std::vector<std::vector<int64_t>>> slot_positions_;
  PageKind kind_ = PageKind::kResident;
  struct PackedLayer {
    std::vector<int32_t> table;                   // packed pages in slot order
    std::vector<std::vector<int64_t>> positions;  // [n_kv_heads][slot]
    int64_t length = 0;
  };
  std::vector<PackedLayer> packed_;  // [n_layers] once a layer is packed; empty before

  // Moves slot from_slots[h][j] to slot j for every head h of `layer`, sets the layer's length to
  // the per-head count and frees the pages past it.
  void keep_slots(PagePool& pool, int64_t layer, const std::vector<std::vector<int64_t>>& from_slots);
};

}  // namespace vericache
