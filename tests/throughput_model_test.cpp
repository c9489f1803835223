// The throughput model (Eq. 3, Eq. 4) on the paper's worked examples, the profile files, and the
// forward-cost fit that gives Eq. 3 its constants on a CPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "sim/forward_cost_fit.h"
#include "sim/profiles.h"
#include "sim/throughput_model.h"

namespace vericache::sim {
namespace {

const std::string kProfiles = std::string(VC_SOURCE_DIR) + "/profiles";

// Mistral-24B on an RTX PRO 6000 at 50K context (paper.md, Throughput model): M = 48 GB,
// KV_full = 5 GB, c = 0.2, x = 25, B = 6, gamma = 0.85. The paper: 55.2 GB per iteration,
// T_gpu about 35 ms, 1.2 GB of reloads, T_xfer about 19 ms, eta about 1.82, about 312 tok/s.
TEST(ThroughputModel, ReproducesThePapersWorkedExample) {
  auto gpu = load_hardware_profile("rtx-pro-6000", kProfiles);
  ASSERT_TRUE(gpu.ok()) << gpu.status().message();
  LongContextInputs in;
  in.weight_bytes = 48e9;
  in.kv_full_bytes = 5e9;
  in.hbm_bandwidth = gpu->memory_bandwidth;
  in.link_bandwidth = gpu->link_bandwidth;
  in.batch = 6;
  in.ratio = 0.2;
  in.draft_length = 25;
  in.gamma = 0.85;
  const LongContextEstimate e = estimate_long_context(in);
  EXPECT_NEAR(e.hbm_bytes_per_iteration, 55.2e9, 1e6);
  EXPECT_NEAR(e.t_gpu_s, 0.0345, 1e-6);
  EXPECT_NEAR(e.reload_bytes_per_iteration, 1.2e9, 1e3);
  EXPECT_NEAR(e.t_xfer_s, 0.01875, 1e-6);
  EXPECT_DOUBLE_EQ(e.t_iter_s, e.t_gpu_s);
  EXPECT_STREQ(e.binding, "hbm");
  EXPECT_NEAR(e.rho, 25.0, 1e-12);
  EXPECT_LT(e.c_star, 0.0);  // HBM binds at every c
  EXPECT_NEAR(e.eta_paper, 1.0 + 0.85 * 25 / 26, 1e-12);
  EXPECT_NEAR(e.tok_s_paper, 312.0, 0.02 * 312.0);  // the paper rounds T_gpu to 35 ms
  // A cycle of 25 drafts and a verify yields 0.85 * 25 + 1 tokens in 26 iterations.
  EXPECT_NEAR(e.eta_cycle, 22.25 / 26.0, 1e-12);
  EXPECT_NEAR(e.tok_s_cycle, 6 * (22.25 / 26.0) / 0.0345, 1e-6);
  // Full-KV decoding streams all 30 GB of full caches every step: 78 GB, 48.75 ms, 123 tok/s.
  EXPECT_NEAR(e.full_kv_t_step_s, 0.04875, 1e-6);
  EXPECT_NEAR(e.full_kv_tok_s, 6 / 0.04875, 1e-6);
  std::printf("[ worked example ] T_gpu %.2f ms, T_xfer %.2f ms, %.1f tok/s (paper's eta %.3f), %.1f tok/s (cycle eta %.3f), "
              "full KV %.1f tok/s\n",
              1e3 * e.t_gpu_s, 1e3 * e.t_xfer_s, e.tok_s_paper, e.eta_paper, e.tok_s_cycle, e.eta_cycle, e.full_kv_tok_s);
}

// Fig. 6 (paper.md, Staggered vs lockstep): B = 10, KV_comp 1 GB and KV_full 4 GB per request,
// x = 30, one reload about 80 ms with overheads (50 GB/s effective), M = 50 GB (the example's peaks
// of 64 and 90 GB imply it). Lockstep: about 800 ms of serialized reload and a 90 GB peak;
// staggered: a 64 GB peak, and each reload shorter than the spacing of verifies (hidden).
TEST(ThroughputModel, ReproducesTheStaggeredVersusLockstepExample) {
  LongContextInputs in;
  in.weight_bytes = 50e9;
  in.kv_full_bytes = 4e9;
  in.hbm_bandwidth = 1.6e12;
  in.link_bandwidth = 50e9;
  in.batch = 10;
  in.ratio = 0.25;
  in.draft_length = 30;
  const LongContextEstimate e = estimate_long_context(in);
  EXPECT_NEAR(e.lockstep_reload_s, 0.8, 1e-9);
  EXPECT_NEAR(e.hbm_peak_lockstep_bytes, 90e9, 1e3);
  EXPECT_NEAR(e.hbm_peak_staggered_bytes, 64e9, 1e3);
  const double reload_s = in.kv_full_bytes / in.link_bandwidth;  // 80 ms
  const double verify_spacing_s = in.draft_length * e.t_iter_s / in.batch;
  EXPECT_LT(reload_s, verify_spacing_s);
  EXPECT_STREQ(e.binding, "hbm");
  EXPECT_GT(e.lockstep_reload_s / e.t_iter_s, 15.0);  // "about 20x an iteration"
}

// Eq. 4: start-up moves c * KV_full over the slow link (1/c faster than the whole prefix); a cycle
// is the longer of x draft steps and a fast-link reload plus the verify forward.
TEST(ThroughputModel, RemotePrefixFollowsEquation4) {
  RemotePrefixInputs in;
  in.kv_full_bytes = 4e9;
  in.ratio = 0.25;
  in.slow_link_bandwidth = 1.2e9;
  in.fast_link_bandwidth = 40e9;
  in.draft_length = 40;
  in.gamma = 0.8;
  in.output_tokens = 320;
  in.t_decode_s = 0.004;
  in.t_forward_x_s = 0.03;
  const RemotePrefixEstimate e = estimate_remote_prefix(in);
  EXPECT_NEAR(e.t_start_s, 1e9 / 1.2e9, 1e-12);
  EXPECT_NEAR(e.startup_speedup, 4.0, 1e-12);
  EXPECT_NEAR(e.t_cycle_s, 0.16, 1e-12);  // 40 x 4 ms against 100 ms + 30 ms
  EXPECT_NEAR(e.cycles_paper, 10.0, 1e-12);
  EXPECT_NEAR(e.cycles_cycle, 320.0 / 33.0, 1e-12);
  EXPECT_NEAR(e.t_request_paper_s, 1e9 / 1.2e9 + 1.6, 1e-12);
  in.t_decode_s = 0.001;  // now the reload and verify bind: 130 ms
  EXPECT_NEAR(estimate_remote_prefix(in).t_cycle_s, 0.13, 1e-12);
}

TEST(Profiles, ModelShapesGiveKvBytesPerToken) {
  struct Want {
    const char* name;
    double kv_bytes_per_token, weight_gb;
  };
  for (const Want w : {Want{"mistral-24b", 163840, 47.14}, Want{"qwen-32b", 262144, 65.52},
                       Want{"llama-3.1-70b", 327680, 141.1}, Want{"llama-3.1-8b", 131072, 16.06},
                       Want{"smollm2-135m", 46080, 0.0964}}) {
    auto p = load_model_shape(w.name, kProfiles);
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_EQ(p->name, w.name);
    EXPECT_EQ(p->kv_bytes_per_token(), w.kv_bytes_per_token) << w.name;
    EXPECT_NEAR(p->weight_bytes / 1e9, w.weight_gb, 0.01) << w.name;
  }
  EXPECT_EQ(profile_names(kProfiles, "hardware"),
            (std::vector<std::string>{"cpu-2core", "gh200", "h100-nvl", "h200", "rtx-pro-6000"}));
  auto cpu = load_hardware_profile("cpu-2core", kProfiles);  // bench-reload's calibration of this machine
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  EXPECT_GT(cpu->request_s, 0);
  EXPECT_GT(cpu->verify_row_s, cpu->request_s);
}

TEST(Profiles, BadProfilesAreNamedErrors) {
  auto unknown = load_hardware_profile("a100", kProfiles);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().message(),
            "no hardware profile named 'a100' (known: cpu-2core, gh200, h100-nvl, h200, rtx-pro-6000; or give a .json path)");
  const std::string path = ::testing::TempDir() + "/bad_profile.json";
  std::ofstream(path) << R"({"name": "x", "description": "d", "source": "s", "memory_gb": 80,
                            "memory_bandwidth_gb_s": -3, "link_bandwidth_gb_s": 64})";
  auto bad = load_hardware_profile(path, kProfiles);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            path + ": 'memory_bandwidth_gb_s' = -3.000000 is out of range [0.001000, 1000000.000000]");
  std::ofstream(path) << R"({"name": "x", "description": "d", "source": "s", "memory_gb": 24,
                            "memory_bandwidth_gb_s": 11, "link_bandwidth_gb_s": 2, "forward_overhead_ms": 9.5,
                            "request_us": 7400, "verify_row_us": 11000})";
  auto cpu = load_hardware_profile(path, kProfiles);
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  EXPECT_DOUBLE_EQ(cpu->forward_overhead_s, 0.0095);
  EXPECT_DOUBLE_EQ(cpu->request_s, 0.0074);
  EXPECT_DOUBLE_EQ(cpu->verify_row_s, 0.011);
  std::ofstream(path) << R"({"name": "x", "description": "d", "source": "s", "memory_gb": 24,
                            "memory_bandwidth_gb_s": 11, "link_bandwidth_gb_s": 2, "verify_row_us": -1})";
  EXPECT_EQ(load_hardware_profile(path, kProfiles).status().message(),
            path + ": 'verify_row_us' = -1.000000 is out of range [0.000000, 1000000000.000000]");
  std::ofstream(path) << R"({"name": "x", "description": "d", "source": "s", "layers": 2.5})";
  auto fractional = load_model_shape(path, kProfiles);
  ASSERT_FALSE(fractional.ok());
  EXPECT_EQ(fractional.status().message(), path + ": 'layers' must be a whole number");
  std::ofstream(path) << "{not json";
  EXPECT_EQ(load_model_shape(path, kProfiles).status().message(), path + ": not a JSON object");
}

// Forwards that follow t = n*2 ms + rows*1 ms + bytes/10 GB/s exactly give those costs back; when
// the unconstrained solution would make a cost negative, that term is dropped, not fitted below 0.
TEST(ForwardCostFit, RecoversExactCostsAndNeverGoesNegative) {
  std::vector<ForwardSample> samples;
  for (double n : {1.0, 2.0, 4.0}) {
    for (double rows : {0.0, 5.0, 25.0}) {
      for (double bytes : {1e8, 3e8}) samples.push_back({n, rows, bytes, n * 2e-3 + rows * 1e-3 + bytes / 1e10, 1.0});
    }
  }
  const ForwardCosts fit = fit_forward_costs(samples);
  EXPECT_NEAR(fit.request_s, 2e-3, 1e-9);
  EXPECT_NEAR(fit.row_s, 1e-3, 1e-9);
  EXPECT_NEAR(fit.seconds_per_byte, 1e-10, 1e-16);
  EXPECT_NEAR(fit.predict(3, 10, 2e8), 6e-3 + 10e-3 + 2e-2, 1e-9);
  // Time falls as rows grow: the best fit with row_s >= 0 leaves rows out (row_s = 0).
  const ForwardCosts falling = fit_forward_costs({{1, 0, 0, 0.010, 1}, {1, 10, 0, 0.008, 1}, {1, 20, 0, 0.006, 1}});
  EXPECT_EQ(falling.row_s, 0.0);
  EXPECT_GT(falling.request_s, 0.0);
}

// The draft policy's fit: a cost per forward (the weights) besides cache bytes in the hundreds of
// megabytes and rows in ones, at one batch size, where a cost per request is the same column as
// the one per forward. The costs come back exactly, and the two collinear terms are never fitted
// together (a solver that compared its pivots across rows of different scales called the full
// model singular here and fitted the rows' cost into the bytes').
TEST(ForwardCostFit, FitsACostPerForwardAtOneBatchSize) {
  auto seconds = [](double rows, double bytes) { return 4e-3 + rows * 3.5e-3 + bytes * 1e-10; };
  std::vector<ForwardSample> samples;
  samples.push_back({1, 0, 1.84e8, seconds(0, 1.84e8), 1});  // a decode step on the full cache
  for (double rows : {2.0, 4.0, 8.0, 16.0}) {
    for (int d = 0; d < 5; ++d) samples.push_back({1, 0, 4.6e7 + d * 2.3e4, seconds(0, 4.6e7 + d * 2.3e4), 1});
    samples.push_back({1, rows, 1.84e8, seconds(rows, 1.84e8), 1});
  }
  const ForwardCosts fit = fit_forward_costs(samples, FitTerms::kPerForward);
  EXPECT_NEAR(fit.forward_s + fit.request_s, 4e-3, 1e-9);
  EXPECT_EQ(fit.forward_s * fit.request_s, 0.0);
  EXPECT_NEAR(fit.row_s, 3.5e-3, 1e-9);
  EXPECT_NEAR(fit.seconds_per_byte, 1e-10, 1e-16);
  for (const ForwardSample& s : samples) EXPECT_NEAR(fit.predict(1, s.further_rows, s.bytes), s.seconds, 1e-9);
  // Eq. 3's terms (the default) never fit a per-forward cost.
  EXPECT_EQ(fit_forward_costs(samples).forward_s, 0.0);
}

}  // namespace
}  // namespace vericache::sim
