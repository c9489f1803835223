// The whole lossless matrix of the draft-verify issue: 50 prompts (datasets/lossless_prompts) x
// every bundled plugin x c in {0.1, 0.25, 0.5} x x in {1, 4, 16, 32} x batches of 1 and 8 requests;
// greedy output must equal full-KV decoding (Generator) for every request of every case.
// Hours on 2 cores, so not part of `ctest -L cpu`: run it with `ctest --test-dir build -L matrix`
// or build/tests/lossless_matrix_tests, whole or in shards of prompts. Environment:
//   VERICACHE_MATRIX_FROM     first prompt (default 0; a multiple of 8, so groups stay the same)
//   VERICACHE_MATRIX_PROMPTS  how many prompts from there (default: all the rest; 0 only rewrites the
//                             table from the recorded groups)
//   VERICACHE_MATRIX_DRAFT_POLICY  the engine's draft policy (engine/draft_policy.h; default fixed): under
//                             an adaptive one, x is each window's most (goodput also decodes on the
//                             full cache, x = 0, and probes)
//   VERICACHE_MATRIX_OUT      a markdown table (results/....md). Each finished group of 8 prompts is
//                             also recorded in the JSON file beside it (same name, .json), replacing
//                             an earlier record of the same prompts; the table sums every recorded
//                             group, so shards run at different times add up to the whole matrix.
// Prefill is most of the cost, so the offline plugins share it: each group of 8 prompts is prefilled
// once with every offline plugin observing, each plugin compresses once per ratio, and the cases
// start their requests from copies of that prefill (DraftVerifyEngine::add_prefilled) — every
// batch-1 case, and the batch-8 cases but one per (plugin, ratio), which goes through the engine's
// own prefill and compression (add_request) at draft length kDraftLengths[(ratio index + group
// index) % 4], so each x takes that path in some group. KVzap, an online compressor whose state
// starts at the prefill, always prefills itself.
// KV_comp keeps verified K/V or drafted K/V alternately over (ratio, draft length), so each ratio
// and each draft length runs in both modes.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "compression_support.h"
#include "engine/compression.h"
#include "engine/draft_verify_engine.h"
#include "engine/engine_pools.h"
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

// VERICACHE_MATRIX_DRAFT_POLICY, or fixed.
DraftPolicyKind matrix_draft_policy() {
  const char* env = std::getenv("VERICACHE_MATRIX_DRAFT_POLICY");
  const std::optional<DraftPolicyKind> kind = parse_draft_policy(env != nullptr && *env != '\0' ? env : "fixed");
  EXPECT_TRUE(kind.has_value()) << "VERICACHE_MATRIX_DRAFT_POLICY must be one of " << kDraftPolicyNames;
  return kind.value_or(DraftPolicyKind::kFixed);
}

struct CaseResult {
  int64_t requests = 0, mismatched = 0, drafts = 0, accepted = 0, drafted = 0;
};

// Which K/V accepted tokens keep in KV_comp: the two modes alternate over ratios and draft lengths,
// so every draft length and every ratio runs in both.
DraftKv draft_kv_for(size_t ratio_index, size_t x_index) {
  return (ratio_index + x_index) % 2 == 0 ? DraftKv::kVerified : DraftKv::kDrafted;
}

// Runs `requests` through one engine and counts the requests whose output differs from `reference`.
void run_case(const LlamaModel& m, const EngineOptions& options, const std::vector<GenerationRequest>& requests,
              const std::vector<const Prefilled*>& prefilled, const PagePool* prefill_pool, size_t ratio_index,
              const std::vector<GenerationResult>& reference, CaseResult* out) {
  auto pools = make_engine_pools(m, options, 16, requests);
  ASSERT_TRUE(pools.ok()) << pools.status().message();
  DraftVerifyEngine engine(m, pools->device, pools->host, options);
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

// results[plugin][ratio][x][batch]
using Results = std::map<std::string, std::map<double, std::map<int64_t, std::map<int, CaseResult>>>>;

std::string json_path_for(const std::string& md) {
  const size_t dot = md.rfind('.');
  return (dot == std::string::npos ? md : md.substr(0, dot)) + ".json";
}

nlohmann::json read_record(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json{{"groups", nlohmann::json::array()}};
  return nlohmann::json::parse(in);
}

std::string shell_output(const std::string& command) {
  std::string out;
  if (FILE* f = popen(command.c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof(buf), f)) out += buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// The checkout's commit when the test starts (the binary does not change while it runs), marked
// when tracked files outside results/ differ from it (results/ holds outputs, this test's own among
// them, which lossless_matrix.sh removes before the run).
const std::string& source_commit() {
  static const std::string commit = [] {
    const std::string git = "git -C '" + testing::source_path("") + "' ";
    std::string c = shell_output(git + "rev-parse --short HEAD 2>/dev/null");
    if (c.empty()) return std::string("unknown");
    if (!shell_output(git + "status --porcelain --untracked-files=no -- . ':!results' 2>/dev/null").empty()) c += " (with uncommitted changes)";
    return c;
  }();
  return commit;
}

// The CPU's model name (/proc/cpuinfo), named beside every timing.
std::string cpu_name() {
  const std::string name = shell_output("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'");
  return name.empty() ? "unknown CPU" : name;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

// Replaces the record of prompts [g0, g1) in the JSON file at `path` (written beside, then renamed).
void record_group(const std::string& path, size_t g0, size_t g1, double seconds, const Results& results) {
  nlohmann::json record = read_record(path);
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& [name, by_ratio] : results)
    for (const auto& [ratio, by_x] : by_ratio)
      for (const auto& [x, by_batch] : by_x)
        for (const auto& [batch, r] : by_batch)
          cases.push_back({{"compressor", name}, {"ratio", ratio}, {"draft_length", x}, {"batch", batch},
                           {"requests", r.requests}, {"mismatched", r.mismatched}, {"drafts", r.drafts},
                           {"accepted", r.accepted}, {"drafted", r.drafted}});
  nlohmann::json groups = nlohmann::json::array();
  for (const nlohmann::json& g : record.at("groups"))
    if (g.at("first") != g0) groups.push_back(g);
  groups.push_back({{"first", g0}, {"end", g1}, {"commit", source_commit()}, {"date", today()},
                    {"seconds", std::round(seconds)}, {"cpu", cpu_name()},
                    {"draft_policy", draft_policy_name(matrix_draft_policy())}, {"cases", cases}});
  std::sort(groups.begin(), groups.end(),
            [](const nlohmann::json& a, const nlohmann::json& b) { return a.at("first") < b.at("first"); });
  record["groups"] = groups;
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << record.dump(1) << "\n";
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0) << path;
}

// The table over every recorded group: counts summed per case.
std::string matrix_markdown(const nlohmann::json& record, const std::string& md_path, size_t total_prompts) {
  Results sum;
  size_t prompts = 0;
  double seconds = 0;
  std::string groups_text;
  int64_t requests = 0, mismatched = 0;
  for (const nlohmann::json& g : record.at("groups")) {
    const size_t first = g.at("first"), end = g.at("end");
    prompts += end - first;
    seconds += g.at("seconds").get<double>();
    groups_text += "  - prompts " + std::to_string(first) + "-" + std::to_string(end - 1) + ": commit `" +
                   g.at("commit").get<std::string>() + "`, " + g.at("date").get<std::string>() + ", " +
                   std::to_string(static_cast<int64_t>(g.at("seconds").get<double>())) + " s" +
                   (g.contains("cpu") ? " on " + g.at("cpu").get<std::string>() : "") +
                   ", draft policy " + g.value("draft_policy", std::string("fixed")) +
                   (g.contains("note") ? " (" + g.at("note").get<std::string>() + ")" : "") + "\n";
    for (const nlohmann::json& c : g.at("cases")) {
      CaseResult& r = sum[c.at("compressor")][c.at("ratio")][c.at("draft_length")][c.at("batch")];
      r.requests += c.at("requests").get<int64_t>();
      r.mismatched += c.at("mismatched").get<int64_t>();
      r.drafts += c.at("drafts").get<int64_t>();
      r.accepted += c.at("accepted").get<int64_t>();
      r.drafted += c.at("drafted").get<int64_t>();
    }
  }
  std::string table =
      "| compressor | c | x | batch | requests | mismatching requests | mean acceptance length | acceptance rate |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|\n";
  int64_t cases = 0;
  for (const auto& [name, by_ratio] : sum)
    for (const auto& [ratio, by_x] : by_ratio)
      for (const auto& [x, by_batch] : by_x)
        for (const auto& [batch, r] : by_batch) {
          char row[256];
          std::snprintf(row, sizeof(row), "| %s | %.2f | %lld | %d | %lld | %lld | %.2f | %.3f |\n", name.c_str(),
                        ratio, static_cast<long long>(x), batch, static_cast<long long>(r.requests),
                        static_cast<long long>(r.mismatched),
                        r.drafts ? 1.0 + static_cast<double>(r.accepted) / r.drafts : 0.0,
                        r.drafted ? static_cast<double>(r.accepted) / r.drafted : 0.0);
          table += row;
          ++cases;
          requests += r.requests;
          mismatched += r.mismatched;
        }
  std::string out = "# The lossless matrix, SmolLM2-135M-Instruct on the CPU\n\n";
  out += "- command: `harness/bench/lossless_matrix.sh` (all groups in one process, refused on a tree with "
         "uncommitted changes); a shard: `VERICACHE_MATRIX_FROM=<FROM> VERICACHE_MATRIX_PROMPTS=8 "
         "VERICACHE_MATRIX_OUT=" + md_path + " build/tests/lossless_matrix_tests`\n";
  out += "- " + std::to_string(prompts) + " of the " + std::to_string(total_prompts) +
         " prompts of datasets/lossless_prompts recorded, " + std::to_string(kMaxTokens) +
         " greedy tokens each; every request's tokens and finish reason compared with full-KV decoding "
         "(Generator)\n";
  out += "- batch 8 = a group of 8 different prompts in one engine; batch 1 = each prompt alone. Offline plugins "
         "start from a shared prefill except one batch-8 case per (plugin, c) and group, which runs the engine's "
         "own prefill and compression (at x = 1, 4, 16, 32 in turn over c and groups); KVzap always prefills "
         "itself. KV_comp keeps "
         "verified K/V at (c, x) = (0.1, 1), (0.1, 16), (0.25, 4), (0.25, 32), (0.5, 1), (0.5, 16), drafted K/V "
         "at the others\n";
  std::set<std::string> commits, policies;
  for (const nlohmann::json& g : record.at("groups")) {
    commits.insert(g.at("commit").get<std::string>());
    policies.insert(g.value("draft_policy", std::string("fixed")));
  }
  if (policies.size() == 1 && *policies.begin() != "fixed") {
    out += "- draft policy **" + *policies.begin() + "**: x is each window's most, not every window's length\n";
  }
  if (prompts == total_prompts && commits.size() == 1 && policies.size() == 1) {
    out += "- **the whole matrix at one commit**, `" + *commits.begin() + "`: all " + std::to_string(prompts) +
           " prompts, " + std::to_string(static_cast<int64_t>(seconds)) +
           " s of wall time in all (`harness/bench/lossless_matrix.sh`)\n";
  } else {
    out += "- not one run: " + std::to_string(prompts) + " of " + std::to_string(total_prompts) + " prompts, " +
           std::to_string(commits.size()) + " commits, " + std::to_string(policies.size()) + " draft policies\n";
  }
  out += "- groups (machine: 2 cores):\n" + groups_text;
  out += "- total: " + std::to_string(cases) + " cases, " + std::to_string(requests) + " requests, " +
         std::to_string(mismatched) + " mismatching, " + std::to_string(static_cast<int64_t>(seconds)) + " s\n\n";
  return out + table;
}

TEST(LosslessMatrix, EveryPromptPluginRatioDraftLengthAndBatch) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const auto data =
      nlohmann::json::parse(testing::read_file(testing::source_path("datasets/lossless_prompts/prompts.json")));
  const size_t total_prompts = data.at("prompts").size();
  size_t first = 0, n_prompts = total_prompts;
  if (const char* env = std::getenv("VERICACHE_MATRIX_FROM")) first = static_cast<size_t>(std::atoi(env));
  ASSERT_EQ(first % kGroup, 0u) << "VERICACHE_MATRIX_FROM must be a multiple of " << kGroup;
  ASSERT_LE(first, total_prompts);
  if (const char* env = std::getenv("VERICACHE_MATRIX_PROMPTS")) n_prompts = static_cast<size_t>(std::atoi(env));
  const size_t end = std::min(total_prompts, first + n_prompts);
  const char* out_md = std::getenv("VERICACHE_MATRIX_OUT");
  const std::vector<std::string> names = testing::bundled_plugin_names(CompressorFamily::kTokenDropping);
  std::map<std::string, std::shared_ptr<Compressor>> plugins;
  for (const std::string& name : names) {
    plugins[name] = testing::bundled_compressor(name, testing::params_for(name), *m);
    ASSERT_NE(plugins[name], nullptr);
  }
  std::vector<std::string> offline;
  for (const std::string& name : names) {
    if (plugins[name]->mode() == CompressionMode::kOffline) offline.push_back(name);
  }
  source_commit();  // read now, before a long run
  matrix_draft_policy();  // a bad VERICACHE_MATRIX_DRAFT_POLICY fails now, not after the first group
  if (HasFailure()) return;
  const auto start = std::chrono::steady_clock::now();
  const int64_t layers = m->config().n_layers;

  for (size_t g0 = first; g0 < end; g0 += kGroup) {
    const auto group_start = std::chrono::steady_clock::now();
    const size_t g1 = std::min(end, g0 + kGroup);
    Results results;
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
    const size_t group_index = g0 / kGroup;
    for (const std::string& name : names) {
      const bool online = plugins[name]->mode() == CompressionMode::kOnline;
      for (size_t ri = 0; ri < std::size(kRatios); ++ri) {
        for (size_t xi = 0; xi < std::size(kDraftLengths); ++xi) {
          const int64_t x = kDraftLengths[xi];
          EngineOptions options;
          options.compressor = plugins[name].get();
          options.ratio = kRatios[ri];
          options.draft_length = x;
          options.draft_kv = draft_kv_for(ri, xi);
          options.draft_policy.kind = matrix_draft_policy();
          std::vector<const Prefilled*> all;
          for (const Prefilled& p : prefilled) all.push_back(&p);
          // Batch 8: the group in one engine, through the engine's own prefill and compression when
          // online or at this (ratio, group)'s draft length, else from the shared prefill.
          // Batch 1: each request alone, an offline plugin's from the shared prefill.
          const bool own_prefill = online || xi == (ri + group_index) % std::size(kDraftLengths);
          run_case(*m, options, requests, own_prefill ? std::vector<const Prefilled*>{} : all, &*prefill_pool, ri,
                   reference, &results[name][kRatios[ri]][x][kGroup]);
          for (size_t i = 0; i < requests.size(); ++i) {
            run_case(*m, options, {requests[i]},
                     online ? std::vector<const Prefilled*>{} : std::vector<const Prefilled*>{all[i]}, &*prefill_pool,
                     ri, {reference[i]}, &results[name][kRatios[ri]][x][1]);
          }
        }
        int64_t mismatched = 0;
        for (const auto& [x, by_batch] : results[name][kRatios[ri]])
          for (const auto& [batch, r] : by_batch) mismatched += r.mismatched;
        std::fprintf(stderr, "[matrix] prompts %zu-%zu: %s c = %.2f done (every x, batches 1 and 8): %lld mismatched, %.0f s\n",
                     g0, g1 - 1, name.c_str(), kRatios[ri], static_cast<long long>(mismatched),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    }
    for (Prefilled& p : prefilled) p.kv.release(*prefill_pool);
    const double group_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - group_start).count();
    std::fprintf(stderr, "[matrix] prompts %zu-%zu of %zu done, %.0f s (group %.0f s)\n", g0, g1 - 1, total_prompts,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), group_seconds);
    if (out_md) record_group(json_path_for(out_md), g0, g1, group_seconds, results);
  }
  if (out_md) {
    const nlohmann::json record = read_record(json_path_for(out_md));
    std::ofstream(out_md) << matrix_markdown(record, out_md, total_prompts);
    std::printf("%s written from %zu recorded groups\n", out_md, record.at("groups").size());
  }
}

}  // namespace
}  // namespace vericache
