// vericache compress: prefill a prompt, run one compressor (by name or by .so path) on the full
// cache at kept fraction --ratio, check its output against the contract and report what it kept.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli_common.h"
#include "commands.h"
#include "engine/compressed_kv_check.h"
#include "engine/model_access.h"
#include "loader/plugin_loader.h"

namespace po = boost::program_options;

namespace vericache::cli {

int run_compress(int argc, char** argv) {
  std::string model_arg, compressor_arg, params = "{}", prompt, prompt_file;
  std::vector<std::string> plugin_dirs;
  double ratio = 0.25;
  bool raw = false, json = false;
  int threads = 0;
  po::options_description desc(
      "vericache compress: run one compressor on a prompt's full KV cache and report the kept set\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&model_arg), "GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    ("compressor", po::value(&compressor_arg), "plugin name (see 'vericache plugins') or path to a vc_plugin_*.so")
    ("params", po::value(&params)->default_value("{}"), "the compressor's parameters as a JSON object")
    ("ratio,c", po::value(&ratio)->default_value(0.25), "kept fraction c in (0, 1]: KV_comp = c * KV_full")
    ("prompt,p", po::value(&prompt), "prompt text")
    ("prompt-file,f", po::value(&prompt_file), "read the prompt from a file ('-' for standard input)")
    ("no-chat-template", po::bool_switch(&raw), "tokenize the prompt as is, without the chat template")
    ("plugin-dir", po::value(&plugin_dirs)->composing(), "also search this folder for plugins (repeatable)")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores")
    ("json", po::bool_switch(&json), "print one JSON object");
  // clang-format on
  po::variables_map vm;
  const std::string example =
      "Example:\n  vericache compress --compressor streaming_llm --params '{\"sinks\": 4}' -c 0.25 -f doc.txt\n";
  if (auto done = parse_command_line("compress", desc, example, argc, argv, &vm)) return *done;
  if (compressor_arg.empty()) return report_usage_error("compress", "give --compressor NAME or --compressor PATH");
  if (!(ratio > 0 && ratio <= 1)) return report_usage_error("compress", "--ratio must be in (0, 1]");
  auto text = read_prompt(prompt, prompt_file);
  if (!text.ok()) return report_usage_error("compress", text.status().message());
  set_threads(threads);

  for (const std::string& d : default_plugin_dirs()) plugin_dirs.push_back(d);
  auto plugin = resolve_plugin(compressor_arg, plugin_dirs);
  if (!plugin.ok()) return report_error(plugin.status());
  auto compressor = load_compressor(plugin->path, params);
  if (!compressor.ok()) return report_error(compressor.status());
  auto path = resolve_model_path(model_arg);
  if (!path.ok()) return report_error(path.status());
  auto model = LlamaModel::load(*path);
  if (!model.ok()) return report_error(model.status());
  const LlamaModel& m = **model;
  auto ids = prompt_tokens(m, *text, raw, "");
  if (!ids.ok()) return report_error(ids.status());
  const auto n = static_cast<int64_t>(ids->size());

  // Room for the prompt and for forwards a compressor runs without keeping (up to as long again).
  auto pool = m.make_page_pool(16, m.config().n_layers * ((2 * n + 64) / 16 + 1));
  if (!pool.ok()) return report_error(pool.status());
  SequenceKv kv(m.config().n_layers);
  std::vector<int32_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(i);
  ForwardItem item{*ids, positions, &kv, LogitRows::kNone};
  at::Tensor logits;
  if (Status s = m.forward(std::span(&item, 1), *pool, &logits); !s.ok()) return report_error(s);

  LlamaModelAccess access(m, *pool, kv, *ids, 0);
  CompressedKV compressed;
  const auto start = std::chrono::steady_clock::now();
  Status s = (*compressor)->compress(kv.view(*pool), ratio, access, &compressed);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (s.ok()) s = check_compressed_kv((*compressor)->name(), compressed, kv.view(*pool).layout, kv.view(*pool).lengths);
  if (!s.ok()) return report_error(s);

  std::vector<int64_t> kept_per_layer;
  int64_t kept_total = 0;
  for (const at::Tensor& k : compressed.kept) {
    kept_per_layer.push_back(k.size(1));
    kept_total += k.size(1);
  }
  const double kept_fraction = static_cast<double>(kept_total) / static_cast<double>(n * m.config().n_layers);
  if (json) {
    nlohmann::json out{{"compressor", (*compressor)->name()}, {"path", plugin->path},   {"params", params},
                       {"ratio", ratio},                      {"prompt_tokens", n},    {"kept_per_layer", kept_per_layer},
                       {"kept_fraction", kept_fraction},      {"compress_seconds", seconds}};
    std::cout << out.dump() << "\n";
  } else {
    std::printf("%s (%s) at c = %.3f on %lld prompt tokens: kept %.3f of the cache in %.3f s\n", (*compressor)->name().c_str(),
                plugin->path.c_str(), ratio, static_cast<long long>(n), kept_fraction, seconds);
    std::printf("kept per layer (per KV head):");
    for (int64_t k : kept_per_layer) std::printf(" %lld", static_cast<long long>(k));
    std::printf("\n");
  }
  kv.release(*pool);
  return kExitOk;
}

}  // namespace vericache::cli
