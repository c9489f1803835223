#include "profile_options.h"

namespace vericache::cli {

namespace po = boost::program_options;

void add_profile_options(po::options_description& desc, ProfileOptions* out) {
  // clang-format off
  desc.add_options()
    ("hardware", po::value(&out->hardware)->default_value("rtx-pro-6000"), "hardware profile: name or .json path")
    ("model-shape", po::value(&out->shape)->default_value("mistral-24b"), "model-shape profile: name or .json path")
    ("weights-gb", po::value(&out->weights_gb), "M in GB instead of the model shape's weight bytes")
    ("kv-full-gb", po::value(&out->kv_full_gb), "KV_full per request at --context in GB instead of the shape's")
    ("link-gb-s", po::value(&out->link_gb_s), "BW_inter in GB/s instead of the hardware profile's");
  // clang-format on
}

std::vector<OptionRange> profile_option_ranges() {
  return {{"weights-gb", 0, 1e6}, {"kv-full-gb", 0, 1e6, true}, {"link-gb-s", 0, 1e6, true}};
}

Result<ResolvedProfiles> resolve_profiles(const ProfileOptions& options, const po::variables_map& vm, int64_t context,
                                          bool with_hardware) {
  ResolvedProfiles r;
  VC_ASSIGN_OR_RETURN(r.shape, sim::load_model_shape(options.shape, VC_PROFILE_DIR));
  if (with_hardware) {
    VC_ASSIGN_OR_RETURN(r.hardware, sim::load_hardware_profile(options.hardware, VC_PROFILE_DIR));
  }
  r.weight_bytes = vm.count("weights-gb") ? options.weights_gb * 1e9 : r.shape.weight_bytes;
  r.kv_full_bytes =
      vm.count("kv-full-gb") ? options.kv_full_gb * 1e9 : static_cast<double>(context) * r.shape.kv_bytes_per_token();
  r.link_bandwidth = vm.count("link-gb-s") ? options.link_gb_s * 1e9 : r.hardware.link_bandwidth;
  return r;
}

sim::SimulationConfig machine_config(const ResolvedProfiles& p, int64_t context) {
  sim::SimulationConfig c;
  c.weight_bytes = p.weight_bytes;
  c.kv_bytes_per_token = p.kv_full_bytes / static_cast<double>(context);
  c.hbm_bandwidth = p.hardware.memory_bandwidth;
  c.link_bandwidth = p.link_bandwidth;
  c.memory_bytes = p.hardware.memory_bytes;
  c.forward_overhead_s = p.hardware.forward_overhead_s;
  c.request_s = p.hardware.request_s;
  c.verify_row_s = p.hardware.verify_row_s;
  c.context = context;
  return c;
}

}  // namespace vericache::cli
