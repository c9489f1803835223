// Random-weights models (timing at shapes no model file here has): named as such, reproducible from
// their seed, drawn at the stated scale, and run by the same row-count-invariant forward as a real
// model. Unknown shapes are refused with the list of known ones.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "model/llama_model.h"
#include "model/model_shapes.h"
#include "test_support.h"
#include "util/system_memory.h"

namespace vericache {
namespace {

std::unique_ptr<LlamaModel> random_model(uint64_t seed) {
  auto m = LlamaModel::with_random_weights("smollm2-135m", seed);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), a.nbytes()) == 0;
}

TEST(RandomWeights, UnknownShapeListsTheKnownOnes) {
  auto m = LlamaModel::with_random_weights("llama-70b", 1);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "unknown model shape 'llama-70b'; known shapes: llama-3.1-8b, smollm2-135m");
  auto bf16 = LlamaModel::with_random_weights("smollm2-135m", 1, LoadOptions{at::kCPU, at::kBFloat16});
  ASSERT_FALSE(bf16.ok());
  EXPECT_EQ(bf16.status().message(), "the CPU forward computes in float32; load CPU models with dtype float32");
  // 32.1 GB of float32 weights: more than 80% of a 24 GiB machine (the test runs on such machines; a
  // larger one skips this check).
  if (physical_memory_bytes() < 40e9) {
    auto big = LlamaModel::with_random_weights("llama-3.1-8b", 1);
    ASSERT_FALSE(big.ok());
    EXPECT_EQ(big.status().message().rfind("random-weights:llama-3.1-8b needs 32.1 GB of float32 weights on the CPU, "
                                           "more than 80% of this machine's ",
                                           0),
              0u)
        << big.status().message();
  }
}

// The 8B shape is Llama-3.1-8B's published config (8.03 B parameters, untied output).
TEST(RandomWeights, LlamaShapeHasThePublishedSize) {
  auto shape = find_named_shape("llama-3.1-8b");
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->config.head_dim, 128);
  EXPECT_FALSE(shape->tied_embeddings);
  EXPECT_EQ(shape->config.parameter_count(false), 8030261248);
}

TEST(RandomWeights, SameSeedSameWeightsNamedAsRandom) {
  auto a = random_model(7), b = random_model(7), c = random_model(8);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->path(), "random-weights:smollm2-135m");
  EXPECT_EQ(a->weight_type(), "random");
  EXPECT_TRUE(a->random_weights());
  EXPECT_EQ(a->tokenizer().vocab_size(), 0);
  EXPECT_EQ(a->chat_template().status().message(), "random-weights:smollm2-135m has no chat template (random weights)");
  EXPECT_EQ(a->config().n_layers, 30);
  EXPECT_TRUE(a->tied_embeddings());
  const at::Tensor wa = *a->weight("blk.3.ffn_down.weight");
  EXPECT_TRUE(bitwise_equal(wa, *b->weight("blk.3.ffn_down.weight")));
  EXPECT_FALSE(bitwise_equal(wa, *c->weight("blk.3.ffn_down.weight")));
  // N(0, 1/k) with k = d_ff = 1536 inputs: 884,736 draws, so the sample std is within 1%.
  EXPECT_NEAR(wa.std().item<double>(), 1.0 / std::sqrt(1536.0), 0.01 / std::sqrt(1536.0));
  EXPECT_NEAR(wa.mean().item<double>(), 0.0, 1e-4);
  EXPECT_TRUE(at::equal(*a->weight("blk.0.attn_norm.weight"), at::ones({576})));
  const LlamaModel* real = testing::default_model();
  ASSERT_NE(real, nullptr);
  EXPECT_FALSE(real->random_weights());
}

// The random model runs through the CPU kernels like a real one: 12 tokens in one forward give the
// same logits, bit for bit, as 12 one-token decodes, and the logits are finite.
TEST(RandomWeights, ForwardIsRowCountInvariant) {
  auto m = random_model(1);
  ASSERT_TRUE(m);
  auto pool = m->make_page_pool(16, 256);
  ASSERT_TRUE(pool.ok());
  std::vector<int32_t> tokens = {5, 49151, 17, 0, 300, 300, 9000, 12, 48000, 7, 1, 2};
  std::vector<int32_t> positions(tokens.size());
  std::iota(positions.begin(), positions.end(), 0);
  SequenceKv whole(m->config().n_layers), one_by_one(m->config().n_layers);
  ForwardItem item{tokens, positions, &whole, &*pool, LogitRows::kAll};
  at::Tensor all;
  const Status whole_forward = m->forward(std::span<const ForwardItem>(&item, 1), &all);
  ASSERT_TRUE(whole_forward.ok()) << whole_forward.message();
  ASSERT_EQ(all.size(0), 12);
  EXPECT_TRUE(at::isfinite(all).all().item<bool>());
  for (size_t i = 0; i < tokens.size(); ++i) {
    ForwardItem step{std::span(tokens).subspan(i, 1), std::span(positions).subspan(i, 1), &one_by_one, &*pool,
                     LogitRows::kLast};
    at::Tensor row;
    ASSERT_TRUE(m->forward(std::span<const ForwardItem>(&step, 1), &row).ok());
    EXPECT_TRUE(bitwise_equal(row, all.narrow(0, static_cast<int64_t>(i), 1).contiguous())) << "token " << i;
  }
}

}  // namespace
}  // namespace vericache
