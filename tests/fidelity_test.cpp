// Fidelity against NVIDIA kvpress 0.5.5 (the reference implementations), on the real model and
// two real prompts: the kept sets of our SnapKV, ExpectedAttention and KVzip against the ones
// kvpress's scores select at compression_ratio 0.75 (kept fraction c = 0.25). The fixtures hold
// kvpress's per-layer scores [layers, KV heads, tokens]; tests/reference/kvpress_fixtures.py
// regenerates them and records versions. The per-layer overlaps printed here are the figures in
// the plugins' READMEs.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include "compression_support.h"
#include "test_support.h"

namespace vericache {
namespace {

constexpr double kRatio = 0.25;

struct Entry {
  std::string press, prompt, file;
  std::vector<int32_t> ids;
  nlohmann::json params;
  int64_t prefix_length = 0;
};

std::vector<Entry> entries() {
  const auto index = nlohmann::json::parse(testing::read_file(testing::source_path("tests/fixtures/reference/kvpress/index.json")));
  std::vector<Entry> out;
  for (const auto& e : index.at("entries")) {
    Entry entry{e.at("press"), e.at("prompt"), e.at("file"), e.at("token_ids").get<std::vector<int32_t>>(), e.at("params")};
    if (e.contains("kvzip")) entry.prefix_length = e.at("kvzip").at("prefix_length");
    out.push_back(entry);
  }
  return out;
}

at::Tensor reference_scores(const Entry& e, int64_t layers, int64_t heads) {
  const std::string bytes = testing::read_file(testing::source_path("tests/fixtures/reference/kvpress/" + e.file));
  const auto n = static_cast<int64_t>(e.ids.size());
  EXPECT_EQ(static_cast<int64_t>(bytes.size()), layers * heads * n * 4);
  at::Tensor t = at::empty({layers, heads, n}, at::kFloat);
  std::memcpy(t.data_ptr<float>(), bytes.data(), bytes.size());
  return t;
}

// kvpress's kept sets: per-head top-k (ScorerPress), or KVzip's global pruning of the
// int(L * H * n * (1 - c)) lowest scores over all layers and heads.
std::vector<std::vector<std::set<int64_t>>> reference_kept(const at::Tensor& scores, bool global) {
  const int64_t layers = scores.size(0), heads = scores.size(1), n = scores.size(2);
  std::vector<std::vector<std::set<int64_t>>> kept(layers, std::vector<std::set<int64_t>>(heads));
  if (global) {
    const auto pruned = static_cast<int64_t>(static_cast<double>(layers * heads * n) * (1 - kRatio));
    const at::Tensor low = std::get<1>(at::topk(-scores.reshape({-1}), pruned));
    at::Tensor keep = at::ones({layers * heads * n}, at::kBool);
    keep.index_fill_(0, low, false);
    const at::Tensor idx = keep.nonzero().squeeze(1);
    for (int64_t i = 0; i < idx.size(0); ++i) {
      const int64_t f = idx[i].item<int64_t>();
      kept[f / (heads * n)][(f / n) % heads].insert(f % n);
    }
    return kept;
  }
  const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(n) * kRatio));
  const at::Tensor top = std::get<1>(at::topk(scores, k, -1));
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < k; ++j) kept[l][h].insert(top[l][h][j].item<int64_t>());
  return kept;
}

// Per layer: mean over KV heads of |ours & theirs| / max(|ours|, |theirs|).
std::vector<double> overlap(const SequenceKv& ours, const std::vector<std::vector<std::set<int64_t>>>& theirs) {
  std::vector<double> per_layer;
  for (size_t l = 0; l < theirs.size(); ++l) {
    double sum = 0;
    for (size_t h = 0; h < theirs[l].size(); ++h) {
      const std::vector<int64_t>& p = ours.slot_positions(static_cast<int64_t>(l), static_cast<int64_t>(h));
      int64_t common = 0;
      for (int64_t x : p) common += theirs[l][h].count(x);
      sum += static_cast<double>(common) / static_cast<double>(std::max(p.size(), theirs[l][h].size()));
    }
    per_layer.push_back(sum / static_cast<double>(theirs[l].size()));
  }
  return per_layer;
}

double report(const std::string& what, const std::vector<double>& per_layer) {
  double mean = 0, low = 1;
  std::string line;
  for (double v : per_layer) {
    mean += v / static_cast<double>(per_layer.size());
    low = std::min(low, v);
    char buf[16];
    std::snprintf(buf, sizeof buf, " %.3f", v);
    line += buf;
  }
  std::printf("[ fidelity ] %-36s mean %.3f min %.3f | per layer:%s\n", what.c_str(), mean, low, line.c_str());
  return mean;
}

std::string our_params(const Entry& e, const std::string& allocation) {
  if (e.press == "snapkv") {
    return "{\"window_size\": " + e.params.at("window_size").dump() + ", \"kernel_size\": " + e.params.at("kernel_size").dump() + "}";
  }
  if (e.press == "expected_attention") {
    return "{\"n_future_positions\": " + e.params.at("n_future_positions").dump() + ", \"n_sink\": " + e.params.at("n_sink").dump() + "}";
  }
  // KVzip: kvpress scores the context after the chat template's prefix, keeps 4 sinks and leaves
  // the rest of the prefix unscored (keep_prefix false; our default keeps it, as the original does).
  return "{\"n_sink\": " + e.params.at("n_sink").dump() + ", \"chunk_size\": " + e.params.at("chunk_size").dump() +
         ", \"context_start\": " + std::to_string(e.prefix_length) + ", \"keep_prefix\": false, \"allocation\": \"" +
         allocation + "\"}";
}

TEST(Fidelity, KeptSetsAgreeWithKvpress) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const int64_t layers = m->config().n_layers, heads = m->config().n_kv_heads;
  for (const Entry& e : entries()) {
    const bool kvzip = e.press.rfind("kvzip", 0) == 0;
    const at::Tensor scores = reference_scores(e, layers, heads);
    for (const std::string& allocation : kvzip ? std::vector<std::string>{"uniform", "global"} : std::vector<std::string>{""}) {
      auto compressor = testing::bundled_compressor(kvzip ? "kvzip" : e.press, our_params(e, allocation), *m);
      ASSERT_NE(compressor, nullptr);
      auto run = testing::run_compression(*m, *compressor, e.ids, kRatio);
      ASSERT_TRUE(run->status.ok()) << run->status.message();
      // Uniform: the same per-head top-k rule on both sides, so any difference is in the scores.
      // Global: kvpress's budget is ragged per head, ours is the same for every head of a layer
      // (the contract), so the sets differ by construction; the layer budgets must agree (within
      // rounding: one slot per head, plus kvpress's total is not floored per layer).
      const auto theirs = reference_kept(scores, allocation == "global");
      const std::vector<double> per_layer = overlap(run->kv, theirs);
      const double mean = report(e.press + " " + e.prompt + (allocation.empty() ? "" : " (" + allocation + ")"), per_layer);
      if (allocation == "global") {
        for (int64_t l = 0; l < layers; ++l) {
          int64_t their_total = 0;
          for (const auto& head : theirs[l]) their_total += static_cast<int64_t>(head.size());
          EXPECT_NEAR(static_cast<double>(run->kv.length(l) * heads), static_cast<double>(their_total), 2.0 * static_cast<double>(heads))
              << "layer " << l << " budget";
        }
      }
      // What the READMEs state: the same sets in every layer under the same rule; at least 0.60 on
      // average with KVzip's global budget (0.62-0.64 measured).
      if (allocation == "global") {
        EXPECT_GE(mean, 0.60) << e.press << " " << e.prompt;
      } else {
        for (int64_t l = 0; l < layers; ++l) EXPECT_EQ(per_layer[l], 1.0) << e.press << " " << e.prompt << " layer " << l;
      }
      run->kv.release(run->pool);
    }
  }
}

}  // namespace
}  // namespace vericache
