// One request inside DraftVerifyEngine: its phase, its two caches and what the current window holds.
// Internal to core/engine (the engine's parts share it; nothing outside the engine sees it).
//
// Phases (DESIGN.md, "Per-request loop"): kPrefill feeds prompt chunks into KV_full; kDraft runs one
// token per forward on KV_comp; kVerify runs [pending, d_1..d_x] over KV_full in one forward.
// Ownership: the engine owns each EngineRequest and the pages its caches hold (returned by
// DraftVerifyEngine::finish or its destructor). Thread-safety: the engine thread only.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include <vericache/status.h>

#include "engine/draft_verify_engine.h"
#include "engine/sampler.h"
#include "kv/sequence_kv.h"

namespace vericache {

enum class Phase { kPrefill, kDraft, kVerify };

// Online compressor, prefill: the positions each (layer, KV head) dropped, in drop order.
using DroppedPositions = std::vector<std::vector<std::vector<int64_t>>>;

// One layer's rows of a verify forward, kept for an online compressor until the verdict is known
// (it must see committed rows only). Each tensor's first dimension is the window's rows.
struct WindowRows {
  at::Tensor residual, hidden, q, k, v, positions;
};

struct EngineRequest {
  EngineRequest(int64_t request_id, GenerationRequest r, int64_t n_layers)
      : id(request_id),
        req(std::move(r)),
        full(n_layers),
        comp(n_layers),
        staged(n_layers, PageKind::kTransient),
        rng(req.sampling.seed),
        draft_rng(req.sampling.seed ^ 0x5851f42d4c957f2dull) {}

  int64_t id;
  GenerationRequest req;
  Phase phase = Phase::kPrefill;
  SequenceKv full;      // in the host pool
  SequenceKv comp;      // in the device pool's resident pages
  SequenceKv staged;    // transfer mode: KV_full's copy in the device pool's transient pages
  uint64_t ticket = 0;  // the transfer filling `staged`; 0: none queued
  Rng rng;              // first token and verification
  Rng draft_rng;        // sampled drafts
  int64_t prefilled = 0;
  int64_t committed = 0;  // positions held by KV_full
  int32_t pending = 0;    // the last committed token, at position `committed`, in no cache yet
  int64_t comp_end = 0;   // KV_comp accounts for every position below this
  int64_t window = 0;     // x of the current window
  DraftPolicyState policy;  // its history under the draft policy
  std::vector<int32_t> drafts;
  std::vector<std::vector<float>> draft_probs;  // sampled drafts: q of each draft
  bool full_only = false;                       // no KV_comp (no compressor state either)
  bool done = false;
  bool reload_due = false;   // scheduler: its copy of KV_full is to start (retried until it does)
  bool verify_due = false;   // scheduler: its verify forward is due
  Status compressor_status;  // a failure inside this forward's observer
  DroppedPositions dropped;  // online compressor, prefill; empty until its first drop
  std::vector<WindowRows> window_rows;     // online compressor, verify with drafts: one per layer
  std::vector<LayerDrops> row_drops;       // online compressor, verify of no drafts: update()'s drops
  std::vector<int32_t> tokens, positions;  // the current forward's input
  EngineResult result;
  DraftVerifyEngine::PageDemand demand;  // before prefill: what admission reserves
  // add_prefilled(): the prompt's KV to copy at admission, the logits after it, its kept set.
  const SequenceKv* prompt_kv = nullptr;
  const PagePool* prompt_pool = nullptr;
  std::vector<float> next_logits;
  std::vector<at::Tensor> given_kept;
  bool external_prefill = false;
};

}  // namespace vericache
