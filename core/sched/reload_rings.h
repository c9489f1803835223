// The two reservation rings of the paper's Algorithm 1, over a window of W iterations from the
// current one (offset 0) to W - 1:
//   link ring  T[i]: seconds of KV_full transfer landing in iteration i; the link is serial, so
//              T[i] <= the link time one iteration offers;
//   memory ring B[i]: bytes of full caches streamed to the device and resident during iteration i,
//              against what device memory has left after the weights and the resident caches.
// A reload reserves its transfer time spread evenly over the iterations the link carries it, and
// its bytes in every iteration from its start through its verify (resident until then).
// advance() slides the window by one iteration.
//
// Thread-safety: none (one scheduler owns it). Offsets outside [0, W) are bugs (VC_CHECK).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vericache::sched {

class ReloadRings {
 public:
  // `window` W >= 1 iterations; `link_seconds_per_iteration` > 0 is what the link carries in one
  // iteration (T_iter); `memory_capacity_bytes` >= 0 is the device memory left for streamed caches.
  ReloadRings(int64_t window, double link_seconds_per_iteration, double memory_capacity_bytes);

  int64_t window() const { return window_; }
  // A reload: `seconds` of link time over iterations [link_first, link_last], `bytes` of device
  // memory over [link_first, resident_last] (resident_last >= link_last).
  struct Span {
    int64_t link_first = 0, link_last = 0, resident_last = 0;
  };
  // Whether it fits both rings.
  bool fits(const Span& span, double seconds, double bytes) const;
  // Reserves it (also when it does not fit: the lockstep and no-overlap policies overbook, and the
  // overbooking is what they cost).
  void reserve(const Span& span, double seconds, double bytes);
  // Slides the window: iteration 1 becomes 0, an empty iteration enters at W - 1.
  void advance();

  double link_seconds(int64_t offset) const { return link_[slot(offset)]; }
  double memory_bytes(int64_t offset) const { return memory_[slot(offset)]; }
  double link_seconds_per_iteration() const { return link_capacity_; }
  // A new estimate of T_iter for the reservations made from now on (those made stay as they are).
  void set_link_seconds_per_iteration(double seconds);
  double memory_capacity_bytes() const { return memory_capacity_; }

 private:
  size_t slot(int64_t offset) const;

  int64_t window_;
  double link_capacity_;
  double memory_capacity_;
  int64_t head_ = 0;  // slot of offset 0
  std::vector<double> link_, memory_;
};

}  // namespace vericache::sched
