#include "checklist_trace.h"

namespace vericache::cli {

namespace {
const char* const kAttributes[] = {"format", "version",   "command", "git_commit", "model_file", "model_fingerprint",
                                   "compressor", "plugin_path", "config", "seed", "hardware", "libraries", "verdicts"};
}  // namespace

Status write_checklist_trace(const std::string& path, Hdf5Table table) {
  table.attributes.insert(table.attributes.begin(), {{"format", kChecklistFormat}, {"version", std::to_string(kChecklistVersion)}});
  return write_hdf5_table(path, table);
}

Result<std::map<std::string, std::string>> read_checklist_attributes(const std::string& path) {
  VC_ASSIGN_OR_RETURN(const std::string format, read_hdf5_attribute(path, "format"));
  if (format != kChecklistFormat) {
    return Status::invalid_argument(path + ": a '" + format + "' file, not a checklist trace (" + kChecklistFormat + ")");
  }
  VC_ASSIGN_OR_RETURN(const std::string version, read_hdf5_attribute(path, "version"));
  if (version != std::to_string(kChecklistVersion)) {
    return Status::invalid_argument(path + ": checklist trace version " + version + "; this vericache reads version " +
                                    std::to_string(kChecklistVersion));
  }
  std::map<std::string, std::string> out;
  for (const char* name : kAttributes) {
    VC_ASSIGN_OR_RETURN(out[name], read_hdf5_attribute(path, name));
  }
  return out;
}

}  // namespace vericache::cli
