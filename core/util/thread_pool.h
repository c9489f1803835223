// ThreadPool: the CPU threads the model's kernels run on.
//
// parallel_for(n, grain, fn) calls fn(begin, end) on disjoint ranges covering [0, n), claimed in
// blocks of `grain` by the calling thread and the workers (dynamic scheduling). Which thread runs
// which range never changes a result: kernels split work only where outputs are independent.
// Workers spin briefly between jobs (a decode step issues hundreds of small parallel loops), then
// sleep.
//
// Why not at::parallel_for: it only runs in parallel in translation units compiled with -fopenmp,
// and the torch wheel carries its own OpenMP runtime; a pool of our own keeps one runtime and an
// explicit thread count.
//
// Thread-safety: parallel_for may be called from one thread at a time per pool (checked); fn
// must not call parallel_for on the same pool. The pool is destroyed at exit.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace vericache {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool (created with every hardware thread on first use).
  static ThreadPool& global();
  // Replaces the process-wide pool with one of `threads` threads (<= 0: every hardware thread).
  // Must not race with parallel_for on the global pool.
  static void set_global_threads(int threads);

 private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};  // bumped for every job
  std::atomic<int> busy_{0};             // workers still inside the current job
  std::atomic<int64_t> next_{0};         // next unclaimed index
  std::atomic<bool> in_use_{false};
  bool stop_ = false;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
};

}  // namespace vericache
