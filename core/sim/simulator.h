// A discrete-event simulation of long-context decoding under the reload scheduler: the same
// sched::ReloadScheduler the engine uses, with iteration times from a hardware profile instead of
// measurements (each goes to the scheduler's observe_iteration, as the engine's measured ones do;
// the first estimate is Eq. 3's T_gpu plus the profile's overhead and rows for a batch of drafts). Each iteration is one batched forward: every drafting request adds a token to its
// compressed cache, every verifying request runs its drafts against its full cache, which must
// have crossed the link first.
//
//   forward time   (M + every request's KV_comp + the KV_full of each verifying request) / BW_hbm,
//                  plus, when the profile has them, a fixed cost per forward, a cost per request
//                  in it and a cost per further verify row (a CPU forward: matrix work that grows
//                  with the rows, where a GPU's is hidden under the bytes)
//   link           serial: a reload starts when the scheduler says and when the link is free, and
//                  takes KV_full / BW_inter; a verify waits for its reload (the wait is a stall)
//   contention     when the copies share the forward's memory (a CPU copying with memcpy on
//                  another core), a forward is slowed by copy_slowdown x the seconds of it during
//                  which a copy is moving bytes: the link's busy time, scaled by
//                  BW_inter / copy_bandwidth when a paced copy moves its bytes in faster bursts
//   memory         M + every KV_comp + the full caches reloading or resident until their verify
//   acceptance     each drafted token is accepted with probability alpha (or the request's own
//                  from request_alphas, or by its position in the window from position_alphas,
//                  as measured by the engine: sim/acceptance_model.h), up to the first rejection;
//                  a verify yields the accepted drafts plus one token
//   drafting       as the engine: a request drafts at most W - 2 tokens and one fewer than it has
//                  left to output; then it waits for its verify outside the forward
// Requests start with `context` prompt tokens already prefilled (prefill is not simulated) and
// leave after `output_tokens` tokens; a new one takes the slot until `requests` have started.
//
// Thread-safety: none; a Simulator is a value.
#pragma once

#include <cstdint>
#include <vector>

#include <vericache/status.h>

#include "sched/reload_scheduler.h"

namespace vericache::sim {

struct SimulationConfig {
  double weight_bytes = 0;        // M
  double kv_bytes_per_token = 0;  // full cache bytes per token
  double hbm_bandwidth = 0;       // BW_hbm, bytes/s
  double link_bandwidth = 0;      // BW_inter, bytes/s
  double memory_bytes = 0;        // device memory
  double forward_overhead_s = 0;  // fixed seconds per forward
  double request_s = 0;           // seconds per request in a forward (its first row)
  double verify_row_s = 0;        // seconds per further row of a verify (one per draft)
  double copy_slowdown = 0;       // extra forward seconds per second of copying beside it (contention)
  double copy_bandwidth = 0;      // bytes/s a copy moves while it moves; 0: the link bandwidth
  // Device memory for streamed full caches; 0: kv_fraction of what memory_bytes leaves after the
  // weights, less every compressed cache (grown to its last token).
  double streamed_capacity_bytes = 0;
  double kv_fraction = 1;  // (0, 1]
  int64_t context = 0;            // prompt tokens per request
  int64_t output_tokens = 256;    // tokens each request generates
  int64_t batch = 1;              // requests decoding at once
  int64_t requests = 1;           // requests in all
  double ratio = 0.2;             // c
  double alpha = 0.9;             // per-token acceptance probability
  // When non-empty, request i (numbered in start order) accepts with request_alphas[i % size]
  // instead of alpha: prompts that differ in how well the compressed cache drafts them.
  std::vector<double> request_alphas;
  // When non-empty (it takes precedence): draft k + 1 of a window, its first k accepted, is
  // accepted with position_alphas[min(k, size - 1)] (sim::acceptance_by_position).
  std::vector<double> position_alphas;
  sched::ReloadPolicy policy = sched::ReloadPolicy::kStaggered;
  int64_t draft_length = 16;      // x
  int64_t window = 64;            // W
  uint64_t seed = 1;
  int64_t max_iterations = 10'000'000;
  bool record_iterations = false;  // fill SimulationResult::iterations
};

struct IterationRecord {
  double start_s = 0, seconds = 0;
  double stall_s = 0;          // waiting for reloads before the forward
  double link_busy_s = 0;      // link time spent in this iteration
  double memory_bytes = 0;     // device memory in use
  int32_t verifies = 0, tokens = 0;
};

struct SimulationResult {
  int64_t iterations = 0;
  double seconds = 0;
  int64_t tokens = 0;
  double tok_s = 0;
  int64_t verifies = 0;
  double mean_drafts_per_verify = 0;
  double mean_acceptance_length = 0;  // tokens per verify: accepted drafts + 1
  double stall_seconds = 0;
  double link_busy_fraction = 0;      // link busy time / simulated time
  double peak_memory_bytes = 0;
  double peak_streamed_bytes = 0;     // full caches on their way or resident at once
  double reload_bytes = 0;
  double mean_iteration_s = 0;
  bool fits_memory = true;            // peak <= device memory
  std::vector<IterationRecord> iterations_trace;
};

// Runs until every request has finished. InvalidArgument for a configuration the scheduler
// refuses (a reload longer than the window) or sizes out of range; Internal when max_iterations
// pass first.
Result<SimulationResult> simulate(const SimulationConfig& config);

}  // namespace vericache::sim
