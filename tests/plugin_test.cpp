// Plugin loading: every broken fixture fails with its exact one-line reason and never takes the
// process down; a valid plugin (the out-of-tree StreamingLLM example, built in place) loads by path
// and by name, validates its parameters, outlives its registry, and compresses a real prefilled cache.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/version.h>
#include <vericache/plugin_abi.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "engine/model_access.h"
#include "loader/plugin_loader.h"
#include "test_support.h"

namespace vericache {
namespace {

std::string fixture(const std::string& name) { return std::string(VC_FIXTURE_PLUGIN_DIR) + "/vc_plugin_" + name + ".so"; }

std::string load_error(const std::string& path, const std::string& params = "{}") {
  auto loaded = load_compressor(path, params);
  EXPECT_FALSE(loaded.ok());
  return loaded.ok() ? "" : loaded.status().message();
}

TEST(PluginErrors, MissingFile) {
  const std::string path = std::string(VC_FIXTURE_PLUGIN_DIR) + "/vc_plugin_absent.so";
  EXPECT_EQ(load_error(path), "plugins: failed to load " + path + ": no such file");
}

TEST(PluginErrors, NotASharedLibrary) {
  const std::string path = testing::temp_dir() + "/vc_plugin_text.so";
  std::ofstream out(path);
  for (int i = 0; i < 8; ++i) out << "this is a text file, not a shared library\n";  // longer than an ELF header
  out.close();
  EXPECT_EQ(load_error(path), "plugins: failed to load " + path + ": not a shared library (no ELF magic)");
}

// A truncated library used to die with SIGBUS inside dlopen. Every cut of a real plugin, from an
// empty file to one byte short, is refused with one line before dlopen sees it.
TEST(PluginErrors, EveryTruncationIsRefusedBeforeDlopen) {
  const std::string whole = testing::read_file(fixture("streaming_llm"));
  ASSERT_GT(whole.size(), 20'000u);
  std::vector<size_t> cuts = {0, 1, 63, 64, 20'000, whole.size() - 1};
  for (int i = 1; i < 40; ++i) cuts.push_back(whole.size() * i / 40);
  for (size_t cut : cuts) {
    const std::string path = testing::temp_dir() + "/vc_plugin_cut.so";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << whole.substr(0, cut);
    const std::string message = load_error(path);
    const std::string prefix = "plugins: failed to load " + path + ": ";
    EXPECT_EQ(message.rfind(prefix, 0), 0u) << cut << ": " << message;
    const std::string why = message.substr(std::min(prefix.size(), message.size()));
    const bool short_header = why == "not a shared library: " + std::to_string(cut) + " bytes, shorter than an ELF header";
    const bool truncated = why.rfind("truncated or corrupt: ", 0) == 0 &&
                           why.find("but the file has " + std::to_string(cut) + " bytes") != std::string::npos;
    EXPECT_TRUE(short_header || truncated) << cut << ": " << why;
  }
}

TEST(PluginErrors, WrongKindsOfFilesAreRefused) {
  const std::string dir = testing::temp_dir();
  const std::string fifo = dir + "/vc_plugin_fifo.so";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(load_error(fifo), "plugins: failed to load " + fifo + ": not a regular file (a FIFO, socket or device)");
  std::string other_cpu = testing::read_file(fixture("streaming_llm"));
  other_cpu[18] = 0xB7;  // e_machine: aarch64
  other_cpu[19] = 0;
  const std::string foreign = dir + "/vc_plugin_foreign.so";
  std::ofstream(foreign, std::ios::binary) << other_cpu;
  EXPECT_EQ(load_error(foreign),
            "plugins: failed to load " + foreign + ": a shared library for another CPU (e_machine 183, this machine is x86-64)");
}

// One bad file in a plugin folder never hides the others.
TEST(PluginSearch, BadFilesInAFolderAreRefusedAndTheRestLoad) {
  const std::string dir = testing::temp_dir();
  const std::string whole = testing::read_file(fixture("streaming_llm"));
  std::ofstream(dir + "/vc_plugin_a_truncated.so", std::ios::binary) << whole.substr(0, 20'000);
  std::ofstream(dir + "/vc_plugin_b_empty.so", std::ios::binary);
  ASSERT_EQ(::mkfifo((dir + "/vc_plugin_c_fifo.so").c_str(), 0600), 0);
  std::filesystem::create_directory(dir + "/vc_plugin_d_folder.so");
  std::filesystem::copy_file(fixture("streaming_llm"), dir + "/vc_plugin_streaming_llm.so");
  const PluginSearch search = find_plugins({dir});
  ASSERT_EQ(search.found.size(), 1u);
  EXPECT_EQ(search.found[0].name, "streaming_llm");
  ASSERT_EQ(search.rejected.size(), 4u);
  EXPECT_EQ(search.rejected[0].message().rfind("plugins: failed to load " + dir + "/vc_plugin_a_truncated.so: truncated or corrupt: ", 0), 0u)
      << search.rejected[0].message();
  EXPECT_EQ(search.rejected[1].message(), "plugins: failed to load " + dir +
                                              "/vc_plugin_b_empty.so: not a shared library: 0 bytes, shorter than an ELF header");
  EXPECT_EQ(search.rejected[2].message(),
            "plugins: failed to load " + dir + "/vc_plugin_c_fifo.so: not a regular file (a FIFO, socket or device)");
  EXPECT_EQ(search.rejected[3].message(), "plugins: failed to load " + dir + "/vc_plugin_d_folder.so: is a directory");
  EXPECT_TRUE(resolve_plugin("streaming_llm", {dir}).ok());
}

TEST(PluginErrors, MissingDescriptor) {
  EXPECT_EQ(load_error(fixture("no_descriptor")),
            "plugins: " + fixture("no_descriptor") + ": missing symbol vc_plugin_descriptor_v1");
}

TEST(PluginErrors, AbiMismatchNamesBothVersions) {
  EXPECT_EQ(load_error(fixture("bad_abi")), "plugins: " + fixture("bad_abi") + ": incompatible ABI (plugin: 99, core: " +
                                                std::to_string(VC_PLUGIN_ABI_VERSION) +
                                                "); rebuild the plugin against this VeriCache's headers");
}

TEST(PluginErrors, TorchMismatchNamesBothVersions) {
  EXPECT_EQ(load_error(fixture("bad_torch")),
            "plugins: " + fixture("bad_torch") + ": built against torch 1.13.1, core uses " + TORCH_VERSION);
}

// The C++ standard library must be the core's (VC_PLUGIN_CXX_LIBRARY), and a libstdc++ no newer;
// the compiler itself may differ (it is listed, not checked: GCC and Clang share the C++ ABI).
TEST(PluginErrors, CxxLibraryMismatchNamesBoth) {
  EXPECT_EQ(load_error(fixture("bad_cxx_library")),
            "plugins: " + fixture("bad_cxx_library") + ": built with the C++ library libc++ 170000, core uses " +
                VC_PLUGIN_CXX_LIBRARY + " (standard containers cross the plugin boundary); rebuild the plugin with libstdc++");
  EXPECT_EQ(load_error(fixture("newer_libstdcxx")),
            "plugins: " + fixture("newer_libstdcxx") + ": built with libstdc++ 99991231, newer than the core's " +
                VC_PLUGIN_CXX_LIBRARY + "; rebuild the plugin with the core's compiler (" + __VERSION__ + ")");
  auto info = inspect_plugin(fixture("streaming_llm"));
  ASSERT_TRUE(info.ok()) << info.status().message();
  EXPECT_EQ(info->cxx_library, VC_PLUGIN_CXX_LIBRARY);
  EXPECT_EQ(info->compiler, __VERSION__);
}

TEST(PluginErrors, ThrowingFactoryBecomesAStatus) {
  EXPECT_EQ(load_error(fixture("throwing_factory")),
            "plugins: throwing_factory: factory failed: out of luck while building the compressor");
}

TEST(PluginErrors, BadParametersCarryThePluginsReason) {
  const std::string path = fixture("streaming_llm");
  EXPECT_EQ(load_error(path, R"({"sinks": -1})"),
            "plugins: streaming_llm: bad parameters: 'sinks' must be a non-negative integer, got -1");
  EXPECT_EQ(load_error(path, R"({"window": 3})"), "plugins: streaming_llm: bad parameters: unknown parameter 'window' (known: sinks)");
  EXPECT_EQ(load_error(path, "[1, 2"), "plugins: streaming_llm: bad parameters: parameters must be a JSON object");
  EXPECT_EQ(load_compressor(path, "{}").status().code(), StatusCode::kOk);
}

TEST(PluginErrors, ThrowingHookBecomesAStatus) {
  auto c = load_compressor(fixture("throwing_compress"), "{}");
  ASSERT_TRUE(c.ok()) << c.status().message();
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  auto pool = m->make_page_pool(16, 64);
  ASSERT_TRUE(pool.ok());
  SequenceKv kv(m->config().n_layers);
  LlamaModelAccess model(*m, *pool, kv, {}, 0);
  const KvCacheView view = kv.view(*pool);
  CompressedKV out;
  const Status s = (*c)->compress(view, 0.5, model, &out);
  EXPECT_EQ(s.code(), StatusCode::kPluginError);
  EXPECT_EQ(s.message(), "throwing_compress: scores went NaN");
}

TEST(PluginSearch, FindsValidPluginsAndReportsTheRest) {
  const PluginSearch search = find_plugins({VC_FIXTURE_PLUGIN_DIR});
  std::vector<std::string> names;
  for (const PluginInfo& p : search.found) names.push_back(p.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"failing_unpack", "rule_breaker", "streaming_llm", "throwing_compress", "throwing_factory"}));
  EXPECT_EQ(search.rejected.size(), 5u);  // bad_abi, bad_torch, bad_cxx_library, newer_libstdcxx, no_descriptor
  auto info = resolve_plugin("streaming_llm", {VC_FIXTURE_PLUGIN_DIR});
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->path, fixture("streaming_llm"));
  EXPECT_EQ(info->family, CompressorFamily::kTokenDropping);
  EXPECT_EQ(info->mode, CompressionMode::kOffline);
  EXPECT_EQ(info->abi_version, 8u);
  EXPECT_EQ(info->torch_version, TORCH_VERSION);
  EXPECT_EQ(resolve_plugin("snapkv", {VC_FIXTURE_PLUGIN_DIR}).status().message(),
            "plugins: no compressor named 'snapkv' (found: failing_unpack, rule_breaker, streaming_llm, "
            "throwing_compress, throwing_factory; see 'vericache plugins')");
}

// The example compresses a real prefilled cache; the plugin's library stays loaded while the
// compressor lives even though nothing else holds it.
TEST(PluginRuntime, StreamingLlmCompressesARealCache) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  std::shared_ptr<Compressor> compressor;
  {
    auto loaded = load_compressor(fixture("streaming_llm"), R"({"sinks": 2})");
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    compressor = *loaded;
  }
  EXPECT_EQ(compressor->name(), "streaming_llm");
  auto pool = m->make_page_pool(16, 1024);
  ASSERT_TRUE(pool.ok());
  const std::vector<int32_t> prompt = m->tokenizer().encode("The quick brown fox jumps over the lazy dog. " "Once more, the quick brown fox jumps.", false);
  SequenceKv kv(m->config().n_layers);
  std::vector<int32_t> pos(prompt.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  ForwardItem item{prompt, pos, &kv, &*pool, LogitRows::kNone};
  at::Tensor logits;
  ASSERT_TRUE(m->forward(std::span(&item, 1), &logits).ok());
  LlamaModelAccess access(*m, *pool, kv, prompt, 0);
  CompressedKV out;
  const Status s = compressor->compress(kv.view(*pool), 0.5, access, &out);
  ASSERT_TRUE(s.ok()) << s.message();
  const auto n = static_cast<int64_t>(prompt.size());
  ASSERT_EQ(static_cast<int64_t>(out.kept.size()), m->config().n_layers);
  const int64_t keep = n / 2;
  for (const at::Tensor& kept : out.kept) {
    ASSERT_EQ(kept.sizes(), (at::IntArrayRef{m->config().n_kv_heads, keep}));
    EXPECT_EQ(kept[0][0].item<int64_t>(), 0);
    EXPECT_EQ(kept[0][1].item<int64_t>(), 1);
    EXPECT_EQ(kept[0][2].item<int64_t>(), n - (keep - 2));
    EXPECT_EQ(kept[0][keep - 1].item<int64_t>(), n - 1);
  }
  kv.release(*pool);
}

// ModelAccess::run_without_keeping reports every layer and leaves no trace in the cache.
TEST(PluginRuntime, RunWithoutKeepingRollsBack) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  auto pool = m->make_page_pool(16, 1024);
  ASSERT_TRUE(pool.ok());
  const std::vector<int32_t> prompt = m->tokenizer().encode("Paged caches keep their pages.", false);
  std::vector<int32_t> pos(prompt.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  SequenceKv kv(m->config().n_layers);
  ForwardItem item{prompt, pos, &kv, &*pool, LogitRows::kNone};
  at::Tensor logits;
  ASSERT_TRUE(m->forward(std::span(&item, 1), &logits).ok());
  const int64_t pages_before = pool->num_free();
  LlamaModelAccess access(*m, *pool, kv, prompt, 7);
  const std::vector<int32_t> extra(40, prompt[0]);
  std::vector<int32_t> extra_pos(40);
  for (int i = 0; i < 40; ++i) extra_pos[i] = static_cast<int32_t>(prompt.size()) + i;
  std::vector<int64_t> layers_seen;
  const Status s = access.run_without_keeping(extra, extra_pos, [&](const LayerActivations& a) {
    layers_seen.push_back(a.layer);
    EXPECT_EQ(a.q.sizes(), (at::IntArrayRef{40, m->config().n_heads, m->config().head_dim}));
    EXPECT_EQ(a.request_ids[0], 7);
    EXPECT_EQ(a.positions[0].item<int64_t>(), static_cast<int64_t>(prompt.size()));
    return Status();
  });
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(static_cast<int64_t>(layers_seen.size()), m->config().n_layers);
  EXPECT_EQ(kv.length(0), static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(pool->num_free(), pages_before);
  auto wq = m->weight("blk.2.attn_q.weight");
  ASSERT_TRUE(wq.ok());
  EXPECT_EQ(wq->sizes(), (at::IntArrayRef{576, 576}));
  EXPECT_EQ(m->weight("blk.2.attn_x.weight").status().code(), StatusCode::kNotFound);
  kv.release(*pool);
}

}  // namespace
}  // namespace vericache
