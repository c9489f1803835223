#include "engine/device_budget.h"

#include <algorithm>
#include <span>

#include "engine/generator.h"

namespace vericache {

BudgetBatches batches_within_budget(const LlamaModel& model, const EngineOptions& options, int64_t page_size,
                                    const GenerationRequest& request, int64_t budget_pages,
                                    int64_t transient_requests) {
  BudgetBatches b;
  b.budget_pages = budget_pages;
  b.full_kv_pages_per_request = Generator::pages_needed(model, page_size, std::span(&request, 1));
  const DraftVerifyEngine::PageDemand one =
      DraftVerifyEngine::pages_for_request(model, options, page_size, page_size, request);
  b.resident_pages_per_request = one.device;
  b.transient_pages = options.transfer != nullptr ? std::max<int64_t>(transient_requests, 1) * one.transient : 0;
  b.full_kv = budget_pages / std::max<int64_t>(b.full_kv_pages_per_request, 1);
  const int64_t left = budget_pages - b.transient_pages;
  b.vericache = left > 0 ? left / std::max<int64_t>(b.resident_pages_per_request, 1) : 0;
  return b;
}

}  // namespace vericache
