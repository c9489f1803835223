#include "engine/compression.h"

#include <ATen/ATen.h>

#include <chrono>
#include <numeric>
#include <string>

#include "engine/compressed_kv_check.h"
#include "engine/model_access.h"

namespace vericache {

LayerObserver compression_observer(Compressor& compressor, std::span<const double> ratios,
                                   std::vector<LayerDrops>* drops) {
  return [&compressor, ratios, drops](const LayerActivations& acts) {
    LayerActivations with_ratios = acts;
    with_ratios.ratios = ratios;
    const size_t before = drops->size();
    VC_RETURN_IF_ERROR(compressor.update(with_ratios, drops));
    for (size_t i = before; i < drops->size(); ++i) (*drops)[i].layer = acts.layer;
    return Status();
  };
}

Status apply_drops(const std::string& compressor, PagePool& pool, const std::function<SequenceKv*(int64_t)>& cache_of,
                   const std::vector<LayerDrops>& drops) {
  for (const LayerDrops& d : drops) {
    SequenceKv* cache = cache_of(d.request_id);
    if (cache == nullptr) {
      return Status::invalid_argument(compressor + ": drops for unknown request " + std::to_string(d.request_id));
    }
    if (Status s = cache->drop(pool, d.layer, d.positions); !s.ok()) {
      return Status::invalid_argument(compressor + ": " + s.message());
    }
  }
  return Status();
}

Status apply_drops(const std::string& compressor, PagePool& pool, std::span<SequenceKv* const> caches,
                   const std::vector<LayerDrops>& drops) {
  return apply_drops(
      compressor, pool,
      [caches](int64_t id) { return id >= 0 && id < static_cast<int64_t>(caches.size()) ? caches[id] : nullptr; },
      drops);
}

Status forward_with_compressor(const LlamaModel& model, std::span<const ForwardItem> batch, PagePool& pool,
                               at::Tensor* logits, Compressor& compressor, std::span<const double> ratios,
                               std::span<SequenceKv* const> caches) {
  if (compressor.family() == CompressorFamily::kQuantization) {
    return Status::not_supported(compressor.name() + ": a quantizer's forward must pack its pages (forward_with_quantizer)");
  }
  std::vector<LayerDrops> drops;
  VC_RETURN_IF_ERROR(model.forward(batch, logits, compression_observer(compressor, ratios, &drops)));
  return apply_drops(compressor.name(), pool, caches, drops);
}

Status forward_with_quantizer(const LlamaModel& model, std::span<const ForwardItem> batch, PagePool& pool,
                              at::Tensor* logits, Compressor& quantizer, const PackedFormat& format,
                              PackedPagePool& packed, bool observe) {
  std::vector<LayerDrops> drops;
  const std::vector<double> ratios(batch.size(), 1.0);  // a quantizer keeps every token
  VC_RETURN_IF_ERROR(model.forward(batch, logits, observe ? compression_observer(quantizer, ratios, &drops) : LayerObserver()));
  if (!drops.empty()) return Status::plugin_error(quantizer.name() + ": a quantizer returned drops; it must keep every token");
  for (const ForwardItem& item : batch) {
    VC_RETURN_IF_ERROR(pack_front(quantizer, format, pool, packed, *item.kv, item.request_id));
  }
  return Status();
}

int64_t resident_kv_bytes(const SequenceKv& kv, const PagePool& pool, const PackedFormat* format) {
  const int64_t page_size = pool.spec().page_size;
  int64_t bytes = 0;
  for (int64_t l = 0; l < kv.n_layers(); ++l) {
    bytes += kv.length(l) * (pool.page_bytes() / page_size);
    if (format != nullptr) bytes += kv.packed_length(l) * (format->bytes_per_page / page_size);
  }
  return bytes;
}

Status compress_offline(const LlamaModel& model, PagePool& pool, Compressor& compressor, double ratio,
                        std::span<const int32_t> prompt, int64_t request_id, SequenceKv& kv, CompressedKV* compressed) {
  CompressedKV local;
  CompressedKV& out = compressed != nullptr ? *compressed : local;
  VC_RETURN_IF_ERROR(compute_kept(model, pool, compressor, ratio, prompt, request_id, kv, &out));
  kv.compact(pool, out.kept);
  return Status();
}

Status compute_kept(const LlamaModel& model, PagePool& pool, Compressor& compressor, double ratio,
                    std::span<const int32_t> prompt, int64_t request_id, SequenceKv& kv, CompressedKV* out) {
  LlamaModelAccess access(model, pool, kv, prompt, request_id);
  const KvCacheView view = kv.view(pool);
  VC_RETURN_IF_ERROR(compressor.compress(view, ratio, access, out));
  return check_compressed_kv(compressor.name(), *out, view.layout, view.lengths);
}

Status prefill_and_compress(const LlamaModel& model, PagePool& pool, Compressor& compressor, double ratio,
                            std::span<const int32_t> prompt, int64_t request_id, SequenceKv& kv,
                            CompressedKV* compressed, CompressionTimes* times) {
  CompressionTimes local;
  CompressionTimes& t = times != nullptr ? *times : local;
  std::vector<int32_t> positions(prompt.size());
  std::iota(positions.begin(), positions.end(), 0);
  ForwardItem item{prompt, positions, &kv, &pool, LogitRows::kNone, request_id};
  at::Tensor logits;
  const std::vector<double> ratios{ratio};
  // Drops name their cache by request id: only this one is known here.
  std::vector<SequenceKv*> caches(request_id + 1, nullptr);
  caches[request_id] = &kv;
  auto start = std::chrono::steady_clock::now();
  VC_RETURN_IF_ERROR(forward_with_compressor(model, std::span(&item, 1), pool, &logits, compressor, ratios, caches));
  t.prefill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (compressor.mode() == CompressionMode::kOffline) {
    start = std::chrono::steady_clock::now();
    VC_RETURN_IF_ERROR(compress_offline(model, pool, compressor, ratio, prompt, request_id, kv, compressed));
    t.compress_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return Status();
}

Result<PackedFormat> checked_packed_format(Compressor& compressor, const KvPageSpec& spec) {
  VC_ASSIGN_OR_RETURN(const PackedFormat f, compressor.packed_format(
                                                KvLayout{spec.n_layers, spec.n_kv_heads, spec.head_dim, spec.page_size}));
  const std::string who = compressor.name() + ": packed format: ";
  if (f.bit_scheme != 2 && f.bit_scheme != 3 && f.bit_scheme != 4 && f.bit_scheme != 8) {
    return Status::plugin_error(who + "bit_scheme must be 2, 3, 4 or 8, got " + std::to_string(f.bit_scheme));
  }
  if (f.bytes_per_page < 1) return Status::plugin_error(who + "bytes_per_page must be positive");
  if (f.flush_slots < spec.page_size || f.flush_slots % spec.page_size != 0) {
    return Status::plugin_error(who + "flush_slots (" + std::to_string(f.flush_slots) +
                                ") must be a positive multiple of the page size " + std::to_string(spec.page_size));
  }
  if (f.layout == PackedLayout::kMinMaxGroups) {
    const MinMaxGroupsLayout layout{spec.page_size, spec.n_kv_heads, spec.head_dim, f.key_group, f.value_group, f.bit_scheme};
    if (const std::string why = layout.violation(); !why.empty()) return Status::plugin_error(who + "min-max-groups layout: " + why);
    if (f.bytes_per_page != layout.bytes()) {
      return Status::plugin_error(who + "the min-max-groups layout has " + std::to_string(layout.bytes()) +
                                  " bytes per page, the format says " + std::to_string(f.bytes_per_page));
    }
  } else if (f.layout != PackedLayout::kOpaque) {
    return Status::plugin_error(who + "unknown layout " + std::to_string(static_cast<uint32_t>(f.layout)));
  }
  return f;
}

Status pack_front(Compressor& compressor, const PackedFormat& format, PagePool& pool, PackedPagePool& packed,
                  SequenceKv& kv, int64_t request_id) {
  const int64_t ps = pool.spec().page_size;
  kv.make_compressed(pool.spec().n_kv_heads);  // packed slots keep their positions
  for (int64_t l = 0; l < kv.n_layers(); ++l) {
    const int64_t n = kv.length(l) / format.flush_slots * format.flush_slots;
    if (n == 0) continue;
    const int64_t n_pages = n / ps;
    const std::vector<int32_t>& table = kv.block_table(l);
    const at::Tensor ids = at::tensor(std::vector<int64_t>(table.begin(), table.begin() + n_pages), at::kLong);
    // pack() reads float32 (a bfloat16 pool's values widen exactly).
    const at::Tensor k = pool.k_pages().index_select(0, ids).to(at::kFloat).contiguous();
    const at::Tensor v = pool.v_pages().index_select(0, ids).to(at::kFloat).contiguous();
    at::Tensor positions = at::empty({pool.spec().n_kv_heads, n}, at::kLong);
    for (int64_t h = 0; h < pool.spec().n_kv_heads; ++h) {
      const std::vector<int64_t>& p = kv.slot_positions(l, h);
      std::copy(p.begin(), p.begin() + n, positions[h].data_ptr<int64_t>());
    }
    std::vector<int32_t> pages;
    VC_RETURN_IF_ERROR(packed.allocate(n_pages, &pages));
    PackedPages dest{packed.storage(), pages, positions, request_id};
    if (Status s = compressor.pack(l, k, v, dest); !s.ok()) {
      packed.release(pages);
      return s;
    }
    kv.move_front_to_packed(pool, l, pages);
  }
  return Status();
}

}  // namespace vericache
