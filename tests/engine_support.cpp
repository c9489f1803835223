#include "engine_support.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "compression_support.h"
#include "engine/engine_pools.h"
#include "test_support.h"

namespace vericache::testing {

std::vector<GenerationResult> full_kv(const LlamaModel& m, const std::vector<GenerationRequest>& requests) {
  auto pool = m.make_page_pool(16, Generator::pages_needed(m, 16, requests));
  EXPECT_TRUE(pool.ok());
  Generator generator(m, *pool);
  auto results = generator.generate(requests);
  EXPECT_TRUE(results.ok()) << results.status().message();
  return results.ok() ? *results : std::vector<GenerationResult>(requests.size());
}

EngineRun run_engine(const LlamaModel& m, const EngineOptions& options, const std::vector<GenerationRequest>& requests,
                     int64_t device_pages, int64_t host_pages) {
  auto pools = make_engine_pools(m, options, 16, requests, PoolOverrides{device_pages, 0, host_pages});
  EXPECT_TRUE(pools.ok()) << pools.status().message();
  if (!pools.ok()) return {};
  EngineRun run;
  {
    DraftVerifyEngine engine(m, pools->device, pools->host, options);
    for (const auto& r : requests) EXPECT_TRUE(engine.add_request(r).ok());
    while (!engine.idle()) {
      const Status s = engine.step();
      EXPECT_TRUE(s.ok()) << s.message();
      if (!s.ok()) break;
      run.max_queued = std::max(run.max_queued, engine.queued());
      ++run.steps;
    }
    run.results = engine.take_finished();
    run.totals = engine.totals();
  }
  std::sort(run.results.begin(), run.results.end(),
            [](const auto& a, const auto& b) { return a.request_id < b.request_id; });
  for (PageKind kind : {PageKind::kResident, PageKind::kTransient}) {
    EXPECT_EQ(pools->device.num_free(kind), pools->device.num_pages(kind)) << "pages leaked";
  }
  EXPECT_EQ(pools->host.num_free(), pools->host.num_pages()) << "pages leaked";
  return run;
}

void expect_identical(const EngineRun& run, const std::vector<GenerationResult>& reference, const std::string& label) {
  ASSERT_EQ(run.results.size(), reference.size()) << label;
  for (size_t i = 0; i < reference.size(); ++i) {
    const auto& got = run.results[i].generation;
    EXPECT_EQ(got.tokens, reference[i].tokens) << label << ", request " << i;
    EXPECT_EQ(got.finish, reference[i].finish) << label << ", request " << i;
  }
}

void expect_every_plugin_lossless(const LlamaModel& m, const std::string& model_label, const std::vector<int64_t>& xs,
                                  const std::vector<int>& prompts) {
  const auto j = nlohmann::json::parse(read_file(source_path("datasets/lossless_prompts/prompts.json")));
  std::vector<GenerationRequest> requests;
  for (int i : prompts) {
    const auto& p = j.at("prompts")[i];
    GenerationRequest r;
    r.prompt = prompt_ids(m, p.at("text"), p.at("chat"));
    r.max_new_tokens = 24;
    if (i >= 40) EXPECT_GE(r.prompt.size(), 2000u) << "prompt " << i << " is meant to be long";
    requests.push_back(std::move(r));
  }
  const std::vector<GenerationResult> reference = full_kv(m, requests);
  for (const std::string& name : bundled_plugin_names()) {
    auto compressor = bundled_compressor(name, params_for(name, m.path()), m);
    ASSERT_NE(compressor, nullptr);
    for (int64_t x : xs) {
      EngineOptions options;
      options.compressor = compressor.get();
      options.ratio = 0.25;
      options.draft_length = x;
      const EngineRun run = run_engine(m, options, requests);
      expect_identical(run, reference, name + " on " + model_label + ", x = " + std::to_string(x));
      for (const EngineResult& r : run.results) EXPECT_EQ(r.compressor_failure, "") << name;
      std::printf("%s %-20s x = %2lld: acceptance %.3f, mean acceptance length %.2f\n", model_label.c_str(), name.c_str(),
                  static_cast<long long>(x), run.totals.acceptance_rate(), run.totals.mean_acceptance_length());
    }
  }
}

}  // namespace vericache::testing
