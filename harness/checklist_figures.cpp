#include "checklist_figures.h"

#include <sstream>

#include "cli_common.h"

namespace vericache::cli {
std::string default_figures_python() { return std::string(VC_SOURCE_DIR) + "/.venv/bin/python"; }

Result<std::vector<std::string>> draw_checklist_figures(const std::string& trace, const std::string& out_dir,
                                                        const std::string& python) {
  std::string ignored;
  if (run_shell(shell_quoted(python) + " -c 'import h5py, matplotlib'", &ignored) != 0) {
    return Status::not_found(python + " cannot import h5py and matplotlib: harness/setup.sh installs both into .venv "
                             "(or pass --python)");
  }
  const std::string script = std::string(VC_SOURCE_DIR) + "/harness/checklist/figures.py";
  std::string output;
  if (run_shell(shell_quoted(python) + " " + shell_quoted(script) + " " + shell_quoted(trace) + " " +
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
