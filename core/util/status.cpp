#include <vericache/status.h>

#include <cstdio>

#include "util/check.h"

namespace vericache {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kCorruption: return "corruption";
    case StatusCode::kNotSupported: return "not supported";
    case StatusCode::kIOError: return "I/O error";
    case StatusCode::kOutOfPages: return "out of KV pages";
    case StatusCode::kPluginError: return "plugin error";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& prefix) const {
  if (ok()) return *this;
  return Status(code_, prefix + ": " + message_);
}

namespace detail {
void check_failed(const char* condition, const char* file, int line, const char* message) {
  std::fprintf(stderr, "vericache: internal check failed: %s (%s:%d): %s\n", condition, file, line, message);
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace vericache
