// How many tokens each verify window drafts: the engine's draft policy (EngineOptions::draft_policy).
// x below is EngineOptions::draft_length, the longest window any policy drafts.
//
//   fixed       every window drafts x tokens.
//   confidence  drafts up to x and stops a window early at the first draft whose top probability on
//               the compressed cache is below `min_confidence`; that draft is dropped (as llama.cpp's
//               --draft-p-min). The top probability is the compressed distribution's: at T = 0 the
//               softmax of the logits, at T > 0 the sampling distribution q the draft came from.
//   tiers       the window moves through tiers 1, 2, 4, ..., x by a moving average of the request's
//               acceptance rate (accepted / drafted per window, smoothing `tier_smoothing`): one
//               tier up when the average is at least `tier_up`, one down when it is below
//               `tier_down` (in the manner of SGLang's adaptive speculation). It never stops drafting.
//   goodput     the window in 0..x with the most expected committed tokens per second for this
//               request: (1 + E[accepted drafts]) / seconds(window). Acceptance by draft position is
//               estimated (sim/acceptance_model.h) from the request's own recent windows together
//               with the engine's recent windows of all requests (the prior; it alone decides a
//               request's first window). Seconds come from forward costs fitted online
//               (sim/forward_cost_fit.h) to the engine's recent decode forwards (draft and verify
//               forwards, no prefill): each request's share of a forward is its item, its further
//               rows, its cache's bytes and an equal share of the forward's own cost (the weights).
//               In place, a request's first window is 0: one plain full-KV decode step, which
//               costs nothing over full-KV decoding and gives the fit a forward reading KV_full
//               without drafts, so a cost per byte can be told from one per request or per row
//               (draft and verify forwards alone differ in both bytes and rows). Transfer mode adds the
//               KV_full copy beyond what the drafting hides, at the link's measured rate. Window 0
//               decodes one token on KV_full: on the CPU in place, plain full-KV decoding. A request
//               at 0 drafts a probe window of `probe_length` after `probe_every` such tokens, so it
//               can come back to drafting; a probe that leads straight back to 0 doubles the request's
//               interval (up to `probe_every_max`), and a window that drafts without being a probe
//               resets it. A window drafts only when its rate beats window 0's by the factor
//               1 + `goodput_margin`: the fitted costs are estimates, and a draft window that is
//               only as good as full-KV decoding on paper loses to it in practice. Until costs are
//               fitted (after 4 decode forwards; refitted every forward up to 16, then every 16) and
//               while no window was seen, windows are probes. Where the fitted costs alone rule
//               drafting out (no window beats window 0 by the margin even if every draft were
//               accepted: on the CPU, short contexts where a draft step costs nearly a decode step),
//               the request decodes on KV_full without probing, except one probe each
//               `probe_every_max` tokens, which refreshes the costs. A window is at most twice the
//               longest window in the history it estimates from (beyond that the acceptance is
//               extrapolated: 4 drafts all accepted read as alpha = 1 everywhere), so windows grow
//               4, 8, 16, ... as long windows prove out.
//
// With a reload scheduler (EngineOptions::scheduler) the policy's window is the draft count the
// scheduler plans the request's verify at; the request drafts until that verify is due (a reload
// longer than the window keeps it drafting while the copy runs). The confidence stop does not apply
// there: the scheduler, not the drafts, ends a window.
//
// Losslessness does not depend on the policy: a window's length (and a confidence stop) is chosen
// from what was verified before it and from the drafts themselves, never from the full-KV rows
// that verify it, so greedy output stays identical and the accepted tokens keep the target
// distribution (the rejection-sampling argument holds for any such stopping rule).
//
// Thread-safety: the engine thread only. DraftPolicy keeps engine-wide history; DraftPolicyState
// is one request's.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <vericache/status.h>

#include "sim/acceptance_model.h"
#include "sim/forward_cost_fit.h"

namespace vericache {

enum class DraftPolicyKind { kFixed, kConfidence, kTiers, kGoodput };
const char* draft_policy_name(DraftPolicyKind kind);  // "fixed", "confidence", "tiers", "goodput"
std::optional<DraftPolicyKind> parse_draft_policy(std::string_view name);
inline constexpr const char* kDraftPolicyNames = "fixed|confidence|tiers|goodput";

struct DraftPolicyOptions;
// InvalidArgument naming the bad field.
Status check_draft_policy_options(const DraftPolicyOptions& o);

struct DraftPolicyOptions {
  DraftPolicyKind kind = DraftPolicyKind::kFixed;
  double min_confidence = 0.5;  // confidence
  double tier_up = 0.8;         // tiers
  double tier_down = 0.4;
  double tier_smoothing = 0.3;  // weight of the newest window in the moving average
  int64_t probe_every = 16;     // goodput: tokens decoded on KV_full before a probe window
  int64_t probe_every_max = 256;  // goodput: the longest interval repeated failed probes back off to
  int64_t probe_length = 4;
  double goodput_margin = 0.1;  // goodput: a window drafts only at a rate >= (1 + margin) x window 0's
  int64_t own_windows = 32;    // goodput: a request's most recent windows it estimates from
  int64_t prior_windows = 32;  // goodput: the engine's most recent windows, the prior
  // Test-only: when non-empty, a request's window i drafts test_windows[i % size] (before the
  // engine's limits) whatever the policy, so tests can make windows of 0 and uneven lengths.
  std::vector<int64_t> test_windows;
};

// The seconds a window of `drafts` tokens costs one request (its share of each forward).
struct WindowCosts {
  double draft_step_s = 0;  // one draft forward on KV_comp
  double verify_s = 0;      // a verify forward of one row on KV_full (window 0: a full-KV decode step)
  double verify_row_s = 0;  // each further row of the verify forward
  double copy_s = 0;        // transfer mode: copying KV_full, overlapped with the drafting
  double seconds(int64_t drafts) const;
};

// The window in [0, max_drafts] with the most expected committed tokens per second,
// (1 + expected_accepted_by_position(alphas, w)) / costs.seconds(w); ties go to the shorter window,
// and 0 unless the best rate is at least (1 + margin) times window 0's. max_drafts when every cost
// is 0 (nothing fitted).
int64_t goodput_window(std::span<const double> alphas, const WindowCosts& costs, int64_t max_drafts,
                       double margin = 0);

// One request's history under the policy.
struct DraftPolicyState {
  std::deque<sim::WindowSample> windows;  // its recent windows that drafted
  double acceptance_average = -1;         // tiers: < 0 before its first window
  int64_t tier = 0;                       // tiers: the current window; 0 before the first (then 4, or x if smaller)
  int64_t tokens_since_draft = 0;         // goodput: windows of 0 drafts since the last that drafted
  int64_t probe_every = 0;                // goodput: the request's probe interval (0: the options')
  bool last_was_probe = false;            // goodput: the last window drafted after a full interval at 0
  int64_t windows_seen = 0;               // every verified window
};

// What a request's forwards read, for its share of the fitted costs.
struct RequestReads {
  double comp_bytes = 0;  // KV_comp
  double full_bytes = 0;  // KV_full
  bool transfer = false;  // verification copies KV_full first
};

class DraftPolicy {
 public:
  // `max_drafts`: x.
  DraftPolicy(DraftPolicyOptions options, int64_t max_drafts);

  const DraftPolicyOptions& options() const { return options_; }
  // The request's next window, before the engine's own limits (tokens left, context).
  int64_t next_window(const DraftPolicyState& state, const RequestReads& reads) const;
  // Confidence: whether a draft with this top probability ends its window (and is dropped).
  bool stops_window(double top_probability) const;
  // A verified window of the request.
  void observe_window(DraftPolicyState& state, int64_t drafted, int64_t accepted);
  // A decode forward: its items, its rows beyond each item's first, the cache bytes it read (KV_comp
  // and KV_full; not the weights, which the fit's per-forward cost carries) and its seconds.
  void observe_forward(int64_t items, int64_t further_rows, double cache_bytes, double seconds);
  // Transfer mode: the link's measured rate (bytes per second; 0: unknown).
  void observe_link(double bytes_per_second) { link_bytes_per_second_ = bytes_per_second; }
  // The costs a window of this request is judged by (all 0 while nothing is fitted).
  WindowCosts costs_for(const RequestReads& reads) const;

 private:
  int64_t goodput_next(const DraftPolicyState& state, const RequestReads& reads) const;
  int64_t probe_interval(const DraftPolicyState& state) const;  // goodput: the request's, or the options'

  DraftPolicyOptions options_;
  int64_t max_drafts_;
  std::deque<sim::WindowSample> recent_windows_;  // every request's, newest last
  std::deque<sim::ForwardSample> forwards_;       // newest last
  int64_t forwards_since_fit_ = 0;
  sim::ForwardCosts costs_;
  bool fitted_ = false;
  double items_per_forward_ = 1;  // of the most recent decode forward: the share of its per-forward cost
  double link_bytes_per_second_ = 0;
};

}  // namespace vericache
