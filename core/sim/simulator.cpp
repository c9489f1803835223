#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <random>
#include <string>

#include "sim/throughput_model.h"

namespace vericache::sim {
namespace {

struct Request {
  int64_t generated = 0;   // tokens output so far
  int64_t drafts = 0;      // drafted since the last verify
  bool verifying = false;  // in the current iteration
  bool reloading = false;  // its full cache is on its way or resident
  double reload_done_s = 0;
};

struct Interval {
  double start, end;
};

Status check(const SimulationConfig& c) {
  auto bad = [](const std::string& what) { return Status::invalid_argument("simulate: " + what); };
  if (!(c.weight_bytes >= 0) || !(c.kv_bytes_per_token > 0)) return bad("weight and KV sizes must be positive");
  if (!(c.hbm_bandwidth > 0) || !(c.link_bandwidth > 0)) return bad("bandwidths must be positive");
  if (c.context < 1 || c.output_tokens < 1 || c.batch < 1 || c.requests < 1) {
    return bad("context, output tokens, batch and requests must be at least 1");
  }
  if (!(c.ratio > 0 && c.ratio <= 1) || !(c.alpha >= 0 && c.alpha <= 1)) return bad("c must be in (0, 1], alpha in [0, 1]");
  for (double a : c.position_alphas) {
    if (!(a >= 0 && a <= 1)) return bad("every position's alpha must be in [0, 1]");
  }
  for (double a : c.request_alphas) {
    if (!(a >= 0 && a <= 1)) return bad("every request's alpha must be in [0, 1]");
  }
  if (!(c.kv_fraction > 0 && c.kv_fraction <= 1)) return bad("the KV fraction must be in (0, 1]");
  if (c.draft_length < 1 || c.draft_length + 1 >= c.window) return bad("need 1 <= x and x + 1 < W");
  if (!(c.copy_slowdown >= 0) || !(c.copy_bandwidth >= 0)) return bad("the copy slowdown and bandwidth must be >= 0");
  return Status();
}

}  // namespace

Result<SimulationResult> simulate(const SimulationConfig& c) {
  VC_RETURN_IF_ERROR(check(c));
  const double b = c.kv_bytes_per_token;
  const int64_t batch = std::min(c.batch, c.requests);
  auto kv_full = [&](const Request& r) { return static_cast<double>(c.context + r.generated) * b; };
  auto kv_comp = [&](const Request& r) { return (c.ratio * static_cast<double>(c.context) + static_cast<double>(r.generated + r.drafts)) * b; };
  // The engine's window_for: drafts stop at W - 2 and one short of the request's last token.
  auto drafts_left = [&](const Request& r) { return std::min(c.window - 2, c.output_tokens - r.generated - 1); };
  auto may_draft = [&](const Request& r) { return r.drafts < drafts_left(r); };

  // The rings' iteration length: Eq. 3's T_gpu at the starting context, what an iteration takes
  // when nothing stalls (the link's share of it is what the link ring offers); their memory: what
  // the weights and every compressed cache (grown to its last token) leave.
  LongContextInputs eq3;
  eq3.weight_bytes = c.weight_bytes;
  eq3.kv_full_bytes = static_cast<double>(c.context) * b;
  eq3.hbm_bandwidth = c.hbm_bandwidth;
  eq3.link_bandwidth = c.link_bandwidth;
  eq3.batch = batch;
  eq3.ratio = c.ratio;
  eq3.draft_length = c.draft_length;
  const double iteration_s =
      c.forward_overhead_s + static_cast<double>(batch) * c.request_s + estimate_long_context(eq3).t_gpu_s;
  const double compressed_bytes =
      static_cast<double>(batch) * (c.ratio * static_cast<double>(c.context) + static_cast<double>(c.output_tokens + c.draft_length)) * b;
  const double streamed_room =
      c.streamed_capacity_bytes > 0 ? c.streamed_capacity_bytes
                                    : c.kv_fraction * (c.memory_bytes - c.weight_bytes) - compressed_bytes;
  if (streamed_room < static_cast<double>(c.context + c.output_tokens) * b) {
    return Status::invalid_argument("simulate: device memory (" + std::to_string(c.memory_bytes / 1e9) +
                                    " GB) cannot hold the weights, every compressed cache and one full cache");
  }
  sched::ReloadSchedulerOptions so;
  so.policy = c.policy;
  so.window = c.window;
  so.draft_length = c.draft_length;
  so.iteration_seconds = iteration_s;
  so.link_bandwidth = c.link_bandwidth;
  so.memory_capacity_bytes = streamed_room;
  sched::ReloadScheduler scheduler(so);

  std::map<int64_t, Request> active;
  int64_t started = 0;
  for (; started < batch; ++started) {
    active[started] = Request{};
    VC_RETURN_IF_ERROR(scheduler.admit(started, static_cast<double>(c.context) * b, drafts_left(Request{})));
  }
  std::mt19937_64 rng(c.seed);
  auto accept = [&](int64_t id, int64_t position) {
    const size_t k = static_cast<size_t>(position);
    const double a = !c.position_alphas.empty()  ? c.position_alphas[std::min(k, c.position_alphas.size() - 1)]
                     : !c.request_alphas.empty() ? c.request_alphas[id % c.request_alphas.size()]
                                                 : c.alpha;
    return std::bernoulli_distribution(a)(rng);
  };

  SimulationResult out;
  double now = 0, link_free = 0, link_busy_total = 0;
  std::deque<Interval> link_jobs;
  int64_t drafts_verified = 0;
  while (!active.empty()) {
    if (out.iterations >= c.max_iterations) {
      return Status::internal("simulate: " + std::to_string(out.iterations) + " iterations passed with " +
                              std::to_string(active.size()) + " requests unfinished");
    }
    const sched::ReloadScheduler::Events events = scheduler.events_now();
    for (const sched::ReloadPlan& p : events.reloads_starting) {
      Request& r = active.at(p.request);
      const double start = std::max(now, link_free), seconds = kv_full(r) / c.link_bandwidth;
      link_free = start + seconds;
      r.reloading = true;
      r.reload_done_s = link_free;
      link_jobs.push_back({start, link_free});
      link_busy_total += seconds;
      out.reload_bytes += kv_full(r);
    }
    double forward_start = now, bytes_read = c.weight_bytes, memory = c.weight_bytes, streamed = 0;
    int64_t verify_rows = 0;
    std::vector<int64_t> verifying;
    for (const sched::ReloadPlan& p : events.verifying) {
      verifying.push_back(p.request);
      Request& r = active.at(p.request);
      r.verifying = true;
      forward_start = std::max(forward_start, r.reload_done_s);
    }
    std::vector<int64_t> drafting;
    for (auto& [id, r] : active) {
      if (!r.verifying && may_draft(r)) drafting.push_back(id);
      bytes_read += r.verifying ? kv_full(r) : may_draft(r) ? kv_comp(r) : 0.0;
      verify_rows += r.verifying ? r.drafts : 0;
      streamed += r.reloading ? kv_full(r) : 0.0;
      memory += kv_comp(r);
    }
    memory += streamed;
    const double in_forward = static_cast<double>(verifying.size() + drafting.size());
    const double forward_s = c.forward_overhead_s + in_forward * c.request_s +
                             static_cast<double>(verify_rows) * c.verify_row_s + bytes_read / c.hbm_bandwidth;
    // Contention: the copying inside [forward_start, forward_start + forward_s], at the copy's duty.
    double copying = 0;
    if (c.copy_slowdown > 0) {
      const double duty = c.copy_bandwidth > 0 ? std::min(1.0, c.link_bandwidth / c.copy_bandwidth) : 1.0;
      for (const Interval& j : link_jobs) {
        copying += duty * std::max(0.0, std::min(j.end, forward_start + forward_s) - std::max(j.start, forward_start));
      }
    }
    const double forward_total = forward_s + c.copy_slowdown * copying;
    const double end = forward_start + forward_total;
    scheduler.observe_iteration(forward_total);

    IterationRecord rec;
    rec.start_s = now;
    rec.seconds = end - now;
    rec.stall_s = forward_start - now;
    rec.memory_bytes = memory;
    while (!link_jobs.empty() && link_jobs.front().end <= now) link_jobs.pop_front();
    for (const Interval& j : link_jobs) rec.link_busy_s += std::max(0.0, std::min(j.end, end) - std::max(j.start, now));

    for (int64_t id : drafting) ++active.at(id).drafts;
    for (int64_t id : verifying) {
      Request& r = active.at(id);
      int64_t accepted = 0;
      while (accepted < r.drafts && accept(id, accepted)) ++accepted;
      const int64_t tokens = std::min(accepted + 1, c.output_tokens - r.generated);
      drafts_verified += r.drafts;
      r.generated += tokens;
      r.drafts = 0;
      r.reloading = false;
      r.verifying = false;
      rec.tokens += static_cast<int32_t>(tokens);
      ++rec.verifies;
      if (r.generated >= c.output_tokens) {
        active.erase(id);
        if (started < c.requests) {
          active[started] = Request{};
          VC_RETURN_IF_ERROR(scheduler.admit(started, static_cast<double>(c.context) * b, drafts_left(Request{})));
          ++started;
        }
      } else {
        VC_RETURN_IF_ERROR(scheduler.admit(id, kv_full(r), drafts_left(r)));
      }
    }
    out.tokens += rec.tokens;
    out.verifies += rec.verifies;
    out.stall_seconds += rec.stall_s;
    out.peak_memory_bytes = std::max(out.peak_memory_bytes, memory);
    out.peak_streamed_bytes = std::max(out.peak_streamed_bytes, streamed);
    if (c.record_iterations) out.iterations_trace.push_back(rec);
    scheduler.advance();
    now = end;
    ++out.iterations;
  }
  out.seconds = now;
  out.tok_s = now > 0 ? static_cast<double>(out.tokens) / now : 0;
  out.mean_drafts_per_verify = out.verifies ? static_cast<double>(drafts_verified) / static_cast<double>(out.verifies) : 0;
  out.mean_acceptance_length = out.verifies ? static_cast<double>(out.tokens) / static_cast<double>(out.verifies) : 0;
  out.link_busy_fraction = now > 0 ? std::min(1.0, link_busy_total / now) : 0;
  out.mean_iteration_s = out.iterations ? now / static_cast<double>(out.iterations) : 0;
  out.fits_memory = out.peak_memory_bytes <= c.memory_bytes;
  return out;
}

}  // namespace vericache::sim
