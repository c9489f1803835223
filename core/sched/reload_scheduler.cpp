#include "sched/reload_scheduler.h"

#include <algorithm>
#include <cmath>

#include "util/check.h"

namespace vericache::sched {

const char* policy_name(ReloadPolicy policy) {
  switch (policy) {
    case ReloadPolicy::kStaggered: return "staggered";
    case ReloadPolicy::kLockstep: return "lockstep";
    case ReloadPolicy::kNoOverlap: return "no-overlap";
  }
  return "?";
}

Result<ReloadPolicy> parse_policy(const std::string& name) {
  for (ReloadPolicy p : {ReloadPolicy::kStaggered, ReloadPolicy::kLockstep, ReloadPolicy::kNoOverlap}) {
    if (name == policy_name(p)) return p;
  }
  return Status::invalid_argument("unknown reload policy '" + name + "' (staggered, lockstep or no-overlap)");
}

ReloadScheduler::ReloadScheduler(const ReloadSchedulerOptions& options)
    : options_(options), rings_(options.window, options.iteration_seconds, options.memory_capacity_bytes) {
  VC_CHECK(options.draft_length >= 1 && options.draft_length + 1 < options.window, "need 1 <= x and x + 1 < W");
  VC_CHECK(options.link_bandwidth > 0, "the link bandwidth must be positive");
}

int64_t ReloadScheduler::span_iterations(double bytes) const {
  const double iterations = bytes / (options_.link_bandwidth * options_.iteration_seconds);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(iterations)));
}

Status ReloadScheduler::admit(int64_t request, double kv_full_bytes, int64_t drafts_left) {
  const int64_t span = span_iterations(kv_full_bytes), w = options_.window, cycle = options_.draft_length + 1;
  if (span + 1 > w - 1) {
    return Status::invalid_argument("a reload of " + std::to_string(kv_full_bytes / 1e9) + " GB takes " +
                                    std::to_string(span) + " iterations; with its verify that is more than the window of " +
                                    std::to_string(w) + " can plan (W - 1); raise the window");
  }
  if (options_.policy == ReloadPolicy::kLockstep && cycle + span + 1 > w) {
    return Status::invalid_argument("lockstep with x = " + std::to_string(cycle - 1) + " and reloads of " +
                                    std::to_string(span) + " iterations needs a window of at least " +
                                    std::to_string(cycle + span + 1));
  }
  const int64_t own_cycle = drafts_left >= 0 ? std::min(cycle, drafts_left + 1) : cycle;
  if (!place(request, kv_full_bytes, own_cycle)) waiting_.push_back({request, kv_full_bytes, own_cycle});
  return Status();
}

bool ReloadScheduler::place(int64_t request, double bytes, int64_t own_cycle) {
  const int64_t span = span_iterations(bytes), w = options_.window, cycle = options_.draft_length + 1;
  const double seconds = bytes / options_.link_bandwidth;
  // Offsets from now; the reload carried by the link over the `span` iterations before the verify.
  auto before = [span](int64_t verify) { return ReloadRings::Span{verify - span, verify - 1, verify}; };
  ReloadRings::Span reload;
  switch (options_.policy) {
    case ReloadPolicy::kStaggered: {
      // Candidates anchor, anchor - 1, anchor + 1, anchor - 2, ...: draft lengths near x, the
      // shorter first on a tie (fewer drafts wasted on a rejection).
      const int64_t lowest = span + 1, anchor = std::clamp(own_cycle, lowest, w - 1);
      std::vector<int64_t> candidates{anchor};
      for (int64_t k = 1; anchor - k >= lowest || anchor + k <= w - 1; ++k) {
        if (anchor - k >= lowest) candidates.push_back(anchor - k);
        if (anchor + k <= w - 1) candidates.push_back(anchor + k);
      }
      const auto found = std::find_if(candidates.begin(), candidates.end(),
                                      [&](int64_t d) { return rings_.fits(before(d), seconds, bytes); });
      if (found == candidates.end()) return false;
      reload = before(*found);
      break;
    }
    case ReloadPolicy::kLockstep: {
      // The next multiple of the cycle with room for the reload before it.
      const int64_t at = ((now_ + span + 1 + cycle - 1) / cycle) * cycle;
      reload = before(at - now_);
      break;
    }
    case ReloadPolicy::kNoOverlap:
      reload = ReloadRings::Span{own_cycle, own_cycle, own_cycle};
      break;
  }
  rings_.reserve(reload, seconds, bytes);
  plans_.push_back({request, now_ + reload.link_first, now_ + reload.resident_last, bytes, seconds});
  return true;
}

ReloadScheduler::Events ReloadScheduler::events_now() {
  // First come, first placed: the first that still does not fit stops the retries.
  while (!waiting_.empty()) {
    const Waiting& w = waiting_.front();
    if (!place(w.request, w.bytes, w.cycle)) break;
    waiting_.pop_front();
  }
  Events events;
  for (const ReloadPlan& p : plans_) {
    if (p.reload_start == now_) events.reloads_starting.push_back(p);
    if (p.verify_at == now_) events.verifying.push_back(p);
  }
  plans_.erase(std::remove_if(plans_.begin(), plans_.end(), [&](const ReloadPlan& p) { return p.verify_at == now_; }),
               plans_.end());
  return events;
}

void ReloadScheduler::observe_iteration(double seconds) {
  if (!(seconds > 0)) return;
  const double t = observed_ ? 0.75 * options_.iteration_seconds + 0.25 * seconds : seconds;
  observed_ = true;
  rings_.set_link_seconds_per_iteration(t);
  options_.iteration_seconds = t;
}

void ReloadScheduler::advance() {
  rings_.advance();
  ++now_;
}

}  // namespace vericache::sched
