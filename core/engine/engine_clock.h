// The clock the engine reads its timings from. The real engine uses SteadyClock; the scheduler's
// simulator (a later issue) drives the same engine code from simulated time.
// Thread-safety: now_seconds() may be called from any thread.
#pragma once

#include <chrono>

namespace vericache {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds since an arbitrary, fixed origin; never decreases.
  virtual double now_seconds() const = 0;
};

class SteadyClock : public Clock {
 public:
  double now_seconds() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
};

}  // namespace vericache
