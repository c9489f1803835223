// The draft–verify engine under each draft policy (engine/draft_policy.h): greedy output identical
// to full-KV decoding whatever length each window takes — fixed, confidence stops, tiers, goodput,
// and scripted windows of 0 (a token decoded on the full cache) and uneven lengths, verified in
// place and from transient copies, with verified and drafted K/V, and under the reload scheduler,
// which plans each request's verify at its policy's window. The decisions themselves are
// draft_policy_test.cpp's; the sampled distribution under adaptive windows is
// engine_distribution_test.cpp's (AdaptiveWindowsKeepTheDistribution).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "compression_support.h"
#include "engine_support.h"
#include "engine/draft_verify_engine.h"
#include "engine/engine_pools.h"
#include "test_support.h"

namespace vericache {
namespace {

// Four medium prompts of datasets/lossless_prompts, `tokens` each.
std::vector<GenerationRequest> medium_requests(const LlamaModel& m, int first, int64_t tokens) {
  const auto j = nlohmann::json::parse(testing::read_file(testing::source_path("datasets/lossless_prompts/prompts.json")));
  std::vector<GenerationRequest> out;
  for (int i = first; i < first + 4; ++i) {
    const auto& p = j.at("prompts").at(i);
    GenerationRequest r;
    r.prompt = testing::prompt_ids(m, p.at("text"), p.at("chat"));
    r.max_new_tokens = tokens;
    out.push_back(std::move(r));
  }
  return out;
}

DraftPolicyOptions policy(DraftPolicyKind kind, std::vector<int64_t> scripted = {}) {
  DraftPolicyOptions o;
  o.kind = kind;
  o.min_confidence = 0.9;  // confidence: stops often on these prompts
  o.probe_every = 3;       // goodput: probes soon after falling back
  o.test_windows = std::move(scripted);
  return o;
}

TEST(DraftPolicies, EveryPolicyIsLossless) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::vector<GenerationRequest> requests = medium_requests(*m, 8, 40);
  const std::vector<GenerationResult> reference = testing::full_kv(*m, requests);
  for (const std::string name : {"snapkv", "kvzap"}) {
    auto compressor = testing::bundled_compressor(name, testing::params_for(name), *m);
    ASSERT_NE(compressor, nullptr);
    for (DraftPolicyKind kind :
         {DraftPolicyKind::kConfidence, DraftPolicyKind::kTiers, DraftPolicyKind::kGoodput}) {
      EngineOptions options;
      options.compressor = compressor.get();
      options.ratio = 0.25;
      options.draft_length = 8;
      options.draft_policy = policy(kind);
      const testing::EngineRun run = testing::run_engine(*m, options, requests);
      const std::string label = name + ", " + draft_policy_name(kind);
      testing::expect_identical(run, reference, label);
      for (const EngineResult& r : run.results) EXPECT_EQ(r.compressor_failure, "") << label;
      std::printf("[policy] %-28s %lld windows, %.2f drafts per window, %lld of none, acceptance %.3f\n",
                  label.c_str(), static_cast<long long>(run.totals.verify_windows), run.totals.mean_window(),
                  static_cast<long long>(run.totals.verify_windows - run.totals.drafts), run.totals.acceptance_rate());
      if (kind == DraftPolicyKind::kConfidence) {
        // p >= 0.9 stops windows early: fewer than x drafts per window that drafted.
        EXPECT_LT(run.totals.draft_tokens, 8 * run.totals.drafts) << label << ": no window stopped early";
      }
    }
  }
}

// Scripted windows, 0 included: the full-cache token, a window after it, uneven lengths; in place
// and from transient copies over an emulated link, with verified and drafted K/V in KV_comp.
TEST(DraftPolicies, WindowsOfNoneAndUnevenLengthsAreLossless) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::vector<GenerationRequest> requests = medium_requests(*m, 12, 40);
  const std::vector<GenerationResult> reference = testing::full_kv(*m, requests);
  auto compressor = testing::bundled_compressor("snapkv", testing::params_for("snapkv"), *m);
  ASSERT_NE(compressor, nullptr);
  for (bool transfer : {false, true}) {
    for (DraftKv mode : {DraftKv::kVerified, DraftKv::kDrafted}) {
      TransferEngine link(TransferOptions{8e9});
      EngineOptions options;
      options.compressor = compressor.get();
      options.ratio = 0.25;
      options.draft_length = 8;
      options.draft_kv = mode;
      options.transfer = transfer ? &link : nullptr;
      options.draft_policy = policy(DraftPolicyKind::kGoodput, {0, 3, 0, 0, 8, 1});
      const testing::EngineRun run = testing::run_engine(*m, options, requests);
      const std::string label = std::string(transfer ? "transfer" : "in place") + ", K/V " + draft_kv_name(mode);
      testing::expect_identical(run, reference, label);
      // Half the scripted windows draft nothing (more near each request's end, where tokens run out).
      EXPECT_GE(run.totals.verify_windows - run.totals.drafts, run.totals.drafts) << label << ": too few windows of none";
      ASSERT_FALSE(run.totals.drafted_per_position.empty());
      EXPECT_EQ(static_cast<int64_t>(run.totals.drafted_per_position.size()), 8) << label;
    }
  }
}

// Under the reload scheduler the policy's window is where each request's verify is planned: scripted
// windows of 0, 2, 0 and 6 drafts (staggered, W = 16, a 4 GB/s emulated link) stay lossless, and the
// planned windows really differ (windows of several lengths were verified).
TEST(DraftPolicies, TheSchedulerPlansEachRequestsWindow) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::vector<GenerationRequest> requests = medium_requests(*m, 16, 24);
  auto compressor = testing::bundled_compressor("snapkv", testing::params_for("snapkv"), *m);
  ASSERT_NE(compressor, nullptr);
  TransferEngine transfer(TransferOptions{4e9});
  sched::ReloadSchedulerOptions so;
  so.window = 16;
  so.draft_length = 8;
  so.iteration_seconds = 0.02;
  so.link_bandwidth = 4e9;
  so.memory_capacity_bytes = 1e12;
  sched::ReloadScheduler scheduler(so);
  EngineOptions options;
  options.compressor = compressor.get();
  options.draft_length = 8;
  options.transfer = &transfer;
  options.scheduler = &scheduler;
  options.draft_policy = policy(DraftPolicyKind::kGoodput, {0, 2, 0, 6});
  const auto all = DraftVerifyEngine::pages_for_requests(*m, options, 16, 16, requests);
  auto device =
      PagePool::create(m->kv_page_spec(16), PagePoolOptions{all.device, all.transient, at::kFloat, at::kCPU, false});
  auto host = m->make_page_pool(16, all.host);
  ASSERT_TRUE(device.ok() && host.ok());
  testing::EngineRun run;
  {
    DraftVerifyEngine engine(*m, *device, *host, options);
    ASSERT_TRUE(engine.validate_options().ok());
    for (const auto& r : requests) ASSERT_TRUE(engine.add_request(r).ok());
    const Status s = engine.run();
    ASSERT_TRUE(s.ok()) << s.message();
    run.results = engine.take_finished();
    run.totals = engine.totals();
  }
  std::sort(run.results.begin(), run.results.end(), [](const auto& a, const auto& b) { return a.request_id < b.request_id; });
  testing::expect_identical(run, testing::full_kv(*m, requests), "staggered, scripted windows");
  EXPECT_EQ(device->num_free(PageKind::kTransient), all.transient);
  // Windows planned at 6 drafts reach position 6; those planned at 0 or 2 end sooner.
  ASSERT_GE(run.totals.drafted_per_position.size(), 6u);
  EXPECT_LT(run.totals.drafted_per_position[5], run.totals.drafted_per_position[0]);
}

}  // namespace
}  // namespace vericache
