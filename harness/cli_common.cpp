#include "cli_common.h"

#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "util/thread_pool.h"

namespace vericache::cli {

std::string default_model_dir() {
  if (const char* dir = std::getenv("VERICACHE_MODEL_DIR"); dir != nullptr && *dir != '\0') return dir;
  return VC_DEFAULT_MODEL_DIR;
}

Result<std::string> resolve_model_path(const std::string& requested) {
  if (!requested.empty()) return requested;
  if (const char* env = std::getenv("VERICACHE_MODEL"); env != nullptr && *env != '\0') return std::string(env);
  const std::string path = (std::filesystem::path(default_model_dir()) / kDefaultModelFile).string();
  if (!std::filesystem::exists(path)) {
    return Status::not_found("the default model " + path +
                             " is missing; run harness/setup.sh to fetch it, or pass --model PATH");
  }
  return path;
}

void set_threads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  ThreadPool::set_global_threads(threads);
}

int report_error(const Status& status) {
  std::fprintf(stderr, "vericache: error: %s\n", status.message().c_str());
  return kExitFailure;
}

int report_usage_error(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "vericache %s: %s\nRun 'vericache %s --help' for the options.\n", command.c_str(),
               message.c_str(), command.c_str());
  return kExitUsage;
}

}  // namespace vericache::cli
