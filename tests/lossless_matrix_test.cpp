// The whole lossless matrix of the draft-verify issue: 50 prompts (datasets/lossless_prompts) x
// every bundled plugin x c in {0.1, 0.25, 0.5} x x in {1, 4, 16, 32} x batches of 1 and 8 requests;
// greedy output must equal full-KV decoding (Generator) for every request of every case.
// Hours on 2 cores, so not part of `ctest -L cpu`: run it with `ctest --test-dir build -L matrix`
// or build/tests/lossless_matrix_tests. Environment:
//   VERICACHE_MATRIX_PROMPTS  how many prompts (default 50; fewer for a quick look)
//   VERICACHE_MATRIX_OUT      write a markdown table of the cases there (results/...)
// To keep it affordable the offline plugins share work: each group of 8 prompts is prefilled once
// with every offline plugin observing, each plugin compresses once per ratio, and every (x, batch)
// case starts its requests from copies of that prefill (DraftVerifyEngine::add_prefilled). KVzap,
// an online compressor whose state starts at the prefill, runs every case from its own prefill.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "compression_support.h"
#include "engine/compression.h"
#include "engine/draft_verify_engine.h"
#include "engine/generator.h"
#include "test_support.h"

namespace vericache {
namespace {

constexpr int64_t kMaxTokens = 32;
constexpr int kGroup = 8;
const double kRatios[] = {0.1, 0.25, 0.5};
const int64_t kDraftLengths[] = {1, 4, 16, 32};

// A prompt prefilled once: its full cache, the logits after it, and each offline plugin's kept set
// per ratio.
struct Prefilled {
  std::vector<int32_t> ids;
  SequenceKv kv;
  std::vector<float> next_logits;
  std::map<std::string, std::vector<std::vector<at::Tensor>>> kept;  // plugin -> [ratio] kept set
};

struct CaseResult {
  int64_t requests = 0, mismatched = 0, drafts = 0, accepted = 0, drafted = 0;
};

// Runs `requests` through one engine and counts the requests whose output differs from `reference`.
void run_case(const LlamaModel& m, const EngineOptions& options, const std::vector<GenerationRequest>& requests,
              const std::vector<const Prefilled*>& prefilled, const PagePool* prefill_pool, size_t ratio_index,
              const std::vector<GenerationResult>& reference, CaseResult* out) {
  const auto need = DraftVerifyEngine::pages_for_requests(m, options, 16, 16, requests);
  auto device = m.make_page_pool(16, need.device);
  auto host = m.make_page_pool(16, need.host);
  ASSERT_TRUE(device.ok() && host.ok());
  DraftVerifyEngine engine(m, *device, *host, options);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (prefilled.empty()) {
      ASSERT_TRUE(engine.add_request(requests[i]).ok());
    } else {
      const Prefilled& p = *prefilled[i];
      ASSERT_TRUE(engine
                      .add_prefilled(requests[i], p.kv, *prefill_pool, p.next_logits,
                                     p.kept.at(options.compressor->name())[ratio_index])
                      .ok());
    }
  }
  ASSERT_TRUE(engine.run().ok());
  std::vector<EngineResult> results = engine.take_finished();
  ASSERT_EQ(results.size(), requests.size());
  for (const EngineResult& r : results) {
    EXPECT_EQ(r.compressor_failure, "");
    const bool same =
        r.generation.tokens == reference[r.request_id].tokens && r.generation.finish == reference[r.request_id].finish;
    EXPECT_TRUE(same) << options.compressor->name() << " c=" << options.ratio << " x=" << options.draft_length
                      << " batch=" << requests.size() << ", request " << r.request_id;
    out->mismatched += same ? 0 : 1;
  }
  out->requests += static_cast<int64_t>(requests.size());
  out->drafts += engine.totals().drafts;
  out->accepted += engine.totals().accepted_tokens;
  out->drafted += engine.totals().draft_tokens;
}

TEST(LosslessMatrix, EveryPromptPluginRatioDraftLengthAndBatch) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const auto data =
      nlohmann::json::parse(testing::read_file(testing::source_path("datasets/lossless_prompts/prompts.json")));
  size_t n_prompts = data.at("prompts").size();
  if (const char* env = std::getenv("VERICACHE_MATRIX_PROMPTS"))
    n_prompts = std::min(n_prompts, static_cast<size_t>(std::atoi(env)));
  const std::vector<std::string> offline = {"snapkv", "expected_attention", "kvzip"};
  std::map<std::string, std::shared_ptr<Compressor>> plugins;
  for (const std::string name : {"snapkv", "expected_attention", "kvzip", "kvzap"}) {
    plugins[name] = testing::bundled_compressor(name, testing::params_for(name), *m);
    ASSERT_NE(plugins[name], nullptr);
  }
  // results[plugin][ratio][x][batch]
  std::map<std::string, std::map<double, std::map<int64_t, std::map<int, CaseResult>>>> results;
  const auto start = std::chrono::steady_clock::now();
  const int64_t layers = m->config().n_layers;

  for (size_t g0 = 0; g0 < n_prompts; g0 += kGroup) {
    const size_t g1 = std::min(n_prompts, g0 + kGroup);
    std::vector<GenerationRequest> requests;
    int64_t slots = 0;
    for (size_t i = g0; i < g1; ++i) {
      const auto& p = data.at("prompts")[i];
      GenerationRequest r;
      r.prompt = testing::prompt_ids(*m, p.at("text"), p.at("chat"));
      r.max_new_tokens = kMaxTokens;
      slots += static_cast<int64_t>(r.prompt.size());
      requests.push_back(std::move(r));
    }
    // The reference: full-KV greedy decoding of the group.
    std::vector<GenerationResult> reference;
    {
      auto pool = m->make_page_pool(16, Generator::pages_needed(*m, 16, requests));
      Generator generator(*m, *pool);
      auto r = generator.generate(requests);
      ASSERT_TRUE(r.ok()) << r.status().message();
      reference = *r;
    }
    // One prefill per prompt, every offline plugin observing; each compresses once per ratio.
    auto prefill_pool = m->make_page_pool(16, layers * ((2 * slots + 300 * kGroup) / 16 + 4 * kGroup));
    ASSERT_TRUE(prefill_pool.ok());
    std::vector<Prefilled> prefilled(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      Prefilled& p = prefilled[i];
      p.ids = requests[i].prompt;
      p.kv = SequenceKv(layers);
      std::vector<int32_t> positions(p.ids.size());
      for (size_t j = 0; j < p.ids.size(); ++j) positions[j] = static_cast<int32_t>(j);
      ForwardItem item{p.ids, positions, &p.kv, &*prefill_pool, LogitRows::kLast, 0};
      std::vector<std::vector<LayerDrops>> drops(offline.size());
      const std::vector<double> ratios{0.25};  // offline plugins read the ratio in compress()
      std::vector<LayerObserver> observers;
      for (size_t c = 0; c < offline.size(); ++c)
        observers.push_back(compression_observer(*plugins[offline[c]], ratios, &drops[c]));
      at::Tensor logits;
      ASSERT_TRUE(m->forward(std::span(&item, 1), &logits, [&](const LayerActivations& acts) {
                     for (const LayerObserver& o : observers) VC_RETURN_IF_ERROR(o(acts));
                     return Status();
                   }).ok());
      p.next_logits.assign(logits[0].data_ptr<float>(), logits[0].data_ptr<float>() + m->config().vocab_size);
      for (const std::string& name : offline) {
        Compressor& c = *plugins[name];
        for (double ratio : kRatios) {
          CompressedKV out;
          const Status s = compute_kept(*m, *prefill_pool, c, ratio, p.ids, 0, p.kv, &out);
          ASSERT_TRUE(s.ok()) << name << " on prompt " << g0 + i << ": " << s.message();
          p.kept[name].push_back(std::move(out.kept));
        }
        c.release(0);
      }
    }
    for (const std::string name : {"snapkv", "expected_attention", "kvzip", "kvzap"}) {
      const bool online = name == std::string("kvzap");
      for (size_t ri = 0; ri < std::size(kRatios); ++ri) {
        for (int64_t x : kDraftLengths) {
          EngineOptions options;
          options.compressor = plugins[name].get();
          options.ratio = kRatios[ri];
          options.draft_length = x;
          options.draft_kv = x % 2 == 0 ? DraftKv::kVerified : DraftKv::kDrafted;
          std::vector<const Prefilled*> all;
          for (const Prefilled& p : prefilled) all.push_back(&p);
          // Batch 8: the group in one engine. Batch 1: each request alone.
          run_case(*m, options, requests, online ? std::vector<const Prefilled*>{} : all, &*prefill_pool, ri, reference,
                   &results[name][kRatios[ri]][x][kGroup]);
          for (size_t i = 0; i < requests.size(); ++i) {
            run_case(*m, options, {requests[i]},
                     online ? std::vector<const Prefilled*>{} : std::vector<const Prefilled*>{all[i]}, &*prefill_pool,
                     ri, {reference[i]}, &results[name][kRatios[ri]][x][1]);
          }
        }
      }
    }
    for (Prefilled& p : prefilled) p.kv.release(*prefill_pool);
    std::fprintf(stderr, "[matrix] prompts %zu-%zu of %zu done, %.0f s\n", g0, g1 - 1, n_prompts,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  std::string table =
      "| compressor | c | x | batch | requests | mismatching requests | mean acceptance length | acceptance rate |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|\n";
  int64_t cases = 0, mismatched = 0;
  for (const auto& [name, by_ratio] : results) {
    for (const auto& [ratio, by_x] : by_ratio) {
      for (const auto& [x, by_batch] : by_x) {
        for (const auto& [batch, r] : by_batch) {
          char row[256];
          std::snprintf(row, sizeof(row), "| %s | %.2f | %lld | %d | %lld | %lld | %.2f | %.3f |\n", name.c_str(),
                        ratio, static_cast<long long>(x), batch, static_cast<long long>(r.requests),
                        static_cast<long long>(r.mismatched),
                        r.drafts ? 1.0 + static_cast<double>(r.accepted) / r.drafts : 0.0,
                        r.drafted ? static_cast<double>(r.accepted) / r.drafted : 0.0);
          table += row;
          ++cases;
          mismatched += r.mismatched;
        }
      }
    }
  }
  std::printf("%s%lld cases, %zu prompts, %lld mismatching requests, %.0f s\n", table.c_str(),
              static_cast<long long>(cases), n_prompts, static_cast<long long>(mismatched),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  if (const char* path = std::getenv("VERICACHE_MATRIX_OUT")) {
    std::ofstream out(path);
    out << "# The lossless matrix, SmolLM2-135M-Instruct on the CPU\n\n"
        << "- command: `"
        << (std::getenv("VERICACHE_MATRIX_PROMPTS") ? "VERICACHE_MATRIX_PROMPTS=" + std::to_string(n_prompts) + " "
                                                    : "")
        << "VERICACHE_MATRIX_OUT=" << path << " build/tests/lossless_matrix_tests` (" << n_prompts
        << " prompts of datasets/lossless_prompts, " << kMaxTokens << " greedy tokens each)\n"
        << "- every request's tokens and finish reason compared with full-KV decoding (Generator)\n\n"
        << table << "\n"
        << cases << " cases, " << mismatched << " mismatching requests\n";
  }
}

}  // namespace
}  // namespace vericache
