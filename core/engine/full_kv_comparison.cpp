#include "engine/full_kv_comparison.h"

#include <algorithm>

#include "engine/engine_pools.h"

namespace vericache {

OutputDiff diff_tokens(std::span<const int32_t> got, std::span<const int32_t> want) {
  OutputDiff d;
  for (size_t t = 0; t < std::max(got.size(), want.size()); ++t) {
    if (t >= got.size() || t >= want.size() || got[t] != want[t]) {
      d.mismatched_tokens += 1;
      if (d.first_mismatch < 0) d.first_mismatch = static_cast<int64_t>(t);
    }
  }
  return d;
}

OutputDiff diff_output(const GenerationResult& got, const GenerationResult& want) {
  OutputDiff d = diff_tokens(got.tokens, want.tokens);
  d.finish_differs = got.finish != want.finish;
  return d;
}

Result<std::vector<GenerationResult>> full_kv_reference(const LlamaModel& model, std::span<const GenerationRequest> requests,
                                                        int64_t page_size, GenerationStats* stats) {
  VC_ASSIGN_OR_RETURN(PagePool pool, model.make_page_pool(page_size, Generator::pages_needed(model, page_size, requests)));
  Generator generator(model, pool);
  return generator.generate(requests, {}, stats);
}

Result<FullKvComparison> compare_with_full_kv(const LlamaModel& model, const EngineOptions& options,
                                              std::span<const GenerationRequest> requests,
                                              const std::vector<GenerationResult>& reference, int64_t page_size,
                                              const PoolOverrides& overrides) {
  if (reference.size() != requests.size()) {
    return Status::invalid_argument("compare_with_full_kv: " + std::to_string(reference.size()) + " references for " +
                                    std::to_string(requests.size()) + " requests");
  }
  VC_ASSIGN_OR_RETURN(EnginePools pools, make_engine_pools(model, options, page_size, requests, overrides));
  FullKvComparison out;
  {
    DraftVerifyEngine engine(model, pools.device, pools.host, options);
    for (const GenerationRequest& r : requests) VC_RETURN_IF_ERROR(engine.add_request(r).status());
    VC_RETURN_IF_ERROR(engine.run());
    out.results = engine.take_finished();
    out.totals = engine.totals();
  }
  if (out.results.size() != requests.size()) {
    return Status::internal("the engine finished " + std::to_string(out.results.size()) + " of " +
                            std::to_string(requests.size()) + " requests");
  }
  std::sort(out.results.begin(), out.results.end(), [](const auto& a, const auto& b) { return a.request_id < b.request_id; });
  for (size_t i = 0; i < requests.size(); ++i) out.diffs.push_back(diff_output(out.results[i].generation, reference[i]));
  return out;
}

}  // namespace vericache
