#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "util/check.h"

namespace vericache {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed) {
  for (uint64_t& s : s_) s = splitmix64(seed);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

int32_t argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

SamplingDistribution make_distribution(const float* logits, int64_t vocab, const SamplingParams& params) {
  VC_CHECK(!params.greedy(), "make_distribution needs a positive temperature");
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  auto more_likely = [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
  int64_t keep = vocab;
  if (params.top_k > 0 && params.top_k < vocab) {
    keep = params.top_k;
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), more_likely);
    order.resize(keep);
  } else {
    std::sort(order.begin(), order.end(), more_likely);
  }
  SamplingDistribution dist;
  dist.probs.resize(keep);
  const double max_logit = logits[order[0]];
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    dist.probs[i] = std::exp((static_cast<double>(logits[order[i]]) - max_logit) / params.temperature);
    total += dist.probs[i];
  }
  for (double& p : dist.probs) p /= total;
  if (params.top_p < 1.0) {
    double mass = 0.0;
    int64_t n = 0;
    while (n < keep && mass < params.top_p) mass += dist.probs[n++];
    keep = std::max<int64_t>(n, 1);
    dist.probs.resize(keep);
    order.resize(keep);
    for (double& p : dist.probs) p /= mass;
  }
  dist.ids = std::move(order);
  return dist;
}

int32_t sample(const SamplingDistribution& dist, Rng& rng) {
  const double u = rng.uniform();
  double cumulative = 0.0;
  for (size_t i = 0; i < dist.ids.size(); ++i) {
    cumulative += dist.probs[i];
    if (u < cumulative) return dist.ids[i];
  }
  return dist.ids.back();  // u beyond the rounded total
}

int32_t select_token(const float* logits, int64_t vocab, const SamplingParams& params, Rng& rng) {
  if (params.greedy()) return argmax(logits, vocab);
  return sample(make_distribution(logits, vocab, params), rng);
}

}  // namespace vericache
