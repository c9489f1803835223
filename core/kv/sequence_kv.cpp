#include "kv/sequence_kv.h"

#include <algorithm>
#include <string>

#include <ATen/ATen.h>
#include <ATen/TensorIndexing.h>

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
  namespace idx = at::indexing;
  const int64_t ps = pool.spec().page_size, n_heads = static_cast<int64_t>(from_slots.size());
  const int64_t n = static_cast<int64_t>(from_slots[0].size());
  const std::vector<int32_t>& table = tables_[layer];
  std::vector<int64_t> src_page, src_off, dst_page, dst_off, head;
  for (int64_t h = 0; h < n_heads; ++h) {
    VC_CHECK(static_cast<int64_t>(from_slots[h].size()) == n, "keep_slots: heads keep different counts");
    std::vector<int64_t>& positions = slot_positions_[layer][h];
    for (int64_t j = 0; j < n; ++j) {
      const int64_t s = from_slots[h][j];
      VC_CHECK(s >= j && s < lengths_[layer], "keep_slots: slots must be increasing and held");
      src_page.push_back(table[s / ps]);
      src_off.push_back(s % ps);
      dst_page.push_back(table[j / ps]);
      dst_off.push_back(j % ps);
      head.push_back(h);
      positions[j] = positions[s];
    }
    positions.resize(n);
  }
  if (n > 0) {
    const auto device = pool.k_pages().device();
    auto t = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).to(device); };
    const at::Tensor sp = t(src_page), so = t(src_off), dp = t(dst_page), dof = t(dst_off), hh = t(head);
    // Gathered into new tensors first, so moving a slot onto one not yet read is safe.
    const at::Tensor k = pool.k_pages().index({sp, hh, idx::Slice(), so});
    const at::Tensor v = pool.v_pages().index({sp, hh, so, idx::Slice()});
    pool.k_pages().index_put_({dp, hh, idx::Slice(), dof}, k);
    pool.v_pages().index_put_({dp, hh, dof, idx::Slice()}, v);
  }
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

}  // namespace vericache
