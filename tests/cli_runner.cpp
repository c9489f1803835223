#include "cli_runner.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>

#include "test_support.h"

namespace vericache::testing {

CliRun run_vericache(const std::string& args) { return run_command(std::string(VC_BINARY) + " " + args); }

CliRun run_command(const std::string& command) {
  const std::string err_path = temp_dir() + "/stderr.txt";
  const std::string cmd = command + " 2>" + err_path;
  CliRun r{-1, "", ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_file(err_path);
  return r;
}

}  // namespace vericache::testing
