// The engine's verify windows in an HDF5 file (util/hdf5_table.h: columns `request`, `drafted`,
// `accepted`, one row per verify, in the order they ran; a `command` attribute), written by
// `vericache bench-reload --windows-out` and read by `vericache simulate --acceptance-trace`, whose
// simulator then draws acceptance as the engine measured it (sim/acceptance_model.h).
//
// Thread-safety: none needed (one call at a time). Failure: the HDF5 layer's IOError / NotFound
// naming the file; InvalidArgument for a trace with no rows.
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

}  // namespace vericache::cli
