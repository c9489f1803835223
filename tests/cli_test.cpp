// The `vericache` binary as a user runs it: JSON generation equal to the reference continuation,
// one-line errors with the right exit codes, and --help.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "util/hdf5_table.h"
#include "test_support.h"

namespace vericache {
namespace {

using testing::CliRun;
using testing::run_vericache;

TEST(Cli, GenerateJsonMatchesTheReferenceGreedyContinuation) {
  const auto fixture =
      nlohmann::json::parse(testing::read_file(testing::source_path("tests/fixtures/reference/logits.json")));
  const auto& c = fixture["cases"][0];
  ASSERT_EQ(c["name"], "capital");
  // float32 compute is the mode that matches transformers; the default (auto) is integer on this
  // quantized model.
  const std::string command = "generate --model " + testing::default_model_path() +
                              " --prompt \"What is the capital of France?\" --max-tokens 64 --temperature 0 --json";
  const CliRun r = run_vericache(command + " --compute float32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["compute"], "float32");
  EXPECT_EQ(out["tokens"].get<std::vector<int32_t>>(), c["greedy_continuation"].get<std::vector<int32_t>>());
  EXPECT_EQ(out["text"], "The capital of France is Paris.");
  EXPECT_EQ(out["finish_reason"], "eos");
  EXPECT_EQ(out["prompt_tokens"], c["ids"].size());
  EXPECT_GT(out["decode_tok_s"].get<double>(), 0.0);
  const CliRun by_default = run_vericache(command);
  ASSERT_EQ(by_default.exit_code, 0) << by_default.err;
  EXPECT_EQ(nlohmann::json::parse(by_default.out)["compute"], "integer");
  const CliRun bad = run_vericache(command + " --compute int8");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--compute must be auto, float32 or integer, got 'int8'"), std::string::npos) << bad.err;
}

TEST(Cli, CorruptModelFileGivesOneLineErrorAndExitCode1) {
  const std::string model = testing::read_file(testing::default_model_path());
  const std::string path = testing::temp_dir() + "/corrupt.gguf";
  std::ofstream(path, std::ios::binary) << model.substr(0, 5'000'000);
  const CliRun r = run_vericache("generate --model " + path + " --prompt hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err.rfind("vericache: error: " + path + ": truncated: tensor '", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(Cli, MissingModelAndBadOptionsAreUsageOrRunErrors) {
  CliRun r = run_vericache("generate --model /nonexistent/model.gguf --prompt hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "vericache: error: /nonexistent/model.gguf: no such file\n");
  r = run_vericache("generate --prompt hi --top-p 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("vericache generate: --top-p must be in (0, 1], got 0\n", 0), 0u) << r.err;
  r = run_vericache("generate --no-such-flag");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unrecognised option '--no-such-flag'"), std::string::npos) << r.err;
  r = run_vericache("generate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("vericache generate: no prompt: give --prompt TEXT or --prompt-file PATH\n", 0), 0u) << r.err;
  r = run_vericache("frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "vericache: unknown command 'frobnicate'. Run 'vericache --help' for the list.\n");
}

// `vericache model --json` on the paper's worked example (Mistral-24B on an RTX PRO 6000, M = 48 GB,
// KV_full = 5 GB, c = 0.2, x = 25, B = 6, gamma = 0.85: T_gpu about 35 ms, T_xfer about 19 ms,
// about 312 tok/s with the paper's eta), and a bad profile name or policy as a usage error.
TEST(Cli, ModelPrintsThePapersWorkedExample) {
  CliRun r = run_vericache("model --hardware rtx-pro-6000 --weights-gb 48 --kv-full-gb 5 -c 0.2 -x 25 -b 6 --gamma 0.85 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_NEAR(out["t_gpu_ms"].get<double>(), 34.5, 1e-9);
  EXPECT_NEAR(out["t_xfer_ms"].get<double>(), 18.75, 1e-9);
  EXPECT_EQ(out["binding"], "hbm");
  EXPECT_NEAR(out["throughput_tok_s_paper"].get<double>(), 312.0, 0.02 * 312.0);
  EXPECT_NEAR(out["eta_cycle"].get<double>(), 22.25 / 26.0, 1e-12);
  EXPECT_EQ(out["staggered_fits_memory"], true);
  r = run_vericache("simulate --policy eager");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("vericache simulate: --policy: unknown reload policy 'eager' (staggered, lockstep or no-overlap)\n", 0),
            0u)
      << r.err;
  r = run_vericache("model --hardware a100");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("vericache model: no hardware profile named 'a100' (known: cpu-2core, gh200, h100-nvl, h200, "
                        "rtx-pro-6000; or give a .json path)\n",
                        0),
            0u)
      << r.err;
}

// vericache bench-reload: two policies over each of two emulated links, each lossless, each with
// the simulator's prediction beside it (what the numbers are is the benchmark's business, under
// results/); its verify windows feed `simulate --acceptance-trace`; bad lists and an unknown policy
// are usage errors.
TEST(Cli, BenchReloadMeasuresAndSimulatesEachPolicy) {
  const std::string windows = testing::temp_dir() + "/windows.h5";
  // The reload spans as many iterations as the copy takes over the measured step time (7 at 2 GB/s in
  // integer compute on a 2-core AMD EPYC), and lockstep needs a window of at least that plus x + 2.
  CliRun r = run_vericache(
      "bench-reload --context 2000 -b 2 --decode-tokens 12 -x 4 --window 24 --policies staggered,lockstep "
      "--link-gb-s 2,4 --simulations 5 --json --windows-out " + windows);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::vector<std::string> policies, links;
  for (std::string line; std::getline(lines, line);) {
    const auto out = nlohmann::json::parse(line);
    policies.push_back(out["policy"]);
    links.push_back(out["link"]);
    EXPECT_EQ(out["mismatches"], 0);
    EXPECT_GT(out["measured_tok_s"].get<double>(), 0);
    EXPECT_GT(out["simulated_tok_s"].get<double>(), 0);
    EXPECT_GT(out["measured_tokens_per_verify"].get<double>(), 1.0);
    EXPECT_GT(out["measured_peak_transient_bytes"].get<double>(), 0);
    ASSERT_EQ(out["request_alphas"].size(), 2u);  // two prompts, each with its own acceptance
    for (double a : out["request_alphas"]) EXPECT_TRUE(a > 0 && a <= 1) << a;
  }
  EXPECT_EQ(policies, (std::vector<std::string>{"staggered", "lockstep", "staggered", "lockstep"}));
  EXPECT_EQ(links, (std::vector<std::string>{"emulated link at 2.00 GB/s", "emulated link at 2.00 GB/s",
                                             "emulated link at 4.00 GB/s", "emulated link at 4.00 GB/s"}));
  // The calibration's verify windows drive the simulator's acceptance.
  auto drafted = read_hdf5_column(windows, "drafted");
  ASSERT_TRUE(drafted.ok()) << drafted.status().message();
  EXPECT_GE(drafted->size(), 4u);  // two requests, 11 tokens after the first, at most 5 per window
  const std::string machine = " --weights-gb 48 --kv-full-gb 5 --requests 6 --output-tokens 100 -x 4";
  r = run_vericache("simulate --json --acceptance-trace " + windows + machine);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto sim = nlohmann::json::parse(r.out);
  EXPECT_EQ(sim["trace_windows"].get<size_t>(), drafted->size());
  ASSERT_FALSE(sim["position_alphas"].empty());
  for (double a : sim["position_alphas"]) EXPECT_TRUE(a >= 0 && a <= 1) << a;
  EXPECT_TRUE(sim["alpha"].is_null());
  r = run_vericache("simulate --alpha 0.9 --acceptance-trace " + windows + machine);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("vericache simulate: --alpha and --acceptance-trace exclude each other\n", 0), 0u) << r.err;
  // The prompts are consecutive stretches of the text: B x context tokens of it.
  const std::string text = testing::temp_dir() + "/short.txt";
  std::ofstream(text) << "Too short for two prompts of 2000 tokens.\n";
  r = run_vericache("bench-reload --context 2000 -b 2 --text-file " + text);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(text + " has 14 tokens, fewer than the 4000 the prompts need"), std::string::npos) << r.err;
  r = run_vericache("bench-reload --link-gb-s 2,0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("vericache bench-reload: --link-gb-s: 0 is outside [0.001, 10000]\n", 0), 0u) << r.err;
  r = run_vericache("bench-reload --policies eager");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("vericache bench-reload: --policies: unknown reload policy 'eager' (staggered, lockstep or "
                        "no-overlap)\n",
                        0),
            0u)
      << r.err;
}

// vericache sweep: the Fig. 6 machine over two links, two KV budgets and every policy, one row per
// configuration in the HDF5 file; a row equals `vericache simulate` of the same configuration, and
// a budget too small for the compressed caches is a refused row (ok = 0, NaN results).
TEST(Cli, SweepWritesEveryConfigurationToHdf5) {
  const std::string out = testing::temp_dir() + "/sweep.h5";
  const std::string machine =
      "--weights-gb 50 --kv-full-gb 4 --context 40000 --requests 10 --output-tokens 300 --alpha 0.97 --window 64";
  CliRun r = run_vericache("sweep " + machine +
                           " --rhos 10,32 --kv-fractions 1,0.05 --ratios 0.25 --draft-lengths 30 --batches 10 -o " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("12 configurations, 6 simulated, 6 refused"), std::string::npos) << r.out;
  auto tok_s = read_hdf5_column(out, "tok_s");
  auto ok = read_hdf5_column(out, "ok");
  auto rho = read_hdf5_column(out, "rho");
  auto fraction = read_hdf5_column(out, "kv_fraction");
  auto policy = read_hdf5_column(out, "policy");
  ASSERT_TRUE(tok_s.ok() && ok.ok() && rho.ok() && fraction.ok() && policy.ok()) << tok_s.status().message();
  ASSERT_EQ(tok_s->size(), 12u);
  EXPECT_EQ(*read_hdf5_attribute(out, "hardware"), "rtx-pro-6000");
  const CliRun single = run_vericache("simulate " + machine + " -c 0.25 -x 30 -b 10 --link-gb-s 50 --json");
  ASSERT_EQ(single.exit_code, 0) << single.err;
  const double want = nlohmann::json::parse(single.out)["throughput_tok_s"].get<double>();
  int matched = 0;
  for (size_t i = 0; i < tok_s->size(); ++i) {
    if ((*fraction)[i] < 1) {
      EXPECT_EQ((*ok)[i], 0.0) << i;
      EXPECT_TRUE(std::isnan((*tok_s)[i])) << i;
      continue;
    }
    EXPECT_EQ((*ok)[i], 1.0) << i;
    EXPECT_GT((*tok_s)[i], 0) << i;
    if ((*rho)[i] == 32 && (*policy)[i] == 0) {
      EXPECT_DOUBLE_EQ((*tok_s)[i], want);
      ++matched;
    }
  }
  EXPECT_EQ(matched, 1);
  // Full-KV decoding at the largest batch whose full caches fit the budget: (96 - 50) GB holds
  // eleven 4 GB caches, each step streaming 50 + 44 GB at 1.6 TB/s; 5% of it holds none.
  auto fit_batch = read_hdf5_column(out, "full_kv_fit_batch");
  auto fit_tok_s = read_hdf5_column(out, "full_kv_fit_tok_s");
  ASSERT_TRUE(fit_batch.ok() && fit_tok_s.ok());
  for (size_t i = 0; i < fit_batch->size(); ++i) {
    EXPECT_EQ((*fit_batch)[i], (*fraction)[i] == 1 ? 11.0 : 0.0) << i;
    EXPECT_NEAR((*fit_tok_s)[i], (*fraction)[i] == 1 ? 11 * 1600.0 / 94.0 : 0.0, 1e-9) << i;
  }
  // Every iteration of a simulation, for the timeline of Fig. 6: lockstep holds all ten full caches
  // at once, staggered one or two.
  double peak[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const std::string policy = k == 0 ? "lockstep" : "staggered";
    const std::string file = testing::temp_dir() + "/" + policy + ".h5";
    const CliRun sim = run_vericache("simulate " + machine + " -c 0.25 -x 30 -b 10 --link-gb-s 64 --json --policy " +
                                     policy + " --iterations-out " + file);
    ASSERT_EQ(sim.exit_code, 0) << sim.err;
    const auto j = nlohmann::json::parse(sim.out);
    auto memory = read_hdf5_column(file, "memory_gb");
    auto tokens = read_hdf5_column(file, "tokens");
    ASSERT_TRUE(memory.ok() && tokens.ok());
    EXPECT_EQ(static_cast<int64_t>(memory->size()), j["iterations"].get<int64_t>());
    EXPECT_EQ(std::accumulate(tokens->begin(), tokens->end(), 0.0), j["tokens"].get<double>());
    peak[k] = *std::max_element(memory->begin(), memory->end());
    EXPECT_DOUBLE_EQ(peak[k], j["peak_memory_bytes"].get<double>() / 1e9);
    EXPECT_EQ(*read_hdf5_attribute(file, "policy"), policy);
  }
  // M + B KV_comp + B KV_full, and M + B KV_comp + 2 KV_full; the caches grow by the tokens decoded
  // (300 of 40,000 each: under 1 GB here).
  EXPECT_GE(peak[0], 50 + 10 * 0.25 * 4 + 10 * 4);
  EXPECT_LT(peak[0], 50 + 10 * 0.25 * 4 + 10 * 4 + 1);
  EXPECT_GE(peak[1], 50 + 10 * 0.25 * 4 + 2 * 4);
  EXPECT_LT(peak[1], 50 + 10 * 0.25 * 4 + 2 * 4 + 1);
  EXPECT_EQ(read_hdf5_column(out, "missing").status().message(), out + ": no column 'missing'");
  r = run_vericache("sweep --rhos 10,x -o " + out);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("vericache sweep: --rhos: 'x' is not a number\n", 0), 0u) << r.err;
}

// --model takes an embedded model's short name as well as a path.
TEST(Cli, ModelsByShortName) {
  const CliRun qwen = run_vericache("generate --model qwen2.5-coder-0.5b -p \"What is 2+2?\" -n 8 --json");
  ASSERT_EQ(qwen.exit_code, 0) << qwen.err;
  const auto out = nlohmann::json::parse(qwen.out);
  EXPECT_EQ(out["model"], testing::qwen_model_path());
  EXPECT_NE(out["text"].get<std::string>().find('4'), std::string::npos) << out["text"];
  const CliRun unknown = run_vericache("generate --model nosuch -p hi");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_EQ(unknown.err, "vericache: error: no model named 'nosuch' (embedded: smollm2-135m, qwen2.5-coder-0.5b, "
                         "qwen2.5-coder-1.5b; or a path to a GGUF file)\n");
}

TEST(Cli, PluginsListsDescriptorsAndRefusals) {
  const CliRun r = run_vericache(std::string("plugins --json --plugin-dir ") + VC_FIXTURE_PLUGIN_DIR);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  // The bundled compressors (build/plugins) and the example from the fixture folder, with their
  // families and modes.
  std::map<std::string, std::pair<std::string, std::string>> expected{
      {"streaming_llm", {"token-dropping", "offline"}}, {"snapkv", {"token-dropping", "offline"}},
      {"expected_attention", {"token-dropping", "offline"}}, {"kvzip", {"token-dropping", "offline"}},
      {"kvzap", {"token-dropping", "online"}}, {"kivi", {"quantization", "online"}},
      {"rotatekv", {"quantization", "online"}}, {"kvquant", {"quantization", "online"}}};
  for (const auto& p : out["plugins"]) {
    const auto it = expected.find(p["name"]);
    if (it == expected.end()) continue;
    EXPECT_EQ(p["family"], it->second.first) << it->first;
    EXPECT_EQ(p["mode"], it->second.second) << it->first;
    EXPECT_EQ(p["abi_version"], 8);
    expected.erase(it);
  }
  EXPECT_TRUE(expected.empty()) << expected.begin()->first << " not listed: " << r.out;
  EXPECT_EQ(out["rejected"].size(), 5u);  // the broken fixtures
}

// `vericache calibrate --compressor rotatekv` writes one key-channel order per layer, each a
// permutation, and different layers get different orders (their keys differ).
TEST(Cli, CalibrateWritesOneKeyOrderPerLayer) {
  const std::string out = testing::temp_dir() + "/rotatekv.json";
  const CliRun r = run_vericache("calibrate --compressor rotatekv --passages 2 --passage-tokens 64 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(out);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["format"], "vericache-calibration");
  EXPECT_EQ(j["compressor"], "rotatekv");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["head_group"], 1) << "SmolLM2 has 3 KV heads: no grouping";
  ASSERT_EQ(j["layers"].size(), 30u);
  std::set<std::vector<int>> distinct;
  for (const auto& layer : j["layers"]) {
    std::vector<int> order = layer["key_order"].get<std::vector<int>>();
    std::vector<int> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < 192; ++i) ASSERT_EQ(sorted.at(i), i) << "not a permutation of the 192 key channels";
    distinct.insert(order);
  }
  EXPECT_EQ(distinct.size(), 30u) << "every layer has its own order";
}

// `vericache calibrate --compressor kvquant` writes per layer a key range per channel (lower below
// upper) and, for keys and values at 2, 3, 4 and 8 bits, 2^b increasing centroids in [-1, 1] with
// Q-Norm terms near the identity; different layers get different ranges.
TEST(Cli, CalibrateKvquantWritesRangesAndDatatypes) {
  const std::string out = testing::temp_dir() + "/kvquant.json";
  const CliRun r = run_vericache("calibrate --compressor kvquant --passages 2 --passage-tokens 64 --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(out);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["compressor"], "kvquant");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["outlier_fraction"], 0.01);
  ASSERT_EQ(j["layers"].size(), 30u);
  std::set<std::vector<float>> distinct;
  for (const auto& layer : j["layers"]) {
    const auto lower = layer["key_lower"].get<std::vector<float>>(), upper = layer["key_upper"].get<std::vector<float>>();
    ASSERT_EQ(lower.size(), 192u);
    ASSERT_EQ(upper.size(), 192u);
    for (size_t c = 0; c < lower.size(); ++c) ASSERT_LT(lower[c], upper[c]) << "channel " << c;
    distinct.insert(upper);
    for (const char* types : {"key_types", "value_types"}) {
      for (int bits : {2, 3, 4, 8}) {
        const auto& d = layer[types][std::to_string(bits)];
        const auto c = d["centroids"].get<std::vector<float>>();
        ASSERT_EQ(c.size(), size_t{1} << bits) << types << " " << bits;
        for (size_t i = 0; i < c.size(); ++i) {
          ASSERT_GE(c[i], -1.0f);
          ASSERT_LE(c[i], 1.0f);
          if (i > 0) {
            ASSERT_LT(c[i - 1], c[i]) << types << " " << bits << " bits: not increasing";
          }
        }
        EXPECT_NEAR(d["norm_scale"].get<double>(), 1.0, 0.25) << types << " " << bits;
        EXPECT_NEAR(d["norm_offset"].get<double>(), 0.0, 0.1) << types << " " << bits;
      }
    }
  }
  EXPECT_EQ(distinct.size(), 30u) << "every layer has its own key ranges";
}

// Quantizers in `compress` and `generate`: the prompt's whole blocks are packed (KIVI 4 bits,
// G = 32, residual 32: a packed slot is 2 * 192 * 4 / 8 code bytes + 2 * 6 * 4 group bytes = 240
// bytes per layer against 768 in the default bfloat16 pages, 1,536 in float32 ones), the rest stays
// in float pages, and resident bytes are exactly that; decoding on the packed cache alone
// generates; --ratio is refused for a quantizer.
TEST(Cli, CompressAndGenerateRunQuantizers) {
  const std::string prompt = testing::temp_dir() + "/quantizer_prompt.txt";
  std::ofstream(prompt) << testing::read_file(testing::source_path("datasets/tokenizer_corpus/corpus.txt")).substr(0, 2000);
  const CliRun c = run_vericache("compress --compressor kivi --params '{\"bits\": 4}' --json -f " + prompt);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const auto packed = nlohmann::json::parse(c.out);
  const int64_t n = packed["prompt_tokens"], layers = 30;
  EXPECT_EQ(packed["bits"], 4);
  EXPECT_EQ(packed["packed_slots"].get<int64_t>(), n / 32 * 32);
  EXPECT_EQ(packed["full_kv_bytes"].get<int64_t>(), layers * n * 768);
  EXPECT_EQ(packed["resident_kv_bytes"].get<int64_t>(), layers * ((n / 32 * 32) * 240 + (n % 32) * 768));

  const CliRun g = run_vericache("generate --compressor kivi --params '{\"bits\": 4}' -n 8 --ignore-eos --json -f " + prompt);
  ASSERT_EQ(g.exit_code, 0) << g.err;
  const auto out = nlohmann::json::parse(g.out);
  EXPECT_EQ(out["tokens"].size(), 8u);
  // Prompt + 7 decoded tokens per layer, every one kept; packed up to the last whole block.
  const int64_t total = n + 7;
  EXPECT_EQ(out["resident_kv_slots"].get<int64_t>(), total * layers);
  EXPECT_EQ(out["resident_kv_bytes"].get<int64_t>(), layers * ((total / 32 * 32) * 240 + (total % 32) * 768));
  // float32 pages: the residual and the full cache at 1,536 bytes a slot.
  const CliRun f = run_vericache("compress --compressor kivi --params '{\"bits\": 4}' --kv-cache float32 --json -f " + prompt);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  const auto packed_f32 = nlohmann::json::parse(f.out);
  EXPECT_EQ(packed_f32["full_kv_bytes"].get<int64_t>(), layers * n * 1536);
  EXPECT_EQ(packed_f32["resident_kv_bytes"].get<int64_t>(), layers * ((n / 32 * 32) * 240 + (n % 32) * 1536));

  for (const std::string command : {"generate -n 4", "compress", "run -n 4"}) {
    const CliRun r = run_vericache(command + " --compressor kivi -c 0.5 -p hello");
    const std::string name = command.substr(0, command.find(' '));
    EXPECT_EQ(r.exit_code, 2) << command;
    EXPECT_EQ(r.err, "vericache " + name +
                         ": --ratio does not apply to a quantizer: kivi keeps every token, its bit width sets the size "
                         "(--params '{\"bits\": 4}')\nRun 'vericache " + name + " --help' for the options.\n");
  }
}

// bench-attention: one row per cache (the float cache, KIVI in place, KIVI through unpack()), the
// float row the reference of the speedups, the packed rows at KIVI's bit math (4 bits + 2 float16
// per group of 32 keys and of 32 values: 5/32 of float32, 10/32 of bfloat16 pages, the default
// with integer compute) plus the float residual of the new tokens.
TEST(Cli, BenchAttentionMeasuresFloatAndKiviBothWays) {
  const CliRun r = run_vericache("bench-attention --json --context 256 --batch 2 --steps 2 --quantizer 'kivi={\"bits\": 4}'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<nlohmann::json> rows;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 3u) << r.out;
  EXPECT_EQ(rows[0]["cache"], "bfloat16");
  EXPECT_EQ(rows[0]["kv_cache"], "bfloat16");
  EXPECT_EQ(rows[1]["cache"], "kivi 4-bit in place");
  EXPECT_EQ(rows[2]["cache"], "kivi 4-bit unpack()");
  EXPECT_DOUBLE_EQ(rows[0]["attention_speedup"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(rows[0]["resident_fraction"].get<double>(), 1.0);
  for (int i : {1, 2}) {
    EXPECT_EQ(rows[i]["bits"], 4);
    EXPECT_DOUBLE_EQ(rows[i]["resident_fraction"].get<double>(), 10.0 / 32.0) << rows[i].dump();
    EXPECT_GT(rows[i]["attention_ms"].get<double>(), 0.0);
  }
  const CliRun dropper = run_vericache("bench-attention --context 256 --quantizer snapkv");
  EXPECT_EQ(dropper.exit_code, 2);
  EXPECT_EQ(dropper.err.rfind("vericache bench-attention: snapkv is not a quantizer", 0), 0u) << dropper.err;
}

// bench --random-weights: every line names the random weights and the random K/V; bytes per step
// count the cache each forward reads (C cached + the window's slots, float32 K and V in 30 layers
// of 3 heads x 64); FLOPs grow with the window; the option errors say what to do. bench --window on
// the model file: the same timing with its weights, split into parts, in decode steps.
TEST(Cli, BenchRandomWeightsTimesForwardsAtANamedShape) {
  const CliRun r = run_vericache(
      "bench --random-weights smollm2-135m --contexts 64 --batches 2 --decode-tokens 2 --window 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const CliRun w = run_vericache(
      "bench --random-weights smollm2-135m --contexts 64 --batches 2 --decode-tokens 2 --window 3 --json");
  ASSERT_EQ(w.exit_code, 0) << w.err;
  const nlohmann::json step = nlohmann::json::parse(r.out), window = nlohmann::json::parse(w.out);
  for (const nlohmann::json& row : {step, window}) {
    EXPECT_EQ(row["model"], "random-weights:smollm2-135m (random weights, timing only)");
    EXPECT_EQ(row["weights"], "random (timing only)");
    EXPECT_EQ(row["kv"], "random (no prefill)");
    EXPECT_EQ(row["steps"], 2);
    EXPECT_GT(row["ms_per_step"].get<double>(), 0.0);
  }
  EXPECT_EQ(step["kv_bytes_per_step"], int64_t{2} * 30 * 3 * 64 * 4 * 2 * (64 + 1));
  EXPECT_EQ(window["kv_bytes_per_step"], int64_t{2} * 30 * 3 * 64 * 4 * 2 * (64 + 3));
  EXPECT_GT(window["flops_per_step"].get<double>(), 2.9 * step["flops_per_step"].get<double>());
  EXPECT_NE(r.err.find("[bench] random-weights:smollm2-135m: context 64, batch 2, window 1: 2 timed forwards"),
            std::string::npos)
      << r.err;

  const CliRun unknown = run_vericache("bench --random-weights llama-70b");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_EQ(unknown.err.rfind("vericache bench: --random-weights: unknown model shape 'llama-70b'; known shapes: "
                              "llama-3.1-8b, smollm2-135m\n",
                              0),
            0u)
      << unknown.err;
  const CliRun both = run_vericache("bench --random-weights smollm2-135m --model smollm2");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_EQ(both.err.rfind("vericache bench: --random-weights replaces --model and --text-file; pass one or the other", 0),
            0u)
      << both.err;
  // On the model file's weights: a decode step, then a 3-row window, its time split into the weight
  // matrices, attention and the output head, and given in decode steps of the same configuration.
  const CliRun file = run_vericache("bench --window 1,3 --contexts 64 --batches 1 --decode-tokens 2 --json");
  ASSERT_EQ(file.exit_code, 0) << file.err;
  std::vector<nlohmann::json> lines;
  std::istringstream out(file.out);
  for (std::string line; std::getline(out, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 2u) << file.out;
  for (const nlohmann::json& row : lines) {
    EXPECT_EQ(row["weights"], "the model file's");
    EXPECT_EQ(row["kv"], "random (no prefill)");
    for (const char* part : {"linear_ms", "attention_ms", "logits_ms"}) EXPECT_GT(row[part].get<double>(), 0.0) << part;
    EXPECT_LT(row["linear_ms"].get<double>() + row["attention_ms"].get<double>() + row["logits_ms"].get<double>(),
              row["ms_per_step"].get<double>());
  }
  EXPECT_EQ(lines[0]["window"], 1);
  EXPECT_EQ(lines[1]["window"], 3);
  EXPECT_EQ(lines[0]["decode_steps"], 1.0);
  EXPECT_NEAR(lines[1]["decode_steps"].get<double>(),
              lines[1]["ms_per_step"].get<double>() / lines[0]["ms_per_step"].get<double>(), 1e-9);
  const CliRun help = run_vericache("bench --help");
  EXPECT_NE(help.out.find("llama-3.1-8b  Llama-3.1-8B (32 layers"), std::string::npos) << help.out;
}

// `vericache conformance` on the rule-breaking fixture by path: exit status 1 and a report naming
// the broken rule and where; 0 on the same fixture without a flaw; errors for a bad or missing spec.
TEST(Cli, ConformanceReportsTheBrokenRule) {
  const std::string plugin = std::string(VC_FIXTURE_PLUGIN_DIR) + "/vc_plugin_rule_breaker.so";
  const CliRun broken =
      run_vericache("conformance --compressor " + plugin + " --params '{\"flaw\": \"drops_sink\"}' --ratios 0.25");
  EXPECT_EQ(broken.exit_code, 1) << broken.err;
  EXPECT_NE(broken.out.find("\n  FAIL  protected       c = 0.25         layer 7, head 0, position 0: a protected token is "
                            "not kept\n"),
            std::string::npos)
      << broken.out;
  EXPECT_TRUE(broken.out.ends_with("\n9 of 10 checks passed: BROKEN: protected\n")) << broken.out;

  const CliRun fine = run_vericache("conformance --compressor " + plugin + " --ratios 0.5 --json");
  ASSERT_EQ(fine.exit_code, 0) << fine.err;
  const auto report = nlohmann::json::parse(fine.out);
  EXPECT_EQ(report["compressor"], "rule_breaker");
  EXPECT_EQ(report["passed"], true);
  EXPECT_EQ(report["broken_rules"].size(), 0u);
  EXPECT_EQ(report["checks"].size(), 11u);
  EXPECT_EQ(report["checks"].back()["rule"], "lossless");

  const std::string spec = testing::temp_dir() + "/bad_spec.json";
  std::ofstream(spec) << R"({"protect": {"first": 4}})";
  const CliRun bad = run_vericache("conformance --compressor " + plugin + " --spec " + spec);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err, "vericache conformance: " + spec +
                         ": conformance spec: \"protect\" is not a spec key (params, ratios, budget, window, protected, "
                         "max_relative_error)\nRun 'vericache conformance --help' for the options.\n");
  const CliRun missing = run_vericache("conformance --compressor " + plugin + " --spec /nonexistent/spec.json");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err, "vericache: error: /nonexistent/spec.json: cannot read the conformance spec\n");
  const CliRun none = run_vericache("conformance");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_EQ(none.err, "vericache conformance: give --compressor NAME or --compressor PATH\nRun 'vericache conformance "
                      "--help' for the options.\n");
}

TEST(Cli, CompressRunsAPluginByPath) {
  const std::string plugin = std::string(VC_FIXTURE_PLUGIN_DIR) + "/vc_plugin_streaming_llm.so";
  const CliRun r = run_vericache("compress --compressor " + plugin +
                                 " --params '{\"sinks\": 2}' -c 0.5 --no-chat-template --json -p \"" +
                                 std::string(40, 'a') + " b c d e f g h\"");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["compressor"], "streaming_llm");
  const int64_t n = out["prompt_tokens"];
  for (const auto& k : out["kept_per_layer"]) EXPECT_EQ(k.get<int64_t>(), n / 2);
  EXPECT_FALSE(out.contains("kept_positions"));
  // --positions: StreamingLLM keeps the 2 sinks and the newest n/2 - 2 tokens, in every (layer, head).
  const CliRun listed = run_vericache("compress --compressor " + plugin +
                                      " --params '{\"sinks\": 2}' -c 0.5 --no-chat-template --json --positions -p \"" +
                                      std::string(40, 'a') + " b c d e f g h\"");
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  std::vector<int64_t> want{0, 1};
  for (int64_t p = n - (n / 2 - 2); p < n; ++p) want.push_back(p);
  const auto kept = nlohmann::json::parse(listed.out)["kept_positions"];
  ASSERT_EQ(kept.size(), out["kept_per_layer"].size());
  for (const auto& layer : kept) {
    ASSERT_EQ(layer.size(), 3u);  // SmolLM2's KV heads
    for (const auto& head : layer) EXPECT_EQ(head.get<std::vector<int64_t>>(), want);
  }
  const CliRun quantized = run_vericache("compress --compressor kivi --positions -p hi");
  EXPECT_EQ(quantized.exit_code, 2);
  EXPECT_EQ(quantized.err.rfind("vericache compress: --positions lists kept tokens; a quantizer (kivi) keeps every token\n", 0), 0u)
      << quantized.err;
  const CliRun bad = run_vericache("compress --compressor " + plugin + " --params '{\"sinks\": -1}' -p hi");
  EXPECT_EQ(bad.exit_code, 2);  // bad --params are a bad command line
  EXPECT_EQ(bad.err.rfind("vericache compress: plugins: streaming_llm: bad parameters: 'sinks' must be a non-negative "
                          "integer, got -1\n", 0), 0u) << bad.err;
  const CliRun missing = run_vericache("compress --compressor no_such_compressor -p hi");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err.rfind("vericache: error: plugins: no compressor named 'no_such_compressor'", 0), 0u) << missing.err;
}

TEST(Cli, CompressorErrorsSayWhatToDo) {
  const CliRun no_weights = run_vericache("compress --compressor kvzap -p hi");
  EXPECT_EQ(no_weights.exit_code, 1);
  EXPECT_EQ(no_weights.err,
            "vericache: error: kvzap: no surrogate weights: make them with 'vericache train-kvzap --out kvzap.json', then "
            "pass --params '{\"weights\": \"kvzap.json\"}' (or set VERICACHE_KVZAP_WEIGHTS)\n");
  const std::string other = testing::temp_dir() + "/other_model.json";
  std::ofstream(other) << R"({"format": "vericache-kvzap", "version": 1, "kind": "linear", "layers": [],
                             "model": {"name": "Other", "fingerprint": "0123456789abcdef"}})";
  const CliRun wrong_model = run_vericache("compress --compressor kvzap --params '{\"weights\": \"" + other + "\"}' -p hi");
  EXPECT_EQ(wrong_model.exit_code, 1);
  EXPECT_EQ(wrong_model.err.rfind("vericache: error: kvzap: surrogate weights '" + other +
                                      "' were trained for model 'Other' (fingerprint 0123456789abcdef), not this one",
                                  0),
            0u)
      << wrong_model.err;
  const CliRun even_kernel = run_vericache("compress --compressor snapkv --params '{\"kernel_size\": 4}' -p hi");
  EXPECT_EQ(even_kernel.exit_code, 2);
  EXPECT_EQ(even_kernel.err.rfind("vericache compress: plugins: snapkv: bad parameters: 'kernel_size' must be odd (the "
                                  "pooling keeps the length), got 4\n", 0), 0u) << even_kernel.err;
  const CliRun unknown = run_vericache("compress --compressor kvzip --params '{\"chunk\": 4}' -p hi");
  EXPECT_EQ(unknown.err.rfind("vericache compress: plugins: kvzip: bad parameters: unknown parameter 'chunk' (known: ", 0), 0u)
      << unknown.err;
  const CliRun short_prompt = run_vericache("compress --compressor snapkv -p hi");
  EXPECT_EQ(short_prompt.exit_code, 1);
  EXPECT_EQ(short_prompt.err.rfind("vericache: error: snapkv: the prompt (", 0), 0u) << short_prompt.err;
  const CliRun ratio_alone = run_vericache("generate -c 0.5 -p hi");
  EXPECT_EQ(ratio_alone.exit_code, 2);
  EXPECT_EQ(ratio_alone.err.rfind("vericache generate: --ratio needs --compressor", 0), 0u) << ratio_alone.err;
}

TEST(Cli, GenerateOnACompressedCacheReportsResidentSlots) {
  const std::string text = testing::read_file(testing::source_path("datasets/tokenizer_corpus/corpus.txt")).substr(0, 3000);
  const std::string prompt = testing::temp_dir() + "/prompt.txt";
  std::ofstream(prompt) << text;
  const CliRun r = run_vericache("generate --compressor snapkv -c 0.25 -n 8 --ignore-eos --json -f " + prompt);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["compressor"], "snapkv");
  EXPECT_EQ(out["tokens"].size(), 8u);
  const int64_t n = out["prompt_tokens"], layers = 30;
  // The full cache would hold prompt + 7 decoded tokens per layer; the compressed one floor(n/4) + 7.
  EXPECT_EQ(out["full_kv_slots"].get<int64_t>(), (n + 7) * layers);
  EXPECT_EQ(out["resident_kv_slots"].get<int64_t>(), (n / 4 + 7) * layers);
}

TEST(Cli, HelpExplainsEveryOption) {
  const CliRun r = run_vericache("generate --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* option : {"--model", "--prompt", "--prompt-file", "--system", "--no-chat-template", "--max-tokens",
                             "--temperature", "--top-k", "--top-p", "--seed", "--batch", "--stop", "--ignore-eos",
                             "--threads", "--page-size", "--prefill-chunk", "--compressor", "--params", "--ratio",
                             "--plugin-dir", "--json"}) {
    EXPECT_NE(r.out.find(option), std::string::npos) << option;
  }
  const CliRun top = run_vericache("--help");
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_NE(top.out.find("generate"), std::string::npos);
}

// vericache run: VeriCache decoding diffed against full-KV decoding in the same process.
TEST(Cli, RunCheckIsLosslessAndReportsAcceptance) {
  const std::string text = testing::read_file(testing::source_path("datasets/tokenizer_corpus/corpus.txt")).substr(0, 2000);
  const std::string prompt = testing::temp_dir() + "/prompt.txt";
  std::ofstream(prompt) << text;
  const CliRun r = run_vericache("run --check --compressor expected_attention -c 0.25 -x 6 --draft-policy fixed -b 2 -n 24 --ignore-eos --json -f " + prompt);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["compressor"], "expected_attention");
  EXPECT_EQ(out["mismatches"], 0);
  EXPECT_EQ(out["mismatched_requests"], 0);
  ASSERT_EQ(out["requests"].size(), 2u);
  EXPECT_EQ(out["requests"][0]["tokens"].size(), 24u);
  EXPECT_EQ(out["requests"][0]["tokens"], out["requests"][1]["tokens"]);  // same prompt, greedy
  EXPECT_EQ(out["generated_tokens"], 48);
  const int64_t drafts = out["drafts"], accepted = out["accepted_tokens"], drafted = out["draft_tokens"];
  EXPECT_GT(drafts, 0);
  EXPECT_DOUBLE_EQ(out["mean_acceptance_length"].get<double>(), 1.0 + static_cast<double>(accepted) / drafts);
  EXPECT_DOUBLE_EQ(out["acceptance_rate"].get<double>(), static_cast<double>(accepted) / drafted);
  EXPECT_EQ(out["acceptance_rate_per_position"].size(), 6u);
  EXPECT_LT(out["resident_kv_slots"].get<int64_t>(), out["full_kv_slots"].get<int64_t>());
  EXPECT_EQ(out["compressor_failures"].size(), 0u);
}

// --check must be able to fail: with a test-only fault (VERICACHE_TEST_FAULT, engine/test_faults.h)
// the verify row that decides request 1's output token 5 loses its largest logit, so the engine
// commits another token there. --check exits 1 and names that request and position, in JSON and
// in text; request 0 stays identical. A malformed fault is a usage error.
TEST(Cli, RunCheckFailsAndNamesTheFirstMismatchWhenAVerifyRowIsPerturbed) {
  const std::string prompt = testing::temp_dir() + "/prompt.txt";
  std::ofstream(prompt) << testing::read_file(testing::source_path("datasets/tokenizer_corpus/corpus.txt")).substr(0, 600);
  const std::string args = "run --check --compressor snapkv -c 0.25 -x 4 -b 2 -n 12 --ignore-eos -f " + prompt;
  const CliRun r = testing::run_command("VERICACHE_TEST_FAULT=perturb_verify_row:1:5 " + std::string(VC_BINARY) + " " +
                                        args + " --json");
  ASSERT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("[test-only fault injected (VERICACHE_TEST_FAULT=perturb_verify_row:1:5): this run is wrong on "
                       "purpose]"),
            std::string::npos)
      << r.err;
  const auto out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["mismatched_requests"], 1);
  EXPECT_TRUE(out.contains("test_fault")) << "a faulted run's JSON must say so";
  EXPECT_GT(out["mismatches"].get<int64_t>(), 0);
  EXPECT_EQ(out["requests"][0]["first_mismatch"], -1);
  EXPECT_EQ(out["requests"][1]["first_mismatch"], 5);
  EXPECT_EQ(out["first_difference"].get<std::string>().rfind("request 1, output token 5: VeriCache ", 0), 0u)
      << out["first_difference"];
  // Tokens 0-4 of the faulted request are still full-KV greedy (request 0 is the same prompt).
  for (int t = 0; t < 5; ++t) EXPECT_EQ(out["requests"][1]["tokens"][t], out["requests"][0]["tokens"][t]) << t;

  const CliRun text = testing::run_command("VERICACHE_TEST_FAULT=perturb_verify_row:1:5 " + std::string(VC_BINARY) +
                                           " " + args);
  EXPECT_EQ(text.exit_code, 1);
  EXPECT_NE(text.err.find("mismatching tokens in 1 of 2 requests"), std::string::npos) << text.err;
  EXPECT_NE(text.err.find("[first difference: request 1, output token 5: VeriCache "), std::string::npos) << text.err;

  // Without the fault the same run is lossless (the check is not failing for another reason).
  EXPECT_EQ(run_vericache(args + " --json").exit_code, 0);

  const CliRun bad = testing::run_command("VERICACHE_TEST_FAULT=perturb_verify_row:1:0 " + std::string(VC_BINARY) + " " +
                                          args);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err.rfind("vericache run: VERICACHE_TEST_FAULT: test fault 'perturb_verify_row:1:0': expected "
                          "perturb_verify_row:REQUEST:POSITION (POSITION >= 1), draft_probs_from_next_row or "
                          "target_from_next_row\n",
                          0),
            0u)
      << bad.err;
}

// bench-engine gives each request of a batch its own stretch of the text (a prompt set read as text
// here): the requests' greedy outputs differ (with --same-prompt they are one); it checks VeriCache
// against full-KV decoding on those prompts, and says which prompts it used;
// a text too short for batch x context tokens is refused with the numbers.
TEST(Cli, BenchEngineDecodesDistinctPromptsPerRequest) {
  const std::string set = testing::source_path("datasets/lossless_prompts/prompts.json");
  const CliRun r = run_vericache("bench-engine --json --contexts 256 --batches 2 --compressors snapkv --draft-lengths 4 "
                                 "--decode-tokens 8 --text-file " + set);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto row = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  EXPECT_EQ(row["mismatches"], 0);
  EXPECT_EQ(row["batch"], 2);
  EXPECT_EQ(row["prompts"], "a different stretch of the text per request");
  EXPECT_EQ(row["text"], set);
  EXPECT_EQ(row["distinct_outputs"], 2);  // two prompts, two greedy continuations
  // Its baseline is the mean of the full-KV runs just before and just after it; drift is how they differ.
  EXPECT_GT(row["full_kv_step_ms"].get<double>(), 0.0);
  EXPECT_LT(std::abs(row["full_kv_drift"].get<double>()), 2.0);  // |after - before| < 2 x their mean
  // The steady state: steps that carried both requests, a share of the decode time (the first
  // window is always both requests').
  EXPECT_GT(row["full_batch_speedup"].get<double>(), 0.0);
  EXPECT_GT(row["full_batch_time_share"].get<double>(), 0.0);
  EXPECT_LE(row["full_batch_time_share"].get<double>(), 1.0);
  const CliRun same = run_vericache("bench-engine --json --contexts 256 --batches 2 --compressors snapkv "
                                    "--draft-lengths 4 --decode-tokens 8 --same-prompt --text-file " + set);
  ASSERT_EQ(same.exit_code, 0) << same.err;
  const auto same_row = nlohmann::json::parse(same.out.substr(0, same.out.find('\n')));
  EXPECT_EQ(same_row["prompts"], "one prompt, copied to every request");
  EXPECT_EQ(same_row["distinct_outputs"], 1);
  const std::string tiny = testing::temp_dir() + "/tiny.txt";
  std::ofstream(tiny) << "a few words only";
  const CliRun refused = run_vericache("bench-engine --contexts 256 --batches 2 --compressors snapkv --text-file " + tiny);
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find(tiny + " has 4 tokens, fewer than the 512 the prompts need"), std::string::npos) << refused.err;
}

// bench-budget sizes each side's batch from one device budget (two full-KV requests here) and
// checks every VeriCache run against full-KV decoding: in place VeriCache runs more requests than
// full KV (its compressed caches alone take the budget); over an emulated link the ring of one
// KV_full copy comes out of the budget first. Bad --links values are usage errors.
TEST(Cli, BenchBudgetRunsEachSidesLargestBatch) {
  const std::string set = testing::source_path("datasets/lossless_prompts/prompts.json");
  const CliRun r = run_vericache("bench-budget --json --context 256 --decode-tokens 8 --compressor snapkv -x 4 "
                                 "--links in-place,2 --max-batch 8 --text-file " + set);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<nlohmann::json> rows;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 2u) << r.out;
  for (const auto& row : rows) {
    EXPECT_EQ(row["mismatches"], 0);
    EXPECT_EQ(row["full_kv_batch"], 2);
    EXPECT_EQ(row["budget_pages"], 2 * row["full_kv_pages_per_request"].get<int64_t>());
    EXPECT_GT(row["vericache_tok_s"].get<double>(), 0);
    EXPECT_LE(row["vericache_batch"].get<int64_t>() * row["resident_pages_per_request"].get<int64_t>() +
                  row["transient_pages"].get<int64_t>(),
              row["budget_pages"].get<int64_t>());
  }
  EXPECT_EQ(rows[0]["verification"], "in place");
  EXPECT_EQ(rows[0]["transient_pages"], 0);
  // The steady state in place (the first window carries every request); none over a link.
  EXPECT_GT(rows[0]["full_batch_tok_s"].get<double>(), 0.0);
  EXPECT_GT(rows[0]["full_batch_time_share"].get<double>(), 0.0);
  EXPECT_EQ(rows[1]["full_batch_tok_s"].get<double>(), 0.0);
  EXPECT_GT(rows[0]["vericache_batch"].get<int64_t>(), 2);
  EXPECT_EQ(rows[1]["verification"], "2 GB/s emulated link");
  EXPECT_GT(rows[1]["transient_pages"].get<int64_t>(), 0);
  const CliRun bad = run_vericache("bench-budget --links in-place,fast");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--links: 'fast' is neither in-place nor a bandwidth"), std::string::npos) << bad.err;
}

TEST(Cli, RunRejectsBadOptionsWithOneLine) {
  const std::map<std::string, std::string> cases = {
      {"run -p hi --draft-length 0", "vericache run: --draft-length must be in [1, 256], got 0\n"},
      {"run -p hi --ratio 0", "vericache run: --ratio must be in (0, 1], got 0\n"},
      {"run -p hi --draft-kv both", "vericache run: --draft-kv must be 'verified' or 'drafted', got 'both'\n"},
      {"run -p hi --draft-sampling top", "vericache run: --draft-sampling must be 'sampled' or 'argmax', got 'top'\n"},
      {"run -p hi --verify remote", "vericache run: --verify must be 'in-place' or 'transfer', got 'remote'\n"},
      {"run -p hi --link-gbps 8", "vericache run: --link-gbps and --transient-pages need --verify transfer\n"},
      {"run -p hi --check -t 0.7",
       "vericache run: --check compares tokens, which only greedy decoding (--temperature 0) makes identical; at T > 0 "
       "VeriCache matches the full-KV distribution, not its tokens\n"},
      {"run", "vericache run: no prompt: give --prompt TEXT or --prompt-file PATH\n"},
      // Shared with generate (one declaration and check of the decoding options).
      {"run -p hi --page-size 0", "vericache run: --page-size must be a multiple of 16 in [16, 4096], got 0\n"},
      {"generate -p hi --page-size 0", "vericache generate: --page-size must be a multiple of 16 in [16, 4096], got 0\n"},
      {"generate -p hi --threads -1", "vericache generate: --threads must be in [0, 1024], got -1\n"},
      {"run -p hi -t nan", "vericache run: --temperature must be in [0, 100], got nan\n"},
  };
  for (const auto& [args, message] : cases) {
    const CliRun r = run_vericache(args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_EQ(r.err.rfind(message, 0), 0u) << args << ": " << r.err;
  }
  const CliRun plugin = run_vericache("run -p hi --compressor no_such_plugin");
  EXPECT_EQ(plugin.exit_code, 1);
  EXPECT_EQ(plugin.err.rfind("vericache: error: ", 0), 0u) << plugin.err;
  // The compressor's own state counts against --state-memory-mb (Compressor::footprint):
  // ExpectedAttention's per-head query moments, 30 layers x 9 heads x (64 + 64^2) float64 =
  // 8,985,600 bytes on SmolLM2.
  const CliRun state = run_vericache("run -p hi --compressor expected_attention --state-memory-mb 1");
  EXPECT_EQ(state.exit_code, 1);
  EXPECT_NE(state.err.find("request 0 can never fit: expected_attention holds 8985600 bytes of state for it "
                           "(budget: 1000000 bytes)"),
            std::string::npos)
      << state.err;
  const CliRun help = run_vericache("run --help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* option : {"--check", "--compressor", "--ratio", "--draft-length", "--draft-kv", "--draft-sampling",
                             "--verify", "--link-gbps", "--resident-pages", "--host-pages", "--temperature", "--json"}) {
    EXPECT_NE(help.out.find(option), std::string::npos) << option;
  }
}

}  // namespace
}  // namespace vericache
