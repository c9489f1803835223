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

bool ReloadRings::fits(int64_t first, int64_t last, double seconds, double bytes) const {
  VC_CHECK(first <= last, "empty span");
  const double per_iteration = seconds / static_cast<double>(last - first + 1);
  for (int64_t i = first; i <= last; ++i) {
    if (link_[slot(i)] + per_iteration > link_capacity_ * (1 + kSlack)) return false;
    if (memory_[slot(i)] + bytes > memory_capacity_ * (1 + kSlack)) return false;
  }
  return true;
}

void ReloadRings::reserve(int64_t first, int64_t last, double seconds, double bytes) {
  VC_CHECK(first <= last, "empty span");
  const double per_iteration = seconds / static_cast<double>(last - first + 1);
  for (int64_t i = first; i <= last; ++i) {
    link_[slot(i)] += per_iteration;
    memory_[slot(i)] += bytes;
  }
}

void ReloadRings::advance() {
  link_[static_cast<size_t>(head_)] = 0;
  memory_[static_cast<size_t>(head_)] = 0;
  head_ = (head_ + 1) % window_;
}

}  // namespace vericache::sched
