#include "engine/verification.h"

#include <algorithm>
#include <cmath>

#include "util/check.h"

namespace vericache {

const char* draft_sampling_name(DraftSampling mode) { return mode == DraftSampling::kArgmax ? "argmax" : "sampled"; }

std::vector<float> dense_distribution(const float* logits, int64_t vocab, const SamplingParams& params) {
  VC_CHECK(!params.greedy(), "dense_distribution needs a positive temperature");
  if ((params.top_k <= 0 || params.top_k >= vocab) && params.top_p >= 1.0) {
    // Nothing is cut: a plain softmax at the temperature, without make_distribution's sort of the
    // whole vocabulary (this runs for every row of every verify window).
    const float max_logit = *std::max_element(logits, logits + vocab);
    std::vector<double> e(vocab);
    double total = 0.0;
    for (int64_t i = 0; i < vocab; ++i) {
      e[i] = std::exp((static_cast<double>(logits[i]) - max_logit) / params.temperature);
      total += e[i];
    }
    std::vector<float> dense(vocab);
    for (int64_t i = 0; i < vocab; ++i) dense[i] = static_cast<float>(e[i] / total);
    return dense;
  }
  const SamplingDistribution sparse = make_distribution(logits, vocab, params);
  std::vector<float> dense(vocab, 0.0f);
  for (size_t i = 0; i < sparse.ids.size(); ++i) dense[sparse.ids[i]] = static_cast<float>(sparse.probs[i]);
  return dense;
}

int32_t sample_dense(std::span<const float> probs, Rng& rng) {
  double total = 0.0;
  for (float p : probs) total += p;
  VC_CHECK(total > 0.0, "sample_dense: no probability mass");
  const double u = rng.uniform() * total;
  double cumulative = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    cumulative += probs[i];
    last = static_cast<int32_t>(i);
    if (u < cumulative) return last;
  }
  return last;  // u beyond the rounded total
}

WindowVerdict verify_greedy(std::span<const int32_t> drafts, const float* target_logits, int64_t vocab) {
  WindowVerdict v;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    const int32_t target = argmax(target_logits + static_cast<int64_t>(i) * vocab, vocab);
    if (i == drafts.size() || drafts[i] != target) {
      v.next = target;
      return v;
    }
    ++v.accepted;
  }
  return v;
}

WindowVerdict verify_sampled(std::span<const int32_t> drafts, std::span<const std::vector<float>> draft_probs,
                             DraftSampling mode, std::span<const std::vector<float>> target_probs, Rng& rng) {
  VC_CHECK(mode == DraftSampling::kArgmax || draft_probs.size() == drafts.size(), "verify_sampled: one q per draft");
  VC_CHECK(target_probs.size() == drafts.size() + 1, "verify_sampled: one p row per draft plus the bonus row");
  WindowVerdict v;
  for (size_t i = 0; i < drafts.size(); ++i) {
    const std::vector<float>& p = target_probs[i];
    const int32_t t = drafts[i];
    const double q_t = mode == DraftSampling::kArgmax ? 1.0 : draft_probs[i][t];
    // Accept with probability min(1, p/q); q_t > 0 for a token drawn from q.
    if (q_t > 0.0 && rng.uniform() * q_t < p[t]) {
      ++v.accepted;
      continue;
    }
    // Rejected: draw from normalize(max(0, p - q)).
    std::vector<float> residual(p.size());
    double residual_mass = 0.0;
    for (size_t j = 0; j < p.size(); ++j) {
      const double q_j =
          mode == DraftSampling::kArgmax ? (static_cast<int32_t>(j) == t ? 1.0 : 0.0) : draft_probs[i][j];
      residual[j] = static_cast<float>(std::max(0.0, static_cast<double>(p[j]) - q_j));
      residual_mass += residual[j];
    }
    // No residual mass means p <= q everywhere, i.e. p == q, where a rejection has probability 0
    // (reachable only through float rounding): draw from p itself.
    v.next = sample_dense(residual_mass > 0.0 ? std::span<const float>(residual) : std::span<const float>(p), rng);
    return v;
  }
  v.next = sample_dense(target_probs[drafts.size()], rng);
  return v;
}

}  // namespace vericache
