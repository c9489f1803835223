// The draft-policy options the commands that run the draft–verify engine share (run, bench-engine):
// one declaration, one set of checks (engine/draft_policy.h says what each policy does).
#pragma once

#include <boost/program_options.hpp>

#include <string>

#include <vericache/status.h>

#include "engine/draft_policy.h"

namespace vericache::cli {

struct DraftPolicyArgs {
  std::string policy = "goodput";
  double min_confidence = DraftPolicyOptions{}.min_confidence;
  double goodput_margin = DraftPolicyOptions{}.goodput_margin;
};

// Adds --draft-policy, --draft-p-min and --goodput-margin, bound to `a`.
void add_draft_policy_options(boost::program_options::options_description& d, DraftPolicyArgs& a);
// InvalidArgument naming the bad value.
Result<DraftPolicyOptions> draft_policy_options(const DraftPolicyArgs& a);

}  // namespace vericache::cli
