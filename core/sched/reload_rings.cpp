#include "sched/reload_rings.h"

#include "util/check.h"

namespace vericache::sched {

namespace {
// Reservations are sums of doubles: allow rounding when comparing with a capacity.
constexpr double kSlack = 1e-9;
}  // namespace

ReloadRings::ReloadRings(int64_t window, double link_seconds_per_iteration, double memory_capacity_bytes)
    : window_(window),
      link_capacity_(link_seconds_per_iteration),
      memory_capacity_(memory_capacity_bytes),
      link_(static_cast<size_t>(window), 0.0),
      memory_(static_cast<size_t>(window), 0.0) {
  VC_CHECK(window >= 1 && link_seconds_per_iteration > 0 && memory_capacity_bytes >= 0, "bad ring sizes");
}

size_t ReloadRings::slot(int64_t offset) const {
  VC_CHECK(offset >= 0 && offset < window_, "ring offset outside the window");
  return static_cast<size_t>((head_ + offset) % window_);
}

bool ReloadRings::fits(const Span& span, double seconds, double bytes) const {
  VC_CHECK(span.link_first <= span.link_last && span.link_last <= span.resident_last, "bad reload span");
  const double per_iteration = seconds / static_cast<double>(span.link_last - span.link_first + 1);
  for (int64_t i = span.link_first; i <= span.resident_last; ++i) {
    if (i <= span.link_last && link_[slot(i)] + per_iteration > link_capacity_ * (1 + kSlack)) return false;
    if (memory_[slot(i)] + bytes > memory_capacity_ * (1 + kSlack)) return false;
  }
  return true;
}

void ReloadRings::reserve(const Span& span, double seconds, double bytes) {
  VC_CHECK(span.link_first <= span.link_last && span.link_last <= span.resident_last, "bad reload span");
  const double per_iteration = seconds / static_cast<double>(span.link_last - span.link_first + 1);
  for (int64_t i = span.link_first; i <= span.resident_last; ++i) {
    if (i <= span.link_last) link_[slot(i)] += per_iteration;
    memory_[slot(i)] += bytes;
  }
}

void ReloadRings::set_link_seconds_per_iteration(double seconds) {
  VC_CHECK(seconds > 0, "an iteration must take some time");
  link_capacity_ = seconds;
}

void ReloadRings::advance() {
  link_[static_cast<size_t>(head_)] = 0;
  memory_[static_cast<size_t>(head_)] = 0;
  head_ = (head_ + 1) % window_;
}

}  // namespace vericache::sched
