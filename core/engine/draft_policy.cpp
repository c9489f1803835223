#include "engine/draft_policy.h"

#include <algorithm>
#include <string>

namespace vericache {

namespace {

constexpr size_t kForwardHistory = 256;  // decode forwards the costs are fitted to
constexpr int64_t kRefitEvery = 16;      // forwards between fits (every forward until there are this many)
constexpr size_t kMinForwards = 4;       // forwards the first fit needs
constexpr int64_t kMinReached = 8;       // windows a draft position needs for its own estimate
constexpr int64_t kFirstTier = 4;        // tiers: where a request starts (or x if smaller)

template <typename T>
void push_bounded(std::deque<T>& q, T value, size_t bound) {
  q.push_back(std::move(value));
  while (q.size() > bound) q.pop_front();
}

// tiers: 1, 2, 4, ... below x, then x.
std::vector<int64_t> tiers_up_to(int64_t max_drafts) {
  std::vector<int64_t> tiers;
  for (int64_t t = 1; t < max_drafts; t *= 2) tiers.push_back(t);
  tiers.push_back(max_drafts);
  return tiers;
}

}  // namespace

const char* draft_policy_name(DraftPolicyKind kind) {
  switch (kind) {
    case DraftPolicyKind::kFixed: return "fixed";
    case DraftPolicyKind::kConfidence: return "confidence";
    case DraftPolicyKind::kTiers: return "tiers";
    case DraftPolicyKind::kGoodput: return "goodput";
  }
  return "?";
}

std::optional<DraftPolicyKind> parse_draft_policy(std::string_view name) {
  for (DraftPolicyKind k :
       {DraftPolicyKind::kFixed, DraftPolicyKind::kConfidence, DraftPolicyKind::kTiers, DraftPolicyKind::kGoodput}) {
    if (name == draft_policy_name(k)) return k;
  }
  return std::nullopt;
}

Status check_draft_policy_options(const DraftPolicyOptions& o) {
  if (!(o.min_confidence >= 0 && o.min_confidence <= 1)) {
    return Status::invalid_argument("the confidence policy's minimum probability must be in [0, 1], got " +
                                    std::to_string(o.min_confidence));
  }
  if (!(o.tier_down >= 0 && o.tier_down <= o.tier_up && o.tier_up <= 1 && o.tier_smoothing > 0 &&
        o.tier_smoothing <= 1)) {
    return Status::invalid_argument("the tiers policy needs 0 <= down <= up <= 1 and smoothing in (0, 1]");
  }
  if (o.probe_every < 1 || o.probe_length < 1 || o.probe_every_max < o.probe_every) {
    return Status::invalid_argument(
        "the goodput policy's probe interval and probe length must be >= 1, and its longest interval >= the interval");
  }
  if (!(o.goodput_margin >= 0)) return Status::invalid_argument("the goodput policy's margin must be >= 0");
  if (o.own_windows < 1 || o.prior_windows < 1) {
    return Status::invalid_argument("the goodput policy needs at least one window of history");
  }
  for (int64_t w : o.test_windows) {
    if (w < 0) return Status::invalid_argument("test windows must be >= 0");
  }
  return Status();
}

double WindowCosts::seconds(int64_t drafts) const {
  const double drafting = static_cast<double>(drafts) * draft_step_s;
  return drafting + std::max(copy_s - drafting, 0.0) + verify_s + static_cast<double>(drafts) * verify_row_s;
}

int64_t goodput_window(std::span<const double> alphas, const WindowCosts& costs, int64_t max_drafts,
                       double margin) {
  if (costs.seconds(0) <= 0 || alphas.empty()) return max_drafts;
  int64_t best = 0;
  double best_rate = (1.0 + margin) / costs.seconds(0);  // what a drafting window must reach
  double reach = 1, expected = 0;  // expected accepted drafts of a window of w (sim/acceptance_model.h)
  for (int64_t w = 1; w <= max_drafts; ++w) {
    reach *= alphas[std::min<size_t>(static_cast<size_t>(w - 1), alphas.size() - 1)];
    expected += reach;
    const double rate = (1.0 + expected) / costs.seconds(w);
    if (rate > best_rate) {
      best_rate = rate;
      best = w;
    }
  }
  return best;
}

DraftPolicy::DraftPolicy(DraftPolicyOptions options, int64_t max_drafts)
    : options_(options), max_drafts_(std::max<int64_t>(max_drafts, 1)) {}

int64_t DraftPolicy::next_window(const DraftPolicyState& state, const RequestReads& reads) const {
  const std::vector<int64_t>& scripted = options_.test_windows;
  if (!scripted.empty()) return scripted[static_cast<size_t>(state.windows_seen) % scripted.size()];
  switch (options_.kind) {
    case DraftPolicyKind::kFixed:
    case DraftPolicyKind::kConfidence: return max_drafts_;
    case DraftPolicyKind::kTiers: return state.tier > 0 ? state.tier : std::min(kFirstTier, max_drafts_);
    case DraftPolicyKind::kGoodput: return goodput_next(state, reads);
  }
  return max_drafts_;
}

bool DraftPolicy::stops_window(double top_probability) const {
  return options_.kind == DraftPolicyKind::kConfidence && top_probability < options_.min_confidence;
}

int64_t DraftPolicy::probe_interval(const DraftPolicyState& state) const {
  return state.probe_every > 0 ? state.probe_every : options_.probe_every;
}

void DraftPolicy::observe_window(DraftPolicyState& state, int64_t drafted, int64_t accepted) {
  ++state.windows_seen;
  const int64_t interval = probe_interval(state);
  if (drafted == 0) {
    // A probe that led straight back to full-KV decoding: wait twice as long before the next.
    if (state.last_was_probe) state.probe_every = std::min(2 * interval, options_.probe_every_max);
    state.last_was_probe = false;
    ++state.tokens_since_draft;
    return;
  }
  state.last_was_probe = state.tokens_since_draft >= interval;
  if (!state.last_was_probe) state.probe_every = 0;  // drafting on its own merit: probe promptly again
  state.tokens_since_draft = 0;
  const sim::WindowSample w{drafted, accepted};
  push_bounded(state.windows, w, static_cast<size_t>(options_.own_windows));  // >= 1: check_draft_policy_options
  push_bounded(recent_windows_, w, static_cast<size_t>(options_.prior_windows));
  if (options_.kind != DraftPolicyKind::kTiers) return;
  const double rate = static_cast<double>(accepted) / static_cast<double>(drafted);
  const double s = options_.tier_smoothing;
  state.acceptance_average = state.acceptance_average < 0 ? rate : s * rate + (1 - s) * state.acceptance_average;
  const std::vector<int64_t> tiers = tiers_up_to(max_drafts_);
  const int64_t current = state.tier > 0 ? state.tier : std::min(kFirstTier, max_drafts_);
  auto at = std::lower_bound(tiers.begin(), tiers.end(), current);
  if (at == tiers.end()) --at;
  if (state.acceptance_average >= options_.tier_up && at + 1 != tiers.end()) ++at;
  else if (state.acceptance_average < options_.tier_down && at != tiers.begin()) --at;
  state.tier = *at;
}

void DraftPolicy::observe_forward(int64_t items, int64_t further_rows, double cache_bytes, double seconds) {
  if (items <= 0 || seconds <= 0) return;
  const sim::ForwardSample sample{static_cast<double>(items), static_cast<double>(further_rows), cache_bytes, seconds};
  push_bounded(forwards_, sample, kForwardHistory);
  items_per_forward_ = static_cast<double>(items);
  if (++forwards_since_fit_ < kRefitEvery && forwards_.size() >= static_cast<size_t>(kRefitEvery)) return;
  if (forwards_.size() < kMinForwards) return;
  forwards_since_fit_ = 0;
  costs_ = sim::fit_forward_costs(std::vector<sim::ForwardSample>(forwards_.begin(), forwards_.end()),
                                  sim::FitTerms::kPerForward);
  fitted_ = costs_.forward_s > 0 || costs_.request_s > 0 || costs_.row_s > 0 || costs_.seconds_per_byte > 0;
}

WindowCosts DraftPolicy::costs_for(const RequestReads& reads) const {
  if (!fitted_) return {};
  // The per-forward cost (the weights) is shared by the items of a forward.
  const double own = costs_.forward_s / items_per_forward_ + costs_.request_s;
  WindowCosts c;
  c.draft_step_s = own + costs_.seconds_per_byte * reads.comp_bytes;
  c.verify_s = own + costs_.seconds_per_byte * reads.full_bytes;
  c.verify_row_s = costs_.row_s;
  if (reads.transfer && link_bytes_per_second_ > 0) c.copy_s = reads.full_bytes / link_bytes_per_second_;
  return c;
}

int64_t DraftPolicy::goodput_next(const DraftPolicyState& state, const RequestReads& reads) const {
  const int64_t probe = std::min(options_.probe_length, max_drafts_);
  // In place, a request's first window decodes on KV_full: plain decoding, so free, and it gives the
  // fit a forward that reads the full cache without drafts. Drafts (KV_comp, one row) and verifies
  // (KV_full, more rows) alone cannot tell a cost per byte from one per request or per row.
  if (state.windows_seen == 0 && !reads.transfer) return 0;
  if (!fitted_) return probe;
  const WindowCosts costs = costs_for(reads);
  // No window pays even if every draft were accepted: the costs alone say decode on KV_full, and
  // only the longest interval's probe (which refreshes the fitted costs) drafts.
  static constexpr double kEveryDraftAccepted[] = {1.0};
  if (goodput_window(kEveryDraftAccepted, costs, max_drafts_, options_.goodput_margin) == 0) {
    return state.tokens_since_draft >= options_.probe_every_max ? probe : 0;
  }
  std::vector<sim::WindowSample> windows(state.windows.begin(), state.windows.end());
  windows.insert(windows.end(), recent_windows_.begin(), recent_windows_.end());
  if (windows.empty()) return probe;
  Result<std::vector<double>> alphas = sim::acceptance_by_position(windows, kMinReached);
  if (!alphas.ok()) return probe;
  // Past the longest window drafted, the acceptance is extrapolated (a probe whose drafts were all
  // accepted reads as alpha = 1 at every position): windows grow at most twofold beyond it.
  int64_t longest = 0;
  for (const sim::WindowSample& w : windows) longest = std::max(longest, w.drafted);
  const int64_t most = std::clamp<int64_t>(2 * longest, probe, max_drafts_);
  const int64_t w = goodput_window(*alphas, costs, most, options_.goodput_margin);
  return w == 0 && state.tokens_since_draft >= probe_interval(state) ? probe : w;
}

}  // namespace vericache
