// vericache sweep: the simulator (core/sim/simulator.h) over a grid of configurations, every row
// with Eq. 3's prediction beside it, written to one HDF5 file for the harness to draw (ρ, the
// KV budget, x, c, batch size, policy). No model is loaded.
#include <boost/program_options.hpp>

#include <cmath>
#include <cstdio>
#include <limits>

#include "cli_common.h"
#include "commands.h"
#include "profile_options.h"
#include "window_trace.h"
#include "sim/acceptance_model.h"
#include "sim/simulator.h"
#include "sim/throughput_model.h"
#include "util/check.h"
#include "util/hdf5_table.h"
#include "util/output_file.h"

namespace po = boost::program_options;

namespace vericache::cli {
namespace {

// The file's columns, in order; the README of results/ and --help describe them.
const std::vector<std::string> kColumns = {
    "rho", "link_gb_s", "kv_fraction", "draft_length", "ratio", "batch", "policy", "ok",
    "tok_s", "eq3_tok_s_cycle", "eq3_tok_s_paper", "full_kv_tok_s", "stall_s", "link_busy",
    "peak_memory_gb", "peak_streamed_gb", "fits_memory", "drafts_per_verify", "tokens_per_verify", "iterations",
    "simulated_s", "full_kv_fit_batch", "full_kv_fit_tok_s"};

}  // namespace

int run_sweep(int argc, char** argv) {
  ProfileOptions profiles;
  std::string rhos_arg, fractions_arg, drafts_arg, ratios_arg, batches_arg, policies_arg, out_path, trace_path;
  int64_t context = 0, requests = 0, output_tokens = 0, window = 0, seed = 0;
  double alpha = 0;
  po::options_description desc(
      "vericache sweep: the reload-scheduler simulator over a grid of configurations (the Cartesian product of\n"
      "the lists below), each row with Eq. 3's prediction beside it, written to one HDF5 file: one float64\n"
      "column per quantity (rho, link_gb_s, kv_fraction, draft_length, ratio, batch, policy [0 staggered,\n"
      "1 lockstep, 2 no-overlap], ok [0: the configuration cannot run, e.g. memory too small; its results\n"
      "are NaN], tok_s, eq3_tok_s_cycle, eq3_tok_s_paper, full_kv_tok_s, stall_s, link_busy, peak_memory_gb,\n"
      "peak_streamed_gb, fits_memory, drafts_per_verify, tokens_per_verify, iterations, simulated_s,\n"
      "full_kv_fit_batch, full_kv_fit_tok_s [full-KV decoding at the largest batch whose full caches fit the\n"
      "KV budget, from bytes / bandwidth: the baseline of Fig. 13]) and attributes naming the command, the\n"
      "profiles and the acceptance.\n\nOptions");
  desc.add_options()("help,h", "print this help and exit");
  add_profile_options(desc, &profiles);
  // clang-format off
  desc.add_options()
    ("out,o", po::value(&out_path), "the HDF5 file to write (required)")
    ("rhos", po::value(&rhos_arg), "BW_hbm / BW_inter values, each setting the link; default: the profile's link")
    ("kv-fractions", po::value(&fractions_arg)->default_value("1"),
     "fractions of the device memory the weights leave that KV caches (compressed and streamed full) may use")
    ("draft-lengths", po::value(&drafts_arg)->default_value("25"), "x values")
    ("ratios", po::value(&ratios_arg)->default_value("0.2"), "c values")
    ("batches", po::value(&batches_arg)->default_value("6"), "B values")
    ("policies", po::value(&policies_arg)->default_value("staggered,lockstep,no-overlap"), "reload policies")
    ("context", po::value(&context)->default_value(50000), "prompt tokens per request")
    ("requests", po::value(&requests)->default_value(24), "requests per configuration")
    ("output-tokens", po::value(&output_tokens)->default_value(512), "tokens each request generates")
    ("alpha", po::value(&alpha)->default_value(0.95), "probability that a drafted token is accepted")
    ("acceptance-trace", po::value(&trace_path),
     "HDF5 verify windows the engine ran (a checklist trace.h5, or `vericache bench-reload --windows-out`): "
     "acceptance by position in the window, estimated from them, instead of --alpha")
    ("window", po::value(&window)->default_value(64), "W: iterations the scheduler plans ahead")
    ("seed", po::value(&seed)->default_value(1), "acceptance random seed");
  // clang-format on
  po::variables_map vm;
  const std::string examples =
      "Example:\n"
      "  vericache sweep --weights-gb 48 --kv-full-gb 5 --rhos 10,20,30,40,50,60 --ratios 0.1,0.2,0.3 -o sweep.h5\n"
      "  vericache sweep --kv-fractions 0.2,0.5,0.74 --batches 4,8,16,32 \\\n"
      "      --acceptance-trace results/runs/checklist-20261203-100823-kvzip/trace.h5 -o budget.h5\n";
  std::vector<OptionRange> ranges = profile_option_ranges();
  ranges.insert(ranges.end(), {{"context", 1, 1e9},
                               {"requests", 1, 1e6},
                               {"output-tokens", 1, 1e7},
                               {"alpha", 0, 1},
                               {"window", 3, 1e6},
                               {"seed", 0, 9e15}});
  if (auto done = parse_command_line("sweep", desc, examples, argc, argv, &vm, ranges)) return *done;
  if (out_path.empty()) return report_usage_error("sweep", "--out is required");
  if (!trace_path.empty() && !vm["alpha"].defaulted()) {
    return report_usage_error("sweep", "--alpha and --acceptance-trace exclude each other");
  }
  std::vector<double> position_alphas;
  if (!trace_path.empty()) {
    auto acceptance = read_trace_acceptance(trace_path);
    if (!acceptance.ok()) return report_status("sweep", acceptance.status());
    position_alphas = std::move(acceptance->position_alphas);
  }
  std::vector<double> rhos, fractions, ratios;
  std::vector<int64_t> drafts, batches;
  std::vector<sched::ReloadPolicy> policies;
  try {
    if (!rhos_arg.empty()) rhos = parse_number_list(rhos_arg, "rhos", 1e-3, 1e6);
    fractions = parse_number_list(fractions_arg, "kv-fractions", 1e-6, 1);
    ratios = parse_number_list(ratios_arg, "ratios", 1e-6, 1);
    drafts = parse_positive_list(drafts_arg, "draft-lengths", 1 << 16);
    batches = parse_positive_list(batches_arg, "batches", 1 << 20);
  } catch (const po::error& e) {
    return report_usage_error("sweep", e.what());
  }
  for (const std::string& name : split_list(policies_arg)) {
    auto p = sched::parse_policy(name);
    if (!p.ok()) return report_usage_error("sweep", "--policies: " + p.status().message());
    policies.push_back(*p);
  }
  if (policies.empty()) return report_usage_error("sweep", "--policies needs at least one value");
  auto p = resolve_profiles(profiles, vm, context, true);
  if (!p.ok()) return report_usage_error("sweep", p.status().message());
  if (Status s = check_output_path(out_path); !s.ok()) return report_status("sweep", s);
  if (rhos.empty()) rhos = {p->hardware.memory_bandwidth / p->link_bandwidth};

  const size_t total = rhos.size() * fractions.size() * drafts.size() * ratios.size() * batches.size() * policies.size();
  Hdf5Table table;
  table.names = kColumns;
  table.columns.assign(kColumns.size(), {});
  table.attributes = {{"command", command_line(argc, argv)},
                      {"hardware", p->hardware.name},
                      {"model_shape", p->shape.name},
                      {"policies", "0 staggered, 1 lockstep, 2 no-overlap"},
                      {"kv_fraction", "share of (device memory - weights) for compressed and streamed full caches"},
                      {"acceptance", trace_path.empty() ? "alpha " + std::to_string(alpha)
                                                        : "by draft position, from the windows of " + trace_path}};
  size_t done = 0, refused = 0;
  std::string first_refusal;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double rho : rhos)
    for (double fraction : fractions)
      for (int64_t x : drafts)
        for (double ratio : ratios)
          for (int64_t batch : batches)
            for (sched::ReloadPolicy policy : policies) {
              sim::SimulationConfig c = machine_config(*p, context);
              c.link_bandwidth = c.hbm_bandwidth / rho;
              c.output_tokens = output_tokens;
              c.batch = batch;
              c.requests = requests;
              c.ratio = ratio;
              c.alpha = alpha;
              c.position_alphas = position_alphas;
              c.policy = policy;
              c.draft_length = x;
              c.window = window;
              c.seed = static_cast<uint64_t>(seed);
              c.kv_fraction = fraction;
              const double in_row[] = {rho, c.link_bandwidth / 1e9, fraction, static_cast<double>(x), ratio,
                                       static_cast<double>(batch), static_cast<double>(policy)};
              for (size_t k = 0; k < std::size(in_row); ++k) table.columns[k].push_back(in_row[k]);
              auto r = x + 1 < window ? sim::simulate(c)
                                      : Result<sim::SimulationResult>(Status::invalid_argument("need x + 1 < W"));
              const double gamma =
                  position_alphas.empty()
                      ? sim::gamma_for_alpha(alpha, x)
                      : sim::expected_accepted_by_position(position_alphas, x) / static_cast<double>(x);
              sim::LongContextInputs in{c.weight_bytes, p->kv_full_bytes, c.hbm_bandwidth, c.link_bandwidth,
                                        std::min(batch, requests), ratio, x, gamma};
              const sim::LongContextEstimate e = sim::estimate_long_context(in);
              const sim::FullKvAtBudget full = sim::full_kv_at_budget(
                  c.weight_bytes, p->kv_full_bytes, c.hbm_bandwidth, fraction * (c.memory_bytes - c.weight_bytes));
              std::vector<double> out_row;
              if (r.ok()) {
                out_row = {1, r->tok_s, e.tok_s_cycle, e.tok_s_paper, e.full_kv_tok_s, r->stall_seconds,
                           r->link_busy_fraction, r->peak_memory_bytes / 1e9, r->peak_streamed_bytes / 1e9,
                           r->fits_memory ? 1.0 : 0.0, r->mean_drafts_per_verify, r->mean_acceptance_length,
                           static_cast<double>(r->iterations), r->seconds, static_cast<double>(full.batch), full.tok_s};
              } else {
                ++refused;
                if (first_refusal.empty()) first_refusal = r.status().message();
                out_row = {0,   nan, e.tok_s_cycle, e.tok_s_paper, e.full_kv_tok_s, nan, nan, nan, nan, nan, nan, nan, nan,
                           nan, static_cast<double>(full.batch), full.tok_s};
              }
              VC_CHECK(std::size(in_row) + out_row.size() == kColumns.size(), "a row for every column");
              for (size_t k = 0; k < out_row.size(); ++k) table.columns[std::size(in_row) + k].push_back(out_row[k]);
              ++done;
              if (done % std::max<size_t>(1, total / 10) == 0 || done == total) {
                std::fprintf(stderr, "[sweep] %zu of %zu configurations\n", done, total);
              }
            }
  if (Status s = write_hdf5_table(out_path, table); !s.ok()) return report_status("sweep", s);
  std::printf("%zu configurations, %zu simulated, %zu refused%s%s; wrote %s\n", total, total - refused, refused,
              refused ? " (the first: " : "", refused ? (first_refusal + ")").c_str() : "", out_path.c_str());
  return kExitOk;
}

}  // namespace vericache::cli
