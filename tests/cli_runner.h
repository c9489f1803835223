// Runs the `vericache` binary (VC_BINARY) as a user does and captures what it prints.
#pragma once

#include <string>

namespace vericache::testing {

struct CliRun {
  int exit_code;    // -1 when the process did not exit normally (a signal)
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `vericache <args>` through the shell (so `args` may quote and redirect).
CliRun run_vericache(const std::string& args);
// Runs any shell command line the same way.
CliRun run_command(const std::string& command);

}  // namespace vericache::testing
