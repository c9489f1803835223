#include "engine/compression.h"

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

Status apply_drops(const std::string& compressor, PagePool& pool, std::span<SequenceKv* const> caches,
                   const std::vector<LayerDrops>& drops) {
  for (const LayerDrops& d : drops) {
    if (d.request_id < 0 || d.request_id >= static_cast<int64_t>(caches.size()) || caches[d.request_id] == nullptr) {
      return Status::invalid_argument(compressor + ": drops for unknown request " + std::to_string(d.request_id));
    }
    if (Status s = caches[d.request_id]->drop(pool, d.layer, d.positions); !s.ok()) {
      return Status::invalid_argument(compressor + ": " + s.message());
    }
  }
  return Status();
}

Status forward_with_compressor(const LlamaModel& model, std::span<const ForwardItem> batch, PagePool& pool,
                               at::Tensor* logits, Compressor& compressor, std::span<const double> ratios,
                               std::span<SequenceKv* const> caches) {
  std::vector<LayerDrops> drops;
  VC_RETURN_IF_ERROR(model.forward(batch, logits, compression_observer(compressor, ratios, &drops)));
  return apply_drops(compressor.name(), pool, caches, drops);
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

}  // namespace vericache
