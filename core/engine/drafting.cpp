#include "engine/drafting.h"

#include <algorithm>
#include <cmath>

namespace vericache {

int32_t take_draft(const float* lossy, int64_t vocab, const SamplingParams& sampling, DraftSampling mode, Rng& rng,
                   std::vector<std::vector<float>>* draft_probs) {
  if (sampling.greedy() || mode == DraftSampling::kArgmax) return argmax(lossy, vocab);
  draft_probs->push_back(dense_distribution(lossy, vocab, sampling));
  return sample_dense(draft_probs->back(), rng);
}

double draft_confidence(const float* lossy, int64_t vocab, const std::vector<float>* q) {
  if (q != nullptr && !q->empty()) return *std::max_element(q->begin(), q->end());
  const float top = *std::max_element(lossy, lossy + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(lossy[i] - top));
  return 1.0 / sum;
}

}  // namespace vericache
