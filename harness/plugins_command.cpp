// vericache plugins: the compressor plugins found on the search path, with their descriptors, and
// the files that look like plugins but were refused (with the reason).
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "cli_common.h"
#include "commands.h"
#include "loader/plugin_loader.h"

namespace po = boost::program_options;

namespace vericache::cli {
namespace {

std::string scenario_list(uint32_t bits) {
  std::string out;
  if (bits & static_cast<uint32_t>(Scenario::kLongContext)) out += "long-context";
  if (bits & static_cast<uint32_t>(Scenario::kRemotePrefix)) out += std::string(out.empty() ? "" : ",") + "remote-prefix";
  return out.empty() ? "-" : out;
}

}  // namespace

int run_plugins(int argc, char** argv) {
  std::vector<std::string> extra_dirs;
  bool json = false;
  po::options_description desc(
      "vericache plugins: list the compressor plugins (vc_plugin_*.so) found in $VERICACHE_PLUGIN_PATH\n"
      "(colon-separated), then the build tree's and the install tree's plugin folders\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("plugin-dir", po::value(&extra_dirs)->composing(), "also search this folder (repeatable; searched first)")
    ("json", po::bool_switch(&json), "print one JSON object");
  // clang-format on
  po::variables_map vm;
  if (auto done = parse_command_line("plugins", desc, "", argc, argv, &vm)) return *done;
  std::vector<std::string> dirs = extra_dirs;
  for (const std::string& d : default_plugin_dirs()) dirs.push_back(d);
  const PluginSearch search = find_plugins(dirs);

  if (json) {
    nlohmann::json out;
    out["plugins"] = nlohmann::json::array();
    for (const PluginInfo& p : search.found) {
      out["plugins"].push_back({{"name", p.name},
                                {"description", p.description},
                                {"family", family_name(p.family)},
                                {"mode", mode_name(p.mode)},
                                {"scenarios", scenario_list(p.scenarios)},
                                {"path", p.path},
                                {"abi_version", p.abi_version},
                                {"api_version", p.api_version},
                                {"torch_version", p.torch_version},
                                {"cxx11_abi", p.cxx11_abi},
                                {"compiler", p.compiler}, {"cxx_library", p.cxx_library}});
    }
    out["rejected"] = nlohmann::json::array();
    for (const Status& s : search.rejected) out["rejected"].push_back(s.message());
    const char* env = std::getenv("VERICACHE_PLUGIN_PATH");
    out["search_path"] = {{"VERICACHE_PLUGIN_PATH", env != nullptr ? env : ""}, {"folders", dirs}};
    std::cout << out.dump(1) << "\n";
    return kExitOk;
  }
  if (search.found.empty()) std::printf("no compressor plugins found\n");
  for (const PluginInfo& p : search.found) {
    std::printf("%-20s %-15s %-8s %-27s %s\n    %s\n", p.name.c_str(), family_name(p.family), mode_name(p.mode),
                scenario_list(p.scenarios).c_str(), p.path.c_str(), p.description.c_str());
  }
  if (!search.rejected.empty()) {
    std::printf("\nrefused:\n");
    for (const Status& s : search.rejected) std::printf("  %s\n", s.message().c_str());
  }
  return kExitOk;
}

}  // namespace vericache::cli
