// The draft-policy options the commands that run the draft–verify engine share (run, bench-engine):
// one declaration, one set of checks (engine/draft_policy.h says what each policy does).
#pragma once

#include <boost/program_options.hpp>

#include <string>
#include <vector>

#include <vericache/status.h>

#include "cli_common.h"
#include "engine/draft_policy.h"

namespace vericache::cli {

struct DraftPolicyArgs {
  std::string policy = "goodput";
  double min_confidence = DraftPolicyOptions{}.min_confidence;
  double goodput_margin = DraftPolicyOptions{}.goodput_margin;
};

// Adds --draft-policy, --draft-p-min and --goodput-margin, bound to `a`.
void add_draft_policy_options(boost::program_options::options_description& d, DraftPolicyArgs& a);
// Adds only the policies' tuning options, --draft-p-min and --goodput-margin (for commands that take
// their policies another way, as bench-engine's --draft-policies).
void add_draft_policy_tuning_options(boost::program_options::options_description& d, DraftPolicyArgs& a);
// The ranges parse_command_line checks the tuning options against.
inline const std::vector<OptionRange> kDraftPolicyTuningRanges = {{"draft-p-min", 0, 1}, {"goodput-margin", 0, 100}};
// InvalidArgument naming the bad value.
Result<DraftPolicyOptions> draft_policy_options(const DraftPolicyArgs& a);

}  // namespace vericache::cli
