#include "kv/sequence_kv.h"

#include <algorithm>
#include <string>

#include <ATen/ATen.h>

#include "kv/slot_copy.h"
#include "util/check.h"

namespace vericache {
namespace {

void add_slot(SlotList& list, const std::vector<int32_t>& table, int64_t page_size, int64_t slot, int64_t head) {
  list.add(table[slot / page_size], slot % page_size, head);
}

}  // namespace

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
  if (needed > pool.num_free(kind_)) {
    std::vector<int32_t> none;
    return pool.allocate(needed, &none, kind_);  // the pool's own OutOfPages message; takes nothing
  }
  for (size_t l = 0; l < tables_.size(); ++l) {
    const int64_t missing = spec.pages_for(lengths_[l] + n) - static_cast<int64_t>(tables_[l].size());
    if (missing > 0) VC_CHECK(pool.allocate(missing, &tables_[l], kind_).ok(), "reserve: pool refused counted pages");
  }
  return Status();
}

void SequenceKv::advance(int64_t n) {
  VC_CHECK(!compressed(), "advance: a compressed sequence needs the new tokens' positions");
  for (int64_t& len : lengths_) len += n;
}

void SequenceKv::advance(std::span<const int32_t> positions) {
  for (auto& layer : slot_positions_) {
    for (auto& head : layer) head.insert(head.end(), positions.begin(), positions.end());
  }
  for (int64_t& len : lengths_) len += static_cast<int64_t>(positions.size());
}

void SequenceKv::make_compressed(int64_t n_kv_heads) {
  if (compressed()) return;
  slot_positions_.resize(tables_.size());
  for (size_t l = 0; l < tables_.size(); ++l) {
    std::vector<int64_t> identity(lengths_[l]);
    for (int64_t s = 0; s < lengths_[l]; ++s) identity[s] = s;
    slot_positions_[l].assign(n_kv_heads, identity);
  }
}

void SequenceKv::keep_slots(PagePool& pool, int64_t layer, const std::vector<std::vector<int64_t>>& from_slots) {
  const int64_t ps = pool.spec().page_size, n_heads = static_cast<int64_t>(from_slots.size());
  const int64_t n = static_cast<int64_t>(from_slots[0].size());
  const std::vector<int32_t>& table = tables_[layer];
  SlotList from, to;
  for (int64_t h = 0; h < n_heads; ++h) {
    VC_CHECK(static_cast<int64_t>(from_slots[h].size()) == n, "keep_slots: heads keep different counts");
    std::vector<int64_t>& positions = slot_positions_[layer][h];
    for (int64_t j = 0; j < n; ++j) {
      const int64_t s = from_slots[h][j];
      VC_CHECK(s >= j && s < lengths_[layer], "keep_slots: slots must be increasing and held");
      add_slot(from, table, ps, s, h);
      add_slot(to, table, ps, j, h);
      positions[j] = positions[s];
    }
    positions.resize(n);
  }
  copy_slots(pool, from, pool, to);
  lengths_[layer] = n;
  const auto keep = static_cast<size_t>((n + ps - 1) / ps);
  if (tables_[layer].size() > keep) {
    pool.release(std::span<const int32_t>(tables_[layer]).subspan(keep));
    tables_[layer].resize(keep);
  }
}

void SequenceKv::compact(PagePool& pool, const std::vector<at::Tensor>& kept) {
  VC_CHECK(static_cast<int64_t>(kept.size()) == n_layers(), "compact: one kept tensor per layer");
  const int64_t n_heads = pool.spec().n_kv_heads;
  make_compressed(n_heads);
  for (int64_t l = 0; l < n_layers(); ++l) {
    const at::Tensor k = kept[l].to(at::kCPU).contiguous();
    const int64_t n = k.size(1);
    const int64_t* p = k.data_ptr<int64_t>();
    std::vector<std::vector<int64_t>> slots(n_heads, std::vector<int64_t>(n));
    for (int64_t h = 0; h < n_heads; ++h) {
      const std::vector<int64_t>& held = slot_positions_[l][h];
      for (int64_t j = 0; j < n; ++j) {
        const auto it = std::lower_bound(held.begin(), held.end(), p[h * n + j]);
        VC_CHECK(it != held.end() && *it == p[h * n + j], "compact: a kept position is not held");
        slots[h][j] = it - held.begin();
      }
    }
    keep_slots(pool, l, slots);
  }
}

Status SequenceKv::drop(PagePool& pool, int64_t layer, const at::Tensor& positions) {
  const int64_t n_heads = pool.spec().n_kv_heads;
  if (layer < 0 || layer >= n_layers()) {
    return Status::invalid_argument("drop: layer " + std::to_string(layer) + " outside [0, " + std::to_string(n_layers()) + ")");
  }
  if (!positions.defined() || positions.dim() != 2 || positions.scalar_type() != at::kLong ||
      positions.size(0) != n_heads) {
    return Status::invalid_argument("layer " + std::to_string(layer) + ": dropped positions must be an int64 tensor [" +
                                    std::to_string(n_heads) + ", n]");
  }
  const at::Tensor d = positions.to(at::kCPU).contiguous();
  const int64_t n = d.size(1);
  if (n == 0) return Status();
  const int64_t* p = d.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> slots(n_heads);
  std::vector<int64_t> identity;  // a full cache: slot s holds position s
  if (!compressed()) {
    identity.resize(lengths_[layer]);
    for (int64_t s = 0; s < lengths_[layer]; ++s) identity[s] = s;
  }
  for (int64_t h = 0; h < n_heads; ++h) {
    // Held positions are increasing (slots stay in position order), so one merge walk suffices.
    const std::vector<int64_t>& held = compressed() ? slot_positions_[layer][h] : identity;
    std::vector<int64_t> gone(p + h * n, p + (h + 1) * n);
    std::sort(gone.begin(), gone.end());
    size_t next = 0;
    for (size_t s = 0; s < held.size(); ++s) {
      if (next < gone.size() && held[s] == gone[next]) {
        ++next;
      } else {
        slots[h].push_back(static_cast<int64_t>(s));
      }
    }
    if (next < gone.size() || slots[h].size() + gone.size() != held.size()) {
      const int64_t bad = next < gone.size() ? gone[next] : gone.front();
      return Status::invalid_argument("layer " + std::to_string(layer) + ", KV head " + std::to_string(h) +
                                      ": cannot drop position " + std::to_string(bad) + ", which is not kept (or is dropped twice)");
    }
  }
  make_compressed(n_heads);
  keep_slots(pool, layer, slots);
  return Status();
}

void SequenceKv::truncate(PagePool& pool, int64_t length) {
  VC_CHECK(length >= 0, "truncate: negative length");
  truncate(pool, std::vector<int64_t>(tables_.size(), length));
}

void SequenceKv::truncate(PagePool& pool, const std::vector<int64_t>& lengths) {
  VC_CHECK(lengths.size() == tables_.size(), "truncate: one length per layer");
  for (int64_t len : lengths) VC_CHECK(len >= 0, "truncate: negative length");
  const int64_t page_size = pool.spec().page_size;
  for (size_t l = 0; l < tables_.size(); ++l) {
    lengths_[l] = std::min(lengths_[l], lengths[l]);
    if (compressed()) {
      for (auto& head : slot_positions_[l]) head.resize(lengths_[l]);
    }
    const auto keep = static_cast<size_t>((lengths_[l] + page_size - 1) / page_size);
    if (tables_[l].size() > keep) {
      pool.release(std::span<const int32_t>(tables_[l]).subspan(keep));
      tables_[l].resize(keep);
    }
  }
}

void SequenceKv::release(PagePool& pool) {
  VC_CHECK(packed_pages_held() == 0, "release: return the packed pages first (release_packed)");
  packed_.clear();
  for (auto& t : tables_) {
    pool.release(t);
    t.clear();
  }
  std::fill(lengths_.begin(), lengths_.end(), 0);
  slot_positions_.clear();
}

KvCacheView SequenceKv::view(PagePool& pool) const {
  const KvPageSpec& spec = pool.spec();
  KvCacheView v;
  v.layout = KvLayout{spec.n_layers, spec.n_kv_heads, spec.head_dim, spec.page_size};
  v.k_pages = pool.k_pages();
  v.v_pages = pool.v_pages();
  for (const auto& t : tables_) v.block_tables.emplace_back(t);
  v.lengths = lengths_;
  for (const auto& layer : slot_positions_) {
    at::Tensor p = at::empty({static_cast<int64_t>(layer.size()), layer.empty() ? 0 : static_cast<int64_t>(layer[0].size())}, at::kLong);
    for (size_t h = 0; h < layer.size(); ++h) std::copy(layer[h].begin(), layer[h].end(), p[h].data_ptr<int64_t>());
    v.positions.push_back(p);
  }
  return v;
}

void SequenceKv::truncate_positions(PagePool& pool, int64_t end) {
  if (!compressed()) {
    truncate(pool, std::max<int64_t>(end, 0));
    return;
  }
  std::vector<int64_t> lengths(lengths_);
  for (size_t l = 0; l < tables_.size(); ++l) {
    VC_CHECK(packed_length(l) == 0 || packed_[l].positions[0].back() < end,
             "truncate_positions: rolling back into packed slots");
    const auto& heads = slot_positions_[l];
    int64_t keep = lengths_[l];
    while (keep > 0 && heads[0][keep - 1] >= end) --keep;
    for (const auto& head : heads) {
      VC_CHECK((keep == 0 || head[keep - 1] < end) && (keep == lengths_[l] || head[keep] >= end),
               "truncate_positions: KV heads of a layer hold different tails");
    }
    lengths[l] = keep;
  }
  truncate(pool, lengths);
}

Status SequenceKv::append_range(PagePool& pool, const SequenceKv& src, const PagePool& src_pool, int64_t first,
                                int64_t count) {
  VC_CHECK(first >= 0 && count >= 0, "append_range: negative range");
  const int64_t n_heads = pool.spec().n_kv_heads, ps = pool.spec().page_size, src_ps = src_pool.spec().page_size;
  if (count == 0) return Status();
  for (int64_t l = 0; l < n_layers(); ++l) {
    VC_CHECK(first + count <= src.length(l), "append_range: slots past the source's length");
    VC_CHECK(compressed() || src.position(l, 0, first) == lengths_[l], "append_range: a full cache must continue where it ends");
  }
  VC_RETURN_IF_ERROR(reserve(pool, count));
  SlotList from, to;
  for (int64_t l = 0; l < n_layers(); ++l) {
    for (int64_t h = 0; h < n_heads; ++h) {
      for (int64_t j = 0; j < count; ++j) {
        add_slot(from, src.block_table(l), src_ps, first + j, h);
        add_slot(to, tables_[l], ps, lengths_[l] + j, h);
      }
    }
  }
  copy_slots(src_pool, from, pool, to);
  for (int64_t l = 0; l < n_layers(); ++l) {
    if (compressed()) {
      for (int64_t h = 0; h < n_heads; ++h) {
        for (int64_t j = 0; j < count; ++j) slot_positions_[l][h].push_back(src.position(l, h, first + j));
      }
    }
    lengths_[l] += count;
  }
  return Status();
}

Status SequenceKv::assign_kept(PagePool& pool, const SequenceKv& src, const PagePool& src_pool,
                               const std::vector<at::Tensor>& kept) {
  VC_CHECK(pages_held() == 0 && !compressed(), "assign_kept: the cache must be empty");
  VC_CHECK(!src.compressed(), "assign_kept: the source must be a full cache");
  VC_CHECK(static_cast<int64_t>(kept.size()) == n_layers(), "assign_kept: one kept tensor per layer");
  const KvPageSpec& spec = pool.spec();
  std::vector<at::Tensor> positions(kept.size());
  int64_t needed = 0;
  for (size_t l = 0; l < kept.size(); ++l) {
    positions[l] = kept[l].to(at::kCPU, at::kLong).contiguous();
    VC_CHECK(positions[l].dim() == 2 && positions[l].size(0) == spec.n_kv_heads, "assign_kept: kept is [n_kv_heads, n]");
    needed += spec.pages_for(positions[l].size(1));
  }
  if (needed > pool.num_free(kind_)) {
    std::vector<int32_t> none;
    return pool.allocate(needed, &none, kind_);
  }
  slot_positions_.assign(tables_.size(), std::vector<std::vector<int64_t>>(spec.n_kv_heads));
  SlotList from, to;
  for (size_t l = 0; l < kept.size(); ++l) {
    const int64_t n = positions[l].size(1);
    VC_CHECK(pool.allocate(spec.pages_for(n), &tables_[l], kind_).ok(), "assign_kept: pool refused counted pages");
    const int64_t* p = positions[l].data_ptr<int64_t>();
    for (int64_t h = 0; h < spec.n_kv_heads; ++h) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t position = p[h * n + j];
        VC_CHECK(position >= 0 && position < src.length(l) && (j == 0 || position > p[h * n + j - 1]),
                 "assign_kept: kept positions must be increasing and held");
        add_slot(from, src.block_table(l), src_pool.spec().page_size, position, h);
        add_slot(to, tables_[l], spec.page_size, j, h);
        slot_positions_[l][h].push_back(position);
      }
    }
    lengths_[l] = n;
  }
  copy_slots(src_pool, from, pool, to);
  return Status();
}

const std::vector<int32_t>& SequenceKv::packed_table(int64_t layer) const {
  static const std::vector<int32_t> kNone;
  return packed_.empty() ? kNone : packed_[layer].table;
}

at::Tensor SequenceKv::packed_positions(int64_t layer) const {
  if (packed_.empty()) return at::empty({0, 0}, at::kLong);
  const auto& heads = packed_[layer].positions;
  at::Tensor p = at::empty({static_cast<int64_t>(heads.size()), packed_[layer].length}, at::kLong);
  for (size_t h = 0; h < heads.size(); ++h) std::copy(heads[h].begin(), heads[h].end(), p[h].data_ptr<int64_t>());
  return p;
}

int64_t SequenceKv::packed_pages_held() const {
  int64_t n = 0;
  for (const PackedLayer& p : packed_) n += static_cast<int64_t>(p.table.size());
  return n;
}

void SequenceKv::move_front_to_packed(PagePool& pool, int64_t layer, std::span<const int32_t> packed_pages) {
  const int64_t ps = pool.spec().page_size, n_pages = static_cast<int64_t>(packed_pages.size());
  const int64_t n = n_pages * ps;
  VC_CHECK(compressed(), "move_front_to_packed: only a compressed sequence packs slots");
  VC_CHECK(n <= lengths_[layer], "move_front_to_packed: packing slots that are not held");
  if (packed_.empty()) {
    packed_.resize(tables_.size());
    for (PackedLayer& p : packed_) p.positions.resize(slot_positions_[0].size());
  }
  PackedLayer& p = packed_[layer];
  p.table.insert(p.table.end(), packed_pages.begin(), packed_pages.end());
  for (size_t h = 0; h < p.positions.size(); ++h) {
    std::vector<int64_t>& from = slot_positions_[layer][h];
    VC_CHECK(p.positions[h].empty() || from.empty() || p.positions[h].back() < from.front(),
             "move_front_to_packed: packed slots must precede the float slots in position order");
    p.positions[h].insert(p.positions[h].end(), from.begin(), from.begin() + n);
    from.erase(from.begin(), from.begin() + n);
  }
  p.length += n;
  pool.release(std::span<const int32_t>(tables_[layer]).first(n_pages));
  tables_[layer].erase(tables_[layer].begin(), tables_[layer].begin() + n_pages);
  lengths_[layer] -= n;
}

void SequenceKv::release_packed(PackedPagePool& packed) {
  for (PackedLayer& p : packed_) {
    packed.release(p.table);
    p = PackedLayer{{}, std::vector<std::vector<int64_t>>(p.positions.size()), 0};
  }
}

}  // namespace vericache
