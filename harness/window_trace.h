// The engine's verify windows in an HDF5 file (util/hdf5_table.h: columns `request`, `drafted`,
// `accepted`, one row per verify, in the order they ran; a `command` attribute), written by
// `vericache bench-reload --windows-out`. `vericache simulate` and `vericache sweep` read them with
// --acceptance-trace, from such a file or from a checklist trace (checklist_trace.h: its
// acceptance/ group, the windows of every draft length), and their simulator then draws acceptance
// as the engine measured it (sim/acceptance_model.h).
//
// Thread-safety: none needed (one call at a time). Failure: the HDF5 layer's IOError / NotFound
// naming the file; InvalidArgument for a trace with no rows or no drafted token.
#pragma once

#include <span>
#include <string>
#include <vector>

#include <vericache/status.h>

#include "engine/engine_stats.h"
#include "sim/acceptance_model.h"

namespace vericache::cli {

Status write_window_trace(const std::string& path, std::span<const WindowRecord> windows, const std::string& command);
Result<std::vector<sim::WindowSample>> read_window_trace(const std::string& path);

// What --acceptance-trace gives the simulator: acceptance by draft position
// (sim::acceptance_by_position) and how many windows it was estimated from.
struct TraceAcceptance {
  std::vector<double> position_alphas;
  int64_t windows = 0;
};
Result<TraceAcceptance> read_trace_acceptance(const std::string& path);

}  // namespace vericache::cli
