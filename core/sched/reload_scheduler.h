// When each request reloads its full KV cache and verifies: the paper's Algorithm 1 (Admit over the
// link and memory rings) and the two policies it is compared with. Time is counted in iterations
// (one batched forward each: drafting requests add one token, verifying ones their drafts); the
// caller owns the clock: the engine with measured times, the simulator with a hardware profile,
// both through this one class.
//
// A request admitted in iteration a (after its prefill or verify) and verifying in iteration a + d
// drafts in the d - 1 iterations between: a draft length of x is a verify x + 1 iterations on,
// which is the target below (the paper's anchor x, counted in drafts).
//
//   staggered   Admit(r): a reload takes S_r = max(1, ceil(bytes / (BW * T_iter))) iterations;
//               candidates d = anchor, anchor - 1, anchor + 1, anchor - 2, ... within
//               [S_r + 1, W - 1] (offsets from now), anchor = clamp(x' + 1, S_r + 1, W - 1); the
//               first whose reload fits both rings is reserved and r verifies at d: link over
//               [d - S_r, d - 1] (the verify forward needs the whole cache when it starts, where the
//               paper's span [d - S_r + 1, d] lets the last part arrive during it), memory over
//               [d - S_r, d]. Nothing fits: r waits, and is retried every iteration in arrival order.
//               x' = min(x, drafts r has left): a request near its last token verifies sooner.
//   lockstep    every request verifies at the next iteration that is a multiple of x + 1 (at least
//               S_r + 1 ahead), its reload in the S_r iterations before; the rings are overbooked,
//               not checked: the serialized link and the memory peak are what lockstep costs.
//   no-overlap  r verifies x' + 1 iterations after admission and its reload starts only then (the
//               whole transfer lands in the verify iteration: a stall).
//
// Thread-safety: none; one owner calls admit / events_now / advance in turn.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include <vericache/status.h>

#include "sched/reload_rings.h"

namespace vericache::sched {

enum class ReloadPolicy { kStaggered, kLockstep, kNoOverlap };

// "staggered", "lockstep", "no-overlap".
const char* policy_name(ReloadPolicy policy);
// InvalidArgument naming the three for anything else.
Result<ReloadPolicy> parse_policy(const std::string& name);

struct ReloadSchedulerOptions {
  ReloadPolicy policy = ReloadPolicy::kStaggered;
  int64_t window = 64;               // W iterations of lookahead
  int64_t draft_length = 16;         // x: target drafts per verify; x + 1 < W
  double iteration_seconds = 0;      // T_iter until the first observe_iteration()
  double link_bandwidth = 0;         // bytes/s of the link full caches come over
  double memory_capacity_bytes = 0;  // device memory left for streamed full caches
};

struct ReloadPlan {
  int64_t request = 0;
  int64_t reload_start = 0;  // iteration the reload begins
  int64_t verify_at = 0;     // iteration of the verify forward
  double bytes = 0;          // KV_full of the request
  double seconds = 0;        // its transfer time on the link
};

class ReloadScheduler {
 public:
  explicit ReloadScheduler(const ReloadSchedulerOptions& options);

  // Plans request `request`'s next reload and verify (after its prefill, and after each verify;
  // the earliest reload starts in the next iteration). InvalidArgument when its reload and verify
  // cannot fit in the window (S_r + 1 > W - 1), or for lockstep the verify would fall outside it.
  // A request not placed yet waits. `drafts_left`: the most drafts the request can still make
  // before this verify (one short of its last token); a negative value means no limit.
  Status admit(int64_t request, double kv_full_bytes, int64_t drafts_left = -1);
  // Iterations a reload of `bytes` spans (S_r).
  int64_t span_iterations(double bytes) const;

  struct Events {
    std::vector<ReloadPlan> reloads_starting;  // begin these transfers now
    std::vector<ReloadPlan> verifying;         // run these verify forwards now (their plans end)
  };
  // The current iteration's events, after retrying waiting admissions in arrival order (up to the
  // first that still does not fit). Call once per iteration.
  Events events_now();
  // The next iteration.
  void advance();
  // How long an iteration's forward took (stalls left out), by whichever clock drives the
  // scheduler: the engine's measurements or the simulator's profile. T_iter, which sizes spans and
  // the link's capacity for the placements made from now on, follows their moving average
  // (weight 1/4 for the newest).
  void observe_iteration(double seconds);

  int64_t now() const { return now_; }
  size_t waiting() const { return waiting_.size(); }
  const std::vector<ReloadPlan>& planned() const { return plans_; }
  const ReloadRings& rings() const { return rings_; }
  const ReloadSchedulerOptions& options() const { return options_; }

 private:
  // Places a request whose verify is due `own_cycle` iterations on (x' + 1; policy by policy);
  // false when staggered finds no span that fits.
  bool place(int64_t request, double bytes, int64_t own_cycle);

  struct Waiting {
    int64_t request;
    double bytes;
    int64_t cycle;  // x' + 1
  };
  ReloadSchedulerOptions options_;
  ReloadRings rings_;
  int64_t now_ = 0;
  bool observed_ = false;  // T_iter is still the one given in the options
  std::vector<ReloadPlan> plans_;
  std::deque<Waiting> waiting_;
};

}  // namespace vericache::sched
