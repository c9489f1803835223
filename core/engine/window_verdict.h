// The end of a verify window: the verdict on its drafts and the caches rolled to it.
//   judge_window   the x + 1 verify rows against the drafts: greedy compares argmaxes, T > 0 runs
//                  rejection sampling (verification.h); the test-only faults (test_faults.h) are
//                  applied here, where a real bug would sit.
//   roll_back      KV_full keeps the last committed token and the accepted drafts (truncated in
//                  place, or written back from the transient copy the window verified against);
//                  KV_comp is rolled back by position and refilled from KV_full to the same end,
//                  or, after a window of no drafts, left behind KV_full until refill_comp.
// Ownership: borrows the request and the pools. Thread-safety: the engine thread only.
#pragma once

#include <cstdint>

#include "engine/draft_verify_engine.h"
#include "engine/engine_request.h"
#include "engine/verification.h"
#include "kv/page_pool.h"

namespace vericache {

// `rows`: [x + 1, vocab] full-KV logits of the window [pending, d_1..d_x] of `r` (x = r.drafts.size()).
// Consumes draws of r.rng for sampled requests.
WindowVerdict judge_window(EngineRequest& r, const float* rows, int64_t vocab, const EngineOptions& options);

// Rolls r's caches to r.committed + accepted + 1 positions. `transfer`: the window was verified
// against r.staged (transient pages of `device`), which is released. KV_comp keeps the drafted K/V
// of accepted tokens (DraftKv::kDrafted) or takes the verified K/V (kVerified). Admission reserved
// the pages, so a failed allocation here is a bug (checked). `defer_comp_refill`: KV_comp is left as
// it is (ending at r.comp_end, behind KV_full) for refill_comp to bring up to date later.
void roll_back(EngineRequest& r, int64_t accepted, PagePool& device, PagePool& host, bool transfer, DraftKv draft_kv,
               bool defer_comp_refill);

// Appends KV_full's positions [r.comp_end, end) to KV_comp (in `device`'s resident pages, copied
// from `host`) and sets r.comp_end = end. Admission reserved the pages (checked).
void refill_comp(EngineRequest& r, PagePool& device, PagePool& host, int64_t end);

}  // namespace vericache
