// The paper's analytic throughput model: Eq. 3 (long-context decoding with staggered reloads) and
// Eq. 4 (remote prefix caching), with the crossover c* and the acceptance model eta. Plain
// arithmetic on bytes, bytes/s and seconds; the simulator (same folder) checks it by running the
// scheduler, and the engine by measuring.
//
// eta, tokens per request per iteration: the paper writes eta = 1 + gamma*x/(x+1). A request drafts
// one token per iteration and a cycle of x drafts plus one verify yields gamma*x + 1 tokens (the
// accepted drafts plus the verifier's correction or bonus token), i.e. (gamma*x + 1)/(x + 1) per
// iteration. Both are reported side by side ("paper" and "cycle") until measurements settle it.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace vericache::sim {

// Eq. 3 inputs. Bytes and bytes/s; gamma is the fraction of drafted tokens accepted.
struct LongContextInputs {
  double weight_bytes = 0;    // M: what one forward streams for the weights
  double kv_full_bytes = 0;   // KV_full of one request at its context length
  double hbm_bandwidth = 0;   // BW_hbm
  double link_bandwidth = 0;  // BW_inter: host -> device, for KV_full reloads
  int64_t batch = 1;          // B requests, all at the same context
  double ratio = 0.2;         // c: KV_comp = c * KV_full
  int64_t draft_length = 25;  // x
  double gamma = 0.85;        // fraction of drafted tokens accepted, in [0, 1]
};

struct LongContextEstimate {
  double hbm_bytes_per_iteration = 0;     // M + B*KV_full*(c + 1/x)
  double reload_bytes_per_iteration = 0;  // B*KV_full/x
  double t_gpu_s = 0;                     // hbm_bytes_per_iteration / BW_hbm
  double t_xfer_s = 0;                    // reload_bytes_per_iteration / BW_inter
  double t_iter_s = 0;                    // max of the two
  const char* binding = "";               // "hbm" or "link": the larger term
  double rho = 0;                         // BW_hbm / BW_inter
  double c_star = 0;                      // 1/rho - 1/x - M/(B*KV_full): below it HBM binds
  double eta_paper = 0;                   // 1 + gamma*x/(x+1)
  double eta_cycle = 0;                   // (gamma*x + 1)/(x + 1)
  double tok_s_paper = 0;                 // B * eta_paper / t_iter, all requests together
  double tok_s_cycle = 0;                 // B * eta_cycle / t_iter
  // Full-KV decoding of the same batch with every KV_full resident: each step streams
  // M + B*KV_full and gives each request one token.
  double full_kv_t_step_s = 0;
  double full_kv_tok_s = 0;
  // Device memory: weights, every request's KV_comp, and the full caches resident at once.
  double hbm_peak_staggered_bytes = 0;  // M + B*KV_comp + one KV_full (one verify at a time)
  double hbm_peak_lockstep_bytes = 0;   // M + B*KV_full (everyone verifies in the same iteration)
  double full_kv_resident_bytes = 0;    // M + B*KV_full: what full-KV decoding needs
  double lockstep_reload_s = 0;         // B*KV_full / BW_inter: the serialized reload before a lockstep verify
};

// Eq. 3. Inputs must be positive (ratio in (0, 1], gamma in [0, 1]); checked by the callers that
// parse them (an assertion here).
LongContextEstimate estimate_long_context(const LongContextInputs& in);

// Full-KV decoding at the largest batch whose full caches fit in `kv_budget_bytes`, every step
// streaming M + batch*KV_full: what full-KV decoding gets out of a KV budget. batch 0 and tok_s 0
// when not one request fits.
struct FullKvAtBudget {
  int64_t batch = 0;
  double tok_s = 0;
};
FullKvAtBudget full_kv_at_budget(double weight_bytes, double kv_full_bytes, double hbm_bandwidth, double kv_budget_bytes);

// gamma when each of x drafts is accepted with probability alpha until the first rejection:
// E[accepted] / x = alpha (1 - alpha^x) / ((1 - alpha) x); 1 at alpha = 1.
double gamma_for_alpha(double alpha, int64_t x);

// Eq. 4 inputs: one request whose prefix KV is stored remotely.
struct RemotePrefixInputs {
  double kv_full_bytes = 0;         // KV_full of the prefix
  double ratio = 0.25;              // c: what crosses the slow link
  double slow_link_bandwidth = 0;   // BW_l: storage -> drafting GPU
  double fast_link_bandwidth = 0;   // BW_h: local pool -> verifying GPU
  int64_t draft_length = 40;        // x
  double gamma = 0.85;
  int64_t output_tokens = 256;      // K
  double t_decode_s = 0;            // one draft step on KV_comp
  double t_forward_x_s = 0;         // one verify forward of x + 1 tokens on KV_full
};

struct RemotePrefixEstimate {
  double t_start_s = 0;         // c*KV_full / BW_l
  double t_cycle_s = 0;         // max(x*T_decode, KV_full/BW_h + T_fwd(x))
  double cycles_paper = 0;      // K / (x*gamma)
  double cycles_cycle = 0;      // K / (gamma*x + 1)
  double t_request_paper_s = 0;  // t_start + cycles_paper * t_cycle (Eq. 4)
  double t_request_cycle_s = 0;  // t_start + cycles_cycle * t_cycle
  double full_kv_start_s = 0;   // KV_full / BW_l: sending the whole prefix instead
  double startup_speedup = 0;   // full_kv_start_s / t_start_s (= 1/c)
};

// Eq. 4.
RemotePrefixEstimate estimate_remote_prefix(const RemotePrefixInputs& in);

}  // namespace vericache::sim
