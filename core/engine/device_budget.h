// How many requests a fixed device KV budget holds: full-KV decoding keeps every request's whole
// cache on the device; VeriCache keeps only its compressed cache there (the full one stays in the
// host store) plus, when verifying from copies, a ring of transient pages for KV_full copies (the
// paper's Fig. 13 comparison, at equal device memory).
//
// Requests are alike in shape (prompt length, tokens to generate); the counts are whole requests
// whose worst case fits (DraftVerifyEngine::pages_for_request: a token dropper's declared bound,
// not the kept set it happens to pick), so admission of that many at once never fails later.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "engine/draft_verify_engine.h"
#include "model/llama_model.h"

namespace vericache {

struct BudgetBatches {
  int64_t budget_pages = 0;                // device pages of the budget (page_size tokens of one layer each)
  int64_t full_kv_pages_per_request = 0;   // a request's whole cache (Generator::pages_needed)
  int64_t resident_pages_per_request = 0;  // a request's compressed cache at its worst
  int64_t transient_pages = 0;             // the ring: `transient_requests` copies of KV_full and a window
  int64_t full_kv = 0;                     // requests full-KV decoding runs at once within the budget
  int64_t vericache = 0;                   // requests VeriCache runs at once within the budget
};

// `options`: the engine's (compressor, ratio, draft length; options.transfer set means verification
// from transient pages, sized for `transient_requests` copies at once, >= 1). `request`: one
// request's shape. The counts are 0 when not even one request fits.
BudgetBatches batches_within_budget(const LlamaModel& model, const EngineOptions& options, int64_t page_size,
                                    const GenerationRequest& request, int64_t budget_pages,
                                    int64_t transient_requests);

}  // namespace vericache
