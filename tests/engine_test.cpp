// The draft–verify engine on the real model with the real plugins: greedy output token-identical
// to full-KV decoding (Generator) over many prompts, plugins, ratios, draft lengths and batch sizes;
// back-pressure from a small pool; an online compressor with rollbacks and requests joining; a
// failing plugin; and sampled output that follows the full-KV distribution (chi-square tests).
// Prompts: datasets/lossless_prompts/prompts.json (40 medium, 10 long).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <map>
#include <set>
#include <string>

#include <vericache/plugin_abi.h>
#include "compression_support.h"
#include "engine_support.h"
#include "statistics_support.h"

#include "engine/draft_verify_engine.h"
#include "engine/device_budget.h"
#include "engine/engine_pools.h"
#include "engine/generator.h"
#include "loader/plugin_loader.h"
#include "test_support.h"
#include "util/thread_pool.h"

namespace vericache {
namespace {

using testing::EngineRun;
using testing::expect_identical;
using testing::full_kv;
using testing::run_engine;

struct Prompt {
  std::string name;
  std::vector<int32_t> ids;
};

const std::vector<Prompt>& lossless_prompts() {
  static const std::vector<Prompt> prompts = [] {
    std::vector<Prompt> out;
    const LlamaModel* m = testing::default_model();
    if (m == nullptr) return out;
    const auto j =
        nlohmann::json::parse(testing::read_file(testing::source_path("datasets/lossless_prompts/prompts.json")));
    for (const auto& p : j.at("prompts"))
      out.push_back({p.at("name"), testing::prompt_ids(*m, p.at("text"), p.at("chat"))});
    return out;
  }();
  return prompts;
}
const Prompt& medium(int i) { return lossless_prompts()[i % 40]; }
const Prompt& long_prompt(int i) { return lossless_prompts()[40 + i % 10]; }

GenerationRequest request_for(const Prompt& p, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = p.ids;
  r.max_new_tokens = max_tokens;
  return r;
}

std::shared_ptr<Compressor> plugin(const std::string& name) {
  if (name == "none") return nullptr;
  return testing::bundled_compressor(name, testing::params_for(name), *testing::default_model());
}

// The prompt lengths the README states: the 40 medium prompts (the CI subset's and the matrix's)
// are 151-710 tokens, the 10 long ones 1,984-3,383; Lossless.ALongPrompt's is 2.7K and
// Lossless.LongPrompts adds a 3.2K one. A rebuilt prompts.json or a changed tokenizer or chat
// template that moves them fails here, not silently in the README.
TEST(LosslessPrompts, HaveTheTokenCountsTheReadmeStates) {
  ASSERT_EQ(lossless_prompts().size(), 50u);
  size_t lo = SIZE_MAX, hi = 0;
  for (int i = 0; i < 40; ++i) {
    lo = std::min(lo, medium(i).ids.size());
    hi = std::max(hi, medium(i).ids.size());
  }
  std::printf("medium prompts: %zu-%zu tokens\n", lo, hi);
  EXPECT_EQ(lo, 151u);
  EXPECT_EQ(hi, 710u);
  lo = SIZE_MAX, hi = 0;
  for (int i = 0; i < 10; ++i) {
    lo = std::min(lo, long_prompt(i).ids.size());
    hi = std::max(hi, long_prompt(i).ids.size());
  }
  std::printf("long prompts: %zu-%zu tokens\n", lo, hi);
  EXPECT_EQ(lo, 1984u);
  EXPECT_EQ(hi, 3383u);
  EXPECT_NEAR(static_cast<double>(long_prompt(0).ids.size()), 3200.0, 50.0);
  EXPECT_NEAR(static_cast<double>(long_prompt(1).ids.size()), 2700.0, 50.0);
}

// The CI subset of the lossless matrix: every token dropper at every ratio class (0.1, 0.25, 0.5),
// every draft-length class (1, 4, 16, 32) and both batch sizes, both ways of keeping accepted K/V
// (drafted K/V at x > 1 too), the strongest compression (c = 0.1) with a long window (x = 16) at
// batch 8, all through the engine's own prefill and compression; 32-token greedy continuations of
// medium prompts. The plugins share each case's prompts, so full-KV decoding of them runs once.
TEST(Lossless, EveryPluginRatioDraftLengthAndBatch) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  struct Case {
    double ratio;
    int64_t x;
    int batch;
    DraftKv draft_kv;
  };
  const std::vector<Case> cases = {{0.1, 16, 8, DraftKv::kVerified},
                                   {0.25, 4, 1, DraftKv::kDrafted},
                                   {0.5, 32, 8, DraftKv::kDrafted},
                                   {0.1, 1, 1, DraftKv::kVerified}};
  const int64_t max_tokens = 32;
  std::vector<std::vector<GenerationRequest>> requests(cases.size());
  std::vector<std::vector<GenerationResult>> references(cases.size());
  int prompt_offset = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    for (int b = 0; b < cases[k].batch; ++b) requests[k].push_back(request_for(medium(prompt_offset++), max_tokens));
    references[k] = full_kv(*m, requests[k]);
  }
  std::printf("%-20s %5s %3s %5s %-8s %9s %9s\n", "plugin", "c", "x", "batch", "draft_kv", "accept", "mean_len");
  std::vector<std::string> names = testing::bundled_plugin_names(CompressorFamily::kTokenDropping);
  names.insert(names.begin(), "none");
  for (const std::string& name : names) {
    auto compressor = plugin(name);
    if (name != "none") {
      ASSERT_NE(compressor, nullptr);
    }
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      if (name == "none" && k > 0) break;  // the identity: one case is enough
      EngineOptions options;
      options.compressor = compressor.get();
      options.ratio = c.ratio;
      options.draft_length = name == "none" ? 32 : c.x;
      options.draft_kv = c.draft_kv;
      const EngineRun run = run_engine(*m, options, requests[k]);
      const std::string label = name + " c=" + std::to_string(c.ratio) + " x=" + std::to_string(options.draft_length) +
                                " batch=" + std::to_string(c.batch) + " " + draft_kv_name(c.draft_kv);
      expect_identical(run, references[k], label);
      for (const EngineResult& r : run.results) {
        EXPECT_EQ(r.compressor_failure, "") << label;
        if (name != "none") {
          EXPECT_LT(r.metrics.resident_kv_slots, r.metrics.full_kv_slots) << label << ": nothing was compressed";
        }
      }
      if (name == "none") {
        EXPECT_EQ(run.totals.acceptance_rate(), 1.0) << "drafting on a full copy must accept every draft";
      }
      EXPECT_GT(run.totals.drafts, 0) << label;
      std::printf("%-20s %5.2f %3lld %5d %-8s %9.3f %9.2f\n", name.c_str(), c.ratio,
                  static_cast<long long>(options.draft_length), c.batch, draft_kv_name(options.draft_kv),
                  run.totals.acceptance_rate(), run.totals.mean_acceptance_length());
    }
  }
}

// Each quantizer as the drafter at every bit width: its packed pages are what drafting reads (KIVI
// keeps a residual of one block of 32 tokens, RotateKV and KVQuant of at most one page, so nearly
// the whole prompt is packed), and the output is still full-KV greedy; draft lengths 1 to 25, the
// strongest (2 bits) at batch 8, both ways of keeping accepted K/V (drafted at x = 4). RotateKV sees
// the prompts' prefill and keeps their sinks. The quantizers share each case's prompts.
TEST(Lossless, QuantizersAtEveryBitWidth) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  struct Case {
    int bits;
    int64_t x;
    int batch;
  };
  const std::vector<Case> cases = {{2, 25, 8}, {3, 4, 1}, {4, 16, 1}, {8, 1, 1}};
  // Per quantizer: its parameters besides bits, the bytes of its parameters per byte of a float slot
  // (KIVI, RotateKV: two 16-bit numbers per group of G keys and of G values, 1 / G; KVQuant: a value
  // range and 4 bytes per outlier, 2 outliers of 192 channels for keys and for values, over 2 * 192 *
  // 4 bytes) and its float residual.
  struct Quantizer {
    std::string name, params;
    double parameters;
    int64_t residual;
  };
  const double head_dim = static_cast<double>(m->config().head_dim);
  const std::vector<Quantizer> quantizers = {
      {"kivi", "\"group_size\": 32, \"residual_length\": 32", 1.0 / 32, 32},
      {"rotatekv", "\"calibration\": \"" + testing::rotatekv_calibration(m->path()) + "\"", 1.0 / head_dim, 16},
      {"kvquant", "\"calibration\": \"" + testing::kvquant_calibration(m->path()) + "\"", (4.0 + 2 * 2 * 4) / (2 * 192 * 4),
       16}};
  std::vector<std::vector<GenerationRequest>> requests(cases.size());
  std::vector<std::vector<GenerationResult>> references(cases.size());
  int prompt_offset = 20;
  for (size_t k = 0; k < cases.size(); ++k) {
    for (int b = 0; b < cases[k].batch; ++b) requests[k].push_back(request_for(medium(prompt_offset++), 40));
    references[k] = full_kv(*m, requests[k]);
  }
  for (const Quantizer& q : quantizers) {
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      auto compressor =
          testing::bundled_compressor(q.name, "{\"bits\": " + std::to_string(c.bits) + ", " + q.params + "}", *m);
      ASSERT_NE(compressor, nullptr);
      EngineOptions options;
      options.compressor = compressor.get();
      options.draft_length = c.x;
      options.draft_kv = k % 2 == 0 ? DraftKv::kVerified : DraftKv::kDrafted;
      const EngineRun run = run_engine(*m, options, requests[k]);
      const std::string label = q.name + " bits=" + std::to_string(c.bits) + " x=" + std::to_string(c.x);
      expect_identical(run, references[k], label);
      for (const EngineResult& r : run.results) EXPECT_EQ(r.compressor_failure, "") << label;
      // Packed slots cost bits / 32 of a float slot plus their parameters; the float residual adds
      // at most `residual` float slots per layer.
      const double packed_fraction = c.bits / 32.0 + q.parameters;
      const double layers = static_cast<double>(m->config().n_layers);
      const double float_slot_bytes = static_cast<double>(run.totals.full_kv_bytes) / run.totals.full_kv_slots;
      const double bound = packed_fraction * run.totals.full_kv_bytes +
                           static_cast<double>(q.residual) * layers * c.batch * float_slot_bytes;
      EXPECT_LE(run.totals.resident_kv_bytes, bound) << label;
      EXPECT_LT(run.totals.resident_kv_bytes, run.totals.full_kv_bytes / 2) << label;
      EXPECT_EQ(run.totals.resident_kv_slots, run.totals.full_kv_slots) << label << ": a quantizer keeps every token";
      EXPECT_GT(run.totals.drafts, 0) << label;
      std::printf("%-18s %3lld %5d %-8s accept %.3f mean_len %.2f resident %.3f of full\n", label.c_str(),
                  static_cast<long long>(c.x), c.batch, draft_kv_name(options.draft_kv), run.totals.acceptance_rate(),
                  run.totals.mean_acceptance_length(),
                  static_cast<double>(run.totals.resident_kv_bytes) / static_cast<double>(run.totals.full_kv_bytes));
    }
  }
}

// The lossless subset in the integer compute mode (kernels/int8_linear.h), where the engine and its
// full-KV reference both run integer arithmetic: every token dropper at c = 0.25 and x = 8 at
// batch 4, KVzip under the goodput policy, and KIVI at 2 bits with x = 16; greedy output identical.
TEST(Lossless, IntegerComputeEveryTokenDropperAndKivi) {
  const LlamaModel* m = testing::default_integer_model();
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->compute(), Compute::kInteger);
  std::vector<GenerationRequest> requests;
  for (int b = 0; b < 4; ++b) requests.push_back(request_for(medium(40 + b), 32));
  const std::vector<GenerationResult> reference = full_kv(*m, requests);
  auto check = [&](const std::string& label, const EngineOptions& options) {
    const EngineRun run = run_engine(*m, options, requests);
    expect_identical(run, reference, label);
    for (const EngineResult& r : run.results) EXPECT_EQ(r.compressor_failure, "") << label;
    EXPECT_GT(run.totals.drafts, 0) << label;
    std::printf("integer %-26s accept %.3f mean_len %.2f\n", label.c_str(), run.totals.acceptance_rate(),
                run.totals.mean_acceptance_length());
  };
  for (const std::string& name : testing::bundled_plugin_names(CompressorFamily::kTokenDropping)) {
    auto compressor = plugin(name);
    ASSERT_NE(compressor, nullptr) << name;
    EngineOptions options;
    options.compressor = compressor.get();
    options.ratio = 0.25;
    options.draft_length = 8;
    check(name, options);
    if (name == "kvzip") {
      options.draft_policy.kind = DraftPolicyKind::kGoodput;
      options.draft_length = 16;
      check(name + " goodput", options);
    }
  }
  auto kivi = testing::bundled_compressor("kivi", "{\"bits\": 2}", *m);
  ASSERT_NE(kivi, nullptr);
  EngineOptions options;
  options.compressor = kivi.get();
  options.draft_length = 16;
  check("kivi bits=2", options);
}

// `name` at c = 0.25, x = 16 on long `requests`: identical to `reference`, no compressor failure,
// really compressed.
void expect_long_prompts_lossless(const LlamaModel& m, const std::string& name,
                                  const std::vector<GenerationRequest>& requests,
                                  const std::vector<GenerationResult>& reference) {
  auto compressor = plugin(name);
  ASSERT_NE(compressor, nullptr);
  EngineOptions options;
  options.compressor = compressor.get();
  options.ratio = 0.25;
  options.draft_length = 16;
  const EngineRun run = run_engine(m, options, requests);
  expect_identical(run, reference, name + " on long prompts");
  for (const EngineResult& r : run.results) {
    EXPECT_EQ(r.compressor_failure, "") << name;
    EXPECT_LT(r.metrics.resident_kv_slots, r.metrics.full_kv_slots) << name << ": nothing was compressed";
  }
  std::printf("%-20s long prompts: acceptance %.3f, mean acceptance length %.2f\n", name.c_str(),
              run.totals.acceptance_rate(), run.totals.mean_acceptance_length());
}

// CI's long prompt (2.7K tokens, many pages, KVzip's chunked reconstruction): KVzip at c = 0.25,
// x = 16, identical to full-KV decoding. Every token dropper on two long prompts is
// Lossless.LongPrompts, in the slow suite.
TEST(Lossless, ALongPrompt) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::vector<GenerationRequest> requests = {request_for(long_prompt(1), 24)};
  ASSERT_GE(requests[0].prompt.size(), 2000u);
  expect_long_prompts_lossless(*m, "kvzip", requests, full_kv(*m, requests));
}

// Long prompts (3.2K and 2.7K tokens): every plugin at c = 0.25, two requests per engine. Slow suite only
// (tests/CMakeLists.txt: VC_SLOW_TESTS); CI's long prompt is Lossless.ALongPrompt's.
TEST(Lossless, LongPrompts) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::vector<GenerationRequest> requests = {request_for(long_prompt(0), 24), request_for(long_prompt(1), 24)};
  ASSERT_GE(requests[0].prompt.size(), 2000u);
  const std::vector<GenerationResult> reference = full_kv(*m, requests);
  for (const std::string& name : testing::bundled_plugin_names(CompressorFamily::kTokenDropping))
    expect_long_prompts_lossless(*m, name, requests, reference);
}

// Qwen2.5-Coder 0.5B (qwen2): two medium prompts in one batch, every plugin (droppers at c = 0.25,
// quantizers at their default bits; RotateKV's keys rotated two KV heads together) with x = 16:
// every request identical to full-KV decoding.
TEST(Lossless, Qwen2EveryPlugin) {
  const LlamaModel* m = testing::qwen_model();
  ASSERT_NE(m, nullptr);
  testing::expect_every_plugin_lossless(*m, "Qwen2.5-Coder 0.5B", {16}, {0, 3});
}

// The same with a third prompt of 2K+ tokens in the batch, at x = 4 and 16. Slow suite only
// (tests/CMakeLists.txt: VC_SLOW_TESTS).
TEST(Lossless, Qwen2EveryPluginWithALongPrompt) {
  const LlamaModel* m = testing::qwen_model();
  ASSERT_NE(m, nullptr);
  testing::expect_every_plugin_lossless(*m, "Qwen2.5-Coder 0.5B", {4, 16});
}

TEST(Engine, SmallPoolMakesRequestsWaitNotFail) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  auto compressor = plugin("snapkv");
  EngineOptions options;
  options.compressor = compressor.get();
  options.draft_length = 8;
  std::vector<GenerationRequest> requests;
  int64_t largest = 0, largest_host = 0;
  for (int i = 0; i < 6; ++i) {
    requests.push_back(request_for(medium(i + 3), 24));
    const auto d = DraftVerifyEngine::pages_for_request(*m, options, 16, 16, requests.back());
    largest = std::max(largest, d.device);
    largest_host = std::max(largest_host, d.host);
  }
  // Room for the largest request and a little more: the others wait their turn.
  const EngineRun run = run_engine(*m, options, requests, largest + 40, largest_host + 40);
  EXPECT_GE(run.max_queued, 4);
  expect_identical(run, full_kv(*m, requests), "small pool");

  // A request that can never fit is refused up front, with the numbers.
  auto device = m->make_page_pool(16, 100);
  auto host = m->make_page_pool(16, 100);
  DraftVerifyEngine engine(*m, *device, *host, options);
  const auto id = engine.add_request(requests[0]);
  EXPECT_EQ(id.status().message(),
            "request 0 can never fit: it needs up to " +
                std::to_string(DraftVerifyEngine::pages_for_request(*m, options, 16, 16, requests[0]).device) +
                " resident device pages (pool: 100) and " +
                std::to_string(DraftVerifyEngine::pages_for_request(*m, options, 16, 16, requests[0]).host) +
                " host pages (pool: 100)");
  GenerationRequest empty;
  EXPECT_EQ(engine.add_request(empty).status().message(), "request 0: the prompt is empty");
}

// Admission by the compressed cache (issue 30): at a fixed device budget that holds two full-KV
// requests, SnapKV at c = 0.25 admits six at once. The numbers, SmolLM2 (30 layers), pages of 16
// slots, prompts of 400 tokens, 16 new tokens, x = 4: a full cache needs 30 * ceil(416 / 16) = 780
// pages (Generator::pages_needed), so the budget is 1,560 pages; SnapKV's kept set is 30 * 100 slots,
// reserved with 16 + 4 slots of growth and a partly filled last page per layer:
// (3,000 + 30 * (20 + 15)) / 16 = 253 pages, and 1,560 / 253 = 6 requests (3x, >= floor(1/c) - 1).
// Without a compressor (KV_comp a full copy) the same pool admits one. All eight requests then run
// to the end without an allocation failing, token-identical to full-KV decoding.
TEST(Engine, AdmitsByTheCompressedCacheNotTheFullOne) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r = request_for(long_prompt(i), 16);
    r.prompt.resize(400);
    requests.push_back(std::move(r));
  }
  const int64_t full_kv_pages = Generator::pages_needed(*m, 16, std::span(requests).first(1));
  ASSERT_EQ(full_kv_pages, 780);
  const int64_t budget = 2 * full_kv_pages;
  auto snapkv = plugin("snapkv");
  EngineOptions options;
  options.compressor = snapkv.get();
  options.draft_length = 4;
  EXPECT_EQ(DraftVerifyEngine::pages_for_request(*m, options, 16, 16, requests[0]).device, 253);
  const auto host_pages = DraftVerifyEngine::pages_for_requests(*m, options, 16, 16, requests).host;
  auto admitted_at_once = [&](Compressor* c) {
    EngineOptions o = options;
    o.compressor = c;
    auto pools = make_engine_pools(*m, o, 16, requests, PoolOverrides{budget, 0, host_pages});
    EXPECT_TRUE(pools.ok());
    DraftVerifyEngine engine(*m, pools->device, pools->host, o);
    for (const GenerationRequest& r : requests) EXPECT_TRUE(engine.add_request(r).ok());
    engine.admit();
    return engine.active();
  };
  EXPECT_EQ(admitted_at_once(snapkv.get()), 6);
  EXPECT_EQ(admitted_at_once(nullptr), 1);
  // bench-budget's sizing: full-KV decoding fits 2 of these requests, VeriCache in place 6 (253
  // pages each: c * 400 per layer and the 20 slots still to come, page-rounded per layer), which is
  // (floor(1/c) - 1) = 3 times as many, and the engine admits exactly that many at once. Verifying
  // over a link takes a ring of one KV_full copy (810 pages) from the budget: 2 then.
  const BudgetBatches in_place = batches_within_budget(*m, options, 16, requests[0], budget, 1);
  EXPECT_EQ(in_place.full_kv, 2);
  EXPECT_EQ(in_place.resident_pages_per_request, 253);
  EXPECT_EQ(in_place.vericache, 6);
  EXPECT_EQ(admitted_at_once(snapkv.get()), in_place.vericache);
  TransferEngine link;
  EngineOptions over_link = options;
  over_link.transfer = &link;
  const BudgetBatches copied = batches_within_budget(*m, over_link, 16, requests[0], budget, 1);
  EXPECT_EQ(copied.transient_pages, 810);
  EXPECT_EQ(copied.vericache, 2);
  const EngineRun run = run_engine(*m, options, requests, budget, host_pages);
  EXPECT_EQ(run.max_queued, 2);
  expect_identical(run, full_kv(*m, requests), "snapkv at a fixed device budget");
  for (const EngineResult& r : run.results) EXPECT_EQ(r.compressor_failure, "");
}

// KVzap drops tokens after every verify window while drafts are rolled back and requests join
// and leave between steps.
TEST(Engine, OnlineCompressorWithRollbackAndJoiningRequests) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  auto compressor = plugin("kvzap");
  ASSERT_NE(compressor, nullptr);
  for (DraftKv mode : {DraftKv::kDrafted, DraftKv::kVerified}) {
    EngineOptions options;
    options.compressor = compressor.get();
    options.ratio = 0.25;
    options.draft_length = 6;
    options.draft_kv = mode;
    std::vector<GenerationRequest> requests = {request_for(medium(20), 12), request_for(medium(21), 30),
                                               request_for(medium(22), 20), request_for(medium(23), 26)};
    requests[3].ignore_eos = true;
    const std::vector<int64_t> join_at_step = {0, 0, 5, 17};
    const auto all = DraftVerifyEngine::pages_for_requests(*m, options, 16, 16, requests);
    auto device = m->make_page_pool(16, all.device);
    auto host = m->make_page_pool(16, all.host);
    std::vector<EngineResult> results;
    {
      DraftVerifyEngine engine(*m, *device, *host, options);
      size_t joined = 0;
      for (int64_t step = 0; joined < requests.size() || !engine.idle(); ++step) {
        while (joined < requests.size() && join_at_step[joined] <= step)
          ASSERT_TRUE(engine.add_request(requests[joined++]).ok());
        ASSERT_TRUE(engine.step().ok());
        ASSERT_LT(step, 10000);
      }
      results = engine.take_finished();
      const RequestMetrics& t = engine.totals();
      EXPECT_LT(t.accepted_tokens, t.draft_tokens) << "no draft was rejected: nothing was rolled back";
      EXPECT_LT(t.resident_kv_slots, t.full_kv_slots);
    }
    std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) { return a.request_id < b.request_id; });
    EngineRun run;
    run.results = results;
    expect_identical(run, full_kv(*m, requests), std::string("kvzap, K/V ") + draft_kv_name(mode));
    for (const EngineResult& r : results) EXPECT_EQ(r.compressor_failure, "");
    EXPECT_EQ(device->num_free(), device->num_pages());
  }
}

// An online compressor that keeps everything and counts the rows update() is handed, by whether
// they are the prompt's (position < prompt_length) or decoded.
class RowCounter : public CompressorBase {
 public:
  RowCounter(DecodeRows decode_rows, int64_t prompt_length)
      : CompressorBase("row_counter", CompressorFamily::kTokenDropping, CompressionMode::kOnline, kAllScenarios,
                       decode_rows),
        prompt_length_(prompt_length) {}
  int64_t prompt_rows = 0, decode_rows_seen = 0;

 protected:
  Status update_impl(const LayerActivations& acts, std::vector<LayerDrops>*) override {
    if (acts.layer != 0) return Status();
    const at::Tensor positions = acts.positions.to(at::kCPU);
    for (int64_t i = 0; i < positions.numel(); ++i) {
      ++(positions[i].item<int64_t>() < prompt_length_ ? prompt_rows : decode_rows_seen);
    }
    return Status();
  }

 private:
  int64_t prompt_length_;
};

// update() is handed decode rows (the committed rows of each window) only when the compressor
// declares DecodeRows::kObserved; with kIgnored the engine skips every decode forward's calls, and
// both see the whole prompt and decode the same tokens as full KV (windows of 0 and 3 drafts).
TEST(Engine, DecodeRowsReachUpdateOnlyWhenTheCompressorAsksForThem) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::vector<GenerationRequest> requests = {request_for(medium(5), 16)};
  const auto n = static_cast<int64_t>(requests[0].prompt.size());
  const std::vector<GenerationResult> reference = full_kv(*m, requests);
  for (DecodeRows mode : {DecodeRows::kObserved, DecodeRows::kIgnored}) {
    RowCounter counter(mode, n);
    EngineOptions options;
    options.compressor = &counter;
    options.ratio = 0.5;
    options.draft_length = 3;
    options.draft_policy.test_windows = {0, 3};
    const EngineRun run = run_engine(*m, options, requests);
    const std::string label = mode == DecodeRows::kObserved ? "observed" : "ignored";
    expect_identical(run, reference, label);
    EXPECT_EQ(counter.prompt_rows, n) << label;
    const int64_t decoded = static_cast<int64_t>(run.results[0].generation.tokens.size());
    if (mode == DecodeRows::kObserved) {
      EXPECT_GE(counter.decode_rows_seen, decoded - 1) << "every committed row but the last token's";
    } else {
      EXPECT_EQ(counter.decode_rows_seen, 0);
    }
  }
}

TEST(Engine, FailingCompressorFallsBackToFullKv) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  auto loaded = load_compressor(std::string(VC_FIXTURE_PLUGIN_DIR) + "/vc_plugin_throwing_compress.so", "{}");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EngineOptions options;
  options.compressor = loaded->get();
  const std::vector<GenerationRequest> requests = {request_for(medium(5), 16), request_for(medium(6), 16)};
  const EngineRun run = run_engine(*m, options, requests);
  expect_identical(run, full_kv(*m, requests), "failing compressor");
  for (const EngineResult& r : run.results) {
    EXPECT_EQ(r.compressor_failure, "throwing_compress: scores went NaN");
    EXPECT_EQ(r.metrics.drafts, 0);
  }
}

// A quantizer whose unpack() fails once, in the middle of drafting: the request whose read failed
// falls back to full KV with the failure recorded, the other keeps drafting on its packed cache,
// and both outputs are full-KV greedy.
TEST(Engine, FailingUnpackFallsBackForThatRequestOnly) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  // Each draft step of the two requests reads 30 layers of each: call 92 falls in a later draft step.
  auto loaded = load_compressor(std::string(VC_FIXTURE_PLUGIN_DIR) + "/vc_plugin_failing_unpack.so", R"({"fail_at": 92})");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  ASSERT_TRUE((*loaded)->attach(m->shape()).ok());
  EngineOptions options;
  options.compressor = loaded->get();
  options.draft_length = 8;
  const std::vector<GenerationRequest> requests = {request_for(medium(5), 32), request_for(medium(6), 32)};
  const EngineRun run = run_engine(*m, options, requests);
  expect_identical(run, full_kv(*m, requests), "failing unpack");
  ASSERT_EQ(run.results.size(), 2u);
  int failed = 0;
  for (const EngineResult& r : run.results) {
    if (r.compressor_failure.empty()) {
      EXPECT_GT(r.metrics.drafts, 1) << "request " << r.request_id << " kept drafting on its packed cache";
    } else {
      ++failed;
      EXPECT_EQ(r.compressor_failure, "failing_unpack: unpack failed on purpose (call 92)");
    }
  }
  EXPECT_EQ(failed, 1);
}

// Verification from copies of KV_full in transient pages, filled over an emulated link while the
// requests draft; transient pages for one window at a time, so windows queue for them.
TEST(Engine, VerifyFromTransientCopiesOverAnEmulatedLink) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  auto compressor = plugin("snapkv");
  TransferEngine transfer(TransferOptions{2e9});
  EngineOptions options;
  options.compressor = compressor.get();
  options.draft_length = 8;
  options.transfer = &transfer;
  std::vector<GenerationRequest> requests;
  int64_t largest_transient = 0;
  for (int i = 0; i < 4; ++i) {
    requests.push_back(request_for(medium(30 + i), 20));
    largest_transient = std::max(largest_transient,
                                 DraftVerifyEngine::pages_for_request(*m, options, 16, 16, requests.back()).transient);
  }
  const auto all = DraftVerifyEngine::pages_for_requests(*m, options, 16, 16, requests);
  auto device = PagePool::create(m->kv_page_spec(16),
                                 PagePoolOptions{all.device, largest_transient, at::kFloat, at::kCPU, false});
  auto host = m->make_page_pool(16, all.host);
  ASSERT_TRUE(device.ok() && host.ok());
  EngineRun run;
  {
    DraftVerifyEngine engine(*m, *device, *host, options);
    for (const auto& r : requests) ASSERT_TRUE(engine.add_request(r).ok());
    ASSERT_TRUE(engine.run().ok());
    run.results = engine.take_finished();
    run.totals = engine.totals();
  }
  std::sort(run.results.begin(), run.results.end(),
            [](const auto& a, const auto& b) { return a.request_id < b.request_id; });
  expect_identical(run, full_kv(*m, requests), "verify from transient copies");
  const TransferStats stats = transfer.stats();
  EXPECT_EQ(stats.transfers, run.totals.verify_windows);
  EXPECT_EQ(stats.bytes, run.totals.transfer_bytes);
  EXPECT_GT(stats.bytes, 0);
  EXPECT_EQ(transfer.describe(), "emulated link at 2.00 GB/s");
  EXPECT_EQ(device->num_free(PageKind::kTransient), largest_transient);
  EXPECT_EQ(device->num_free(PageKind::kResident), all.device);

  // Too few transient pages for one window: refused up front.
  auto tiny = PagePool::create(m->kv_page_spec(16), PagePoolOptions{all.device, 30, at::kFloat, at::kCPU, false});
  DraftVerifyEngine engine(*m, *tiny, *host, options);
  EXPECT_EQ(engine.add_request(requests[0]).status().message(),
            "request 0 can never be verified: its full cache needs up to " +
                std::to_string(DraftVerifyEngine::pages_for_request(*m, options, 16, 16, requests[0]).transient) +
                " transient device pages (pool: 30)");
}

// The reload scheduler drives when each request reloads KV_full (over an emulated link) and
// verifies, under each policy: output identical to full-KV decoding every time, and the policy's
// shape visible in the steps: staggered keeps the transient pages in use within the memory it is
// given (one and a half of the largest copy) and spreads verifies among drafting steps; lockstep
// verifies every running request in the same steps, overbooking that memory; no-overlap stalls
// every verify on its own copy.
class StepLog : public StatsSink {
 public:
  void on_step(const StepRecord& s) override { steps.push_back(s); }
  std::vector<StepRecord> steps;
};

TEST(Engine, EveryReloadPolicyIsLossless) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  auto compressor = plugin("snapkv");
  ASSERT_NE(compressor, nullptr);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(request_for(medium(12 + i), 24));
  for (const sched::ReloadPolicy policy :
       {sched::ReloadPolicy::kStaggered, sched::ReloadPolicy::kLockstep, sched::ReloadPolicy::kNoOverlap}) {
    const std::string label = sched::policy_name(policy);
    TransferEngine transfer(TransferOptions{4e9});
    sched::ReloadSchedulerOptions so;
    so.policy = policy;
    so.window = 16;
    so.draft_length = 4;
    so.iteration_seconds = 0.02;
    so.link_bandwidth = 4e9;
    StepLog log;
    EngineOptions options;
    options.compressor = compressor.get();
    options.draft_length = 4;
    options.transfer = &transfer;
    options.sink = &log;
    // Pages sized with the scheduler's window, as the engine will draft with it (x = window - 2).
    sched::ReloadScheduler sizing(so);
    options.scheduler = &sizing;
    int64_t largest_transient = 0;
    for (const auto& r : requests) {
      largest_transient =
          std::max(largest_transient, DraftVerifyEngine::pages_for_request(*m, options, 16, 16, r).transient);
    }
    const auto all = DraftVerifyEngine::pages_for_requests(*m, options, 16, 16, requests);
    auto device = PagePool::create(m->kv_page_spec(16),
                                   PagePoolOptions{all.device, all.transient, at::kFloat, at::kCPU, false});
    auto host = m->make_page_pool(16, all.host);
    ASSERT_TRUE(device.ok() && host.ok());
    // Room for one request's copy and a half: the staggered policy must never hold two at once.
    so.memory_capacity_bytes = 1.5 * static_cast<double>(largest_transient * device->page_bytes());
    sched::ReloadScheduler scheduler(so);
    options.scheduler = &scheduler;
    EngineRun run;
    {
      DraftVerifyEngine engine(*m, *device, *host, options);
      for (const auto& r : requests) ASSERT_TRUE(engine.add_request(r).ok());
      const Status s = engine.run();
      ASSERT_TRUE(s.ok()) << label << ": " << s.message();
      run.results = engine.take_finished();
      run.totals = engine.totals();
    }
    std::sort(run.results.begin(), run.results.end(),
              [](const auto& a, const auto& b) { return a.request_id < b.request_id; });
    expect_identical(run, full_kv(*m, requests), label);
    EXPECT_EQ(transfer.stats().transfers, run.totals.verify_windows) << label;
    EXPECT_EQ(device->num_free(PageKind::kTransient), all.transient) << label << ": transient pages leaked";
    int64_t most_verifies = 0, mixed_steps = 0, verify_steps = 0, stalled_verify_steps = 0;
    for (const StepRecord& s : log.steps) {
      most_verifies = std::max(most_verifies, s.verify_items);
      if (s.verify_items > 0 && s.draft_items > 0) ++mixed_steps;
      if (s.verify_items > 0) ++verify_steps;
      if (s.verify_items > 0 && s.stall_seconds > 0) ++stalled_verify_steps;
    }
    const double peak_bytes = static_cast<double>(device->peak_in_use(PageKind::kTransient) * device->page_bytes());
    std::printf("%-10s steps %3zu  verify steps %3lld (stalled %3lld)  most verifies in a step %lld  steps mixing "
                "drafts and verifies %3lld  peak transient %.1f MB (capacity %.1f MB)\n",
                label.c_str(), log.steps.size(), static_cast<long long>(verify_steps),
                static_cast<long long>(stalled_verify_steps), static_cast<long long>(most_verifies),
                static_cast<long long>(mixed_steps), peak_bytes / 1e6, so.memory_capacity_bytes / 1e6);
    EXPECT_GT(run.totals.mean_acceptance_length(), 1.0) << label;
    switch (policy) {
      case sched::ReloadPolicy::kStaggered:
        EXPECT_LE(peak_bytes, so.memory_capacity_bytes) << label << ": the memory ring was not respected";
        EXPECT_GT(mixed_steps, 0) << label << ": verifies were not spread over steps";
        break;
      case sched::ReloadPolicy::kLockstep:
        // The first verify comes after every prompt is in: from then on all verify together.
        EXPECT_EQ(most_verifies, 4) << label;
        EXPECT_EQ(mixed_steps, 0) << label;
        EXPECT_GT(peak_bytes, so.memory_capacity_bytes) << label << ": four copies at once exceed the capacity";
        break;
      case sched::ReloadPolicy::kNoOverlap:
        EXPECT_EQ(stalled_verify_steps, verify_steps) << label << ": a copy that starts at its verify must stall it";
        break;
    }
  }
}

// Which thread computes which range never changes a result: at 1, 2 and 3 kernel threads and at
// the default (every core) the engine with a compressor gives the same tokens and the same logits,
// bit for bit, for every committed token of greedy and of seeded sampled requests.
class LogitLog : public StatsSink {
 public:
  void on_token_logits(int64_t request, int64_t position, std::span<const float> logits) override {
    rows[{request, position}].assign(logits.begin(), logits.end());
  }
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> rows;
};

TEST(Engine, IdenticalAtAnyThreadCount) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  auto compressor = plugin("snapkv");
  ASSERT_NE(compressor, nullptr);
  std::vector<GenerationRequest> requests = {request_for(medium(2), 16), request_for(medium(9), 16),
                                             request_for(medium(11), 16)};
  requests[2].sampling = {0.8, 0, 1.0, 42};
  const int every_core = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<EngineResult> first;
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> first_rows;
  for (const int threads : {1, 2, 3, every_core}) {
    ThreadPool::set_global_threads(threads);
    at::set_num_threads(threads);
    LogitLog log;
    EngineOptions options;
    options.compressor = compressor.get();
    options.ratio = 0.1;
    options.draft_length = 5;
    options.sink = &log;
    const EngineRun run = run_engine(*m, options, requests);
    ASSERT_EQ(run.results.size(), requests.size());
    EXPECT_GT(run.totals.draft_tokens, run.totals.accepted_tokens) << "no draft was rolled back";
    if (first.empty()) {
      first = run.results;
      first_rows = log.rows;
      continue;
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(run.results[i].generation.tokens, first[i].generation.tokens) << threads << " threads, request " << i;
    }
    EXPECT_EQ(log.rows.size(), first_rows.size()) << threads << " threads";
    for (const auto& [key, row] : log.rows) {
      const auto it = first_rows.find(key);
      ASSERT_NE(it, first_rows.end()) << threads << " threads";
      EXPECT_EQ(std::memcmp(row.data(), it->second.data(), row.size() * sizeof(float)), 0)
          << threads << " threads: request " << key.first << ", position " << key.second << " logits differ";
    }
  }
  ThreadPool::set_global_threads(every_core);
  at::set_num_threads(every_core);
}

TEST(Engine, SchedulerMustPlanTheEnginesDraftLength) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  auto device = m->make_page_pool(16, 10);
  auto host = m->make_page_pool(16, 10);
  sched::ReloadSchedulerOptions so;
  so.draft_length = 8;
  so.iteration_seconds = 0.01;
  so.link_bandwidth = 1e9;
  sched::ReloadScheduler scheduler(so);
  EngineOptions options;
  options.draft_length = 4;
  options.scheduler = &scheduler;
  DraftVerifyEngine engine(*m, *device, *host, options);
  EXPECT_EQ(engine.validate_options().message(), "the reload scheduler plans for draft length 8 but the engine's is 4");
}

TEST(Engine, RejectsBadOptions) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  auto device = m->make_page_pool(16, 10);
  auto host = m->make_page_pool(16, 10);
  EngineOptions options;
  options.draft_length = 0;
  DraftVerifyEngine engine(*m, *device, *host, options);
  EXPECT_EQ(engine.add_request(request_for(medium(0), 4)).status().message(),
            "draft length must be in [1, 1024], got 0");
  options.draft_length = 4;
  options.ratio = 1.5;
  DraftVerifyEngine engine2(*m, *device, *host, options);
  EXPECT_EQ(engine2.validate_options().message(), "ratio must be in (0, 1], got 1.500000");
  options.ratio = 0.25;
  options.draft_policy.kind = DraftPolicyKind::kTiers;
  options.draft_policy.tier_down = 0.9;  // above tier_up
  EXPECT_EQ(DraftVerifyEngine(*m, *device, *host, options).validate_options().message(),
            "the tiers policy needs 0 <= down <= up <= 1 and smoothing in (0, 1]");
  options.draft_policy = {};
  options.draft_policy.test_windows = {2, -1};
  EXPECT_EQ(DraftVerifyEngine(*m, *device, *host, options).validate_options().message(),
            "test windows must be >= 0");
}

// ---- Sampling (T > 0) ----------------------------------------------------------------------

// Full-KV and compressed-cache logits after the prompt plus a continuation, computed by real
// forwards over caches built the engine's way (prefill, compress), rolled back after each.
class Distributions {
 public:
  Distributions(const LlamaModel& m, Compressor& compressor, const std::vector<int32_t>& prompt, double ratio)
      : m_(m),
        full_(testing::run_compression(m, identity_, prompt, 1.0)),
        comp_(testing::run_compression(m, compressor, prompt, ratio)),
        n_(static_cast<int64_t>(prompt.size())) {
    EXPECT_TRUE(full_->status.ok() && comp_->status.ok());
    // The prompt's own next-token logits (what the engine's prefill gives), from a fresh prefill.
    auto pool = m.make_page_pool(16, m.config().n_layers * (n_ / 16 + 2));
    SequenceKv kv(m.config().n_layers);
    std::vector<int32_t> positions(prompt.size());
    for (size_t i = 0; i < prompt.size(); ++i) positions[i] = static_cast<int32_t>(i);
    ForwardItem item{prompt, positions, &kv, &*pool, LogitRows::kLast, 0};
    at::Tensor out;
    EXPECT_TRUE(m.forward(std::span(&item, 1), &out).ok());
    first_.assign(out[0].data_ptr<float>(), out[0].data_ptr<float>() + m.config().vocab_size);
    kv.release(*pool);
  }

  const std::vector<float>& after_prompt() const { return first_; }
  // Logits [vocab] of the full (or compressed) cache after the prompt and `continuation` (not empty).
  const std::vector<float>& logits(bool full, const std::vector<int32_t>& continuation) {
    auto& memo = full ? full_memo_ : comp_memo_;
    auto it = memo.find(continuation);
    if (it != memo.end()) return it->second;
    testing::CompressionRun& run = full ? *full_ : *comp_;
    std::vector<int32_t> positions;
    for (size_t i = 0; i < continuation.size(); ++i)
      positions.push_back(static_cast<int32_t>(n_ + static_cast<int64_t>(i)));
    ForwardItem item{continuation, positions, &run.kv, &run.pool, LogitRows::kLast, 0};
    at::Tensor out;
    EXPECT_TRUE(m_.forward(std::span(&item, 1), &out).ok());
    run.kv.truncate_positions(run.pool, n_);
    const float* p = out[0].data_ptr<float>();
    return memo.emplace(continuation, std::vector<float>(p, p + m_.config().vocab_size)).first->second;
  }

 private:
  class Identity : public CompressorBase {  // keeps everything: the full cache
   public:
    Identity()
        : CompressorBase("identity", CompressorFamily::kTokenDropping, CompressionMode::kOnline, kAllScenarios) {}
  };
  const LlamaModel& m_;
  Identity identity_;
  std::unique_ptr<testing::CompressionRun> full_, comp_;
  int64_t n_;
  std::vector<float> first_;
  std::map<std::vector<int32_t>, std::vector<float>> full_memo_, comp_memo_;
};

// The engine's loop replayed on real logits for thousands of seeds: the first token from the
// full-KV prefill, then windows of x = 2 drafts verified with verify_sampled, as the engine runs
// them. The first one, two and three tokens must follow full-KV sampling exactly. Slow suite only
// (tests/CMakeLists.txt: VC_SLOW_TESTS): CI tests the engine itself (EngineDistribution.*).
TEST(Sampling, OutputFollowsTheFullKvDistribution) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  auto compressor = plugin("expected_attention");
  ASSERT_NE(compressor, nullptr);
  Distributions d(*m, *compressor, medium(7).ids, 0.1);
  const int64_t vocab = m->config().vocab_size, n = 20000;
  for (double temperature : {0.3, 0.7, 1.0}) {
    const SamplingParams params{temperature, 4, 1.0, 0};
    // Dense distributions per context, computed once per temperature.
    std::map<std::vector<int32_t>, std::vector<float>> p_memo, q_memo;
    auto p = [&](const std::vector<int32_t>& ctx) -> const std::vector<float>& {
      auto it = p_memo.find(ctx);
      if (it == p_memo.end())
        it = p_memo.emplace(ctx, dense_distribution(d.logits(true, ctx).data(), vocab, params)).first;
      return it->second;
    };
    auto q = [&](const std::vector<int32_t>& ctx) -> const std::vector<float>& {
      auto it = q_memo.find(ctx);
      if (it == q_memo.end())
        it = q_memo.emplace(ctx, dense_distribution(d.logits(false, ctx).data(), vocab, params)).first;
      return it->second;
    };
    // Exact full-KV probabilities of the first one, two and three tokens.
    std::map<std::vector<int32_t>, double> expected[3];
    const std::vector<float> p0 = dense_distribution(d.after_prompt().data(), vocab, params);
    for (int32_t a = 0; a < vocab; ++a) {
      if (p0[a] <= 0) continue;
      expected[0][{a}] = p0[a];
      const std::vector<float>& p1 = p({a});
      for (int32_t b = 0; b < vocab; ++b) {
        if (p1[b] <= 0) continue;
        expected[1][{a, b}] = static_cast<double>(p0[a]) * p1[b];
        const std::vector<float>& p2 = p({a, b});
        for (int32_t c = 0; c < vocab; ++c) {
          if (p2[c] > 0) expected[2][{a, b, c}] = static_cast<double>(p0[a]) * p1[b] * p2[c];
        }
      }
    }
    for (DraftSampling mode : {DraftSampling::kSampled, DraftSampling::kArgmax}) {
      std::map<std::vector<int32_t>, int64_t> counts[3];
      int64_t accepted = 0, drafted = 0;
      for (int64_t seed = 0; seed < n; ++seed) {
        Rng rng(seed), draft_rng(seed ^ 0x5851f42d4c957f2dull);
        std::vector<int32_t> out{select_token(d.after_prompt().data(), vocab, params, rng)};
        while (out.size() < 3) {
          std::vector<int32_t> drafts, ctx = out;
          std::vector<std::vector<float>> qs;
          for (int i = 0; i < 2; ++i) {
            qs.push_back(q(ctx));
            const int32_t t = mode == DraftSampling::kArgmax ? argmax(d.logits(false, ctx).data(), vocab)
                                                             : sample_dense(qs.back(), draft_rng);
            drafts.push_back(t);
            ctx.push_back(t);
          }
          std::vector<std::vector<float>> rows;
          for (int i = 0; i <= 2; ++i) {
            std::vector<int32_t> prefix = out;
            prefix.insert(prefix.end(), drafts.begin(), drafts.begin() + i);
            rows.push_back(p(prefix));
          }
          const WindowVerdict v = verify_sampled(drafts, qs, mode, rows, rng);
          accepted += v.accepted;
          drafted += 2;
          for (int64_t i = 0; i < v.accepted; ++i) out.push_back(drafts[i]);
          out.push_back(v.next);
        }
        for (int k = 0; k < 3; ++k) ++counts[k][std::vector<int32_t>(out.begin(), out.begin() + k + 1)];
      }
      std::printf("T=%.1f %-7s drafts: acceptance %.3f", temperature, draft_sampling_name(mode),
                  static_cast<double>(accepted) / drafted);
      for (int k = 0; k < 3; ++k) {
        const testing::GoodnessOfFit g = testing::goodness_of_fit(counts[k], expected[k], n);
        std::printf(" | %d token%s chi2 %.1f (dof %d, p %.2g)", k + 1, k ? "s" : "", g.chi2, g.dof, g.p_value);
        EXPECT_GE(g.p_value, 0.001) << "T=" << temperature << " " << draft_sampling_name(mode) << ", " << k + 1
                                    << " tokens: chi2 " << g.chi2 << " (dof " << g.dof << "), " << g.outside_support
                                    << " outputs outside the full-KV support";
      }
      std::printf("\n");
      EXPECT_LT(accepted, drafted) << "no rejection: the test would not exercise the residual";
    }
  }
}

// The engine itself at T > 0: the same seeds give the same outputs, and every emitted token lies in
// the full-KV top-k at its position (a draft from the compressed cache outside it must be rejected).
TEST(Sampling, EngineIsSeededAndStaysInTheTargetSupport) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  auto compressor = plugin("expected_attention");
  const Prompt story{"story", testing::prompt_ids(*m, "Tell me a short story about a cat who learns to sail.", true)};
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 8; ++i) {
    requests.push_back(request_for(story, 12));
    requests.back().sampling = {1.0, 3, 1.0, static_cast<uint64_t>(100 + i)};
  }
  for (DraftSampling mode : {DraftSampling::kSampled, DraftSampling::kArgmax}) {
    EngineOptions options;
    options.compressor = compressor.get();
    options.ratio = 0.1;
    options.draft_length = 4;
    options.draft_sampling = mode;
    const EngineRun a = run_engine(*m, options, requests);
    const EngineRun b = run_engine(*m, options, requests);
    ASSERT_EQ(a.results.size(), requests.size());
    std::set<std::vector<int32_t>> distinct;
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(a.results[i].generation.tokens, b.results[i].generation.tokens) << "request " << i;
      distinct.insert(a.results[i].generation.tokens);
      // Full-KV logits at every output position, in one forward over prompt + output.
      std::vector<int32_t> all = requests[i].prompt;
      const std::vector<int32_t>& out = a.results[i].generation.tokens;
      all.insert(all.end(), out.begin(), out.end());
      std::vector<int32_t> positions(all.size());
      for (size_t j = 0; j < all.size(); ++j) positions[j] = static_cast<int32_t>(j);
      auto pool = m->make_page_pool(16, m->config().n_layers * (static_cast<int64_t>(all.size()) / 16 + 2));
      SequenceKv kv(m->config().n_layers);
      ForwardItem item{all, positions, &kv, &*pool, LogitRows::kAll, 0};
      at::Tensor logits;
      ASSERT_TRUE(m->forward(std::span(&item, 1), &logits).ok());
      for (size_t j = 0; j < out.size(); ++j) {
        const std::vector<float> p = dense_distribution(logits[requests[i].prompt.size() - 1 + j].data_ptr<float>(),
                                                        m->config().vocab_size, requests[i].sampling);
        EXPECT_GT(p[out[j]], 0.0f) << "request " << i << ", token " << j << " is outside the full-KV top-3";
      }
      kv.release(*pool);
    }
    EXPECT_GT(distinct.size(), 1u) << "different seeds should give different samples";
    EXPECT_LT(a.totals.accepted_tokens, a.totals.draft_tokens);
  }
}

}  // namespace
}  // namespace vericache
