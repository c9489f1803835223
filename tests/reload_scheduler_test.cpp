// The reload rings and the three policies on the paper's staggered-vs-lockstep example (Fig. 6):
// B = 10 requests, KV_full 4 GB each over a 50 GB/s link (80 ms a reload), T_iter 35 ms, x = 30.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "sched/reload_rings.h"
#include "sched/reload_scheduler.h"

namespace vericache::sched {
namespace {

constexpr double kGB = 1e9;

TEST(ReloadRings, ReservationsFitUntilTheLinkOrMemoryIsFullAndSlideOut) {
  ReloadRings rings(8, 0.1, 10 * kGB);
  EXPECT_TRUE(rings.fits({1, 3, 4}, 0.3, 4 * kGB));  // 0.1 s in each of 3 iterations: exactly full
  rings.reserve({1, 3, 4}, 0.3, 4 * kGB);             // resident through iteration 4
  EXPECT_FALSE(rings.fits({3, 3, 3}, 0.01, 1 * kGB));  // the link of iteration 3 is full
  EXPECT_TRUE(rings.fits({4, 5, 5}, 0.2, 6 * kGB));    // iteration 4: link free, memory 4 + 6
  EXPECT_FALSE(rings.fits({4, 5, 5}, 0.2, 6.5 * kGB));  // memory of iteration 4: 4 + 6.5 > 10
  EXPECT_DOUBLE_EQ(rings.memory_bytes(4), 4 * kGB);
  EXPECT_DOUBLE_EQ(rings.link_seconds(4), 0.0);
  for (int i = 0; i < 3; ++i) rings.advance();
  EXPECT_DOUBLE_EQ(rings.link_seconds(0), 0.1);  // old iteration 3 is now
  for (int i = 0; i < 2; ++i) rings.advance();
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(rings.link_seconds(i), 0.0);
    EXPECT_EQ(rings.memory_bytes(i), 0.0);
  }
}

ReloadSchedulerOptions fig6(ReloadPolicy policy) {
  ReloadSchedulerOptions o;
  o.policy = policy;
  o.window = 64;
  o.draft_length = 30;
  o.iteration_seconds = 0.035;
  o.link_bandwidth = 50 * kGB;
  // Room for two streamed full caches: the one a verify reads and the next one arriving.
  o.memory_capacity_bytes = 8 * kGB;
  return o;
}

// Staggered: one reload of 3 iterations at a time, so the 10 verifications spread one every 3
// iterations and each request drafts about x = 30 tokens between its verifications (verifies
// about every 31 iterations); the link never carries more than an iteration's worth and memory
// never holds more than two full caches.
TEST(ReloadScheduler, StaggeredSpreadsTheVerifications) {
  ReloadScheduler s(fig6(ReloadPolicy::kStaggered));
  EXPECT_EQ(s.span_iterations(4 * kGB), 3);
  for (int64_t r = 0; r < 10; ++r) ASSERT_TRUE(s.admit(r, 4 * kGB).ok());
  EXPECT_EQ(s.waiting(), 0u);
  std::vector<int64_t> first_verifies;
  for (const ReloadPlan& p : s.planned()) first_verifies.push_back(p.verify_at);
  EXPECT_EQ(first_verifies, (std::vector<int64_t>{31, 28, 34, 25, 37, 22, 40, 19, 43, 16}));

  std::map<int64_t, int64_t> admitted_at;
  std::vector<int64_t> draft_lengths;
  double peak_memory = 0, peak_link = 0;
  for (int64_t it = 0; it < 600; ++it) {
    peak_memory = std::max(peak_memory, s.rings().memory_bytes(0));
    peak_link = std::max(peak_link, s.rings().link_seconds(0));
    const auto events = s.events_now();
    EXPECT_LE(events.verifying.size(), 1u) << "iteration " << it;
    for (const ReloadPlan& p : events.verifying) {
      if (admitted_at.count(p.request)) draft_lengths.push_back(p.verify_at - admitted_at[p.request] - 1);
      admitted_at[p.request] = it;
      ASSERT_TRUE(s.admit(p.request, p.bytes).ok());
    }
    s.advance();
  }
  EXPECT_LE(peak_memory, 8 * kGB * (1 + 1e-9));
  EXPECT_LE(peak_link, 0.035 * (1 + 1e-9));
  ASSERT_GT(draft_lengths.size(), 150u);
  double mean = 0;
  for (int64_t d : draft_lengths) mean += static_cast<double>(d) / static_cast<double>(draft_lengths.size());
  EXPECT_NEAR(mean, 30.0, 1.0);
  EXPECT_EQ(s.waiting(), 0u);
}

// Lockstep: all 10 verify at iteration 31 (30 drafts each) and their reloads share iterations
// 28-30: 800 ms of link time where 105 ms exist, and 40 GB of full caches resident at once.
TEST(ReloadScheduler, LockstepOverbooksTheLinkAndMemory) {
  ReloadScheduler s(fig6(ReloadPolicy::kLockstep));
  for (int64_t r = 0; r < 10; ++r) ASSERT_TRUE(s.admit(r, 4 * kGB).ok());
  for (const ReloadPlan& p : s.planned()) {
    EXPECT_EQ(p.verify_at, 31);
    EXPECT_EQ(p.reload_start, 28);
  }
  double link = 0;
  for (int64_t i = 28; i <= 30; ++i) link += s.rings().link_seconds(i);
  EXPECT_NEAR(link, 0.8, 1e-9);
  EXPECT_NEAR(s.rings().memory_bytes(31), 40 * kGB, 1);
}

// No-overlap: each reload starts in its verify iteration, so the whole 80 ms lands there.
TEST(ReloadScheduler, NoOverlapReloadsWhenTheVerifyIsDue) {
  ReloadScheduler s(fig6(ReloadPolicy::kNoOverlap));
  ASSERT_TRUE(s.admit(7, 4 * kGB).ok());
  ASSERT_EQ(s.planned().size(), 1u);
  EXPECT_EQ(s.planned()[0].reload_start, 31);
  EXPECT_EQ(s.planned()[0].verify_at, 31);
  EXPECT_NEAR(s.rings().link_seconds(31), 0.08, 1e-12);
  EXPECT_EQ(s.rings().link_seconds(30), 0.0);
}

TEST(ReloadScheduler, BadConfigurationsAreErrors) {
  ReloadScheduler s(fig6(ReloadPolicy::kStaggered));
  const Status s1 = s.admit(0, 200 * kGB);  // 4 s: 115 iterations
  EXPECT_EQ(s1.message(), "a reload of 200.000000 GB takes 115 iterations; with its verify that is more than the window "
                          "of 64 can plan (W - 1); raise the window");
  ReloadScheduler lock(fig6(ReloadPolicy::kLockstep));
  EXPECT_EQ(lock.admit(0, 70 * kGB).message(),
            "lockstep with x = 30 and reloads of 40 iterations needs a window of at least 72");
  EXPECT_EQ(parse_policy("eager").status().message(), "unknown reload policy 'eager' (staggered, lockstep or no-overlap)");
  EXPECT_EQ(*parse_policy("no-overlap"), ReloadPolicy::kNoOverlap);
}

}  // namespace
}  // namespace vericache::sched
