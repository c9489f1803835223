// Finding, validating and loading compressor plugins (shared libraries, see vericache/plugin_abi.h).
//
// Validation happens in this order, each failure a one-line Status starting "plugins: ":
//   the file exists and dlopen accepts it; it exports vc_plugin_descriptor_v1; the ABI version is
//   the core's; the plugin was built against the core's torch version and C++11-ABI setting; it
//   exports vc_plugin_create_v1. Only then is any C++ symbol of the plugin called.
// Search path for names: $VERICACHE_PLUGIN_PATH (colon-separated), then the directories given
// (the build tree's and the install tree's plugin folders). A plugin file is `vc_plugin_*.so`.
//
// Ownership: a loaded compressor keeps its library loaded (the library handle lives in the
// compressor's deleter), so the plugin's code outlives every object it made.
// Thread-safety: all functions are safe to call concurrently.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <vericache/compressor.h>
#include <vericache/status.h>

namespace vericache {

struct PluginInfo {
  std::string path;
  std::string name;
  std::string description;
  CompressorFamily family = CompressorFamily::kTokenDropping;
  CompressionMode mode = CompressionMode::kOffline;
  uint32_t scenarios = 0;
  uint32_t abi_version = 0;
  uint32_t api_version = 0;
  std::string torch_version;
  int cxx11_abi = 0;
  std::string compiler;
  std::string cxx_library;
};

// Opens `path` and validates its descriptor.
Result<PluginInfo> inspect_plugin(const std::string& path);

struct PluginSearch {
  std::vector<PluginInfo> found;   // valid plugins, in search order (first wins for a name)
  std::vector<Status> rejected;    // files that look like plugins but failed validation
};
// Every vc_plugin_*.so in $VERICACHE_PLUGIN_PATH and `dirs` (missing directories are skipped).
PluginSearch find_plugins(const std::vector<std::string>& dirs);

// The plugin named `name_or_path`: a path when it contains '/' or ends in ".so", else the first
// found plugin with that descriptor name (NotFound lists the names found).
Result<PluginInfo> resolve_plugin(const std::string& name_or_path, const std::vector<std::string>& dirs);

// Loads the plugin at `path` and creates a compressor with `json_params` (a JSON object).
Result<std::shared_ptr<Compressor>> load_compressor(const std::string& path, const std::string& json_params);

// The directories searched by default: the build tree's and the install tree's plugin folders.
std::vector<std::string> default_plugin_dirs();

}  // namespace vericache
