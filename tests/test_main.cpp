// Test entry point: kernel and libtorch threads set to every core before any test runs, as the CLI does.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <thread>

#include "util/thread_pool.h"

int main(int argc, char** argv) {
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  vericache::ThreadPool::set_global_threads(threads);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
