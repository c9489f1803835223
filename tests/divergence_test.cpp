// kl_divergence_of_logits against closed forms: the per-step KL the acceptance benchmark reports.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/compression_divergence.h"

namespace vericache {
namespace {

TEST(Divergence, KlOfLogitsMatchesTheClosedForm) {
  // p = softmax(0, log 3) = (1/4, 3/4), q = (1/2, 1/2): KL = 1/4 ln(1/2) + 3/4 ln(3/2).
  const std::vector<float> p{0.0f, std::log(3.0f)}, q{5.0f, 5.0f};
  EXPECT_NEAR(kl_divergence_of_logits(p.data(), q.data(), 2), 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-7);
  // Reversed: 1/2 ln 2 + 1/2 ln(2/3).
  EXPECT_NEAR(kl_divergence_of_logits(q.data(), p.data(), 2), 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-7);
}

TEST(Divergence, KlIsZeroForEqualAndShiftedLogits) {
  std::vector<float> p(151936), shifted(p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 9.0);
    shifted[i] = p[i] + 40.0f;  // softmax ignores a shift; rounding it moves each logit < 4e-6
  }
  EXPECT_EQ(kl_divergence_of_logits(p.data(), p.data(), static_cast<int64_t>(p.size())), 0.0);
  EXPECT_NEAR(kl_divergence_of_logits(p.data(), shifted.data(), static_cast<int64_t>(p.size())), 0.0, 1e-9);
  // A token made impossible under q costs p's mass times the logit gap.
  std::vector<float> masked = p;
  masked[0] = -1e4f;
  EXPECT_GT(kl_divergence_of_logits(p.data(), masked.data(), static_cast<int64_t>(p.size())), 1e-6);
}

}  // namespace
}  // namespace vericache
