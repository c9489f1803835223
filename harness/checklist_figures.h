// Drawing a checklist trace's figures: runs harness/checklist/figures.py (matplotlib and h5py, from
// the project's .venv) on the trace. Used by `vericache figures` and at the end of
// `vericache checklist`.
//
// Thread-safety: one call at a time (it runs a child process). Failure: NotFound when `python`
// cannot import h5py and matplotlib (the message says how to install them); Internal with the
// script's own error output when it fails.
#pragma once

#include <string>
#include <vector>

#include <vericache/status.h>

namespace vericache::cli {

// The interpreter the figures use by default: the source tree's .venv/bin/python.
std::string default_figures_python();

// Draws the figures of `trace` into `out_dir` (made if missing); the PNG paths written.
Result<std::vector<std::string>> draw_checklist_figures(const std::string& trace, const std::string& out_dir,
                                                        const std::string& python);

}  // namespace vericache::cli
