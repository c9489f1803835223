// vericache simulate: the reload scheduler run by the discrete-event simulator on a hardware
// profile and a model shape (core/sim/simulator.h), next to Eq. 3's prediction for the same
// configuration. No model is loaded.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "cli_common.h"
#include "commands.h"
#include "profile_options.h"
#include "window_trace.h"
#include "sim/acceptance_model.h"
#include "sim/simulator.h"
#include "sim/throughput_model.h"
#include "util/hdf5_table.h"
#include "util/output_file.h"

namespace po = boost::program_options;

namespace vericache::cli {

int run_simulate(int argc, char** argv) {
  std::string policy_arg, trace_path, iterations_path;
  ProfileOptions profiles;
  int64_t context = 0, batch = 0, requests = 0, output_tokens = 0, draft_length = 0, window = 0;
  int64_t seed = 0;
  double ratio = 0, alpha = 0;
  bool json = false;
  po::options_description desc(
      "vericache simulate: long-context decoding under the reload scheduler, simulated on a hardware\n"
      "profile (iteration time from bytes / memory bandwidth, a serial link for full-cache reloads, each\n"
      "drafted token accepted with probability --alpha until the first rejection, or as the engine's\n"
      "verify windows in --acceptance-trace did), with Eq. 3's prediction for the same configuration\n"
      "beside it. Profiles as for `vericache model`.\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit");
  add_profile_options(desc, &profiles);
  desc.add_options()
    ("policy", po::value(&policy_arg)->default_value("staggered"), "staggered, lockstep or no-overlap")
    ("context", po::value(&context)->default_value(50000), "prompt tokens per request")
    ("batch,b", po::value(&batch)->default_value(6), "requests decoding at once")
    ("requests", po::value(&requests)->default_value(24), "requests in all (a new one takes a finished one's place)")
    ("output-tokens", po::value(&output_tokens)->default_value(512), "tokens each request generates")
    ("ratio,c", po::value(&ratio)->default_value(0.2), "c: kept fraction")
    ("draft-length,x", po::value(&draft_length)->default_value(25), "x: target drafts per verify")
    ("alpha", po::value(&alpha)->default_value(0.95), "probability that a drafted token is accepted")
    ("acceptance-trace", po::value(&trace_path),
     "HDF5 verify windows the engine ran (`vericache bench-reload --windows-out`, or a checklist "
     "trace.h5): acceptance by position in the window, estimated from them, instead of --alpha")
    ("iterations-out", po::value(&iterations_path),
     "also write every simulated iteration to this HDF5 file (columns start_s, seconds, stall_s, "
     "link_busy_s, memory_gb, verifies, tokens): the timeline of Fig. 6")
    ("window", po::value(&window)->default_value(64), "W: iterations the scheduler plans ahead")
    ("seed", po::value(&seed)->default_value(1), "acceptance random seed")
    ("json", po::bool_switch(&json), "print one JSON object instead of text");
  // clang-format on
  po::variables_map vm;
  const std::string examples =
      "Examples:\n"
      "  vericache simulate --weights-gb 48 --kv-full-gb 5 --requests 60 --output-tokens 1000\n"
      "  vericache simulate --policy lockstep --weights-gb 50 --kv-full-gb 4 -c 0.25 -x 30 -b 10 --link-gb-s 50\n"
      "  vericache simulate --acceptance-trace windows.h5 --weights-gb 48 --kv-full-gb 5\n"
      "  vericache simulate --policy lockstep --weights-gb 50 --kv-full-gb 4 -c 0.25 -x 30 -b 10 --link-gb-s 64 \\\n"
      "      --iterations-out lockstep.h5\n";
  std::vector<OptionRange> ranges = profile_option_ranges();
  ranges.insert(ranges.end(), {{"context", 1, 1e9},
                               {"batch", 1, 1e6},
                               {"requests", 1, 1e9},
                               {"output-tokens", 1, 1e9},
                               kRatioRange,
                               {"draft-length", 1, 1e5},
                               {"alpha", 0, 1},
                               {"window", 3, 1e6},
                               {"seed", 0, 9e15}});
  if (auto done = parse_command_line("simulate", desc, examples, argc, argv, &vm, ranges)) return *done;
  if (!trace_path.empty() && !vm["alpha"].defaulted()) {
    return report_usage_error("simulate", "--alpha and --acceptance-trace exclude each other");
  }
  std::vector<double> position_alphas;
  int64_t trace_windows = 0;
  if (!trace_path.empty()) {
    auto acceptance = read_trace_acceptance(trace_path);
    if (!acceptance.ok()) return report_status("simulate", acceptance.status());
    position_alphas = std::move(acceptance->position_alphas);
    trace_windows = acceptance->windows;
  }
  auto policy = sched::parse_policy(policy_arg);
  if (!policy.ok()) return report_usage_error("simulate", "--policy: " + policy.status().message());
  if (draft_length + 1 >= window) {
    return report_usage_error("simulate", "--draft-length + 1 must be below --window (" + std::to_string(window) + ")");
  }
  auto p = resolve_profiles(profiles, vm, context, true);
  if (!p.ok()) return report_usage_error("simulate", p.status().message());
  const sim::HardwareProfile* hw = &p->hardware;
  const sim::ModelShapeProfile* shape = &p->shape;

  sim::SimulationConfig c = machine_config(*p, context);
  c.output_tokens = output_tokens;
  c.batch = batch;
  c.requests = requests;
  c.ratio = ratio;
  c.alpha = alpha;
  c.position_alphas = position_alphas;
  c.policy = *policy;
  c.draft_length = draft_length;
  c.window = window;
  c.seed = static_cast<uint64_t>(seed);
  c.record_iterations = !iterations_path.empty();
  if (c.record_iterations) {
    if (Status s = check_output_path(iterations_path); !s.ok()) return report_status("simulate", s);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto result = sim::simulate(c);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!result.ok()) return report_status("simulate", result.status());
  const sim::SimulationResult& r = *result;
  if (c.record_iterations) {
    Hdf5Table t;
    t.names = {"start_s", "seconds", "stall_s", "link_busy_s", "memory_gb", "verifies", "tokens"};
    t.columns.resize(t.names.size());
    for (const sim::IterationRecord& it : r.iterations_trace) {
      const double row[] = {it.start_s, it.seconds, it.stall_s, it.link_busy_s, it.memory_bytes / 1e9,
                            static_cast<double>(it.verifies), static_cast<double>(it.tokens)};
      for (size_t k = 0; k < t.names.size(); ++k) t.columns[k].push_back(row[k]);
    }
    t.attributes = {{"command", command_line(argc, argv)},
                    {"policy", sched::policy_name(*policy)},
                    {"hardware", hw->name},
                    {"model_shape", shape->name},
                    {"memory_gb", std::to_string(c.memory_bytes / 1e9)}};
    if (Status s = write_hdf5_table(iterations_path, t); !s.ok()) return report_status("simulate", s);
  }

  // Eq. 3 with the gamma this acceptance gives at x drafts.
  const double gamma =
      position_alphas.empty()
          ? sim::gamma_for_alpha(alpha, draft_length)
          : sim::expected_accepted_by_position(position_alphas, draft_length) / static_cast<double>(draft_length);
  sim::LongContextInputs in{c.weight_bytes, c.kv_bytes_per_token * static_cast<double>(context), c.hbm_bandwidth,
                            c.link_bandwidth, std::min(batch, requests), ratio, draft_length, gamma};
  const sim::LongContextEstimate e = sim::estimate_long_context(in);
  if (json) {
    nlohmann::json out{{"hardware", hw->name},
                       {"model_shape", shape->name},
                       {"policy", sched::policy_name(*policy)},
                       {"context", context},
                       {"batch", batch},
                       {"requests", requests},
                       {"output_tokens", output_tokens},
                       {"ratio", ratio},
                       {"draft_length", draft_length},
                       {"alpha", position_alphas.empty() ? nlohmann::json(alpha) : nlohmann::json(nullptr)},
                       {"acceptance_trace", trace_path},
                       {"trace_windows", trace_windows},
                       {"position_alphas", position_alphas},
                       {"window", window},
                       {"iterations", r.iterations},
                       {"simulated_seconds", r.seconds},
                       {"tokens", r.tokens},
                       {"throughput_tok_s", r.tok_s},
                       {"verifies", r.verifies},
                       {"mean_drafts_per_verify", r.mean_drafts_per_verify},
                       {"mean_acceptance_length", r.mean_acceptance_length},
                       {"stall_seconds", r.stall_seconds},
                       {"link_busy_fraction", r.link_busy_fraction},
                       {"peak_memory_bytes", r.peak_memory_bytes},
                       {"peak_streamed_bytes", r.peak_streamed_bytes},
                       {"fits_memory", r.fits_memory},
                       {"mean_iteration_ms", 1e3 * r.mean_iteration_s},
                       {"eq3_gamma", gamma},
                       {"eq3_t_iter_ms", 1e3 * e.t_iter_s},
                       {"eq3_throughput_tok_s_cycle", e.tok_s_cycle},
                       {"eq3_throughput_tok_s_paper", e.tok_s_paper},
                       {"full_kv_throughput_tok_s", e.full_kv_tok_s},
                       {"wall_seconds", wall_s}};
    std::cout << out.dump() << std::endl;
    return kExitOk;
  }
  auto three_digits = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3g", v);
    return std::string(buf);
  };
  std::string acceptance = "alpha = " + three_digits(alpha);
  if (!position_alphas.empty()) {
    acceptance = "acceptance of " + std::to_string(trace_windows) + " engine windows (" + trace_path +
                 "), by position:";
    for (double a : position_alphas) acceptance += " " + three_digits(a);
  }
  std::printf("%s on %s, %s: %lld requests (%lld at once), context %lld, %lld tokens each, c = %.3g, x = %lld, "
              "%s\n",
              shape->name.c_str(), hw->name.c_str(), sched::policy_name(*policy), static_cast<long long>(requests),
              static_cast<long long>(std::min(batch, requests)), static_cast<long long>(context),
              static_cast<long long>(output_tokens), ratio, static_cast<long long>(draft_length), acceptance.c_str());
  std::printf("  simulated: %.1f tok/s (%lld tokens in %.2f s, %lld iterations of %.2f ms on average)\n", r.tok_s,
              static_cast<long long>(r.tokens), r.seconds, static_cast<long long>(r.iterations),
              1e3 * r.mean_iteration_s);
  std::printf("  per verify: %.2f drafts, %.2f tokens; stalled %.3f s waiting for reloads; link busy %.0f%%\n",
              r.mean_drafts_per_verify, r.mean_acceptance_length, r.stall_seconds, 100 * r.link_busy_fraction);
  std::printf("  device memory peak %.1f GB of %.0f GB (%s)\n", r.peak_memory_bytes / 1e9, c.memory_bytes / 1e9,
              r.fits_memory ? "fits" : "does not fit");
  std::printf("  Eq. 3 at gamma = %.3f: %.1f tok/s with eta = (gamma*x + 1)/(x + 1), %.1f with the paper's eta; "
              "full-KV decoding %.1f\n",
              gamma, e.tok_s_cycle, e.tok_s_paper, e.full_kv_tok_s);
  std::printf("  (simulated in %.3f s)\n", wall_s);
  return kExitOk;
}

}  // namespace vericache::cli
