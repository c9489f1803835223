#include "engine/engine_pools.h"

#include <ATen/ATen.h>

namespace vericache {

Result<EnginePools> make_engine_pools(const LlamaModel& model, const EngineOptions& options, int64_t page_size,
                                      std::span<const GenerationRequest> requests, const PoolOverrides& overrides) {
  const DraftVerifyEngine::PageDemand need =
      DraftVerifyEngine::pages_for_requests(model, options, page_size, page_size, requests);
  auto chosen = [](int64_t asked, int64_t needed) { return asked > 0 ? asked : needed; };
  const PagePoolOptions device_options{chosen(overrides.resident_pages, need.device),
                                       chosen(overrides.transient_pages, need.transient), model.kv_dtype(), model.device(),
                                       false};
  VC_ASSIGN_OR_RETURN(PagePool device, PagePool::create(model.kv_page_spec(page_size), device_options));
  VC_ASSIGN_OR_RETURN(PagePool host, model.make_page_pool(page_size, chosen(overrides.host_pages, need.host)));
  return EnginePools{std::move(device), std::move(host)};
}

}  // namespace vericache
