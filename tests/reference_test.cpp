// Agreement with an independent implementation: Hugging Face transformers running the same GGUF
// in float32 (tests/fixtures/reference/logits.json, made by tests/reference/make_fixtures.py).
// For 20 prompts (14 short, 6 of 2K-3.7K tokens): the prompt tokenizes to the same ids, the
// next-token logits agree closely with the same argmax, and the greedy continuation (up to 64
// tokens) is identical for nearly all prompts.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>

#include "engine/generator.h"
#include "test_support.h"

namespace vericache {
namespace {

// Largest |ours - reference| allowed on any compared logit. Measured: see the test's output.
constexpr double kLogitTolerance = 5e-4;

TEST(Reference, LogitsAndGreedyContinuationsMatchTransformers) {
  const LlamaModel* m = testing::default_model();
  ASSERT_NE(m, nullptr);
  const auto fixture =
      nlohmann::json::parse(testing::read_file(testing::source_path("tests/fixtures/reference/logits.json")));
  const auto& cases = fixture["cases"];
  ASSERT_EQ(cases.size(), 20u);
  auto pool = m->make_page_pool(16, 30 * 300 + 64);
  ASSERT_TRUE(pool.ok());
  const int64_t vocab = m->config().vocab_size;

  int top1_agree = 0, continuations_equal = 0, long_prompts = 0;
  double worst = 0;
  std::printf("%-24s %7s %12s %5s %14s\n", "prompt", "tokens", "max|diff|", "top1", "continuation");
  for (const auto& c : cases) {
    const std::string name = c["name"];
    const std::vector<int32_t> ids = c["ids"];
    EXPECT_EQ(m->tokenizer().encode(c["text"].get<std::string>(), true), ids) << name << ": tokenization differs";
    if (ids.size() >= 2000) ++long_prompts;

    // Next-token logits after the whole prompt (prefilled in chunks of 512).
    SequenceKv kv(m->config().n_layers);
    at::Tensor logits;
    for (size_t start = 0; start < ids.size(); start += 512) {
      const size_t n = std::min<size_t>(512, ids.size() - start);
      std::vector<int32_t> pos(n);
      for (size_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(start + i);
      ForwardItem item{std::span(ids).subspan(start, n), pos, &kv, &*pool, LogitRows::kLast};
      ASSERT_TRUE(m->forward(std::span(&item, 1), &logits).ok());
    }
    kv.release(*pool);
    const float* ours = logits.data_ptr<float>();
    double max_diff = 0;
    const std::vector<int32_t> top_ids = c["top_ids"];
    const std::vector<double> top_logits = c["top_logits"];
    for (size_t i = 0; i < top_ids.size(); ++i) max_diff = std::max(max_diff, std::abs(ours[top_ids[i]] - top_logits[i]));
    const int64_t stride = c["stride"];
    const std::vector<double> strided = c["strided_logits"];
    for (size_t i = 0; i < strided.size(); ++i) max_diff = std::max(max_diff, std::abs(ours[i * stride] - strided[i]));
    worst = std::max(worst, max_diff);
    const bool top1 = argmax(ours, vocab) == top_ids[0];
    top1_agree += top1;
    EXPECT_LE(max_diff, kLogitTolerance) << name;

    // Greedy continuation through the generator (one-token decode steps).
    GenerationRequest request;
    request.prompt = ids;
    request.max_new_tokens = 64;
    request.stop_ids = fixture["eos_ids"].get<std::vector<int32_t>>();
    Generator generator(*m, *pool);
    auto result = generator.generate(std::span(&request, 1));
    ASSERT_TRUE(result.ok()) << result.status().message();
    const std::vector<int32_t> expected = c["greedy_continuation"];
    const std::vector<int32_t>& got = (*result)[0].tokens;
    size_t same = 0;
    while (same < got.size() && same < expected.size() && got[same] == expected[same]) ++same;
    const bool equal = got == expected;
    continuations_equal += equal;
    std::printf("%-24s %7zu %12.2e %5s %8zu/%-5zu\n", name.c_str(), ids.size(), max_diff, top1 ? "yes" : "NO", same,
                expected.size());
  }
  std::printf("top-1 agreement %d/20, identical greedy continuations %d/20, worst max|diff| %.2e\n", top1_agree,
              continuations_equal, worst);
  EXPECT_GE(long_prompts, 6);
  EXPECT_EQ(top1_agree, 20);
  EXPECT_GE(continuations_equal, 18) << "greedy continuations must match for nearly all prompts";
}

}  // namespace
}  // namespace vericache
