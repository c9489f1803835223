// Token selection from logits: greedy, or temperature sampling with top-k and top-p, driven by a
// per-request seeded generator so every run with the same seed picks the same tokens.
//
// The sampling distribution is explicit (SamplingDistribution) because speculative verification
// needs the probabilities themselves, not only a drawn token.
// Thread-safety: pure functions; an Rng must not be shared between threads.
#pragma once

#include <cstdint>
#include <vector>

namespace vericache {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy (argmax, lowest id on ties)
  int64_t top_k = 0;         // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // keep the smallest most-likely set with mass >= top_p; 1: all
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0; }
};

// xoshiro256** seeded through splitmix64: fast, statistically sound and identical on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();

 private:
  uint64_t s_[4];
};

// The candidates left after temperature, top-k and top-p, most likely first (ties: lower id
// first), with probabilities that sum to 1.
struct SamplingDistribution {
  std::vector<int32_t> ids;
  std::vector<double> probs;
};

int32_t argmax(const float* logits, int64_t vocab);
// Requires !params.greedy().
SamplingDistribution make_distribution(const float* logits, int64_t vocab, const SamplingParams& params);
int32_t sample(const SamplingDistribution& dist, Rng& rng);
// Greedy argmax, or a draw from make_distribution.
int32_t select_token(const float* logits, int64_t vocab, const SamplingParams& params, Rng& rng);

}  // namespace vericache
