// vericache figures RUN: redraws the figures of a checklist run (harness/checklist/figures.py)
// from its trace, into RUN/figures.
#include <boost/program_options.hpp>

#include <cstdio>
#include <filesystem>

#include "checklist_figures.h"
#include "checklist_trace.h"
#include "cli_common.h"
#include "commands.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace vericache::cli {

int run_figures(int argc, char** argv) {
  std::string run, python, out_dir;
  po::options_description desc(
      "vericache figures: draws the figures of a checklist run from its HDF5 trace (PNG, and the\n"
      "data behind each as CSV), with matplotlib from the project's .venv.\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("run", po::value(&run), "the run folder (results/runs/checklist-...) or its trace.h5; also the first argument")
    ("out", po::value(&out_dir), "where the figures go (default RUN/figures)")
    ("python", po::value(&python)->default_value(default_figures_python()), "the Python with h5py and matplotlib");
  // clang-format on
  po::positional_options_description positional;
  positional.add("run", 1);
  po::variables_map vm;
  const std::string example = "Example:\n  vericache figures results/runs/checklist-20261203-040000-kvzip\n";
  if (auto done = parse_command_line("figures", desc, example, argc, argv, &vm, {}, &positional)) return *done;
  if (run.empty()) return report_usage_error("figures", "name the run folder (or its trace.h5)");
  const std::string trace = fs::is_directory(run) ? (fs::path(run) / "trace.h5").string() : run;
  if (!fs::exists(trace)) return report_error(Status::not_found(trace + ": no such trace (a checklist run folder holds trace.h5)"));
  if (auto attrs = read_checklist_attributes(trace); !attrs.ok()) return report_error(attrs.status());
  if (out_dir.empty()) out_dir = (fs::path(trace).parent_path() / "figures").string();
  auto pngs = draw_checklist_figures(trace, out_dir, python);
  if (!pngs.ok()) return report_error(pngs.status());
  for (const std::string& png : *pngs) std::printf("%s\n", png.c_str());
  return kExitOk;
}

}  // namespace vericache::cli
