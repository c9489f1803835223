// DraftVerifyEngine: VeriCache's lossless decoding loop, as a per-request state machine advanced
// one batched forward at a time by step().
//
// Each request keeps two caches:
//   KV_full  every committed token's K/V, in the host store (`host_pool`). Verification reads it in
//            place (CPU, unified memory: no copy), or — with a TransferEngine — from transient pages
//            of the device pool that the transfer engine fills while the request drafts (the copy
//            starts when a window starts: x draft steps of overlap); the verified rows of accepted
//            tokens are then appended to the host store and the transient pages freed.
//   KV_comp  the compressor's kept set plus every committed token since, in resident pages of
//            `device_pool`; drafting reads only this.
// Life of a request (DESIGN.md, "Per-request loop"):
//   prefill   the prompt in chunks into KV_full; the first token comes from the full-KV logits;
//             then KV_comp = compress(KV_full, c) (offline: compress(); online: the drops update()
//             returned while prefilling), gathered from the host store into resident pages;
//   draft     x forwards on KV_comp, one token each (the last committed token, then the drafts);
//   verify    one forward of [last committed token, d_1..d_x] over KV_full gives x+1 rows; accept
//             the longest prefix the full-KV model agrees with (greedy: argmax; T > 0: rejection
//             sampling, engine/verification.h) plus its correction or bonus token; KV_full keeps
//             the committed tokens' verified K/V (the rejected rows are truncated away); KV_comp
//             is rolled back by position (SequenceKv::truncate_positions) and filled up to the
//             committed length (DraftKv); an online compressor then sees the committed rows of
//             this verify forward through update() and its drops are applied to KV_comp (a
//             window of no drafts hands it its one row during the forward: that row is committed
//             whatever the verdict, so no copy of it is kept).
// An online compressor only ever sees committed tokens (never a draft that may be rolled back),
// so no compressor state needs rolling back.
//
// When to verify and when to reload: without a scheduler every request verifies after its own x
// drafts and (transfer mode) its copy starts when the window starts. With a sched::ReloadScheduler
// (EngineOptions::scheduler) the scheduler decides both, under its policy (staggered, lockstep,
// no-overlap): after a request's prefill and after each verify the engine asks it to place the
// request's next reload (the bytes of the transient pages the copy takes) and its verify, at the
// draft policy's window for that request (EngineOptions::draft_policy); each step is one
// scheduler iteration, whose events start copies and mark verifies due. A request drafts until its
// verify is due (at most the scheduler's window - 2 drafts, or fewer near its token limit, then it
// waits); a due verify whose copy is still in flight holds the whole step back (a stall, reported
// in StepRecord::stall_seconds), as the simulator models it; one whose copy could not start (no
// transient pages free: lockstep overbooks) runs when its copy is in. The measured forward
// times (decode steps only) go to the scheduler (observe_iteration), as the simulator's go there.
//
// Requests at different phases share each forward; new requests are admitted between steps when
// the pools can hold their worst case (admission control: no page allocation can fail later), so
// a small pool means waiting, never a crash or a lost token. If a compressor fails on a request,
// that request continues on KV_full alone (plain full-KV decoding: still exact) and the failure is
// reported with the plugin's name and reason.
//
// Losslessness: greedy output equals Generator's full-KV output token for token, because the
// CPU kernels are row-count and batch invariant (kernels/cpu_kernels.h): a verify row's logits are
// bitwise the logits one-token decoding computes. Sampled output has exactly the full-KV
// distribution (per-request seeded generators: the same seed gives the same output).
//
// Parts (core/engine/): engine_request.h (a request's state and phase), admission.cpp (page demand,
// queueing, admission), drafting.h (a draft from a lossy row), window_verdict.h (the verdict on a
// window and the caches rolled to it), compressor_feed.h (what a compressor sees and its drops),
// engine_pools.h (pools sized for a set of requests); this file's .cpp is the step loop itself.
//
// Ownership: borrows the model, the pools, the compressor, the transfer engine, the clock and the
// sink; every page a request takes is returned when it finishes (and by the destructor).
// Thread-safety: one thread drives an engine; the pools must not be used by anything else meanwhile.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <vericache/compressor.h>
#include <vericache/status.h>

#include "engine/draft_policy.h"
#include "engine/engine_clock.h"
#include "engine/engine_stats.h"
#include "engine/generator.h"
#include "engine/test_faults.h"
#include "engine/verification.h"
#include "kv/packed_page_pool.h"
#include "kv/page_pool.h"
#include "kv/transfer_engine.h"
#include "model/llama_model.h"
#include "sched/reload_scheduler.h"

namespace vericache {

struct EngineRequest;  // engine/engine_request.h

// Which K/V the accepted tokens keep in KV_comp after a verify window.
enum class DraftKv {
  kDrafted,   // the K/V computed while drafting (attention over KV_comp); tokens drafting did not
              // run (the last draft of a fully accepted window) take the verified K/V
  kVerified,  // the verified K/V from the full-KV forward, copied from the host store
};
const char* draft_kv_name(DraftKv mode);  // "drafted", "verified"

struct EngineOptions {
  int64_t draft_length = 8;          // x: tokens drafted per window (the most, under an adaptive policy), >= 1
  // How long each window is (engine/draft_policy.h): fixed x by default; confidence, tiers and
  // goodput adapt it per request and window (goodput down to 0: a full-KV decode step).
  DraftPolicyOptions draft_policy;
  Compressor* compressor = nullptr;  // borrowed, attach()ed; nullptr: KV_comp is a full copy
  double ratio = 0.25;               // c, the kept fraction the compressor runs at
  int64_t prefill_chunk = 512;       // prompt tokens per request per forward
  DraftKv draft_kv = DraftKv::kVerified;
  DraftSampling draft_sampling = DraftSampling::kSampled;  // T > 0 only
  TransferEngine* transfer = nullptr;                      // nullptr: verify in place; else from transient pages
  const Clock* clock = nullptr;                            // nullptr: a SteadyClock
  StatsSink* sink = nullptr;                               // optional
  // Borrowed; nullptr: each request verifies after its own x drafts. Its draft length must equal
  // draft_length; the engine owns its admissions and iterations while it runs.
  sched::ReloadScheduler* scheduler = nullptr;
  // The most bytes of compressor state (RequestFootprint::state_bytes) requests may hold at once:
  // requests past it wait. 0: no bound. An offline compressor's state counts until its compress().
  int64_t state_budget_bytes = 0;
  // Test-only: a fault the engine makes on purpose, so tests can show their checks fail.
  TestFault test_fault;
  // Test-only: treat windows of no drafts as windows that draft: refill KV_comp after each (the
  // engine defers that refill to the next window that drafts, for offline compressors and
  // quantizers), and keep an online compressor's rows until the verdict (the engine hands a window
  // of no drafts its one row as the forward computes it, since that row is committed whatever the
  // verdict). Tests compare the two.
  bool eager_comp_refill_for_testing = false;
};

struct EngineResult {
  int64_t request_id = 0;
  GenerationResult generation;  // tokens and finish reason, as Generator reports them
  RequestMetrics metrics;
  std::string compressor_failure;  // non-empty: the compressor failed and the request ran on KV_full
};

class DraftVerifyEngine {
 public:
  // `device_pool` holds compressed caches (resident pages); `host_pool` the full caches. Both must
  // be pools of `model` (same shape, device and dtype; page sizes may differ).
  DraftVerifyEngine(const LlamaModel& model, PagePool& device_pool, PagePool& host_pool, EngineOptions options);
  ~DraftVerifyEngine();
  DraftVerifyEngine(const DraftVerifyEngine&) = delete;
  DraftVerifyEngine& operator=(const DraftVerifyEngine&) = delete;

  // Checks the options: InvalidArgument naming the bad one.
  Status validate_options() const;

  // Queues a request and returns its id (0, 1, 2, ... in order of submission; never reused).
  // InvalidArgument for an empty prompt, one that fills the context, or one whose worst case
  // can never fit the pools (the message gives the pages needed and available).
  Result<int64_t> add_request(GenerationRequest request);

  // Queues a request whose prompt is already prefilled: `prompt_kv` (a full cache in `prompt_pool`)
  // holds exactly the K/V of request.prompt and `next_logits` [vocab] the full-KV logits after it;
  // `kept` ([n_layers] int64 [n_kv_heads, n]) is the compressor's kept set for this prompt, or empty
  // for a KV_comp that copies the whole prompt. The prompt is copied when the request is admitted:
  // `prompt_kv` and its pool must stay unchanged until then. Serves shared prefixes (one prefill,
  // one compress, many requests) and benchmarks that prefill once. Errors as add_request().
  Result<int64_t> add_prefilled(GenerationRequest request, const SequenceKv& prompt_kv, const PagePool& prompt_pool,
                                std::span<const float> next_logits, std::vector<at::Tensor> kept);

  // One iteration: admits queued requests that fit, runs one forward mixing prefill chunks, draft
  // steps and verify windows, and applies its results. Errors are failures of the engine itself
  // (a forward refused, a bug surfaced as a value); compressor failures are not errors here.
  Status step();

  // Admits queued requests that fit now; step() starts with this. Prefilled requests get their
  // prompt copied and KV_comp built here (benchmarks call it to keep that out of decode timings).
  void admit();

  // Steps until every request has finished.
  Status run();

  bool idle() const { return active_.empty() && queue_.empty(); }
  int64_t queued() const { return static_cast<int64_t>(queue_.size()); }
  int64_t active() const { return static_cast<int64_t>(active_.size()); }
  // Results of finished requests since the last call, in order of finishing.
  std::vector<EngineResult> take_finished();
  // Every finished request's metrics, added up.
  const RequestMetrics& totals() const { return totals_; }

  // What a request may hold at most at any time. Device: the resident pages of its compressed
  // cache — the kept set the compressor promises (Compressor::footprint: c * n per layer for a
  // token dropper; every token for a quantizer or no compressor) plus every token still to come and
  // one window, with each layer's last page partly filled. Host: its full cache plus a verify
  // window, and an offline compressor's scratch forwards. The prompt is prefilled into the host
  // store, so the device never holds it whole. A pool of at least this size runs the request
  // through add_request(); the sum over requests runs them all at once. add_prefilled() reserves
  // the kept set it is given (every slot without one), which may differ from this bound.
  struct PageDemand {
    int64_t device = 0;
    int64_t host = 0;
    int64_t transient = 0;    // one verify window's copy of KV_full (transfer mode)
    int64_t state_bytes = 0;  // the compressor's own per-request memory (Compressor::footprint)
    int64_t kept_slots = 0;   // KV_comp's slots right after compression, summed over layers, reserved
  };
  static PageDemand pages_for_request(const LlamaModel& model, const EngineOptions& options, int64_t device_page_size,
                                      int64_t host_page_size, const GenerationRequest& request);
  // The sum over `requests`: pools of this size run them all at once.
  static PageDemand pages_for_requests(const LlamaModel& model, const EngineOptions& options, int64_t device_page_size,
                                       int64_t host_page_size, std::span<const GenerationRequest> requests);

 private:
  PageDemand worst_case(const EngineRequest& r) const;
  // Demand with `kept_slots` slots kept after compression (summed over layers); -1: the bound the
  // compressor's footprint() declares.
  static PageDemand demand_for(const LlamaModel& model, const EngineOptions& options, int64_t device_page_size,
                               int64_t host_page_size, const GenerationRequest& request, int64_t kept_slots);
  // Checks that the pools can ever hold `need`, then queues the request.
  Result<int64_t> enqueue(GenerationRequest request, const PageDemand& need);
  // Copies a prefilled request's prompt KV into its host cache and finishes its prefill.
  void start_prefilled(EngineRequest& r);
  // Transfer mode: queues the copy of r's KV_full into transient pages when none is queued.
  void start_transfer(EngineRequest& r);
  Status run_forward(std::vector<EngineRequest*>& members, double stall_seconds);
  void finish_prefill(EngineRequest& r, const float* logits);
  Status build_compressed(EngineRequest& r);
  void commit_window(EngineRequest& r, const float* rows);
  // Appends a committed token to the output (the token that would be fed at `position`) unless it
  // ends the request: Generator's stop, length and context rules, in its order.
  void commit_token(EngineRequest& r, int32_t token, int64_t position);
  void fall_back_to_full(EngineRequest& r, const Status& why);
  // The drafts r's next window takes: the policy's choice within the tokens left and the context.
  int64_t window_for(const EngineRequest& r) const;
  // What r's forwards read, for the goodput policy's costs.
  RequestReads reads_of(const EngineRequest& r) const;
  // Bytes of one cache slot (one token's K and V in one layer) at the pools' dtype.
  double slot_bytes() const;
  // The most drafts one window may take: x, or with a scheduler its window - 2.
  static int64_t max_window(const EngineOptions& options);
  // Scheduler: places r's next reload and verify (after prefill and after each verify).
  void schedule(EngineRequest& r);
  // Scheduler: this iteration's events (copies to start, verifies due).
  void apply_schedule();
  // Releases a done request's pages and compressor state and moves its result to the finished list.
  void finish(EngineRequest& r);
  // Returns KV_comp's float and packed pages.
  void release_comp(EngineRequest& r);
  // A quantizer packs KV_comp's committed float slots in whole blocks (pack_front).
  Status pack_comp(EngineRequest& r);
  // Whether the window r just verified leaves KV_comp's refill for later: a window of no drafts
  // read KV_full alone, so a request decoding on its full cache does what plain full-KV decoding
  // does (no copy into KV_comp, no packing). An online dropper's drops apply to KV_comp as rows
  // commit, so its requests refill after every window; a quantizer never drops and defers too.
  bool defers_comp_refill(const EngineRequest& r) const;
  // Brings a KV_comp left behind up to the committed tokens (and packs them), before a window drafts
  // and when the request finishes. Failures are the quantizer's (pack()).
  Status catch_up_comp(EngineRequest& r);
  bool quantizer() const { return packed_pool_.has_value(); }

  const LlamaModel& model_;
  PagePool& device_pool_;
  PagePool& host_pool_;
  EngineOptions options_;
  SteadyClock steady_clock_;
  const Clock* clock_;
  int64_t next_id_ = 0;
  std::vector<std::unique_ptr<EngineRequest>> queue_;
  std::vector<std::unique_ptr<EngineRequest>> active_;
  std::vector<EngineResult> finished_;
  RequestMetrics totals_;
  Status scheduler_status_;  // the first placement the scheduler refused
  // A quantization compressor: its packed page format and the pool of packed pages of every
  // KV_comp (as many pages as the device pool has resident pages: any float page may be packed).
  PackedFormat packed_format_;
  std::optional<PackedPagePool> packed_pool_;
  Status quantizer_status_;  // why the quantizer cannot run (validate_options reports it)
  DraftPolicy policy_;
};

}  // namespace vericache
