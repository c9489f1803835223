// `vericache conformance`: the conformance kit (conformance/conformance.h) on one plugin, by name or
// path, with the spec found beside it.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "conformance/conformance.h"
#include "loader/plugin_loader.h"

namespace po = boost::program_options;

namespace vericache::cli {
namespace {

Result<ConformanceSpec> read_spec(const std::string& path, bool given, std::string* note) {
  std::ifstream in(path);
  if (!in) {
    if (given) return Status::not_found(path + ": cannot read the conformance spec");
    *note = "no spec beside the plugin (" + path + "): the contract's rules only (no protected tokens, per-layer budget)";
    return ConformanceSpec{};
  }
  std::stringstream text;
  text << in.rdbuf();
  auto spec = parse_conformance_spec(text.str());
  if (!spec.ok()) return Status::invalid_argument(path + ": " + spec.status().message());
  *note = "spec " + path;
  return spec;
}

void print_report(const ConformanceReport& report, bool json, const std::string& plugin_path, const std::string& note,
                  const std::string& params, int64_t prompt_tokens) {
  if (json) {
    nlohmann::json checks = nlohmann::json::array();
    for (const ConformanceCheck& c : report.checks) {
      checks.push_back({{"rule", c.rule}, {"setting", c.setting}, {"passed", c.passed}, {"detail", c.detail}});
    }
    std::cout << nlohmann::json{{"compressor", report.compressor}, {"path", plugin_path}, {"spec", note},
                                {"params", params}, {"prompt_tokens", prompt_tokens}, {"passed", report.passed()},
                                {"broken_rules", report.broken_rules()}, {"checks", checks}}
                     .dump()
              << "\n";
    return;
  }
  std::printf("%s (%s)\n%s; params %s; prompt of %lld tokens\n", report.compressor.c_str(), plugin_path.c_str(),
              note.c_str(), params.c_str(), static_cast<long long>(prompt_tokens));
  for (const ConformanceCheck& c : report.checks) {
    std::printf("  %s  %-15s %-16s %s\n", c.passed ? "pass" : "FAIL", c.rule.c_str(), c.setting.c_str(), c.detail.c_str());
  }
  int64_t passed = 0;
  for (const ConformanceCheck& c : report.checks) passed += c.passed;
  std::string broken;
  for (const std::string& rule : report.broken_rules()) broken += (broken.empty() ? "" : ", ") + rule;
  std::printf("%lld of %zu checks passed: %s\n", static_cast<long long>(passed), report.checks.size(),
              report.passed() ? "conforms" : ("BROKEN: " + broken).c_str());
}

}  // namespace

int run_conformance(int argc, char** argv) {
  ComputeArgs compute_arg;
  std::string model_arg, compressor_arg, params = "{}", spec_arg, prompt, prompt_file, ratios_arg;
  std::vector<std::string> plugin_dirs;
  int64_t prompt_tokens = 640, draft_length = 4, new_tokens = 16;
  bool json = false;
  int threads = 0;
  po::options_description desc(
      "vericache conformance: check a compressor plugin against the contract, rule by rule, on the real model\n\n"
      "Rules: runs, kept-set, positions, budget, footprint, protected, rollback, resident-pages (token dropping);\n"
      "packed-format, resident-pages, round-trip (quantizers); determinism, release, lossless (both).\n"
      "The plugin's promises (protected tokens, budget rule, parameters) come from its spec,\n"
      "vc_plugin_<name>.conformance.json beside the .so. Exit status 0: conforms; 1: a rule is broken.\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("compressor", po::value(&compressor_arg), "plugin name (see 'vericache plugins') or path to a vc_plugin_*.so")
    ("params", po::value(&params)->default_value("{}"), "parameters as a JSON object, over the spec's own")
    ("spec", po::value(&spec_arg), "the conformance spec (default: vc_plugin_<name>.conformance.json beside the plugin)")
    ("ratios", po::value(&ratios_arg), "token dropping: kept fractions to check, e.g. 0.1,0.5 (default: the spec's)")
    ("prompt,p", po::value(&prompt), "prompt text, tokenized as is (default: the start of datasets/prompts/document_2k.txt)")
    ("prompt-file,f", po::value(&prompt_file), "read the prompt from a file ('-' for standard input)")
    ("prompt-tokens", po::value(&prompt_tokens)->default_value(640), "use the prompt's first N tokens")
    ("draft-length,x", po::value(&draft_length)->default_value(4), "the lossless check's draft length")
    ("max-tokens", po::value(&new_tokens)->default_value(16), "tokens the lossless check generates")
    ("plugin-dir", po::value(&plugin_dirs)->composing(), "also search this folder for plugins (repeatable)")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores")
    ("json", po::bool_switch(&json), "print one JSON object");
  // clang-format on
  add_compute_options(desc, compute_arg);
  po::variables_map vm;
  const std::string example =
      "Examples:\n  vericache conformance --compressor snapkv\n"
      "  vericache conformance --compressor build/my_plugin/vc_plugin_mine.so --params '{\"window\": 32}'\n";
  const std::vector<OptionRange> ranges{kThreadsRange, {"prompt-tokens", 2, 1 << 20}, {"draft-length", 1, 64},
                                        {"max-tokens", 1, 4096}};
  if (auto done = parse_command_line("conformance", desc, example, argc, argv, &vm, ranges)) return *done;
  if (compressor_arg.empty()) return report_usage_error("conformance", "give --compressor NAME or --compressor PATH");
  if (prompt.empty() && prompt_file.empty()) {
    prompt_file = VC_DEFAULT_CONFORMANCE_TEXT;
  }
  auto read = read_prompt(prompt, prompt_file);
  if (!read.ok()) return report_status("conformance", read.status());
  set_threads(threads);

  for (const std::string& d : default_plugin_dirs()) plugin_dirs.push_back(d);
  auto plugin = resolve_plugin(compressor_arg, plugin_dirs);
  if (!plugin.ok()) return report_status("conformance", plugin.status());
  std::string note;
  auto spec = read_spec(spec_arg.empty() ? conformance_spec_path(plugin->path) : spec_arg, !spec_arg.empty(), &note);
  if (!spec.ok()) return report_status("conformance", spec.status());
  if (!ratios_arg.empty()) {
    try {
      spec->ratios = parse_number_list(ratios_arg, "ratios", 1e-6, 1);
    } catch (const po::error& e) {
      return report_usage_error("conformance", e.what());
    }
  }
  auto merged = conformance_params(*spec, params);
  if (!merged.ok()) return report_status("conformance", merged.status());

  auto model = load_model(model_arg, compute_arg);
  if (!model.ok()) return report_error(model.status());
  const LlamaModel& m = **model;
  ConformanceOptions options;
  options.prompt = m.tokenizer().encode(*read, /*parse_special=*/false);
  if (static_cast<int64_t>(options.prompt.size()) > prompt_tokens) options.prompt.resize(prompt_tokens);
  options.draft_length = draft_length;
  options.new_tokens = new_tokens;
  const std::string plugin_path = plugin->path;
  const CompressorFactory make = [&]() -> Result<std::shared_ptr<Compressor>> {
    VC_ASSIGN_OR_RETURN(std::shared_ptr<Compressor> c, load_compressor(plugin_path, *merged));
    if (Status s = c->attach(m.shape()); !s.ok()) return Status::plugin_error(s.message());
    return c;
  };
  std::fprintf(stderr, "vericache conformance: checking %s on %lld prompt tokens...\n", plugin->name.c_str(),
               static_cast<long long>(options.prompt.size()));
  auto report = run_conformance(m, make, *spec, options);
  if (!report.ok()) return report_error(report.status());
  print_report(*report, json, plugin_path, note, *merged, static_cast<int64_t>(options.prompt.size()));
  return report->passed() ? kExitOk : kExitFailure;
}

}  // namespace vericache::cli
