#include "engine/compression.h"

#include <string>

#include "engine/compressed_kv_check.h"
#include "engine/model_access.h"

namespace vericache {

LayerObserver compression_observer(Compressor& compressor, std::span<const double> ratios, std::vector<LayerDrops>* drops) {
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

Status compress_offline(const LlamaModel& model, PagePool& pool, Compressor& compressor, double ratio,
                        std::span<const int32_t> prompt, int64_t request_id, SequenceKv& kv, CompressedKV* compressed) {
  CompressedKV local;
  CompressedKV& out = compressed != nullptr ? *compressed : local;
  LlamaModelAccess access(model, pool, kv, prompt, request_id);
  VC_RETURN_IF_ERROR(compressor.compress(kv.view(pool), ratio, access, &out));
  const KvCacheView view = kv.view(pool);
  VC_RETURN_IF_ERROR(check_compressed_kv(compressor.name(), out, view.layout, view.lengths));
  kv.compact(pool, out.kept);
  return Status();
}

}  // namespace vericache
