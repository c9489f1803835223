// vericache checklist: the paper's checklist for one model and compressor, each step ending in a
// verdict, every measurement in one HDF5 trace (checklist_trace.h) in a new run folder.
//   1. KL growth: decoding on the compressed cache alone along the full-KV greedy continuation
//      (teacher forced); per-step KL(p_full || p_compressed) and argmax agreement; the cumulative KL
//      (mean over prompts) against the step with a least-squares line. Holds: slope > 0, R^2 >= 0.9.
//   2. Acceptance: the draft-verify engine at each draft length x: accepted length per verify,
//      acceptance per draft position, gamma(x, c) = accepted / drafted; then at x, gamma as c falls
//      (the acceptance cliff), as the temperature rises (sampled) and as the context grows (a few
//      prompts per length cut from a long text). Holds: every greedy run's tokens are full-KV
//      greedy decoding's, and gamma at each x is at most a stated band below the committed
//      baseline for this configuration (checklist_baseline.h; not judged without one).
//   3. Throughput model: Eq. 3's iteration time at each x, its constants fitted to the forwards of
//      the runs at the other draft lengths, against the measured one. Holds: median |error| <= 15%
//      (not judged when this machine's speed moved by more than that between the runs, measured).
//   4. End-to-end: VeriCache at (c, x) with the draft policy (--draft-policy, goodput by default:
//      windows of at most x, 0 when drafting does not pay) against full-KV decoding on the prompt
//      set, every request in one batch: token mismatches, KL(p_full || p_VeriCache) of every output
//      token's distribution and both decode speeds; then at a fixed device KV budget (that of
//      --budget-full-requests whole caches): full KV at the largest batch the budget holds against
//      VeriCache at the largest its compressed caches allow, in place, on distinct prompts of the
//      set. Holds: 0 mismatches in both, every KL < 0.01 nats, and the budget's whole VeriCache
//      batch admitted at once.
// The steps themselves live in checklist_steps.h's files.
// Exit status 1 when a verdict fails.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <csignal>
#include <unistd.h>

#include "bench_support.h"
#include "checklist_baseline.h"
#include "checklist_figures.h"
#include "checklist_steps.h"
#include "checklist_trace.h"
#include "cli_common.h"
#include "commands.h"
#include "draft_policy_options.h"
#include "prompt_set.h"
#include "engine/full_kv_comparison.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace vericache::cli {
namespace {

// The run folder, empty until the trace is written at the end: an interrupted run removes it and
// says so (only async-signal-safe calls in the handler).
char g_run_folder[4096] = {0};
extern "C" void on_interrupt(int signal) {
  if (g_run_folder[0] != 0) rmdir(g_run_folder);
  const char message[] = "\n[checklist] interrupted: no trace written (the run folder was empty and is removed)\n";
  [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, message, sizeof(message) - 1);
  _exit(128 + signal);
}

std::string hardware() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " threads";
}

// A new folder under `root` named after the time and the compressor (-2, -3, ... when taken).
Result<std::string> new_run_folder(const std::string& root, const std::string& compressor) {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::gmtime(&now));
  const std::string base = root + "/checklist-" + stamp + "-" + compressor;
  std::error_code ec;
  fs::create_directories(root, ec);
  for (int i = 1; i < 1000; ++i) {
    const std::string path = i == 1 ? base : base + "-" + std::to_string(i);
    if (fs::create_directory(path, ec)) return path;
    if (ec) return Status::io_error(path + ": cannot create the run folder (" + ec.message() + ")");
  }
  return Status::io_error(base + ": every run folder name is taken");
}

}  // namespace

int run_checklist(int argc, char** argv) {
  ComputeArgs compute_arg;
  std::string model_arg, compressor_arg, params = "{}", xs_arg, ratios_arg, temperatures_arg, contexts_arg, out_dir,
      prompt_set_path, python, context_text, baselines_path;
  std::vector<std::string> plugin_dirs;
  DraftPolicyArgs policy_args;
  double ratio = 0.25, budget_full_requests = 2;
  int64_t x = 25, n_prompts = 0, kl_steps = 0, max_tokens = 0, context_prompts = 0;
  bool quick = false;
  int threads = 0;
  po::options_description desc(
      "vericache checklist: the paper's four-step checklist (KL growth, acceptance, throughput model,\n"
      "end-to-end) on one model and compressor; every measurement goes to an HDF5 trace in a new run\n"
      "folder, with the figures drawn from it. Exit status 1 when a verdict fails.\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("compressor", po::value(&compressor_arg)->default_value("kvzip"),
     "plugin name or path: a token dropper, or a quantizer (which keeps every token: no -c, no c sweep)")
    ("params", po::value(&params)->default_value("{}"), "the compressor's parameters as a JSON object")
    ("ratio,c", po::value(&ratio)->default_value(0.25), "kept fraction c in (0, 1]")
    ("draft-length,x", po::value(&x)->default_value(25),
     "the sweeps' draft length and the end-to-end step's longest window")
    ("draft-lengths", po::value(&xs_arg), "the acceptance step's draft lengths (default 5,10,15,20,25,30,40; --quick 5,10,25)")
    ("ratios", po::value(&ratios_arg),
     "kept fractions c of the acceptance-cliff sweep at x, greedy (default 0.5,0.35,0.25,0.15,0.1,0.05; --quick 0.1; "
     "none: skip); the run's own c is measured once, by the acceptance step")
    ("temperatures", po::value(&temperatures_arg),
     "sampling temperatures of the sweep at (c, x) (default 0.3,0.7,1.0; --quick 0.7; none: skip)")
    ("contexts", po::value(&contexts_arg),
     "prompt lengths (tokens) of the context sweep at (c, x), greedy (default 1024,2048,4096,6000; --quick 1024; "
     "none: skip)")
    ("context-prompts", po::value(&context_prompts),
     "prompts per length in the context sweep, run together (default 2; --quick 1)")
    ("context-text", po::value(&context_text)->default_value(VC_DEFAULT_BENCH_TEXT),
     "the text the context sweep's prompts are cut from (for length N, prompt j is its tokens [jN, (j + 1)N))")
    ("baselines", po::value(&baselines_path)->default_value(VC_SOURCE_DIR "/harness/checklist/acceptance_baselines.json"),
     "step 2's committed gamma(x) per configuration, which a run may fall below by at most the file's band")
    ("prompt-set", po::value(&prompt_set_path)->default_value(VC_CHECKLIST_PROMPTS),
     "prompt set (JSON: {\"prompts\": [{\"name\", \"chat\", \"text\"}]}), e.g. datasets/long_code/prompts.json")
    ("prompts", po::value(&n_prompts), "the set's first N prompts to run (default 4; --quick 2)")
    ("kl-steps", po::value(&kl_steps), "decode steps of the KL growth step (default 128; --quick 32)")
    ("max-tokens", po::value(&max_tokens), "tokens per prompt in the engine steps (default 64; --quick 24)")
    ("quick", po::bool_switch(&quick), "a short run (CI): fewer prompts, steps and draft lengths")
    ("out-dir", po::value(&out_dir)->default_value(VC_RESULTS_RUNS_DIR), "where the run folder is made")
    ("python", po::value(&python)->default_value(default_figures_python()),
     "the Python (with h5py and matplotlib) that draws the figures into the run folder")
    ("plugin-dir", po::value(&plugin_dirs)->composing(), "also search this folder for plugins (repeatable)")
    ("budget-full-requests", po::value(&budget_full_requests)->default_value(2),
     "step 4's fixed device KV budget: the whole caches of this many of the longest requests (0: skip)")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores");
  // clang-format on
  add_compute_options(desc, compute_arg);
  add_draft_policy_options(desc, policy_args);
  po::variables_map vm;
  const std::string example = "Examples:\n  vericache checklist --quick\n  vericache checklist --compressor snapkv -c 0.1 -x 16\n";
  std::vector<OptionRange> ranges{kRatioRange,         kThreadsRange,          {"draft-length", 1, 256},
                                  {"prompts", 1, 50},   {"kl-steps", 2, 4096},  {"max-tokens", 1, 4096},
                                  {"context-prompts", 1, 16}, {"budget-full-requests", 0, 64}};
  ranges.insert(ranges.end(), kDraftPolicyTuningRanges.begin(), kDraftPolicyTuningRanges.end());
  if (auto done = parse_command_line("checklist", desc, example, argc, argv, &vm, ranges)) return *done;
  if (n_prompts == 0) n_prompts = quick ? 2 : 4;
  if (kl_steps == 0) kl_steps = quick ? 32 : 128;
  if (max_tokens == 0) max_tokens = quick ? 24 : 64;
  if (context_prompts == 0) context_prompts = quick ? 1 : 2;
  std::vector<int64_t> xs;
  std::vector<double> ratios, temperatures;
  std::vector<int64_t> contexts;
  try {
    if (contexts_arg.empty()) contexts_arg = quick ? "1024" : "1024,2048,4096,6000";
    if (contexts_arg != "none") contexts = parse_positive_list(contexts_arg, "contexts", 1 << 20);
    xs = parse_positive_list(xs_arg.empty() ? (quick ? "5,10,25" : "5,10,15,20,25,30,40") : xs_arg, "draft-lengths", 256);
    if (ratios_arg.empty()) ratios_arg = quick ? "0.1" : "0.5,0.35,0.25,0.15,0.1,0.05";
    if (ratios_arg != "none") ratios = parse_number_list(ratios_arg, "ratios", 1e-3, 1.0);
    if (temperatures_arg.empty()) temperatures_arg = quick ? "0.7" : "0.3,0.7,1.0";
    if (temperatures_arg != "none") temperatures = parse_number_list(temperatures_arg, "temperatures", 1e-3, 10.0);
  } catch (const po::error& e) {
    return report_usage_error("checklist", e.what());
  }
  if (std::find(xs.begin(), xs.end(), x) == xs.end()) xs.push_back(x);
  ratios.erase(std::remove(ratios.begin(), ratios.end(), ratio), ratios.end());
  auto policy = draft_policy_options(policy_args);
  if (!policy.ok()) return report_status("checklist", policy.status());
  // Test-only: step 4's runs wrong on purpose, so tests can see its verdict fail; never an option.
  auto fault = test_fault_from_environment("checklist");
  if (!fault.ok()) return report_status("checklist", fault.status());
  // Every prompt of the set: steps 1-4 run the first --prompts, step 4's fixed budget as many as it holds.
  auto prompt_set = read_prompt_set(prompt_set_path);
  if (!prompt_set.ok()) return report_status("checklist", prompt_set.status());
  if (static_cast<int64_t>(prompt_set->size()) < n_prompts) {
    return report_usage_error("checklist", prompt_set_path + " has " + std::to_string(prompt_set->size()) +
                                               " prompts, " + std::to_string(n_prompts) + " asked (--prompts)");
  }
  set_threads(threads);

  auto model = load_model(model_arg, compute_arg);
  if (!model.ok()) return report_error(model.status());
  const LlamaModel& m = **model;
  std::string plugin_path;
  auto compressor = load_compressor_for(compressor_arg, params, plugin_dirs, m, &plugin_path);
  if (!compressor.ok()) return report_status("checklist", compressor.status());
  // A quantizer keeps every token (c = 1): no kept fraction to set or sweep; its bits are parameters.
  if ((*compressor)->family() == CompressorFamily::kQuantization) {
    if (!vm["ratio"].defaulted()) return report_usage_error("checklist", quantizer_ratio_error((*compressor)->name()));
    if (vm.count("ratios") && ratios_arg != "none") {
      return report_usage_error("checklist", quantizer_ratio_error((*compressor)->name(), "--ratios"));
    }
    ratio = 1.0;
    ratios.clear();
  }
  if (Status fit = check_contexts_fit(m, contexts, max_tokens, x + 1); !fit.ok()) return report_status("checklist", fit);
  // Step 2's baseline, read now: a bad file is reported before the run, not after it.
  const auto baseline = find_acceptance_baseline(
      baselines_path, BaselineKey{m.path(), (*compressor)->name(), params, ratio, prompt_set_path, n_prompts, max_tokens});
  if (!baseline.ok()) return report_status("checklist", baseline.status());
  std::vector<int32_t> corpus;
  if (!contexts.empty()) {
    auto text = bench_corpus(m, context_text, *std::max_element(contexts.begin(), contexts.end()) * context_prompts);
    if (!text.ok()) return report_status("checklist", text.status());
    corpus = std::move(*text);
  }
  Setup setup{&m, compressor->get(), ratio, {}};
  // Step 4's budget runs the set's prompts no longer than the steps' longest (whose caches size the
  // budget), in the set's order: the steps' own prompts first.
  std::vector<std::vector<int32_t>> budget_prompts;
  for (const PromptEntry& p : *prompt_set) {
    auto ids = prompt_tokens(m, p.text, !p.chat, "");
    if (!ids.ok()) return report_error(ids.status());
    if (static_cast<int64_t>(setup.prompts.size()) < n_prompts) setup.prompts.push_back(*ids);
    budget_prompts.push_back(std::move(*ids));
  }
  size_t longest = 0;
  for (const auto& ids : setup.prompts) longest = std::max(longest, ids.size());
  std::erase_if(budget_prompts, [&](const std::vector<int32_t>& ids) { return ids.size() > longest; });
  auto folder = new_run_folder(out_dir, (*compressor)->name());
  if (!folder.ok()) return report_error(folder.status());
  std::snprintf(g_run_folder, sizeof g_run_folder, "%s", folder->c_str());
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);

  Trace trace;
  std::vector<Verdict> verdicts;
  auto kl = kl_growth(setup, kl_steps, trace);
  if (!kl.ok()) return report_error(kl.status());
  verdicts.push_back(*kl);
  // The full-KV greedy reference the engine runs of steps 2 and 4 are compared with, made once.
  const std::vector<GenerationRequest> greedy = engine_requests(setup.prompts, max_tokens, 0.0);
  GenerationStats full_stats;
  auto reference = full_kv_reference(m, greedy, 16, &full_stats);
  if (!reference.ok()) return report_error(reference.status());
  auto engine_steps = cli::acceptance(setup, xs, greedy, *reference, trace);
  if (!engine_steps.ok()) return report_error(engine_steps.status());
  auto sweeps = ratio_and_temperature_sweeps(setup, x, ratios, temperatures, max_tokens, greedy, *reference, trace);
  if (!sweeps.ok()) return report_error(sweeps.status());
  auto by_context = context_sweep(setup, corpus, contexts, context_prompts, x, max_tokens, trace);
  if (!by_context.ok()) return report_error(by_context.status());
  Verdict acceptance = engine_steps->verdict;
  const bool identical = acceptance.holds == 1 && sweeps->all_identical && by_context->all_identical;
  std::map<int64_t, double> gammas;
  for (const EngineRun& run : engine_steps->runs) gammas[run.x] = run.gamma;
  const AcceptanceJudgement judged = judge_acceptance(gammas, *baseline, baselines_path);
  acceptance.holds = identical ? judged.holds : 0;
  acceptance.summary += sweeps->summary + by_context->summary + judged.summary +
                        " (holds: every greedy run identical, and gamma at each x at most the band below the "
                        "committed baseline)";
  verdicts.push_back(acceptance);
  verdicts.push_back(throughput_model(setup, engine_steps->runs, x, max_tokens, trace));
  const EndToEndOptions end_to_end_options{x, *policy, max_tokens, budget_full_requests, *fault};
  auto end_to_end_verdict = end_to_end(setup, end_to_end_options, greedy, *reference, full_stats, budget_prompts, trace);
  if (!end_to_end_verdict.ok()) return report_error(end_to_end_verdict.status());
  verdicts.push_back(*end_to_end_verdict);

  nlohmann::json verdict_json = nlohmann::json::array();
  for (const Verdict& v : verdicts) {
    verdict_json.push_back({{"step", v.step}, {"name", v.name}, {"holds", v.holds < 0 ? nlohmann::json() : nlohmann::json(v.holds == 1)},
                            {"summary", v.summary}});
  }
  nlohmann::json config{{"compressor", compressor_arg}, {"params", params}, {"ratio", ratio}, {"draft_length", x},
                              {"draft_lengths", xs}, {"ratios", ratios}, {"temperatures", temperatures},
                              {"contexts", contexts}, {"context_prompts", context_prompts},
                              {"context_text", context_text},
                              {"prompts", n_prompts}, {"kl_steps", kl_steps},
                              {"max_tokens", max_tokens}, {"quick", quick}, {"prompt_set", prompt_set_path},
                              {"draft_policy", policy_args.policy}, {"budget_full_requests", budget_full_requests}};
  if (fault->kind != TestFaultKind::kNone) config["test_fault"] = describe_test_fault(*fault);  // a faulted run says so
  Hdf5Table table = trace.table();
  table.attributes = {{"command", command_line(argc, argv)},
                      {"git_commit", [] {
                         std::string c;
                         if (run_shell("git -C " + shell_quoted(VC_SOURCE_DIR) + " rev-parse HEAD", &c) != 0) return std::string("unknown");
                         while (!c.empty() && c.back() == '\n') c.pop_back();
                         return c;
                       }()},
                      {"model_file", m.path()},
                      {"model_fingerprint", m.shape().fingerprint},
                      {"compressor", (*compressor)->name()},
                      {"plugin_path", plugin_path},
                      {"config", config.dump()},
                      {"seed", "0 (greedy)"},
                      {"hardware", hardware()},
                      {"libraries", nlohmann::json{{"vericache", VC_VERSION}, {"torch", TORCH_VERSION}, {"hdf5", hdf5_library_version()}}.dump()},
                      {"verdicts", verdict_json.dump()}};
  const std::string trace_path = *folder + "/trace.h5";
  std::signal(SIGINT, SIG_DFL);  // from here the trace is written whole (beside, then renamed) or not at all
  std::signal(SIGTERM, SIG_DFL);
  if (Status s = write_checklist_trace(trace_path, table); !s.ok()) return report_error(s);

  bool failed = false;
  std::printf("vericache checklist: %s on %s, c = %g, x = %lld, %zu prompts\n", (*compressor)->name().c_str(),
              fs::path(m.path()).filename().c_str(), ratio, static_cast<long long>(x), setup.prompts.size());
  for (const Verdict& v : verdicts) {
    std::printf("%d. %-17s %-13s %s\n", v.step, v.name.c_str(), v.holds < 0 ? "NOT MEASURED" : v.holds ? "HOLDS" : "FAILS",
                v.summary.c_str());
    failed = failed || v.holds == 0;
  }
  std::printf("trace: %s\n", trace_path.c_str());
  // Figures are not a verdict: a run whose figures cannot be drawn says why and how to redraw them.
  if (auto pngs = draw_checklist_figures(trace_path, *folder + "/figures", python); pngs.ok()) {
    std::printf("figures: %s/figures (%zu PNG, each with its data as CSV)\n", folder->c_str(), pngs->size());
  } else {
    std::printf("figures: not drawn (%s); redraw with: vericache figures %s\n", pngs.status().message().c_str(),
                folder->c_str());
  }
  return failed ? kExitFailure : kExitOk;
}

}  // namespace vericache::cli

