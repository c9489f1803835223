#include "engine/compressor_feed.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "engine/compression.h"

namespace vericache {

bool feeds_decode_rows(const Compressor* compressor) {
  return compressor != nullptr && compressor->mode() == CompressionMode::kOnline &&
         compressor->decode_rows() == DecodeRows::kObserved;
}

Status update_for_request(Compressor& compressor, const LayerActivations& all, int64_t begin, int64_t n,
                          int64_t request_id, double ratio, int64_t cache_length, std::vector<LayerDrops>* drops) {
  const int64_t offsets[2] = {0, n};
  LayerActivations acts;
  acts.layer = all.layer;
  acts.residual = all.residual.narrow(0, begin, n);
  acts.hidden = all.hidden.narrow(0, begin, n);
  acts.q = all.q.narrow(0, begin, n);
  acts.k = all.k.narrow(0, begin, n);
  acts.v = all.v.narrow(0, begin, n);
  acts.positions = all.positions.narrow(0, begin, n);
  acts.row_offsets = std::span<const int64_t>(offsets, 2);
  acts.request_ids = std::span<const int64_t>(&request_id, 1);
  acts.ratios = std::span<const double>(&ratio, 1);
  acts.cache_lengths = std::span<const int64_t>(&cache_length, 1);
  const size_t before = drops->size();
  VC_RETURN_IF_ERROR(compressor.update(acts, drops));
  for (size_t i = before; i < drops->size(); ++i) (*drops)[i].layer = all.layer;
  return Status();
}

Status record_prefill_drops(const std::string& compressor, std::span<const LayerDrops> drops, int64_t request_id,
                            int64_t layer, int64_t held, int64_t n_layers, int64_t n_kv_heads,
                            DroppedPositions* dropped) {
  const std::string where = compressor + ": layer " + std::to_string(layer) + ": ";
  for (const LayerDrops& d : drops) {
    if (d.request_id != request_id || !d.positions.defined() || d.positions.dim() != 2 ||
        d.positions.size(0) != n_kv_heads || d.positions.scalar_type() != at::kLong) {
      return Status::plugin_error(where + "drops must be an int64 tensor [" + std::to_string(n_kv_heads) +
                                  ", n] for this request");
    }
    if (dropped->empty()) dropped->assign(n_layers, std::vector<std::vector<int64_t>>(n_kv_heads));
    const at::Tensor p = d.positions.to(at::kCPU).contiguous();
    const int64_t* data = p.data_ptr<int64_t>();
    for (int64_t h = 0; h < n_kv_heads; ++h) {
      for (int64_t j = 0; j < p.size(1); ++j) {
        const int64_t position = data[h * p.size(1) + j];
        if (position < 0 || position >= held) {
          return Status::plugin_error(where + "dropped position " + std::to_string(position) + " is not held");
        }
        (*dropped)[layer][h].push_back(position);
      }
    }
  }
  return Status();
}

Result<std::vector<at::Tensor>> kept_after_drops(const std::string& compressor, const DroppedPositions& dropped,
                                                 int64_t n, int64_t n_layers, int64_t n_kv_heads) {
  std::vector<at::Tensor> kept(n_layers);
  for (int64_t l = 0; l < n_layers; ++l) {
    std::vector<std::vector<int64_t>> heads(n_kv_heads);
    for (int64_t h = 0; h < n_kv_heads; ++h) {
      std::vector<bool> gone(n, false);
      if (!dropped.empty()) {
        for (int64_t p : dropped[l][h]) gone[p] = true;
      }
      for (int64_t p = 0; p < n; ++p) {
        if (!gone[p]) heads[h].push_back(p);
      }
      if (heads[h].size() != heads[0].size()) {
        return Status::plugin_error(compressor + ": layer " + std::to_string(l) + ": KV heads kept different counts");
      }
    }
    kept[l] = at::empty({n_kv_heads, static_cast<int64_t>(heads[0].size())}, at::kLong);
    for (int64_t h = 0; h < n_kv_heads; ++h) std::copy(heads[h].begin(), heads[h].end(), kept[l][h].data_ptr<int64_t>());
  }
  return kept;
}

Status feed_committed_rows(Compressor& compressor, std::span<const WindowRows> window_rows, int64_t committed_rows,
                           int64_t request_id, double ratio, SequenceKv& comp, PagePool& pool) {
  std::vector<LayerDrops> drops;
  for (size_t l = 0; l < window_rows.size(); ++l) {
    const WindowRows& w = window_rows[l];
    LayerActivations all;
    all.layer = static_cast<int64_t>(l);
    all.residual = w.residual;
    all.hidden = w.hidden;
    all.q = w.q;
    all.k = w.k;
    all.v = w.v;
    all.positions = w.positions;
    // The committed rows are KV_comp's last `committed_rows` slots of this layer.
    const int64_t cache_length = comp.total_length(static_cast<int64_t>(l)) - committed_rows;
    VC_RETURN_IF_ERROR(update_for_request(compressor, all, 0, committed_rows, request_id, ratio, cache_length, &drops));
  }
  return apply_request_drops(compressor, drops, request_id, comp, pool);
}

Status apply_request_drops(const Compressor& compressor, const std::vector<LayerDrops>& drops, int64_t request_id,
                           SequenceKv& comp, PagePool& pool) {
  return apply_drops(compressor.name(), pool, [&](int64_t id) { return id == request_id ? &comp : nullptr; }, drops);
}

}  // namespace vericache
