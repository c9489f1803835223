// The simulator against the throughput model (Eq. 3) and on the paper's Fig. 6 example.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "sim/simulator.h"
#include "sim/throughput_model.h"

namespace vericache::sim {
namespace {

constexpr double kGB = 1e9;

// Expected accepted drafts of x when each is accepted with probability alpha until the first
// rejection: alpha (1 - alpha^x) / (1 - alpha).
double expected_accepted(double alpha, int64_t x) { return alpha * (1 - std::pow(alpha, x)) / (1 - alpha); }

// The worked example's machine and model: M = 48 GB, 5 GB of KV at 50K tokens, RTX PRO 6000, B = 6.
SimulationConfig worked_example() {
  SimulationConfig c;
  c.weight_bytes = 48 * kGB;
  c.kv_bytes_per_token = 1e5;
  c.context = 50000;
  c.hbm_bandwidth = 1600 * kGB;
  c.link_bandwidth = 64 * kGB;
  c.memory_bytes = 96 * kGB;
  c.batch = 6;
  return c;
}

// Staggered, c = 0.2, x = 25: HBM binds, reloads hide, and the simulated throughput is Eq. 3's with
// eta = (gamma*x + 1)/(x + 1) -- not with the paper's eta, which predicts twice as much.
TEST(Simulator, StaggeredMatchesEquation3WithTheCycleEta) {
  SimulationConfig c = worked_example();
  c.requests = 60;  // long enough that the last requests' tail hardly counts
  c.output_tokens = 1000;
  c.ratio = 0.2;
  c.draft_length = 25;
  c.alpha = 0.95;
  auto r = simulate(c);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const double gamma = expected_accepted(c.alpha, c.draft_length) / static_cast<double>(c.draft_length);
  LongContextInputs in{48 * kGB, 5 * kGB, 1600 * kGB, 64 * kGB, 6, 0.2, 25, gamma};
  const LongContextEstimate e = estimate_long_context(in);
  std::printf("[ simulator ] %.1f tok/s; Eq. 3: %.1f (cycle eta), %.1f (paper's eta); %.2f drafts and %.2f tokens per "
              "verify, stall %.3f s, link busy %.2f, peak %.1f GB\n",
              r->tok_s, e.tok_s_cycle, e.tok_s_paper, r->mean_drafts_per_verify, r->mean_acceptance_length,
              r->stall_seconds, r->link_busy_fraction, r->peak_memory_bytes / kGB);
  EXPECT_EQ(r->tokens, 60 * 1000);
  EXPECT_NEAR(r->mean_drafts_per_verify, 25.0, 1.5);
  EXPECT_EQ(r->stall_seconds, 0.0);
  EXPECT_NEAR(r->tok_s / e.tok_s_cycle, 1.0, 0.05);
  // The README's figures (the simulation is seeded: these are exact to the printed digit).
  EXPECT_NEAR(r->tok_s, 96.7, 0.05);
  EXPECT_NEAR(e.tok_s_cycle, 98.5, 0.05);
  EXPECT_NEAR(e.tok_s_paper, 265.7, 0.05);
  EXPECT_LT(r->tok_s, 0.6 * e.tok_s_paper);
  EXPECT_TRUE(r->fits_memory);
}

// Fig. 6: B = 10, 1 GB compressed and 4 GB full caches, x = 30, 80 ms reloads (50 GB/s), M = 50 GB.
// Staggered hides the reloads and peaks at M + B*KV_comp + two KV_full (one being verified, the
// next arriving; the paper counts one) = 68 GB; lockstep waits for the serialized 800 ms of
// reloads every cycle (less the 3 iterations they start ahead) and holds every full cache at once.
TEST(Simulator, StaggeredBeatsLockstepWhenTheLinkIsTheBottleneck) {
  SimulationConfig c;
  c.weight_bytes = 50 * kGB;
  c.kv_bytes_per_token = 4 * kGB / 40000;
  c.context = 40000;
  c.hbm_bandwidth = 1600 * kGB;
  c.link_bandwidth = 50 * kGB;
  c.memory_bytes = 96 * kGB;
  c.batch = 10;
  c.requests = 10;
  c.output_tokens = 300;
  c.ratio = 0.25;
  c.draft_length = 30;
  c.alpha = 0.97;
  SimulationResult results[3];
  const sched::ReloadPolicy policies[] = {sched::ReloadPolicy::kStaggered, sched::ReloadPolicy::kLockstep,
                                          sched::ReloadPolicy::kNoOverlap};
  for (int i = 0; i < 3; ++i) {
    c.policy = policies[i];
    auto r = simulate(c);
    ASSERT_TRUE(r.ok()) << r.status().message();
    results[i] = *r;
    std::printf("[ %s ] %.1f tok/s, %lld verifies, stall %.2f s of %.2f s, peak %.1f GB\n",
                sched::policy_name(policies[i]), r->tok_s, static_cast<long long>(r->verifies), r->stall_seconds,
                r->seconds, r->peak_memory_bytes / kGB);
  }
  const SimulationResult &staggered = results[0], &lockstep = results[1], &no_overlap = results[2];
  EXPECT_EQ(staggered.stall_seconds, 0.0);
  EXPECT_NEAR(staggered.peak_memory_bytes / kGB, 68.0, 1.0);  // caches grow by 300 tokens
  // Lockstep: each cycle's 10 reloads (800 ms) start S_r iterations (about 38 ms each) before the
  // verify: 3 at the first estimate of T_iter, 2 once verify iterations (which also read 40 GB of
  // full caches) have lengthened the observed average. The rest of the 800 ms is a stall.
  const double cycles = static_cast<double>(lockstep.verifies) / 10.0;
  EXPECT_GT(lockstep.stall_seconds / cycles, 0.8 - 3 * 0.0383 - 0.01);
  EXPECT_LT(lockstep.stall_seconds / cycles, 0.8 - 2 * 0.0383 + 0.01);
  EXPECT_GT(lockstep.peak_memory_bytes, 99 * kGB);  // M + every KV_comp + every KV_full
  EXPECT_FALSE(lockstep.fits_memory);
  EXPECT_GT(staggered.tok_s, 1.3 * lockstep.tok_s);
  EXPECT_NEAR(staggered.tok_s, 136.5, 0.05);  // the README's figures
  EXPECT_NEAR(lockstep.tok_s, 88.5, 0.05);
  EXPECT_GT(staggered.tok_s, no_overlap.tok_s);
  EXPECT_EQ(staggered.tokens, 3000);
  EXPECT_EQ(lockstep.tokens, 3000);
}

// A CPU profile's costs per forward, per request and per verify row add to every iteration exactly:
// with a link fast enough that nothing stalls, the schedule and the acceptance draws stay the same
// and the time grows by iterations * t0 + request-iterations * t_req + drafts verified * t_row
// (every request is in every forward: one iteration per draft and one per verify). A cap on
// streamed memory bounds the simulated peak.
TEST(Simulator, ForwardOverheadAndRowCostAddToEveryIteration) {
  SimulationConfig c = worked_example();
  c.link_bandwidth = 1e6 * kGB;
  c.requests = 12;
  c.output_tokens = 200;
  c.draft_length = 8;
  c.alpha = 0.8;
  auto plain = simulate(c);
  c.forward_overhead_s = 0.002;
  c.request_s = 0.0005;
  c.verify_row_s = 0.0003;
  auto costed = simulate(c);
  ASSERT_TRUE(plain.ok() && costed.ok());
  EXPECT_EQ(costed->iterations, plain->iterations);
  EXPECT_EQ(costed->verifies, plain->verifies);
  EXPECT_EQ(costed->stall_seconds, 0.0);
  const double drafts = costed->mean_drafts_per_verify * static_cast<double>(costed->verifies);
  const double request_iterations = drafts + static_cast<double>(costed->verifies);
  EXPECT_NEAR(costed->seconds - plain->seconds,
              static_cast<double>(costed->iterations) * c.forward_overhead_s + request_iterations * c.request_s +
                  drafts * c.verify_row_s,
              1e-6);

  c.streamed_capacity_bytes = 6 * kGB;  // room for one 5 GB full cache at a time
  auto capped = simulate(c);
  ASSERT_TRUE(capped.ok());
  EXPECT_GT(plain->peak_streamed_bytes, 6 * kGB);
  EXPECT_LE(capped->peak_streamed_bytes, 6 * kGB);
}

// Contention: a forward overlapped by a copy is slowed by copy_slowdown x the copying inside it,
// at the copy's duty (link / copy bandwidth). One request under no-overlap never computes while its
// reload moves: unchanged. Under staggered its reloads overlap its drafts: slower, and less so when
// the copy moves its bytes in bursts of four times the link's speed.
TEST(Simulator, CopiesBesideAForwardSlowItByTheirDuty) {
  SimulationConfig c = worked_example();
  c.batch = 1;
  c.requests = 2;
  c.output_tokens = 200;
  c.draft_length = 8;
  c.alpha = 0.8;
  for (sched::ReloadPolicy policy : {sched::ReloadPolicy::kNoOverlap, sched::ReloadPolicy::kStaggered}) {
    c.policy = policy;
    c.copy_slowdown = 0;
    c.copy_bandwidth = 0;
    auto plain = simulate(c);
    c.copy_slowdown = 1;
    auto always = simulate(c);
    c.copy_bandwidth = 4 * c.link_bandwidth;
    auto bursts = simulate(c);
    ASSERT_TRUE(plain.ok() && always.ok() && bursts.ok());
    if (policy == sched::ReloadPolicy::kNoOverlap) {
      EXPECT_DOUBLE_EQ(always->seconds, plain->seconds);
      EXPECT_DOUBLE_EQ(bursts->seconds, plain->seconds);
    } else {
      EXPECT_GT(always->seconds, bursts->seconds);
      EXPECT_GT(bursts->seconds, plain->seconds);
    }
  }
  c.copy_slowdown = -1;
  EXPECT_EQ(simulate(c).status().message(), "simulate: the copy slowdown and bandwidth must be >= 0");
}

TEST(Simulator, RefusesMachinesThatCannotHoldTheCaches) {
  SimulationConfig c = worked_example();
  c.weight_bytes = 90 * kGB;
  c.requests = 6;
  EXPECT_EQ(simulate(c).status().message(),
            "simulate: device memory (96.000000 GB) cannot hold the weights, every compressed cache and one full cache");
  c.alpha = 1.5;
  EXPECT_EQ(simulate(c).status().message(), "simulate: c must be in (0, 1], alpha in [0, 1]");
}

}  // namespace
}  // namespace vericache::sim
