#include "reference_support.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/generator.h"
#include "engine/sampler.h"
#include "test_support.h"

namespace vericache::testing {

void expect_matches_transformers(const LlamaModel& m, const std::string& fixture_file, const Expectations& e) {
  const auto fixture = nlohmann::json::parse(read_file(source_path(fixture_file)));
  const auto& cases = fixture["cases"];
  ASSERT_EQ(cases.size(), e.cases);
  size_t longest = 0;
  for (const auto& c : cases) longest = std::max(longest, c["ids"].size());
  const int64_t max_new_tokens = fixture.value("max_new_tokens", 64);
  auto pool = m.make_page_pool(16, m.config().n_layers * ((static_cast<int64_t>(longest) + max_new_tokens) / 16 + 2));
  ASSERT_TRUE(pool.ok());
  const int64_t vocab = m.config().vocab_size;

  int top1_agree = 0, continuations_equal = 0, long_prompts = 0;
  double worst = 0;
  std::printf("%-24s %7s %12s %5s %14s\n", "prompt", "tokens", "max|diff|", "top1", "continuation");
  for (const auto& c : cases) {
    const std::string name = c["name"];
    const std::vector<int32_t> ids = c["ids"];
    EXPECT_EQ(m.tokenizer().encode(c["text"].get<std::string>(), true), ids) << name << ": tokenization differs";
    if (ids.size() >= 2000) ++long_prompts;

    // Next-token logits after the whole prompt (prefilled in chunks of 512).
    SequenceKv kv(m.config().n_layers);
    at::Tensor logits;
    for (size_t start = 0; start < ids.size(); start += 512) {
      const size_t n = std::min<size_t>(512, ids.size() - start);
      std::vector<int32_t> pos(n);
      for (size_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(start + i);
      ForwardItem item{std::span(ids).subspan(start, n), pos, &kv, &*pool, LogitRows::kLast};
      ASSERT_TRUE(m.forward(std::span(&item, 1), &logits).ok());
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
    EXPECT_LE(max_diff, e.logit_tolerance) << name;

    // Greedy continuation through the generator (one-token decode steps).
    const std::vector<int32_t> expected = c["greedy_continuation"];
    GenerationRequest request;
    request.prompt = ids;
    request.max_new_tokens = max_new_tokens;
    request.stop_ids = fixture["eos_ids"].get<std::vector<int32_t>>();
    Generator generator(m, *pool);
    auto result = generator.generate(std::span(&request, 1));
    ASSERT_TRUE(result.ok()) << result.status().message();
    const std::vector<int32_t>& got = (*result)[0].tokens;
    size_t same = 0;
    while (same < got.size() && same < expected.size() && got[same] == expected[same]) ++same;
    continuations_equal += got == expected;
    std::printf("%-24s %7zu %12.2e %5s %8zu/%-5zu\n", name.c_str(), ids.size(), max_diff, top1 ? "yes" : "NO", same,
                expected.size());
  }
  std::printf("top-1 agreement %d/%zu, identical greedy continuations %d/%zu, worst max|diff| %.2e\n", top1_agree,
              e.cases, continuations_equal, e.cases, worst);
  EXPECT_GE(long_prompts, e.long_prompts);
  EXPECT_GE(top1_agree, e.top1_agreements < 0 ? static_cast<int>(e.cases) : e.top1_agreements);
  EXPECT_GE(continuations_equal, e.identical_continuations) << "greedy continuations must match for nearly all prompts";
}

}  // namespace vericache::testing
