// VC_CHECK: invariants whose failure is a bug in VeriCache, never a user error. Always on (also in
// release builds); prints the condition, location and message to stderr and aborts.
#pragma once

namespace vericache::detail {
[[noreturn]] void check_failed(const char* condition, const char* file, int line, const char* message);
}  // namespace vericache::detail

#define VC_CHECK(cond, message)                                                         \
  do {                                                                                  \
    if (!(cond)) ::vericache::detail::check_failed(#cond, __FILE__, __LINE__, message); \
  } while (0)
