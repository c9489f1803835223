#include "util/thread_pool.h"

#include <algorithm>
#include <memory>

#include "util/check.h"

namespace vericache {
namespace {

constexpr int kSpinIterations = 20000;  // ~tens of microseconds before a worker sleeps

int hardware_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

std::unique_ptr<ThreadPool>& global_pool() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  threads = std::max(1, threads);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  if (!global_pool()) global_pool() = std::make_unique<ThreadPool>(hardware_threads());
  return *global_pool();
}

void ThreadPool::set_global_threads(int threads) {
  global_pool() = std::make_unique<ThreadPool>(threads > 0 ? threads : hardware_threads());
}

void ThreadPool::run_chunks() {
  for (;;) {
    const int64_t begin = next_.fetch_add(grain_);
    if (begin >= n_) return;
    (*fn_)(begin, std::min(n_, begin + grain_));
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && spins < kSpinIterations) {
      ++spins;
      std::this_thread::yield();
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
    }
    run_chunks();
    busy_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || n <= grain) {
    fn(0, n);
    return;
  }
  VC_CHECK(!in_use_.exchange(true), "ThreadPool::parallel_for called concurrently or recursively");
  fn_ = &fn;
  n_ = n;
  grain_ = grain;
  next_.store(0);
  busy_.store(static_cast<int>(workers_.size()));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  run_chunks();
  while (busy_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  in_use_.store(false);
}

}  // namespace vericache
