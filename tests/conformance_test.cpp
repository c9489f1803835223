// The conformance kit (conformance/conformance.h, `vericache conformance`) on every bundled plugin
// (as the loader finds them: the list lives in plugins/CMakeLists.txt), on SmolLM2 and, for the
// token droppers, on Qwen2.5-Coder 0.5B; the kit's report on a fixture that breaks each rule in
// turn; and how the engine runs a compressor compared with running it by hand.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <numeric>
#include <string>

#include "compression_support.h"
#include "conformance/conformance.h"
#include "engine/compression.h"
#include "engine/compression_divergence.h"
#include "engine/generator.h"
#include "loader/plugin_loader.h"
#include "test_support.h"

namespace vericache {
namespace {

using testing::params_for;

// Greedy decoding of `steps` tokens after `kv` (positions from `start`), returning the logits of
// each step; an online compressor sees every step and its drops are applied.
std::vector<at::Tensor> decode(const LlamaModel& m, PagePool& pool, SequenceKv& kv, std::vector<int32_t> tokens,
                               int64_t start, Compressor* online, double ratio) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<int32_t> token{tokens[i]}, position{static_cast<int32_t>(start + i)};
    ForwardItem item{token, position, &kv, &pool, LogitRows::kLast, 0};
    at::Tensor logits;
    const std::vector<double> ratios{ratio};
    SequenceKv* caches[] = {&kv};
    const Status s = online ? forward_with_compressor(m, std::span(&item, 1), pool, &logits, *online, ratios, caches)
                            : m.forward(std::span(&item, 1), &logits);
    EXPECT_TRUE(s.ok()) << s.message();
    out.push_back(logits[0].clone());
  }
  return out;
}

// Prefills `ids` into `kv` on the full cache and returns the last row's logits.
at::Tensor prefill_full(const LlamaModel& m, const std::vector<int32_t>& ids, PagePool& pool, SequenceKv& kv) {
  std::vector<int32_t> positions(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) positions[i] = static_cast<int32_t>(i);
  ForwardItem prefill{ids, positions, &kv, &pool, LogitRows::kLast, 0};
  at::Tensor logits;
  const Status s = m.forward(std::span(&prefill, 1), &logits);
  EXPECT_TRUE(s.ok()) << s.message();
  return logits[0];
}

// The kit's prompt in tests: what `vericache conformance` runs by default (the first 640 tokens of
// datasets/prompts/document_2k.txt, tokenized as is).
std::vector<int32_t> kit_prompt(const LlamaModel& m) {
  std::vector<int32_t> ids = m.tokenizer().encode(testing::read_file(testing::source_path("datasets/prompts/document_2k.txt")), false);
  ids.resize(640);
  return ids;
}

ConformanceSpec spec_beside(const std::string& plugin_path) {
  const std::string path = conformance_spec_path(plugin_path);
  auto spec = parse_conformance_spec(testing::read_file(path));
  EXPECT_TRUE(spec.ok()) << path << ": " << spec.status().message();
  return spec.ok() ? *spec : ConformanceSpec{};
}

// Runs the kit on the plugin at `path` with `params` over its spec's own; every failed check
// becomes a test failure naming the rule, the setting and the offence.
ConformanceReport run_kit(const LlamaModel& m, const std::string& path, const std::string& params, ConformanceSpec spec) {
  auto merged = conformance_params(spec, params);
  EXPECT_TRUE(merged.ok()) << merged.status().message();
  const CompressorFactory make = [&]() -> Result<std::shared_ptr<Compressor>> {
    VC_ASSIGN_OR_RETURN(std::shared_ptr<Compressor> c, load_compressor(path, *merged));
    VC_RETURN_IF_ERROR(c->attach(m.shape()));
    return c;
  };
  ConformanceOptions options;
  options.prompt = kit_prompt(m);
  auto report = run_conformance(m, make, spec, options);
  EXPECT_TRUE(report.ok()) << report.status().message();
  return report.ok() ? *report : ConformanceReport{};
}

// Every bundled plugin keeps every rule of the kit (vericache conformance) with its spec, on
// SmolLM2: the ratios of its spec (token dropping) or its default bit width (quantization), and
// drafting for the engine without changing a token.
TEST(Conformance, EveryBundledPluginKeepsEveryRule) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::vector<PluginInfo> plugins = testing::bundled_plugins();
  ASSERT_GE(plugins.size(), 7u);
  for (const PluginInfo& plugin : plugins) {
    const ConformanceReport report = run_kit(*m, plugin.path, testing::params_for(plugin.name), spec_beside(plugin.path));
    EXPECT_EQ(report.compressor, plugin.name);
    EXPECT_GE(report.checks.size(), plugin.family == CompressorFamily::kTokenDropping ? 25u : 7u) << plugin.name;
    for (const ConformanceCheck& c : report.checks) {
      EXPECT_TRUE(c.passed) << plugin.name << " " << c.rule << " " << c.setting << ": " << c.detail;
    }
    EXPECT_EQ(report.checks.back().rule, "lossless") << plugin.name;
    std::printf("[ %s ] %zu checks passed; %s\n", plugin.name.c_str(), report.checks.size(), report.checks.back().detail.c_str());
  }
}

// The token droppers on Qwen2.5-Coder 0.5B (attention biases, RoPE permuted at load, 7 query heads
// per KV head) at c = 0.25; KVzap with a surrogate trained on this model. Slow suite only
// (tests/CMakeLists.txt: VC_SLOW_TESTS).
TEST(Conformance, TokenDroppersKeepEveryRuleOnQwen2) {
  const LlamaModel* m = testing::qwen_model();
  ASSERT_NE(m, nullptr);
  int checked = 0;
  for (const PluginInfo& plugin : testing::bundled_plugins()) {
    if (plugin.family != CompressorFamily::kTokenDropping) continue;
    ConformanceSpec spec = spec_beside(plugin.path);
    spec.ratios = {0.25};
    const ConformanceReport report = run_kit(*m, plugin.path, testing::params_for(plugin.name, m->path()), spec);
    EXPECT_FALSE(report.checks.empty()) << plugin.name;
    for (const ConformanceCheck& c : report.checks) {
      EXPECT_TRUE(c.passed) << plugin.name << " on qwen2 " << c.rule << " " << c.setting << ": " << c.detail;
    }
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

// A plugin that breaks a rule gets a report naming that rule, and only that one, with the first
// offending (layer, head, position); the same plugin without a flaw conforms (the control).
TEST(Conformance, TheReportNamesTheBrokenRuleAndWhere) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::string path = std::string(VC_FIXTURE_PLUGIN_DIR) + "/vc_plugin_rule_breaker.so";
  ConformanceSpec spec = spec_beside(path);
  spec.ratios = {0.25};
  const ConformanceReport control = run_kit(*m, path, "{}", spec);
  EXPECT_TRUE(control.passed());
  ASSERT_FALSE(control.checks.empty());
  EXPECT_EQ(control.checks.back().rule, "lossless");
  const struct {
    const char* flaw;
    const char* rule;
    const char* detail;
  } cases[] = {
      {"unsorted", "positions", "layer 3, head 1, position 638: after position 639 (kept positions must be unique and increasing)"},
      {"over_budget", "budget", "layer 5, head 0: keeps 161 of 640 tokens, the budget is 160"},
      {"drops_sink", "protected", "layer 7, head 0, position 0: a protected token is not kept"},
      {"writes_cache", "rollback", "layer 4, head 2, position 9: compress() changed the full cache's keys"},
      {"per_instance", "determinism", "a second instance keeps a different set (slot 4)"},
      {"leaks_state", "release", "layer 2, head 0, position 484: after release(), the same request keeps a different set (slot 4)"},
      {"under_declares", "footprint", "kept 4800 slots (summed over 30 layers), footprint() declared at most 4799"},
  };
  for (const auto& c : cases) {
    const ConformanceReport report = run_kit(*m, path, std::string(R"({"flaw": ")") + c.flaw + "\"}", spec);
    EXPECT_FALSE(report.passed()) << c.flaw;
    EXPECT_EQ(report.broken_rules(), std::vector<std::string>{c.rule}) << c.flaw;
    for (const ConformanceCheck& check : report.checks) {
      if (check.passed) continue;
      EXPECT_EQ(check.setting, "c = 0.25");
      EXPECT_TRUE(check.detail.ends_with(c.detail)) << c.flaw << ": " << check.detail;  // per_instance: which position depends on the instance
    }
    EXPECT_NE(report.checks.back().rule, "lossless") << c.flaw << ": the engine check runs only on a conforming plugin";
  }
  // A plugin whose call fails (here: throws) breaks "runs", with its own message.
  const ConformanceReport thrown =
      run_kit(*m, std::string(VC_FIXTURE_PLUGIN_DIR) + "/vc_plugin_throwing_compress.so", "{}", ConformanceSpec{.ratios = {0.5}});
  EXPECT_EQ(thrown.broken_rules(), std::vector<std::string>{"runs"});
  ASSERT_EQ(thrown.checks.size(), 1u);
  EXPECT_EQ(thrown.checks[0].detail, "throwing_compress: scores went NaN");
}

// Spec files are checked strictly: a typo must not silently weaken a check.
TEST(Conformance, SpecErrorsNameTheKey) {
  EXPECT_EQ(parse_conformance_spec(R"({"protect": {"first": 4}})").status().message(),
            "conformance spec: \"protect\" is not a spec key (params, ratios, budget, window, protected, max_relative_error)");
  EXPECT_EQ(parse_conformance_spec(R"({"protected": {"frist": 4}})").status().message(),
            "conformance spec: \"protected\" has an unknown key \"frist\" (first, last)");
  EXPECT_EQ(parse_conformance_spec(R"({"budget": "global"})").status().message(),
            "conformance spec: \"budget\" must be \"per-layer\" or \"across-layers\"");
  EXPECT_EQ(parse_conformance_spec(R"({"ratios": [0.5, 1.5]})").status().message(),
            "conformance spec: \"ratios\" must hold numbers in (0, 1]");
  EXPECT_EQ(parse_conformance_spec("[]").status().message(), "conformance spec: not a JSON object");
  auto spec = parse_conformance_spec(R"({"params": {"window": 16}, "window": 16, "protected": {"last": 16}, "ratios": [0.5]})");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->window, 16);
  EXPECT_EQ(spec->protect_last, 16);
  EXPECT_EQ(spec->ratios, std::vector<double>{0.5});
  EXPECT_EQ(*conformance_params(*spec, R"({"weights": "w.json", "window": 8})"), R"({"weights":"w.json","window":8})");
  EXPECT_EQ(conformance_params(*spec, "[1]").status().message(), "--params must be a JSON object, got: [1]");
  EXPECT_EQ(conformance_spec_path("/p/vc_plugin_x.so"), "/p/vc_plugin_x.conformance.json");
}

// The engine's Generator runs a compressor exactly as the steps above do: the same tokens as
// greedy decoding by hand on the compressed cache (positions continuing from the uncompressed
// length), and the same resident slots at the end — for an offline and an online compressor.
TEST(CompressedGeneration, GeneratorMatchesDecodingTheCompressedCacheByHand) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> ids = testing::kvpress_prompt_ids("doc");
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t layers = m->config().n_layers, steps = 6;
  const double ratio = 0.25;
  for (const std::string plugin : {"snapkv", "kvzap"}) {
    // By hand: the first token from the full prefill, then greedy steps on the compressed cache.
    auto by_hand = testing::bundled_compressor(plugin, params_for(plugin), *m);
    ASSERT_NE(by_hand, nullptr);
    auto run = testing::run_compression(*m, *by_hand, ids, ratio);
    ASSERT_TRUE(run->status.ok()) << run->status.message();
    auto full_pool = m->make_page_pool(16, layers * (n / 16 + 2));
    ASSERT_TRUE(full_pool.ok());
    SequenceKv full(layers);
    std::vector<int32_t> expected{static_cast<int32_t>(prefill_full(*m, ids, *full_pool, full).argmax().item<int64_t>())};
    full.release(*full_pool);
    Compressor* online = by_hand->mode() == CompressionMode::kOnline ? by_hand.get() : nullptr;
    while (static_cast<int64_t>(expected.size()) < steps) {
      const at::Tensor step = decode(*m, run->pool, run->kv, {expected.back()}, n + static_cast<int64_t>(expected.size()) - 1,
                                     online, ratio)[0];
      expected.push_back(static_cast<int32_t>(step.argmax().item<int64_t>()));
    }
    int64_t resident = 0;
    for (int64_t l = 0; l < layers; ++l) resident += run->kv.length(l);
    run->kv.release(run->pool);

    // The engine: one request, the whole prompt in one prefill forward as above.
    auto engine = testing::bundled_compressor(plugin, params_for(plugin), *m);
    ASSERT_NE(engine, nullptr);
    GenerationRequest request;
    request.prompt = ids;
    request.max_new_tokens = steps;
    request.ignore_eos = true;
    GeneratorOptions options;
    options.prefill_chunk = 1024;
    options.compressor = engine.get();
    options.ratio = ratio;
    auto pool = m->make_page_pool(16, Generator::pages_needed(*m, 16, std::span(&request, 1), n + 64));
    ASSERT_TRUE(pool.ok());
    Generator generator(*m, *pool, options);
    GenerationStats stats;
    auto results = generator.generate(std::span(&request, 1), {}, &stats);
    ASSERT_TRUE(results.ok()) << results.status().message();
    EXPECT_EQ((*results)[0].tokens, expected) << plugin;
    EXPECT_EQ(stats.resident_kv_slots, resident) << plugin;  // both fed steps - 1 decoded tokens
    EXPECT_EQ(stats.full_kv_slots, (n + steps - 1) * layers);
    EXPECT_EQ(pool->num_free(), pool->num_pages());
  }
}

// The divergence reference is full-KV greedy decoding: its tokens are the Generator's (no
// compressor), and a second, uncompressed copy of the prompt's cache compared along it differs in
// nothing (KL exactly 0, same argmax every step): the forward is row-count invariant to the bit.
TEST(Divergence, ReferenceIsFullKvGreedyAndAnUncompressedCopyDoesNotDiverge) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> ids = testing::kvpress_prompt_ids("doc");
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t layers = m->config().n_layers, steps = 6;
  auto pool = m->make_page_pool(16, 2 * layers * ((n + steps) / 16 + 2));
  ASSERT_TRUE(pool.ok());
  SequenceKv full(layers), copy(layers);
  const auto first = static_cast<int32_t>(prefill_full(*m, ids, *pool, full).argmax().item<int64_t>());
  ASSERT_TRUE(copy.append_range(*pool, full, *pool, 0, n).ok());
  auto reference = full_kv_greedy_reference(*m, *pool, full, first, n, steps);
  ASSERT_TRUE(reference.ok()) << reference.status().message();
  ASSERT_EQ(reference->logits.size(), static_cast<size_t>(steps * m->config().vocab_size));

  GenerationRequest request;
  request.prompt = ids;
  request.max_new_tokens = steps;
  request.ignore_eos = true;
  auto generator_pool = m->make_page_pool(16, Generator::pages_needed(*m, 16, std::span(&request, 1), n + 64));
  ASSERT_TRUE(generator_pool.ok());
  Generator generator(*m, *generator_pool, GeneratorOptions{});
  auto generated = generator.generate(std::span(&request, 1), {}, nullptr);
  ASSERT_TRUE(generated.ok()) << generated.status().message();
  EXPECT_EQ(reference->tokens, (*generated)[0].tokens);

  auto same = divergence_along(*m, *reference, *pool, copy, n);
  ASSERT_TRUE(same.ok()) << same.status().message();
  ASSERT_EQ(same->size(), static_cast<size_t>(steps));
  for (const DivergenceStep& d : *same) {
    EXPECT_EQ(d.kl, 0.0);
    EXPECT_TRUE(d.same_argmax);
  }
  full.release(*pool);
  copy.release(*pool);
  EXPECT_EQ(pool->num_free(), pool->num_pages());
}

// Decoding on a quantizer's packed cache alone (every block packed as soon as it is complete) is
// close to full-KV decoding but not equal to it, and closer at 4 bits than at 2: KIVI, and RotateKV
// (which sees the prompt's prefill, as in the engine, to find its sink tokens).
TEST(Divergence, QuantizedCachesAreCloseToFullKvButNotEqual) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> ids = testing::kvpress_prompt_ids("doc");
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t layers = m->config().n_layers, steps = 16;
  auto pool = m->make_page_pool(16, 3 * layers * ((n + steps) / 16 + 2));  // full, its copy, the quantized cache
  ASSERT_TRUE(pool.ok());
  SequenceKv full(layers);
  const auto first = static_cast<int32_t>(prefill_full(*m, ids, *pool, full).argmax().item<int64_t>());
  SequenceKv base(layers);
  ASSERT_TRUE(base.append_range(*pool, full, *pool, 0, n).ok());
  auto reference = full_kv_greedy_reference(*m, *pool, full, first, n, steps);
  ASSERT_TRUE(reference.ok()) << reference.status().message();
  for (const std::string name : {"kivi", "rotatekv", "kvquant"}) {
    std::map<int, double> mean_kl;
    for (int bits : {2, 4}) {
      std::string params = params_for(name);
      params.insert(1, "\"bits\": " + std::to_string(bits) + (params == "{}" ? "" : ", "));
      auto quantizer = testing::bundled_compressor(name, params, *m);
      ASSERT_NE(quantizer, nullptr);
      if (name == "rotatekv") {  // the prefill, observed (into a throwaway cache)
        SequenceKv scratch(layers);
        std::vector<int32_t> positions(n);
        std::iota(positions.begin(), positions.end(), 0);
        const ForwardItem item{ids, positions, &scratch, &*pool, LogitRows::kNone, 0};
        const double ratios[] = {1.0};
        std::vector<LayerDrops> drops;
        at::Tensor logits;
        ASSERT_TRUE(m->forward(std::span(&item, 1), &logits, compression_observer(*quantizer, ratios, &drops)).ok());
        scratch.release(*pool);
      }
      auto format = checked_packed_format(*quantizer, pool->spec());
      ASSERT_TRUE(format.ok()) << format.status().message();
      const int64_t flush = format->flush_slots;
      auto packed = PackedPagePool::create(layers * (n / 16 + 2), format->bytes_per_page);
      ASSERT_TRUE(packed.ok());
      const at::Tensor all = at::arange(n, at::kLong).unsqueeze(0).expand({m->config().n_kv_heads, n}).contiguous();
      SequenceKv cache(layers);
      ASSERT_TRUE(cache.assign_kept(*pool, base, *pool, std::vector<at::Tensor>(layers, all)).ok());
      ASSERT_TRUE(pack_front(*quantizer, *format, *pool, *packed, cache, 0).ok());
      EXPECT_EQ(cache.packed_length(0), n / flush * flush);
      const Packing packing{quantizer.get(), *format, &*packed, 0};
      auto steps_kl = divergence_along(*m, *reference, *pool, cache, n, nullptr, 1.0, &packing);
      ASSERT_TRUE(steps_kl.ok()) << steps_kl.status().message();
      EXPECT_EQ(cache.total_length(0), n + steps);
      EXPECT_EQ(cache.packed_length(0), (n + steps) / flush * flush);  // blocks completed while decoding are packed too
      double kl = 0;
      int agree = 0;
      for (const DivergenceStep& d : *steps_kl) {
        kl += d.kl / steps;
        agree += d.same_argmax;
      }
      mean_kl[bits] = kl;
      std::printf("%s %d bits: mean KL %.4f nats/step, top-1 agreement %d of %lld\n", name.c_str(), bits, kl, agree,
                  static_cast<long long>(steps));
      EXPECT_GT(kl, 0.0) << name << " " << bits << " bits: a quantized cache is not the full one";
      cache.release_packed(*packed);
      cache.release(*pool);
      EXPECT_EQ(format->layout == PackedLayout::kMinMaxGroups, name == "kivi") << name;
      if (format->layout == PackedLayout::kMinMaxGroups) {
        // The same steps read through unpack() instead of in place: the very same logits.
        PackedFormat opaque = *format;
        opaque.layout = PackedLayout::kOpaque;
        SequenceKv again(layers);
        ASSERT_TRUE(again.assign_kept(*pool, base, *pool, std::vector<at::Tensor>(layers, all)).ok());
        ASSERT_TRUE(pack_front(*quantizer, opaque, *pool, *packed, again, 1).ok());
        const Packing unpacking{quantizer.get(), opaque, &*packed, 1};
        auto unpacked = divergence_along(*m, *reference, *pool, again, n, nullptr, 1.0, &unpacking);
        ASSERT_TRUE(unpacked.ok()) << unpacked.status().message();
        ASSERT_EQ(unpacked->size(), steps_kl->size());
        for (size_t i = 0; i < unpacked->size(); ++i) {
          EXPECT_EQ((*unpacked)[i].kl, (*steps_kl)[i].kl) << name << " " << bits << " bits, step " << i;
        }
        again.release_packed(*packed);
        again.release(*pool);
        quantizer->release(1);
      }
    }
    EXPECT_LT(mean_kl[4], mean_kl[2]) << name;
    EXPECT_LT(mean_kl[4], 0.1) << name;
  }
  full.release(*pool);
  base.release(*pool);
}

// Requests do not affect each other: a batch of two prompts of different lengths, prefilled in
// chunks of 128 tokens, generates what each request generates alone, with the same resident slots
// (forwards are batch-invariant to the bit; compressor state is per request).
TEST(CompressedGeneration, BatchedChunkedRequestsEqualSoloRuns) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> doc = testing::kvpress_prompt_ids("doc");
  std::vector<int32_t> longer = testing::kvpress_prompt_ids("long");
  longer.resize(900);
  for (const std::string plugin : {"snapkv", "kvzap"}) {
    auto generate = [&](const std::vector<std::vector<int32_t>>& prompts, GenerationStats* stats) {
      auto compressor = testing::bundled_compressor(plugin, params_for(plugin), *m);
      std::vector<GenerationRequest> requests(prompts.size());
      for (size_t i = 0; i < prompts.size(); ++i) {
        requests[i].prompt = prompts[i];
        requests[i].max_new_tokens = 5;
        requests[i].ignore_eos = true;
      }
      GeneratorOptions options;
      options.prefill_chunk = 128;
      options.compressor = compressor.get();
      options.ratio = 0.25;
      auto pool = m->make_page_pool(16, Generator::pages_needed(*m, 16, requests, 1000));
      EXPECT_TRUE(pool.ok());
      Generator generator(*m, *pool, options);
      auto results = generator.generate(requests, {}, stats);
      EXPECT_TRUE(results.ok()) << results.status().message();
      std::vector<std::vector<int32_t>> tokens;
      for (const GenerationResult& r : *results) tokens.push_back(r.tokens);
      return tokens;
    };
    GenerationStats batch_stats, doc_stats, long_stats;
    const auto batched = generate({doc, longer}, &batch_stats);
    const auto doc_alone = generate({doc}, &doc_stats);
    const auto long_alone = generate({longer}, &long_stats);
    ASSERT_EQ(batched.size(), 2u);
    EXPECT_EQ(batched[0], doc_alone[0]) << plugin;
    EXPECT_EQ(batched[1], long_alone[0]) << plugin;
    EXPECT_EQ(batch_stats.resident_kv_slots, doc_stats.resident_kv_slots + long_stats.resident_kv_slots) << plugin;
    EXPECT_LT(batch_stats.resident_kv_slots, batch_stats.full_kv_slots / 2) << plugin;
  }
}

// The torch forward (the GPU path's structure, run here on the CPU) reads a compacted cache like
// the CPU kernels do: one decode step on the same compressed cache through both paths.
TEST(CompressedGeneration, TorchPathReadsTheCompactedCache) {
  auto loaded = LlamaModel::load(testing::default_model_path(), LoadOptions{at::kCPU, at::kFloat, false});
  ASSERT_TRUE(loaded.ok());
  LlamaModel& m = **loaded;
  const std::vector<int32_t> ids = testing::kvpress_prompt_ids("doc");
  const auto n = static_cast<int64_t>(ids.size());
  auto compressor = testing::bundled_compressor("kvzip", "{}", m);
  ASSERT_NE(compressor, nullptr);
  auto run = testing::run_compression(m, *compressor, ids, 0.25);
  ASSERT_TRUE(run->status.ok()) << run->status.message();
  const std::vector<int64_t> compacted = run->kv.lengths();
  at::Tensor logits[2];
  for (int path = 0; path < 2; ++path) {
    ASSERT_TRUE(m.set_forward_path(path == 0 ? ForwardPath::kCpuKernels : ForwardPath::kTorch).ok());
    logits[path] = decode(m, run->pool, run->kv, {ids.back()}, n, nullptr, 0.25)[0];
    run->kv.truncate(run->pool, compacted);
  }
  EXPECT_LT((logits[0] - logits[1]).abs().max().item<float>(), 1e-3);
  EXPECT_EQ(logits[0].argmax().item<int64_t>(), logits[1].argmax().item<int64_t>());
  run->kv.release(run->pool);
}

}  // namespace
}  // namespace vericache
