// vericache compress: prefill a prompt, run one compressor (by name or by .so path) at kept
// fraction --ratio (offline: on the full cache after prefill; online: during the prefill), check
// its output against the contract, compact the cache and report what it kept and the bytes resident.
// A quantizer sees the prefill, packs the prompt's whole blocks, and the packed bytes are reported.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <numeric>

#include "cli_common.h"
#include "commands.h"
#include "engine/compression.h"
#include "kv/packed_page_pool.h"

namespace po = boost::program_options;

namespace vericache::cli {
namespace {

// Prefills `ids` with the quantizer packing every whole block, then reports the packed cache.
int compress_with_quantizer(const LlamaModel& m, Compressor& quantizer, const std::string& plugin_path,
                            const std::string& params, std::span<const int32_t> ids, PagePool& pool, bool json) {
  auto format = checked_packed_format(quantizer, pool.spec());
  if (!format.ok()) return report_error(format.status());
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t layers = m.config().n_layers;
  auto packed = PackedPagePool::create(layers * pool.spec().pages_for(n), format->bytes_per_page);
  if (!packed.ok()) return report_error(packed.status());
  SequenceKv kv(layers);
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  const ForwardItem item{ids, positions, &kv, &pool, LogitRows::kNone, 0, &*packed, &quantizer, nullptr, &*format};
  at::Tensor logits;
  const auto start = std::chrono::steady_clock::now();
  const Status s = forward_with_quantizer(m, std::span(&item, 1), pool, &logits, quantizer, *format, *packed, true);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t full = layers * n * (pool.page_bytes() / pool.spec().page_size);
  const int64_t resident = resident_kv_bytes(kv, pool, &*format);
  const int64_t packed_slots = kv.packed_length(0);
  kv.release_packed(*packed);
  kv.release(pool);
  quantizer.release(0);
  if (!s.ok()) return report_error(s);
  if (json) {
    const nlohmann::json out{{"compressor", quantizer.name()}, {"path", plugin_path},     {"params", params},
                             {"bits", format->bit_scheme},     {"prompt_tokens", n},       {"packed_slots", packed_slots},
                             {"prefill_seconds", seconds},     {"full_kv_bytes", full},    {"resident_kv_bytes", resident}};
    std::cout << out.dump() << "\n";
  } else {
    std::printf("%s (%s), %d bits, on %lld prompt tokens: %lld slots per layer packed, the last %lld kept float (the "
                "residual)\n",
                quantizer.name().c_str(), plugin_path.c_str(), format->bit_scheme, static_cast<long long>(n),
                static_cast<long long>(packed_slots), static_cast<long long>(n - packed_slots));
    std::printf("prefill %.3f s, packing whole blocks of %lld slots\n", seconds, static_cast<long long>(format->flush_slots));
    std::printf("resident KV: %.3f of the float32 cache (%.2f of %.2f MiB)\n",
                static_cast<double>(resident) / static_cast<double>(full), resident / 1048576.0, full / 1048576.0);
  }
  return kExitOk;
}

}  // namespace

int run_compress(int argc, char** argv) {
  ComputeArgs compute_arg;
  std::string model_arg, compressor_arg, params = "{}", prompt, prompt_file;
  std::vector<std::string> plugin_dirs;
  double ratio = 0.25;
  bool raw = false, json = false, positions = false;
  int threads = 0;
  po::options_description desc(
      "vericache compress: run one compressor on a prompt's full KV cache and report the kept set\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("compressor", po::value(&compressor_arg), "plugin name (see 'vericache plugins') or path to a vc_plugin_*.so")
    ("params", po::value(&params)->default_value("{}"), "the compressor's parameters as a JSON object")
    ("ratio,c", po::value(&ratio)->default_value(0.25), "kept fraction c in (0, 1]: KV_comp = c * KV_full")
    ("prompt,p", po::value(&prompt), "prompt text")
    ("prompt-file,f", po::value(&prompt_file), "read the prompt from a file ('-' for standard input)")
    ("no-chat-template", po::bool_switch(&raw), "tokenize the prompt as is, without the chat template")
    ("plugin-dir", po::value(&plugin_dirs)->composing(), "also search this folder for plugins (repeatable)")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores")
    ("json", po::bool_switch(&json), "print one JSON object")
    ("positions", po::bool_switch(&positions),
     "token dropping: also print the kept positions per (layer, KV head); with --json as kept_positions[layer][head]");
  // clang-format on
  add_compute_options(desc, compute_arg);
  po::variables_map vm;
  const std::string example =
      "Example:\n  vericache compress --compressor streaming_llm --params '{\"sinks\": 4}' -c 0.25 -f doc.txt\n";
  if (auto done = parse_command_line("compress", desc, example, argc, argv, &vm, {kRatioRange, kThreadsRange})) return *done;
  if (compressor_arg.empty()) return report_usage_error("compress", "give --compressor NAME or --compressor PATH");
  auto text = read_prompt(prompt, prompt_file);
  if (!text.ok()) return report_status("compress", text.status());
  set_threads(threads);

  auto model = load_model(model_arg, compute_arg);
  if (!model.ok()) return report_error(model.status());
  const LlamaModel& m = **model;
  std::string plugin_path;
  auto compressor = load_compressor_for(compressor_arg, params, plugin_dirs, m, &plugin_path);
  if (!compressor.ok()) return report_status("compress", compressor.status());
  const bool quantizer = (*compressor)->family() == CompressorFamily::kQuantization;
  if (quantizer && !vm["ratio"].defaulted()) return report_usage_error("compress", quantizer_ratio_error((*compressor)->name()));
  if (quantizer && positions) {
    return report_usage_error("compress", "--positions lists kept tokens; a quantizer (" + (*compressor)->name() +
                                              ") keeps every token");
  }
  auto ids = prompt_tokens(m, *text, raw, "");
  if (!ids.ok()) return report_error(ids.status());
  const auto n = static_cast<int64_t>(ids->size());

  // Room for the prompt and for forwards a compressor runs without keeping (up to as long again).
  auto pool = m.make_page_pool(16, m.config().n_layers * ((2 * n + 64) / 16 + 1));
  if (!pool.ok()) return report_error(pool.status());
  if (quantizer) return compress_with_quantizer(m, **compressor, plugin_path, params, *ids, *pool, json);
  SequenceKv kv(m.config().n_layers);
  CompressionTimes times;
  if (Status s = prefill_and_compress(m, *pool, **compressor, ratio, *ids, 0, kv, nullptr, &times); !s.ok()) {
    return report_error(s);
  }
  const int64_t full_pages = m.config().n_layers * pool->spec().pages_for(n);  // what the full cache holds
  const int64_t resident_pages = kv.pages_held();

  std::vector<int64_t> kept_per_layer;
  int64_t kept_total = 0;
  for (int64_t l = 0; l < kv.n_layers(); ++l) {
    kept_per_layer.push_back(kv.length(l));
    kept_total += kv.length(l);
  }
  const double kept_fraction = static_cast<double>(kept_total) / static_cast<double>(n * m.config().n_layers);
  // [layer][KV head] the original positions kept, in slot order (increasing).
  std::vector<std::vector<std::vector<int64_t>>> kept_positions(kv.n_layers());
  for (int64_t l = 0; l < kv.n_layers() && positions; ++l) {
    for (int64_t h = 0; h < m.config().n_kv_heads; ++h) {
      std::vector<int64_t>& p = kept_positions[l].emplace_back();
      for (int64_t s = 0; s < kv.length(l); ++s) p.push_back(kv.position(l, h, s));
    }
  }
  if (json) {
    nlohmann::json out{{"compressor", (*compressor)->name()}, {"path", plugin_path},   {"params", params},
                       {"ratio", ratio},                      {"prompt_tokens", n},    {"kept_per_layer", kept_per_layer},
                       {"kept_fraction", kept_fraction},      {"compress_seconds", times.compress_seconds},
                       {"prefill_seconds", times.prefill_seconds},
                       {"full_kv_bytes", full_pages * pool->page_bytes()},
                       {"resident_kv_bytes", resident_pages * pool->page_bytes()}};
    if (positions) out["kept_positions"] = kept_positions;
    std::cout << out.dump() << "\n";
  } else {
    std::printf("%s (%s) at c = %.3f on %lld prompt tokens: kept %.3f of the cache\n", (*compressor)->name().c_str(),
                plugin_path.c_str(), ratio, static_cast<long long>(n), kept_fraction);
    if ((*compressor)->mode() == CompressionMode::kOffline) {
      std::printf("prefill %.3f s, then compress %.3f s\n", times.prefill_seconds, times.compress_seconds);
    } else {
      std::printf("prefill %.3f s, evicting online during it\n", times.prefill_seconds);
    }
    std::printf("resident KV: %lld of %lld pages (%.1f of %.1f MiB)\n", static_cast<long long>(resident_pages),
                static_cast<long long>(full_pages), resident_pages * pool->page_bytes() / 1048576.0,
                full_pages * pool->page_bytes() / 1048576.0);
    std::printf("kept per layer (per KV head):");
    for (int64_t k : kept_per_layer) std::printf(" %lld", static_cast<long long>(k));
    std::printf("\n");
    for (size_t l = 0; l < kept_positions.size() && positions; ++l) {
      for (size_t h = 0; h < kept_positions[l].size(); ++h) {
        std::printf("layer %zu head %zu:", l, h);
        for (int64_t p : kept_positions[l][h]) std::printf(" %lld", static_cast<long long>(p));
        std::printf("\n");
      }
    }
  }
  kv.release(*pool);
  return kExitOk;
}

}  // namespace vericache::cli
