// Comparing our model with Hugging Face transformers on a reference fixture made by
// tests/reference/make_fixtures.py (transformers running the same GGUF in float32).
#pragma once

#include <cstddef>
#include <string>

#include "model/llama_model.h"

namespace vericache::testing {

// Largest |ours - reference| allowed on a Qwen2.5-Coder 0.5B logit; measured worst 2.3e-5 (8
// prompts) and 3.6e-5 (an 8,727-token prompt).
inline constexpr double kQwenLogitTolerance = 1e-4;

struct Expectations {
  size_t cases;                 // prompts in the fixture
  int long_prompts;             // of them at least 2,000 tokens
  double logit_tolerance;       // largest |ours - reference| on any compared logit
  int identical_continuations;  // at least this many greedy continuations token for token
  int top1_agreements = -1;     // at least this many next-token argmaxes equal; -1: every prompt's
};

// For every prompt of `fixture_file`: the prompt tokenizes to the same ids, the next-token logits
// (the fixture's top 64 and every 64th entry) agree within the tolerance with the same argmax, and
// the greedy continuation is compared token for token. Prints one line per prompt.
void expect_matches_transformers(const LlamaModel& m, const std::string& fixture_file, const Expectations& e);

}  // namespace vericache::testing
