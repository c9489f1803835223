#include "engine/drafting.h"

namespace vericache {

int32_t take_draft(const float* lossy, int64_t vocab, const SamplingParams& sampling, DraftSampling mode, Rng& rng,
                   std::vector<std::vector<float>>* draft_probs) {
  if (sampling.greedy() || mode == DraftSampling::kArgmax) return argmax(lossy, vocab);
  draft_probs->push_back(dense_distribution(lossy, vocab, sampling));
  return sample_dense(draft_probs->back(), rng);
}

}  // namespace vericache
