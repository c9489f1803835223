// Verification of a draft window: which drafted tokens the full-KV model accepts, and the token
// that follows them. Greedy windows compare argmaxes; sampled windows use speculative (rejection)
// sampling, which makes the output distribution exactly the full-KV sampling distribution
// (Leviathan et al. 2023, Chen et al. 2023; the rule vLLM's rejection sampler implements):
//   accept draft t_i with probability min(1, p(t_i) / q(t_i));
//   on the first rejection draw from normalize(max(0, p - q)) and stop;
//   when all x drafts are accepted draw a bonus token from p of row x.
// p is the full-KV distribution and q the distribution the draft was drawn from: the compressed
// cache's distribution for sampled drafts, or one-hot at the draft for argmax drafts (then the
// rejection residual is p with the draft's probability removed). Temperature, top-k and top-p
// shape p and q identically (dense_distribution).
//
// Thread-safety: pure functions; an Rng must not be shared between threads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampler.h"

namespace vericache {

// The probability of every vocabulary entry under `params` (temperature, top-k, top-p): the same
// distribution select_token draws from, dense, zero outside the kept set. Requires !params.greedy().
std::vector<float> dense_distribution(const float* logits, int64_t vocab, const SamplingParams& params);

// Draws from a dense distribution (entries summing to ~1): the first id whose cumulative mass
// exceeds a uniform draw. Zero entries are never drawn.
int32_t sample_dense(std::span<const float> probs, Rng& rng);

// How drafts are drawn at a positive temperature.
enum class DraftSampling {
  kArgmax,   // the compressed cache's most likely token (q one-hot): nothing to store per draft
  kSampled,  // a draw from the compressed cache's distribution q (stored per draft)
};
const char* draft_sampling_name(DraftSampling mode);  // "argmax", "sampled"

struct WindowVerdict {
  int64_t accepted = 0;  // drafted tokens accepted, a prefix of the window
  int32_t next = 0;      // the token after them: the correction, or the bonus when all were accepted
};

// Greedy: accepted = the longest prefix where drafts[i] == argmax(row i); next = argmax(row accepted).
// `target_logits` holds drafts.size() + 1 rows of `vocab` full-KV logits.
WindowVerdict verify_greedy(std::span<const int32_t> drafts, const float* target_logits, int64_t vocab);

// Speculative sampling. `target_probs` holds drafts.size() + 1 rows of p (dense_distribution of
// the full-KV logits under the request's sampling parameters); `draft_probs[i]` is q of draft i
// (dense) for DraftSampling::kSampled, ignored (may be empty) for kArgmax. Consumes one uniform
// draw per examined draft with q > 0, plus one for the correction or bonus token.
WindowVerdict verify_sampled(std::span<const int32_t> drafts, std::span<const std::vector<float>> draft_probs,
                             DraftSampling mode, std::span<const std::vector<float>> target_probs, Rng& rng);

}  // namespace vericache
