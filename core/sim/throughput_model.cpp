#include "sim/throughput_model.h"

#include <algorithm>
#include <cmath>

#include "util/check.h"

namespace vericache::sim {

LongContextEstimate estimate_long_context(const LongContextInputs& in) {
  VC_CHECK(in.weight_bytes >= 0 && in.kv_full_bytes > 0 && in.hbm_bandwidth > 0 && in.link_bandwidth > 0,
           "sizes and bandwidths must be positive");
  VC_CHECK(in.batch >= 1 && in.draft_length >= 1 && in.ratio > 0 && in.ratio <= 1 && in.gamma >= 0 && in.gamma <= 1,
           "B >= 1, x >= 1, c in (0, 1], gamma in [0, 1]");
  const auto b = static_cast<double>(in.batch), x = static_cast<double>(in.draft_length);
  LongContextEstimate e;
  e.hbm_bytes_per_iteration = in.weight_bytes + b * in.kv_full_bytes * (in.ratio + 1.0 / x);
  e.reload_bytes_per_iteration = b * in.kv_full_bytes / x;
  e.t_gpu_s = e.hbm_bytes_per_iteration / in.hbm_bandwidth;
  e.t_xfer_s = e.reload_bytes_per_iteration / in.link_bandwidth;
  e.t_iter_s = std::max(e.t_gpu_s, e.t_xfer_s);
  e.binding = e.t_gpu_s >= e.t_xfer_s ? "hbm" : "link";
  e.rho = in.hbm_bandwidth / in.link_bandwidth;
  e.c_star = 1.0 / e.rho - 1.0 / x - in.weight_bytes / (b * in.kv_full_bytes);
  e.eta_paper = 1.0 + in.gamma * x / (x + 1.0);
  e.eta_cycle = (in.gamma * x + 1.0) / (x + 1.0);
  e.tok_s_paper = b * e.eta_paper / e.t_iter_s;
  e.tok_s_cycle = b * e.eta_cycle / e.t_iter_s;
  e.full_kv_resident_bytes = in.weight_bytes + b * in.kv_full_bytes;
  e.full_kv_t_step_s = e.full_kv_resident_bytes / in.hbm_bandwidth;
  e.full_kv_tok_s = b / e.full_kv_t_step_s;
  e.hbm_peak_staggered_bytes = in.weight_bytes + b * in.ratio * in.kv_full_bytes + in.kv_full_bytes;
  e.hbm_peak_lockstep_bytes = in.weight_bytes + b * in.kv_full_bytes;
  e.lockstep_reload_s = b * in.kv_full_bytes / in.link_bandwidth;
  return e;
}

FullKvAtBudget full_kv_at_budget(double weight_bytes, double kv_full_bytes, double hbm_bandwidth, double kv_budget_bytes) {
  VC_CHECK(weight_bytes >= 0 && kv_full_bytes > 0 && hbm_bandwidth > 0, "sizes and bandwidths must be positive");
  FullKvAtBudget f;
  f.batch = kv_budget_bytes > 0 ? static_cast<int64_t>(std::floor(kv_budget_bytes / kv_full_bytes)) : 0;
  if (f.batch > 0) {
    const auto b = static_cast<double>(f.batch);
    f.tok_s = b * hbm_bandwidth / (weight_bytes + b * kv_full_bytes);
  }
  return f;
}

RemotePrefixEstimate estimate_remote_prefix(const RemotePrefixInputs& in) {
  VC_CHECK(in.kv_full_bytes > 0 && in.slow_link_bandwidth > 0 && in.fast_link_bandwidth > 0,
           "sizes and bandwidths must be positive");
  VC_CHECK(in.ratio > 0 && in.ratio <= 1 && in.gamma > 0 && in.gamma <= 1 && in.draft_length >= 1 &&
               in.output_tokens >= 1 && in.t_decode_s >= 0 && in.t_forward_x_s >= 0,
           "c in (0, 1], gamma in (0, 1], x >= 1, K >= 1, times >= 0");
  const auto x = static_cast<double>(in.draft_length), k = static_cast<double>(in.output_tokens);
  RemotePrefixEstimate e;
  e.t_start_s = in.ratio * in.kv_full_bytes / in.slow_link_bandwidth;
  e.t_cycle_s = std::max(x * in.t_decode_s, in.kv_full_bytes / in.fast_link_bandwidth + in.t_forward_x_s);
  e.cycles_paper = k / (x * in.gamma);
  e.cycles_cycle = k / (in.gamma * x + 1.0);
  e.t_request_paper_s = e.t_start_s + e.cycles_paper * e.t_cycle_s;
  e.t_request_cycle_s = e.t_start_s + e.cycles_cycle * e.t_cycle_s;
  e.full_kv_start_s = in.kv_full_bytes / in.slow_link_bandwidth;
  e.startup_speedup = e.full_kv_start_s / e.t_start_s;
  return e;
}

double gamma_for_alpha(double alpha, int64_t x) {
  const double n = static_cast<double>(x);
  return alpha >= 1 ? 1.0 : alpha * (1 - std::pow(alpha, n)) / ((1 - alpha) * n);
}

}  // namespace vericache::sim
