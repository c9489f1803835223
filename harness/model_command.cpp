// vericache model: the paper's throughput model for a hardware profile and a model shape. Eq. 3
// (long-context decoding, reloads staggered) by default, Eq. 4 (remote prefix) with
// --scenario remote-prefix. Arithmetic only: no model is loaded, nothing runs.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "cli_common.h"
#include "commands.h"
#include "profile_options.h"
#include "sim/throughput_model.h"

namespace po = boost::program_options;

namespace vericache::cli {
namespace {

constexpr const char* kProfileDir = VC_PROFILE_DIR;

double gb(double bytes) { return bytes / 1e9; }

int print_long_context(const sim::HardwareProfile& hw, const sim::ModelShapeProfile& shape,
                       const sim::LongContextInputs& in, int64_t context, bool json) {
  const sim::LongContextEstimate e = sim::estimate_long_context(in);
  const bool staggered_fits = e.hbm_peak_staggered_bytes <= hw.memory_bytes;
  const bool full_kv_fits = e.full_kv_resident_bytes <= hw.memory_bytes;
  if (json) {
    nlohmann::json out{{"scenario", "long-context"},
                       {"hardware", hw.name},
                       {"model_shape", shape.name},
                       {"context", context},
                       {"batch", in.batch},
                       {"ratio", in.ratio},
                       {"draft_length", in.draft_length},
                       {"gamma", in.gamma},
                       {"weight_bytes", in.weight_bytes},
                       {"kv_full_bytes", in.kv_full_bytes},
                       {"hbm_bandwidth_gb_s", gb(in.hbm_bandwidth)},
                       {"link_bandwidth_gb_s", gb(in.link_bandwidth)},
                       {"hbm_bytes_per_iteration", e.hbm_bytes_per_iteration},
                       {"reload_bytes_per_iteration", e.reload_bytes_per_iteration},
                       {"t_gpu_ms", 1e3 * e.t_gpu_s},
                       {"t_xfer_ms", 1e3 * e.t_xfer_s},
                       {"t_iter_ms", 1e3 * e.t_iter_s},
                       {"binding", e.binding},
                       {"rho", e.rho},
                       {"c_star", e.c_star},
                       {"eta_paper", e.eta_paper},
                       {"eta_cycle", e.eta_cycle},
                       {"throughput_tok_s_paper", e.tok_s_paper},
                       {"throughput_tok_s_cycle", e.tok_s_cycle},
                       {"full_kv_throughput_tok_s", e.full_kv_tok_s},
                       {"hbm_peak_staggered_bytes", e.hbm_peak_staggered_bytes},
                       {"hbm_peak_lockstep_bytes", e.hbm_peak_lockstep_bytes},
                       {"lockstep_reload_ms", 1e3 * e.lockstep_reload_s},
                       {"staggered_fits_memory", staggered_fits},
                       {"full_kv_fits_memory", full_kv_fits}};
    std::cout << out.dump() << std::endl;
    return kExitOk;
  }
  std::printf("%s on %s: context %lld, B = %lld, c = %.3g, x = %lld, gamma = %.3g\n", shape.name.c_str(),
              hw.name.c_str(), static_cast<long long>(context), static_cast<long long>(in.batch), in.ratio,
              static_cast<long long>(in.draft_length), in.gamma);
  std::printf("  M = %.2f GB, KV_full = %.3f GB per request, BW_hbm = %.0f GB/s, BW_inter = %.1f GB/s (rho = %.1f)\n",
              gb(in.weight_bytes), gb(in.kv_full_bytes), gb(in.hbm_bandwidth), gb(in.link_bandwidth), e.rho);
  std::printf("Eq. 3, one iteration:\n");
  std::printf("  T_gpu  = %.2f GB / BW_hbm = %.2f ms   (weights + every KV_comp + amortized KV_full read)\n",
              gb(e.hbm_bytes_per_iteration), 1e3 * e.t_gpu_s);
  std::printf("  T_xfer = %.3f GB / BW_inter = %.2f ms (amortized reloads)\n", gb(e.reload_bytes_per_iteration),
              1e3 * e.t_xfer_s);
  std::printf("  T_iter = %.2f ms, bound by %s; c* = %.3f (below it HBM binds)\n", 1e3 * e.t_iter_s,
              e.binding == std::string("hbm") ? "HBM bandwidth" : "the link", e.c_star);
  std::printf("Throughput, all %lld requests:\n", static_cast<long long>(in.batch));
  std::printf("  %.1f tok/s with the paper's eta = 1 + gamma*x/(x+1) = %.3f tokens per request per iteration\n",
              e.tok_s_paper, e.eta_paper);
  std::printf("  %.1f tok/s with eta = (gamma*x + 1)/(x + 1) = %.3f (a cycle of x drafts and one verify)\n",
              e.tok_s_cycle, e.eta_cycle);
  std::printf("  %.1f tok/s full-KV decoding (every KV_full resident: %.1f GB, %s the %.0f GB device)\n",
              e.full_kv_tok_s, gb(e.full_kv_resident_bytes), full_kv_fits ? "fits" : "does not fit",
              gb(hw.memory_bytes));
  std::printf("Device memory peak: staggered %.1f GB (%s), lockstep %.1f GB; a lockstep verify waits %.0f ms for "
              "its reloads\n",
              gb(e.hbm_peak_staggered_bytes), staggered_fits ? "fits" : "does not fit", gb(e.hbm_peak_lockstep_bytes),
              1e3 * e.lockstep_reload_s);
  return kExitOk;
}

int print_remote_prefix(const sim::ModelShapeProfile& shape, const sim::RemotePrefixInputs& in, int64_t context,
                        bool json) {
  const sim::RemotePrefixEstimate e = sim::estimate_remote_prefix(in);
  if (json) {
    nlohmann::json out{{"scenario", "remote-prefix"},
                       {"model_shape", shape.name},
                       {"context", context},
                       {"ratio", in.ratio},
                       {"draft_length", in.draft_length},
                       {"gamma", in.gamma},
                       {"output_tokens", in.output_tokens},
                       {"kv_full_bytes", in.kv_full_bytes},
                       {"slow_link_gb_s", gb(in.slow_link_bandwidth)},
                       {"fast_link_gb_s", gb(in.fast_link_bandwidth)},
                       {"t_decode_ms", 1e3 * in.t_decode_s},
                       {"t_forward_ms", 1e3 * in.t_forward_x_s},
                       {"t_start_ms", 1e3 * e.t_start_s},
                       {"t_cycle_ms", 1e3 * e.t_cycle_s},
                       {"t_request_ms_paper", 1e3 * e.t_request_paper_s},
                       {"t_request_ms_cycle", 1e3 * e.t_request_cycle_s},
                       {"full_kv_start_ms", 1e3 * e.full_kv_start_s},
                       {"startup_speedup", e.startup_speedup}};
    std::cout << out.dump() << std::endl;
    return kExitOk;
  }
  std::printf("%s, remote prefix of %lld tokens (KV_full %.3f GB): c = %.3g, x = %lld, gamma = %.3g, K = %lld\n",
              shape.name.c_str(), static_cast<long long>(context), gb(in.kv_full_bytes), in.ratio,
              static_cast<long long>(in.draft_length), in.gamma, static_cast<long long>(in.output_tokens));
  std::printf("  start-up: c*KV_full over %.2f GB/s = %.1f ms (%.1f ms for the whole prefix: %.1fx)\n",
              gb(in.slow_link_bandwidth), 1e3 * e.t_start_s, 1e3 * e.full_kv_start_s, e.startup_speedup);
  std::printf("  T_cycle = max(x*T_decode, KV_full/BW_h + T_fwd) = %.1f ms\n", 1e3 * e.t_cycle_s);
  std::printf("  T_req = %.1f ms with the paper's K/(x*gamma) = %.2f cycles; %.1f ms with K/(gamma*x + 1) = %.2f\n",
              1e3 * e.t_request_paper_s, e.cycles_paper, 1e3 * e.t_request_cycle_s, e.cycles_cycle);
  return kExitOk;
}

}  // namespace

int run_model(int argc, char** argv) {
  std::string scenario;
  ProfileOptions profiles;
  int64_t context = 0, batch = 0, draft_length = 0, output_tokens = 0;
  double ratio = 0, gamma = 0, slow_link_gb_s = 0, fast_link_gb_s = 0;
  double t_decode_ms = 0, t_forward_ms = 0;
  bool json = false;
  po::options_description desc(
      "vericache model: the paper's throughput model (Eq. 3 and Eq. 4) for a hardware profile and a model\n"
      "shape. Profiles are JSON files in " +
      std::string(kProfileDir) +
      "/{hardware,models}/ (by name) or any .json path.\n"
      "Tokens per request per iteration are printed two ways: the paper's eta = 1 + gamma*x/(x+1), and\n"
      "(gamma*x + 1)/(x + 1) from a cycle of x drafts and one verify.\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("scenario", po::value(&scenario)->default_value("long-context"), "long-context (Eq. 3) or remote-prefix (Eq. 4)");
  add_profile_options(desc, &profiles);
  desc.add_options()
    ("context", po::value(&context)->default_value(50000), "tokens of context per request")
    ("batch,b", po::value(&batch)->default_value(6), "B: requests decoding together (long-context)")
    ("ratio,c", po::value(&ratio)->default_value(0.2), "c: kept fraction, KV_comp = c * KV_full")
    ("draft-length,x", po::value(&draft_length)->default_value(25), "x: drafted tokens per verify")
    ("gamma", po::value(&gamma)->default_value(0.85), "fraction of drafted tokens accepted")
    ("slow-link-gb-s", po::value(&slow_link_gb_s)->default_value(1.2), "remote-prefix: BW_l, storage to drafting GPU")
    ("fast-link-gb-s", po::value(&fast_link_gb_s)->default_value(40), "remote-prefix: BW_h, local pool to verifying GPU")
    ("output-tokens", po::value(&output_tokens)->default_value(256), "remote-prefix: K tokens generated")
    ("t-decode-ms", po::value(&t_decode_ms)->default_value(20), "remote-prefix: one draft step on KV_comp")
    ("t-forward-ms", po::value(&t_forward_ms)->default_value(60), "remote-prefix: one verify forward of x + 1 tokens")
    ("json", po::bool_switch(&json), "print one JSON object instead of text");
  // clang-format on
  po::variables_map vm;
  const std::string examples =
      "Examples:\n"
      "  vericache model --weights-gb 48 --kv-full-gb 5          # the paper's worked example\n"
      "  vericache model --hardware h100-nvl --model-shape llama-3.1-70b --context 32000 -b 4 --json\n"
      "  vericache model --scenario remote-prefix --model-shape llama-3.1-70b --context 20000 -c 0.25 -x 40\n";
  std::vector<OptionRange> ranges = profile_option_ranges();
  ranges.insert(ranges.end(), {{"context", 1, 1e9},
                               {"batch", 1, 1e6},
                               kRatioRange,
                               {"draft-length", 1, 1e6},
                               {"gamma", 0, 1},
                               {"slow-link-gb-s", 0, 1e6, true},
                               {"fast-link-gb-s", 0, 1e6, true},
                               {"output-tokens", 1, 1e9},
                               {"t-decode-ms", 0, 1e6},
                               {"t-forward-ms", 0, 1e6}});
  if (auto done = parse_command_line("model", desc, examples, argc, argv, &vm, ranges)) return *done;
  if (scenario != "long-context" && scenario != "remote-prefix") {
    return report_usage_error("model", "--scenario must be long-context or remote-prefix, got '" + scenario + "'");
  }
  auto p = resolve_profiles(profiles, vm, context, scenario == "long-context");
  if (!p.ok()) return report_usage_error("model", p.status().message());  // a name or path the user typed

  if (scenario == "remote-prefix") {
    if (gamma <= 0) return report_usage_error("model", "--gamma must be above 0 for remote-prefix");
    sim::RemotePrefixInputs in;
    in.kv_full_bytes = p->kv_full_bytes;
    in.ratio = ratio;
    in.slow_link_bandwidth = slow_link_gb_s * 1e9;
    in.fast_link_bandwidth = fast_link_gb_s * 1e9;
    in.draft_length = draft_length;
    in.gamma = gamma;
    in.output_tokens = output_tokens;
    in.t_decode_s = t_decode_ms / 1e3;
    in.t_forward_x_s = t_forward_ms / 1e3;
    return print_remote_prefix(p->shape, in, context, json);
  }
  sim::LongContextInputs in;
  in.weight_bytes = p->weight_bytes;
  in.kv_full_bytes = p->kv_full_bytes;
  in.hbm_bandwidth = p->hardware.memory_bandwidth;
  in.link_bandwidth = p->link_bandwidth;
  in.batch = batch;
  in.ratio = ratio;
  in.draft_length = draft_length;
  in.gamma = gamma;
  return print_long_context(p->hardware, p->shape, in, context, json);
}

}  // namespace vericache::cli
