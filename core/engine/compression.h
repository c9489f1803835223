// Running a compressor inside the engine: the layer observer that feeds update(), applying the
// drops it returns, and the offline step (compress, check against the contract, compact pages).
//
// Ownership: everything is borrowed for the call. Thread-safety: the engine thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <vericache/compressor.h>

#include "kv/packed_page_pool.h"
#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "model/llama_model.h"

namespace vericache {

// An observer that hands every layer of a forward to `compressor.update()`, telling it each
// request's kept fraction (`ratios`, indexed like the forward's batch), and collects its drops.
LayerObserver compression_observer(Compressor& compressor, std::span<const double> ratios, std::vector<LayerDrops>* drops);

// Applies `drops` to the caches, in order; `cache_of(request_id)` is that request's cache, or
// nullptr for a request the caller does not run. A drop for an unknown request or of a position not
// kept is InvalidArgument naming the compressor; the drops before it stay applied.
Status apply_drops(const std::string& compressor, PagePool& pool, const std::function<SequenceKv*(int64_t)>& cache_of,
                   const std::vector<LayerDrops>& drops);
// The same with `caches[request_id]` the cache of that request.
Status apply_drops(const std::string& compressor, PagePool& pool, std::span<SequenceKv* const> caches,
                   const std::vector<LayerDrops>& drops);

// One forward of `batch` with every layer handed to `compressor` (compression_observer) and the
// drops it returns applied (apply_drops) once the forward is committed. NotSupported for a
// quantizer (its pages must be packed: forward_with_quantizer).
Status forward_with_compressor(const LlamaModel& model, std::span<const ForwardItem> batch, PagePool& pool,
                               at::Tensor* logits, Compressor& compressor, std::span<const double> ratios,
                               std::span<SequenceKv* const> caches);

// An offline compressor's kept set for one request's full cache at kept fraction `ratio`:
// compress(), then check_compressed_kv(). The cache is left as it was (no compaction); the
// compressor's per-request state is kept (call release() when done with the request).
Status compute_kept(const LlamaModel& model, PagePool& pool, Compressor& compressor, double ratio,
                    std::span<const int32_t> prompt, int64_t request_id, SequenceKv& kv, CompressedKV* out);

// Offline compression of one request right after its prefill: compress() on the full cache at
// kept fraction `ratio`, check_compressed_kv(), then compact the kept slots into pages and free
// the rest. On failure the cache is left full and usable.
Status compress_offline(const LlamaModel& model, PagePool& pool, Compressor& compressor, double ratio,
                        std::span<const int32_t> prompt, int64_t request_id, SequenceKv& kv,
                        CompressedKV* compressed = nullptr);

// A quantizer's packed page for KV pages of `spec` (Compressor::packed_format), checked against the
// contract: bit_scheme 2, 3, 4 or 8, bytes_per_page > 0, flush_slots a positive multiple of the page
// size, a known layout (a standard one's requirements met and its byte count matching). Errors
// name the compressor.
Result<PackedFormat> checked_packed_format(Compressor& compressor, const KvPageSpec& spec);

// Quantizers: in every layer of `kv` (a compressed cache in `pool`), packs the leading float slots
// in whole blocks of format.flush_slots through compressor.pack() into new pages of `packed`, then
// frees their float pages (SequenceKv::move_front_to_packed). Call it only when every float slot is
// committed (no drafts). On failure (the compressor's, or OutOfPages from `packed`) the failing
// layer is left as it was and earlier layers stay packed: the cache stays valid. `request_id` is
// the id the compressor saw this request's activations under (PackedPages::request_id).
Status pack_front(Compressor& compressor, const PackedFormat& format, PagePool& pool, PackedPagePool& packed,
                  SequenceKv& kv, int64_t request_id);

// A quantizer's forward outside the engine: `batch`, whose items read their packed slots from
// `packed` through `quantizer` (ForwardItem::packed_pool, unpacker), with every layer handed to
// quantizer.update() when `observe` (a quantizer that returns drops is a PluginError), then each
// item's committed whole blocks packed (pack_front under the item's request id).
Status forward_with_quantizer(const LlamaModel& model, std::span<const ForwardItem> batch, PagePool& pool,
                              at::Tensor* logits, Compressor& quantizer, const PackedFormat& format,
                              PackedPagePool& packed, bool observe);

// The bytes `kv` holds: its float slots at `pool`'s bytes per slot and, with a quantizer's
// `format` (may be null), its packed slots at the packed page's bytes per slot.
int64_t resident_kv_bytes(const SequenceKv& kv, const PagePool& pool, const PackedFormat* format);

// A quantizer's packing for a cache outside the engine (the engine keeps its own): the compressor,
// its checked packed format and the pool that receives the packed pages. Borrowed.
struct Packing {
  Compressor* quantizer = nullptr;
  PackedFormat format;
  PackedPagePool* pool = nullptr;
  int64_t request_id = 0;  // as the compressor saw the prompt's activations
};

struct CompressionTimes {
  double prefill_seconds = 0;   // the prefill forward, the compressor's update() work included
  double compress_seconds = 0;  // compress_offline(); 0 for an online compressor
};
// One request from an empty `kv`: prefills `prompt` in one forward (positions 0..n-1) with every
// layer reported to the compressor and its drops applied, then compress_offline() for an offline
// compressor. `compressed` and `times` are optional outputs.
Status prefill_and_compress(const LlamaModel& model, PagePool& pool, Compressor& compressor, double ratio,
                            std::span<const int32_t> prompt, int64_t request_id, SequenceKv& kv,
                            CompressedKV* compressed = nullptr, CompressionTimes* times = nullptr);

}  // namespace vericache
