// The options `vericache model` and `vericache simulate` share: a hardware profile and a model
// shape by name or path, and overrides of the weight bytes, the full-cache size and the link.
// Thread-safety: plain functions of their arguments.
#pragma once

#include <boost/program_options.hpp>

#include <string>
#include <vector>

#include <vericache/status.h>

#include "cli_common.h"
#include "sim/profiles.h"
#include "sim/simulator.h"

namespace vericache::cli {

struct ProfileOptions {
  std::string hardware, shape;
  double weights_gb = 0, kv_full_gb = 0, link_gb_s = 0;  // used when given on the command line
};

// Adds --hardware, --model-shape, --weights-gb, --kv-full-gb and --link-gb-s.
void add_profile_options(boost::program_options::options_description& desc, ProfileOptions* out);
// Their ranges, for parse_command_line.
std::vector<OptionRange> profile_option_ranges();

// The profiles and the sizes a run uses, the overrides applied.
struct ResolvedProfiles {
  sim::HardwareProfile hardware;  // not loaded when `with_hardware` is false
  sim::ModelShapeProfile shape;
  double weight_bytes = 0;    // M
  double kv_full_bytes = 0;   // KV_full per request at `context`
  double link_bandwidth = 0;  // bytes/s
};
// NotFound / InvalidArgument from the profile loaders, as they word them.
Result<ResolvedProfiles> resolve_profiles(const ProfileOptions& options,
                                          const boost::program_options::variables_map& vm, int64_t context,
                                          bool with_hardware);
// A simulation of requests with `context` prompt tokens on that machine: its sizes, bandwidths and
// costs filled in, the rest (batch, policy, acceptance...) at their defaults.
sim::SimulationConfig machine_config(const ResolvedProfiles& p, int64_t context);

}  // namespace vericache::cli
