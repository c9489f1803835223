// The page pools a DraftVerifyEngine runs on, sized for a set of requests: the device pool's
// resident pages (compressed caches) and transient pages (transfer mode: one verify window's copy
// of each full cache), and the host pool (full caches), each the sum of the requests' worst cases
// (DraftVerifyEngine::pages_for_requests), so that all of them run at once; an override sets a
// smaller pool (requests then wait their turn; one that can never fit is refused by add_request).
// Both pools are on the model's device and dtype, page size `page_size` tokens.
// Errors: PagePool::create's (a page count out of range, memory refused), as values.
#pragma once

#include <cstdint>
#include <span>

#include <vericache/status.h>

#include "engine/draft_verify_engine.h"
#include "kv/page_pool.h"

namespace vericache {

struct EnginePools {
  PagePool device;
  PagePool host;
};

// 0: the sum over the requests; > 0: that many pages.
struct PoolOverrides {
  int64_t resident_pages = 0;
  int64_t transient_pages = 0;
  int64_t host_pages = 0;
};

Result<EnginePools> make_engine_pools(const LlamaModel& model, const EngineOptions& options, int64_t page_size,
                                      std::span<const GenerationRequest> requests, const PoolOverrides& overrides = {});

}  // namespace vericache
