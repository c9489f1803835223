// A draft step's token: from the logits the compressed cache gives (one row), the draft the window
// takes. Greedy requests and argmax drafts take the argmax; sampled drafts draw from the request's
// sampling distribution over those logits and keep it (q, which rejection sampling needs).
// Thread-safety: a pure function of its arguments; `rng` and `draft_probs` belong to one request.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/sampler.h"
#include "engine/verification.h"

namespace vericache {

// `lossy`: [vocab] logits of the draft forward. With sampled drafts at T > 0, q is appended to
// *draft_probs and the draft drawn from it with `rng`; otherwise neither is touched.
int32_t take_draft(const float* lossy, int64_t vocab, const SamplingParams& sampling, DraftSampling mode, Rng& rng,
                   std::vector<std::vector<float>>* draft_probs);

// The draft's top probability on the compressed cache (the confidence policy's signal): the largest
// entry of `q` when the draft was drawn from it, else the largest softmax probability of `lossy`.
double draft_confidence(const float* lossy, int64_t vocab, const std::vector<float>* q);

}  // namespace vericache
