#include "draft_policy_options.h"

#include <cstdio>

namespace po = boost::program_options;

namespace vericache::cli {

void add_draft_policy_options(po::options_description& d, DraftPolicyArgs& a) {
  // clang-format off
  d.add_options()
    ("draft-policy", po::value(&a.policy)->default_value(a.policy),
     "how long each verify window is, per request (--draft-length is the most): fixed (always x), "
     "confidence (stop at a draft below --draft-p-min), tiers (1, 2, 4, ..., x by a moving average of "
     "acceptance), goodput (the window with the most expected tokens per second from the request's "
     "acceptance and the fitted forward costs; 0 decodes a token on the full cache)");
  // clang-format on
  add_draft_policy_tuning_options(d, a);
}

void add_draft_policy_tuning_options(po::options_description& d, DraftPolicyArgs& a) {
  // clang-format off
  d.add_options()
    ("draft-p-min", po::value(&a.min_confidence)->default_value(a.min_confidence),
     "with --draft-policy confidence: a draft whose top probability on the compressed cache is below this ends its window")
    ("goodput-margin", po::value(&a.goodput_margin)->default_value(a.goodput_margin, "0.1"),
     "with --draft-policy goodput: a window drafts only when its expected tokens per second beat full-KV "
     "decoding's by this fraction (0: any gain; guards against errors of the fitted costs)");
  // clang-format on
}

Result<DraftPolicyOptions> draft_policy_options(const DraftPolicyArgs& a) {
  const std::optional<DraftPolicyKind> kind = parse_draft_policy(a.policy);
  if (!kind) {
    return Status::invalid_argument("--draft-policy must be one of " + std::string(kDraftPolicyNames) + ", got '" +
                                    a.policy + "'");
  }
  if (!(a.min_confidence >= 0 && a.min_confidence <= 1)) {
    char got[32];
    std::snprintf(got, sizeof got, "%g", a.min_confidence);
    return Status::invalid_argument(std::string("--draft-p-min must be in [0, 1], got ") + got);
  }
  if (!(a.goodput_margin >= 0)) {
    char got[32];
    std::snprintf(got, sizeof got, "%g", a.goodput_margin);
    return Status::invalid_argument(std::string("--goodput-margin must be >= 0, got ") + got);
  }
  DraftPolicyOptions o;
  o.kind = *kind;
  o.min_confidence = a.min_confidence;
  o.goodput_margin = a.goodput_margin;
  return o;
}

}  // namespace vericache::cli
