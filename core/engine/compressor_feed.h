// What DraftVerifyEngine hands a compressor and what it does with the answers: one request's rows
// of a forward through update() (the contract's single-request view), the drops an online
// compressor returns at prefill (recorded, then turned into the kept set that builds KV_comp), and
// after a verify window the committed rows through update() with the drops applied to KV_comp
// (through compression.h's apply_drops, the one drop-applying path).
//
// Shapes: LayerActivations as in vericache/compressor.h; kept sets int64 [n_kv_heads, kept] per
// layer, positions ascending. Failures are the plugin's (PluginError or apply_drops' error, naming
// the compressor): the engine then runs the request on KV_full alone.
// Ownership: everything is borrowed for the call. Thread-safety: the engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <vericache/compressor.h>
#include <vericache/status.h>

#include "engine/engine_request.h"
#include "kv/page_pool.h"
#include "kv/sequence_kv.h"

namespace vericache {

// Whether decode forwards' rows go to `compressor`'s update(): online, and it declared
// DecodeRows::kObserved. False for nullptr.
bool feeds_decode_rows(const Compressor* compressor);

// Hands rows [begin, begin + n) of `all` (a forward's layer) to compressor.update() as one request:
// `request_id`, kept fraction `ratio`, `cache_length` slots in the layer before these rows. The
// drops it returns are appended to *drops with their layer set.
Status update_for_request(Compressor& compressor, const LayerActivations& all, int64_t begin, int64_t n,
                          int64_t request_id, double ratio, int64_t cache_length, std::vector<LayerDrops>* drops);

// Prefill: checks `drops` (update()'s answer for `layer` of request `request_id`, which holds
// positions [0, held)) and records them in *dropped ([n_layers][n_kv_heads], made on the first drop).
// PluginError for drops of another request or shape, or of a position not held.
Status record_prefill_drops(const std::string& compressor, std::span<const LayerDrops> drops, int64_t request_id,
                            int64_t layer, int64_t held, int64_t n_layers, int64_t n_kv_heads,
                            DroppedPositions* dropped);

// The kept set of an n-token prompt once `dropped` (record_prefill_drops; empty: nothing dropped)
// is taken away. PluginError when the KV heads of a layer kept different counts.
Result<std::vector<at::Tensor>> kept_after_drops(const std::string& compressor, const DroppedPositions& dropped,
                                                 int64_t n, int64_t n_layers, int64_t n_kv_heads);

// Applies update()'s `drops` for request `request_id` to its KV_comp `comp` (every position named
// must be held there). PluginError for drops of another request or of a position not held.
Status apply_request_drops(const Compressor& compressor, const std::vector<LayerDrops>& drops, int64_t request_id,
                           SequenceKv& comp, PagePool& pool);

// After a verify window: hands the first `committed_rows` rows of each layer's `window_rows` to
// update() (KV_comp `comp` already ends with those rows), then applies the drops to `comp`.
Status feed_committed_rows(Compressor& compressor, std::span<const WindowRows> window_rows, int64_t committed_rows,
                           int64_t request_id, double ratio, SequenceKv& comp, PagePool& pool);

}  // namespace vericache
