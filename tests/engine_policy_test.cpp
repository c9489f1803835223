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
#include <span>
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

// Every draft's compressed-cache logits, in the order the engine drafted them.
struct DraftLogits : StatsSink {
  struct Draft {
    int64_t request = 0, position = 0;
    std::vector<float> logits;
  };
  std::vector<Draft> drafts;
  void on_draft_logits(int64_t request, int64_t position, std::span<const float> logits) override {
    drafts.push_back({request, position, std::vector<float>(logits.begin(), logits.end())});
  }
};

// Where two runs' drafts first differ in request, position or logits (bitwise); "" when they do not.
std::string first_difference(const DraftLogits& a, const DraftLogits& b) {
  for (size_t i = 0; i < std::min(a.drafts.size(), b.drafts.size()); ++i) {
    const DraftLogits::Draft &x = a.drafts[i], &y = b.drafts[i];
    if (x.request != y.request || x.position != y.position || x.logits != y.logits) {
      return "draft " + std::to_string(i) + " (request " + std::to_string(x.request) + ", position " +
             std::to_string(x.position) + ")";
    }
  }
  if (a.drafts.size() != b.drafts.size())
    return std::to_string(a.drafts.size()) + " vs " + std::to_string(b.drafts.size()) + " drafts";
  return "";
}

// With an offline token dropper or a quantizer a window of no drafts leaves KV_comp behind (no copy:
// plain full-KV decoding); the next window that drafts first brings it up to the committed tokens.
// An online compressor (KVzap, KIVI) sees the one row of a window of no drafts through update() as
// the forward computes it, with no copy kept for the verdict (KVzap's drops then apply to its
// KV_comp, which keeps up). The drafts are exactly those of an engine that treats every window as
// one that drafts (refill after each, rows kept until the verdict) — the same logits bit for bit —
// with verified and drafted K/V, and the resident cache reported at the end is the same. Skipping
// the catch-up (a test-only fault, once, SnapKV with verified K/V) changes the drafts, so the
// comparison can fail.
TEST(DraftPolicies, KvCompLeftBehindByWindowsOfNoneIsCaughtUpBeforeDrafting) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::vector<GenerationRequest> requests = medium_requests(*m, 20, 40);
  const std::vector<GenerationResult> reference = testing::full_kv(*m, requests);
  struct Case {
    std::string compressor;
    DraftKv mode;
  };
  for (const Case& c : {Case{"snapkv", DraftKv::kVerified}, Case{"snapkv", DraftKv::kDrafted},
                        Case{"expected_attention", DraftKv::kVerified}, Case{"kivi", DraftKv::kVerified},
                        Case{"kvzap", DraftKv::kVerified}}) {
    auto compressor = testing::bundled_compressor(c.compressor, testing::params_for(c.compressor), *m);
    ASSERT_NE(compressor, nullptr);
    auto run = [&](bool eager, TestFaultKind fault, DraftLogits* sink) {
      EngineOptions options;
      options.compressor = compressor.get();
      options.ratio = 0.25;
      options.draft_length = 8;
      options.draft_kv = c.mode;
      // Stretches of 0 long enough to fill pages (page size 16) between windows that draft.
      options.draft_policy = policy(DraftPolicyKind::kGoodput, {0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6});
      options.eager_comp_refill_for_testing = eager;
      options.test_fault.kind = fault;
      options.sink = sink;
      return testing::run_engine(*m, options, requests);
    };
    const std::string label = c.compressor + ", K/V " + draft_kv_name(c.mode);
    DraftLogits eager, lazy, faulted;
    const testing::EngineRun eager_run = run(true, TestFaultKind::kNone, &eager);
    const testing::EngineRun lazy_run = run(false, TestFaultKind::kNone, &lazy);
    testing::expect_identical(lazy_run, reference, label);
    ASSERT_GT(lazy.drafts.size(), 20u) << label;
    EXPECT_EQ(first_difference(eager, lazy), "") << label;
    EXPECT_EQ(lazy_run.totals.accepted_tokens, eager_run.totals.accepted_tokens) << label;
    EXPECT_EQ(lazy_run.totals.resident_kv_slots, eager_run.totals.resident_kv_slots) << label;
    EXPECT_EQ(lazy_run.totals.resident_kv_bytes, eager_run.totals.resident_kv_bytes) << label;
    if (c.compressor != "snapkv" || c.mode != DraftKv::kVerified) continue;  // one fault run shows the check can fail
    const testing::EngineRun faulted_run = run(false, TestFaultKind::kSkipCompCatchUp, &faulted);
    testing::expect_identical(faulted_run, reference, label + ", catch-up skipped");  // still lossless
    EXPECT_NE(first_difference(eager, faulted), "") << label << ": skipping the catch-up went unnoticed";
  }
}

// While a request decodes on its full cache (every window of no drafts), its KV_comp takes no page:
// the resident pages in use stay what the prefill's compressed cache took, where refilling after
// every window (the test-only eager mode) takes more as the tokens fill pages.
TEST(DraftPolicies, DecodingOnTheFullCacheTakesNoKvCompPages) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::vector<GenerationRequest> requests = medium_requests(*m, 24, 40);
  auto compressor = testing::bundled_compressor("snapkv", testing::params_for("snapkv"), *m);
  ASSERT_NE(compressor, nullptr);
  for (bool eager : {false, true}) {
    EngineOptions options;
    options.compressor = compressor.get();
    options.draft_length = 8;
    options.draft_policy = policy(DraftPolicyKind::kGoodput, {0});
    options.eager_comp_refill_for_testing = eager;
    auto pools = make_engine_pools(*m, options, 16, requests, PoolOverrides{});
    ASSERT_TRUE(pools.ok()) << pools.status().message();
    struct LastStep : StatsSink {
      StepRecord step;
      void on_step(const StepRecord& s) override { step = s; }
    } last;
    options.sink = &last;
    DraftVerifyEngine engine(*m, pools->device, pools->host, options);
    for (const auto& r : requests) ASSERT_TRUE(engine.add_request(r).ok());
    int64_t after_prefill = -1, most_used = 0;
    while (!engine.idle()) {
      ASSERT_TRUE(engine.step().ok());
      if (engine.active() < static_cast<int64_t>(requests.size())) break;  // one finished: its pages went back
      const int64_t used = pools->device.num_pages(PageKind::kResident) - pools->device.num_free(PageKind::kResident);
      if (last.step.prefill_items > 0) {
        after_prefill = used;  // the compressed caches the prompts' prefills built
      } else {
        most_used = std::max(most_used, used);
      }
    }
    ASSERT_GT(after_prefill, 0);
    if (eager) {
      EXPECT_GT(most_used, after_prefill) << "eager refill: KV_comp should grow";
    } else {
      EXPECT_EQ(most_used, after_prefill) << "windows of none took KV_comp pages";
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
