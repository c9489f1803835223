#include "window_trace.h"

#include "checklist_trace.h"
#include "util/hdf5_table.h"

namespace vericache::cli {

Status write_window_trace(const std::string& path, std::span<const WindowRecord> windows, const std::string& command) {
  Hdf5Table t;
  t.names = {"request", "drafted", "accepted"};
  t.columns.resize(3);
  for (const WindowRecord& w : windows) {
    t.columns[0].push_back(static_cast<double>(w.request_id));
    t.columns[1].push_back(static_cast<double>(w.drafted));
    t.columns[2].push_back(static_cast<double>(w.accepted));
  }
  t.attributes = {{"command", command}};
  return write_hdf5_table(path, t);
}

Result<std::vector<sim::WindowSample>> read_window_trace(const std::string& path) {
  // A checklist trace keeps its windows in a group; a bench-reload trace at the root.
  auto format = read_hdf5_attribute(path, "format");
  const std::string group = format.ok() && *format == kChecklistFormat ? "acceptance/" : "";
  VC_ASSIGN_OR_RETURN(std::vector<double> drafted, read_hdf5_column(path, group + "drafted"));
  VC_ASSIGN_OR_RETURN(std::vector<double> accepted, read_hdf5_column(path, group + "accepted"));
  if (drafted.empty() || drafted.size() != accepted.size()) {
    return Status::invalid_argument(path + ": a window trace needs equal, non-empty 'drafted' and 'accepted' columns");
  }
  std::vector<sim::WindowSample> out;
  for (size_t i = 0; i < drafted.size(); ++i) {
    out.push_back({static_cast<int64_t>(drafted[i]), static_cast<int64_t>(accepted[i])});
  }
  return out;
}

Result<TraceAcceptance> read_trace_acceptance(const std::string& path) {
  VC_ASSIGN_OR_RETURN(std::vector<sim::WindowSample> windows, read_window_trace(path));
  auto alphas = sim::acceptance_by_position(windows);
  if (!alphas.ok()) return Status::invalid_argument(path + ": " + alphas.status().message());
  return TraceAcceptance{std::move(*alphas), static_cast<int64_t>(windows.size())};
}

}  // namespace vericache::cli
