// Hostile input to the `vericache` binary, one test per class of failure the hardening issue
// found: no crash, no hang, no silently accepted value, no internal message, no late failure, and
// exit code 2 for every bad command line (1 for a run that failed). Messages are asserted exactly.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_runner.h"
#include "test_support.h"

namespace vericache {
namespace {

using testing::CliRun;
using testing::run_vericache;

// Each command line must exit 2 with `message` as its first line.
void expect_usage_errors(const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [args, message] : cases) {
    const CliRun r = run_vericache(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_EQ(r.err.substr(0, r.err.find('\n')), message) << args;
    EXPECT_EQ(r.out, "") << args;
  }
}

// One validation layer: NaN, negative, zero and absurdly large values are refused the same way by
// every subcommand, before the model is loaded (calibrate's --head-group, which needs the model's
// shape, right after).
TEST(Hardening, EveryCommandChecksNumbersTheSameWay) {
  expect_usage_errors({
      {"generate -p hi --temperature nan", "vericache generate: --temperature must be in [0, 100], got nan"},
      {"generate -p hi --temperature inf", "vericache generate: --temperature must be in [0, 100], got inf"},
      {"generate -p hi --top-p -0.5", "vericache generate: --top-p must be in (0, 1], got -0.5"},
      {"generate -p hi --max-tokens -1", "vericache generate: --max-tokens must be in [0, 262144], got -1"},
      {"generate -p hi --batch 0", "vericache generate: --batch must be in [1, 4096], got 0"},
      {"generate -p hi --ratio 1.5 --compressor snapkv", "vericache generate: --ratio must be in (0, 1], got 1.5"},
      {"run -p hi --threads 2000", "vericache run: --threads must be in [0, 1024], got 2000"},
      {"run -p hi --link-gbps -1 --verify transfer", "vericache run: --link-gbps must be in [0, 1000000], got -1"},
      {"run -p hi --resident-pages -4", "vericache run: --resident-pages must be in [0, 2147483648], got -4"},
      {"run -p hi --draft-p-min 1.5", "vericache run: --draft-p-min must be in [0, 1], got 1.5"},
      {"run -p hi --draft-policy adaptive",
       "vericache run: --draft-policy must be one of fixed|confidence|tiers|goodput, got 'adaptive'"},
      {"bench-engine --draft-policies fixed,bogus",
       "vericache bench-engine: --draft-policies: 'bogus' is not one of fixed|confidence|tiers|goodput"},
      {"bench-engine --draft-policies ,", "vericache bench-engine: --draft-policies is empty"},
      {"bench --page-size 0", "vericache bench: --page-size must be a multiple of 16 in [16, 4096], got 0"},
      {"bench --page-size 24", "vericache bench: --page-size must be a multiple of 16 in [16, 4096], got 24"},
      {"bench --prefill-chunk 0", "vericache bench: --prefill-chunk must be in [1, 1048576], got 0"},
      {"bench --threads 2000", "vericache bench: --threads must be in [0, 1024], got 2000"},
      {"bench --decode-tokens 1", "vericache bench: --decode-tokens must be in [2, 1048576], got 1"},
      {"bench --batches 1,0", "vericache bench: --batches: '0' is not a positive integer"},
      {"bench --contexts 999999999", "vericache bench: --contexts: 999999999 is larger than 262144"},
      {"bench-engine --ratio nan", "vericache bench-engine: --ratio must be in (0, 1], got nan"},
      {"bench-engine --page-size 0", "vericache bench-engine: --page-size must be a multiple of 16 in [16, 4096], got 0"},
      {"bench-engine --draft-lengths 300", "vericache bench-engine: --draft-lengths: 300 is larger than 256"},
      {"bench-acceptance --ratios 0.25,0", "vericache bench-acceptance: --ratios: '0' is not a kept fraction in (0, 1]"},
      {"bench-acceptance --ratios 0.25,x", "vericache bench-acceptance: --ratios: 'x' is not a kept fraction in (0, 1]"},
      {"bench-acceptance --ratios 1.5", "vericache bench-acceptance: --ratios: '1.5' is not a kept fraction in (0, 1]"},
      {"bench-acceptance -x 0", "vericache bench-acceptance: --draft-length must be in [1, 256], got 0"},
      {"bench-acceptance --decode-tokens 1", "vericache bench-acceptance: --decode-tokens must be in [2, 65536], got 1"},
      {"compress --compressor snapkv -p hi -c 0", "vericache compress: --ratio must be in (0, 1], got 0"},
      {"compress --compressor snapkv -p hi --threads -3", "vericache compress: --threads must be in [0, 1024], got -3"},
      {"train-kvzap --out w.json --ridge 0", "vericache train-kvzap: --ridge must be in (0, 1000000000], got 0"},
      {"train-kvzap --out w.json --passages 1", "vericache train-kvzap: --passages must be in [2, 1048576], got 1"},
      {"calibrate --out c.json", "vericache calibrate: give --compressor kvquant or --compressor rotatekv"},
      {"calibrate --compressor kivi --out c.json",
       "vericache calibrate: --compressor must be kvquant or rotatekv (the calibrated quantizers), got 'kivi'"},
      {"calibrate --compressor kvquant --out c.json --outlier-fraction 0.5",
       "vericache calibrate: --outlier-fraction must be in [0, 0.2], got 0.5"},
      {"calibrate --compressor rotatekv", "vericache calibrate: give --out FILE for the calibration"},
      {"calibrate --compressor rotatekv --out c.json --passage-tokens 8",
       "vericache calibrate: --passage-tokens must be in [16, 1048576], got 8"},
      {"calibrate --compressor rotatekv --out c.json --head-group 3",
       "vericache calibrate: --head-group 3 must divide the model's 3 KV heads, and head_group * head_dim (192) must be "
       "a power of two"},
      {"generate -p hi --threads 1e3", "vericache generate: the argument ('1e3') for option '--threads' is invalid"},
  });
}

TEST(Hardening, ArgumentsThatWouldBeIgnoredAreRefused) {
  const std::string dir = testing::temp_dir();
  std::ofstream(dir + "/empty.txt");
  expect_usage_errors({
      {"generate -p hello world",
       "vericache generate: unexpected argument 'world' (options take one value each; quote values with spaces, e.g. "
       "-p \"hello world\")"},
      {"plugins extra", "vericache plugins: unexpected argument 'extra' (options take one value each; quote values with "
                        "spaces, e.g. -p \"hello world\")"},
      {"generate -f " + dir, "vericache generate: --prompt-file " + dir + " is a directory, not a file"},
      {"run -f " + dir + "/empty.txt", "vericache run: --prompt-file " + dir + "/empty.txt is empty"},
      {"generate -p hi --params '{\"window_size\": 8}'", "vericache generate: --params needs --compressor"},
      {"generate -p hi --stop ''", "vericache generate: --stop must not be empty"},
      {"generate -p hi --model ''", "vericache generate: --model must not be empty"},
      {"run -p hi --compressor ''", "vericache run: --compressor must not be empty"},
      {"plugins --plugin-dir ''", "vericache plugins: --plugin-dir must not be empty"},
  });
}

// Invalid --params is a bad command line: exit 2, with the plugin's reason.
TEST(Hardening, BadPluginParametersExitWithTwo) {
  expect_usage_errors({
      {"run -p hi --compressor kvzip --params '{\"bogus\": 1}'",
       "vericache run: plugins: kvzip: bad parameters: unknown parameter 'bogus' (known: allocation, chunk_size, "
       "context_start, keep_prefix, kvzip_plus, n_sink)"},
      {"generate -p hi --compressor snapkv --params '[1, 2]'",
       "vericache generate: plugins: snapkv: bad parameters: parameters must be a JSON object, got: [1, 2]"},
  });
}

// The benchmarks check their compressor list and every context against the model before the first
// prefill, so a bad one fails in seconds rather than after an hour of measuring.
TEST(Hardening, BenchmarksCheckEverythingBeforeTheFirstPrefill) {
  expect_usage_errors({
      {"bench-acceptance --compressors snapkv --params kvzip='{}'",
       "vericache bench-acceptance: --params names kvzip, which is not in --compressors snapkv"},
      {"bench-engine --compressors , ", "vericache bench-engine: --compressors is empty"},
      {"bench-acceptance --compressors snapkv --contexts 2048,8190",
       "vericache bench-acceptance: context 8190 + 64 decode tokens + a verify window of 17 exceeds the model's "
       "context of 8192 tokens"},
      {"bench-engine --compressors snapkv --contexts 2048,8190",
       "vericache bench-engine: context 8190 + 64 decode tokens + a verify window of 26 exceeds the model's context "
       "of 8192 tokens"},
  });
}

// Former crashes and hangs: a FIFO as the model, a model declaring a context of billions of
// tokens, a truncated plugin among good ones.
TEST(Hardening, FormerCrashesAndHangsEndWithOneLine) {
  const std::string dir = testing::temp_dir();
  const std::string fifo = dir + "/model.gguf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  CliRun r = run_vericache("generate -p hi --model " + fifo);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "vericache: error: " + fifo + ": not a regular file (a FIFO, socket or device), expected a file\n");

  const std::string huge = testing::patched_default_model("llama.context_length", testing::bytes_of<uint32_t>(4'000'000'000u),
                                                          "huge_context.gguf");
  r = run_vericache("generate -p hi --model " + huge);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "vericache: error: " + huge +
                       ": metadata 'llama.context_length' = 4000000000 is out of range [1, 262144]\n");
  std::filesystem::remove(huge);

  // A plugin folder holding a truncated copy of a plugin next to a good one: both commands work.
  const std::string plugins = dir + "/plugins";
  std::filesystem::create_directory(plugins);
  const std::string good = std::string(VC_FIXTURE_PLUGIN_DIR) + "/vc_plugin_streaming_llm.so";
  std::filesystem::copy_file(good, plugins + "/vc_plugin_streaming_llm.so");
  std::ofstream(plugins + "/vc_plugin_broken.so", std::ios::binary) << testing::read_file(good).substr(0, 20'000);
  r = run_vericache("plugins --plugin-dir " + plugins);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("streaming_llm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("refused:\n  plugins: failed to load " + plugins + "/vc_plugin_broken.so: truncated or corrupt: "),
            std::string::npos)
      << r.out;
  r = run_vericache("compress --compressor streaming_llm --plugin-dir " + plugins + " -c 0.5 --json -p \"" +
                    std::string(40, 'a') + " b c d\"");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A compressor that refuses the prompt fails the run before any text is printed; a pool that
// cannot be allocated says how big it was, not ATen's words.
TEST(Hardening, FailuresComeBeforeOutputAndInTheUsersTerms) {
  CliRun r = run_vericache("generate -p hi --compressor snapkv -c 0.5 -n 8");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err.rfind("vericache: error: snapkv: the prompt (", 0), 0u) << r.err;
  r = run_vericache("generate -p hi -b 4096 -n 262144 --ignore-eos");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err.rfind("vericache: error: cannot allocate the KV cache: 62914560 pages of 16 tokens, 1440.00 GiB on cpu (not enough memory; ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find("alloc_cpu"), std::string::npos) << r.err;
}

// Output destinations are checked before minutes of work; the OS's reason is given.
TEST(Hardening, OutputDestinationsAreCheckedFirst) {
  const std::string dir = testing::temp_dir();
  expect_usage_errors({
      {"train-kvzap --out " + dir + "/missing/w.json",
       "vericache train-kvzap: --out " + dir + "/missing/w.json: cannot use the folder " + dir +
           "/missing: No such file or directory"},
      {"train-kvzap --out " + dir, "vericache train-kvzap: --out " + dir + ": is a directory; give a file name"},
  });
}

}  // namespace
}  // namespace vericache
