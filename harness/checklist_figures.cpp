#include "checklist_figures.h"

#include <cstdio>
#include <sstream>
#include <sys/wait.h>

namespace vericache::cli {
namespace {

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `command` through the shell with stderr joined to stdout; its exit status and output.
int run_captured(const std::string& command, std::string* output) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[512];
  while (fgets(buf, sizeof buf, p) != nullptr) *output += buf;
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

std::string default_figures_python() { return std::string(VC_SOURCE_DIR) + "/.venv/bin/python"; }

Result<std::vector<std::string>> draw_checklist_figures(const std::string& trace, const std::string& out_dir,
                                                        const std::string& python) {
  std::string ignored;
  if (run_captured(shell_quoted(python) + " -c 'import h5py, matplotlib'", &ignored) != 0) {
    return Status::not_found(python + " cannot import h5py and matplotlib: harness/setup.sh installs both into .venv "
                             "(or pass --python)");
  }
  const std::string script = std::string(VC_SOURCE_DIR) + "/harness/checklist/figures.py";
  std::string output;
  if (run_captured(shell_quoted(python) + " " + shell_quoted(script) + " " + shell_quoted(trace) + " " +
                       shell_quoted(out_dir),
                   &output) != 0) {
    while (!output.empty() && output.back() == '\n') output.pop_back();
    return Status::internal("drawing the figures failed: " + output);
  }
  std::vector<std::string> pngs;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("figure: ", 0) == 0) pngs.push_back(line.substr(8));
  }
  return pngs;
}

}  // namespace vericache::cli
