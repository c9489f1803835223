// Row-count invariance, the root of losslessness: on the real model, the logits of tokens
// p..p+M-1 from one forward of M tokens equal, bit for bit, those of M one-token decodes over the
// same cache, for M up to 64, whatever else shares the batch (1 to 8 requests), and with either
// kernel build.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>

#include "model/cpu_attention.h"
#include "model/gguf_file.h"
#include "model/weight_repack.h"
#include "model/int8_repack.h"
#include "test_support.h"

namespace vericache {
namespace {

using testing::default_model;

std::vector<int32_t> prompt_tokens(const LlamaModel& m, int64_t n, uint32_t seed) {
  const std::string text = testing::read_file(testing::source_path("datasets/tokenizer_corpus/corpus.txt"));
  std::vector<int32_t> all = m.tokenizer().encode(text.substr(seed * 7919 % 400000, 40000), false);
  all.resize(n);
  return all;
}

std::vector<int32_t> iota_positions(int64_t from, int64_t n) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), static_cast<int32_t>(from));
  return p;
}

// Runs `tokens` as one forward appended to `kv`, returning all rows' logits.
at::Tensor run(const LlamaModel& m, PagePool& pool, SequenceKv& kv, std::span<const int32_t> tokens) {
  const std::vector<int32_t> pos = iota_positions(kv.length(0), static_cast<int64_t>(tokens.size()));
  ForwardItem item{tokens, pos, &kv, &pool, LogitRows::kAll};
  at::Tensor logits;
  Status s = m.forward(std::span<const ForwardItem>(&item, 1), &logits);
  EXPECT_TRUE(s.ok()) << s.message();
  return logits;
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), a.nbytes()) == 0;
}

// First row where a and b differ, or -1.
int64_t first_different_row(const at::Tensor& a, const at::Tensor& b) {
  for (int64_t r = 0; r < a.size(0); ++r) {
    if (std::memcmp(a[r].data_ptr<float>(), b[r].data_ptr<float>(), a.size(1) * sizeof(float)) != 0) return r;
  }
  return -1;
}

// Logits of tokens 33..39 of a text after its first 33 tokens, on a pool of its own.
at::Tensor window_after_prefix(const LlamaModel& m) {
  auto pool = m.make_page_pool(16, 1024);
  EXPECT_TRUE(pool.ok());
  const std::vector<int32_t> tokens = prompt_tokens(m, 40, 3);
  SequenceKv kv(m.config().n_layers);
  run(m, *pool, kv, std::span(tokens).first(33));
  at::Tensor logits = run(m, *pool, kv, std::span(tokens).subspan(33));
  kv.release(*pool);
  return logits;
}

// One forward of M new tokens equals M one-token decodes, for M up to 64 after three prefixes.
void expect_one_forward_equals_decodes(const LlamaModel* m) {
  ASSERT_NE(m, nullptr);
  auto pool = m->make_page_pool(16, 4096);
  ASSERT_TRUE(pool.ok());
  for (int64_t prefix : {1, 37, 300}) {
    const std::vector<int32_t> tokens = prompt_tokens(*m, prefix + 64, static_cast<uint32_t>(prefix));
    SequenceKv base(m->config().n_layers);
    run(*m, *pool, base, std::span(tokens).first(prefix));
    // The reference: 64 one-token decodes.
    SequenceKv stepwise(m->config().n_layers);
    run(*m, *pool, stepwise, std::span(tokens).first(prefix));
    std::vector<at::Tensor> step_rows;
    for (int64_t i = 0; i < 64; ++i) step_rows.push_back(run(*m, *pool, stepwise, std::span(tokens).subspan(prefix + i, 1)));
    const at::Tensor reference = at::cat(step_rows, 0);
    for (int64_t rows : {1, 2, 3, 7, 16, 17, 31, 64}) {
      SequenceKv kv(m->config().n_layers);
      run(*m, *pool, kv, std::span(tokens).first(prefix));
      const at::Tensor window = run(*m, *pool, kv, std::span(tokens).subspan(prefix, rows));
      const int64_t bad = first_different_row(window, reference.narrow(0, 0, rows));
      EXPECT_EQ(bad, -1) << "prefix " << prefix << ", " << rows << "-row forward differs from decoding at row " << bad;
      kv.release(*pool);
    }
    base.release(*pool);
    stepwise.release(*pool);
  }
  EXPECT_EQ(pool->num_free(), pool->num_pages());
}

// A request's rows are the same, bit for bit, whatever shares its batch (1 to 8 requests).
void expect_independent_of_the_batch(const LlamaModel* m) {
  ASSERT_NE(m, nullptr);
  auto pool = m->make_page_pool(16, 8192);
  ASSERT_TRUE(pool.ok());
  const int64_t layers = m->config().n_layers;
  std::mt19937 rng(7);
  for (int batch_size = 1; batch_size <= 8; ++batch_size) {
    // Requests of different cached lengths and different numbers of new tokens.
    std::vector<std::vector<int32_t>> tokens(batch_size);
    std::vector<int64_t> cached(batch_size), fresh(batch_size);
    std::vector<SequenceKv> solo, shared;
    for (int i = 0; i < batch_size; ++i) {
      cached[i] = 1 + rng() % 200;
      fresh[i] = 1 + rng() % 24;
      tokens[i] = prompt_tokens(*m, cached[i] + fresh[i], rng() % 1000);
      solo.emplace_back(layers);
      shared.emplace_back(layers);
      run(*m, *pool, solo[i], std::span(tokens[i]).first(cached[i]));
      run(*m, *pool, shared[i], std::span(tokens[i]).first(cached[i]));
    }
    std::vector<std::vector<int32_t>> positions(batch_size);
    std::vector<ForwardItem> items;
    for (int i = 0; i < batch_size; ++i) {
      positions[i] = iota_positions(cached[i], fresh[i]);
      items.push_back({std::span(tokens[i]).subspan(cached[i], fresh[i]), positions[i], &shared[i], &*pool, LogitRows::kAll});
    }
    at::Tensor together;
    ASSERT_TRUE(m->forward(items, &together).ok());
    int64_t row = 0;
    for (int i = 0; i < batch_size; ++i) {
      const at::Tensor alone = run(*m, *pool, solo[i], std::span(tokens[i]).subspan(cached[i], fresh[i]));
      EXPECT_TRUE(bitwise_equal(alone, together.narrow(0, row, fresh[i])))
          << "batch of " << batch_size << ": request " << i << " (" << cached[i] << " cached, " << fresh[i]
          << " new) differs from running alone";
      row += fresh[i];
      solo[i].release(*pool);
      shared[i].release(*pool);
    }
  }
}

TEST(ForwardInvariance, OneForwardOfMTokensEqualsMDecodes) { expect_one_forward_equals_decodes(default_model()); }
TEST(ForwardInvariance, IndependentOfTheRestOfTheBatch) { expect_independent_of_the_batch(default_model()); }
// The same on Qwen2.5-Coder 0.5B: attention biases and 14 query heads over 2 KV heads.
TEST(ForwardInvariance, Qwen2OneForwardOfMTokensEqualsMDecodes) { expect_one_forward_equals_decodes(testing::qwen_model()); }
// Slow suite only (tests/CMakeLists.txt: VC_SLOW_TESTS).
TEST(ForwardInvariance, Qwen2IndependentOfTheRestOfTheBatch) { expect_independent_of_the_batch(testing::qwen_model()); }

// The same in the integer compute mode (kernels/int8_linear.h).
TEST(ForwardInvariance, IntegerOneForwardOfMTokensEqualsMDecodes) {
  expect_one_forward_equals_decodes(testing::default_integer_model());
}
TEST(ForwardInvariance, IntegerIndependentOfTheRestOfTheBatch) {
  expect_independent_of_the_batch(testing::default_integer_model());
}
// Slow suite only (tests/CMakeLists.txt: VC_SLOW_TESTS).
TEST(ForwardInvariance, Qwen2IntegerOneForwardOfMTokensEqualsMDecodes) {
  expect_one_forward_equals_decodes(testing::qwen_integer_model());
}

// Integer and float32 compute differ (8-bit activations) but stay close: over 64 positions of a
// text, the integer argmax equals the float32 one at >= 90% of them and the mean KL(float32 ||
// integer) per token is below 0.05 nats; the two modes' logits are not bitwise equal.
void expect_integer_close_to_float32(const LlamaModel* float32, const LlamaModel* integer) {
  const LlamaModel* models[2] = {float32, integer};
  ASSERT_NE(models[0], nullptr);
  ASSERT_NE(models[1], nullptr);
  at::Tensor logits[2];
  for (int i = 0; i < 2; ++i) {
    auto pool = models[i]->make_page_pool(16, 256);
    ASSERT_TRUE(pool.ok());
    SequenceKv kv(models[i]->config().n_layers);
    logits[i] = run(*models[i], *pool, kv, prompt_tokens(*models[i], 64, 11));
    kv.release(*pool);
  }
  EXPECT_FALSE(bitwise_equal(logits[0], logits[1]));
  const double agree = logits[0].argmax(1).eq(logits[1].argmax(1)).to(at::kDouble).mean().item<double>();
  const at::Tensor p = logits[0].log_softmax(1), q = logits[1].log_softmax(1);
  const double kl = (p.exp() * (p - q)).sum(1).mean().item<double>();
  std::printf("[ info ] integer vs float32 on 64 positions: argmax agreement %.3f, mean KL %.5f nats\n", agree, kl);
  EXPECT_GE(agree, 0.9);
  EXPECT_LT(kl, 0.05);
}

TEST(ForwardInvariance, IntegerComputeStaysCloseToFloat32) {
  expect_integer_close_to_float32(default_model(), testing::default_integer_model());
}
// Qwen2.5-Coder 0.5B: Q5_0, Q8_0, Q4_K and Q6_K panels, and QKV stacks of mixed types (read part by
// part, with Qwen2's RoPE row order applied to each part as to the float stack).
TEST(ForwardInvariance, Qwen2IntegerComputeStaysCloseToFloat32) {
  expect_integer_close_to_float32(testing::qwen_model(), testing::qwen_integer_model());
}

// The integer mode's VNNI and portable kernels (with either float kernel build beside them) give
// the same logits, bit for bit.
TEST(ForwardInvariance, IntegerVnniAndPortableKernelsAgreeBitwise) {
  const cpu::IntKernelTable* vnni = cpu::vnni_int_kernels();
  if (vnni == nullptr) GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  LoadOptions options;
  options.compute = Compute::kInteger;
  auto loaded = LlamaModel::load(testing::default_model_path(), options);
  ASSERT_TRUE(loaded.ok());
  LlamaModel& m = **loaded;
  m.set_int_kernels(*vnni);
  m.set_kernels(cpu::best_kernels());
  const at::Tensor fast = window_after_prefix(m);
  m.set_int_kernels(cpu::portable_int_kernels());
  m.set_kernels(cpu::portable_kernels());
  EXPECT_TRUE(bitwise_equal(fast, window_after_prefix(m)));
}

// Every kernel build this CPU runs gives the portable build's logits, bit for bit, over float32
// and over bfloat16 pages (where attention computes in bfloat16 products, emulated or not).
TEST(ForwardInvariance, EveryKernelBuildGivesThePortableLogits) {
  const std::vector<const cpu::KernelTable*> tables = cpu::supported_kernels();
  if (tables.size() == 1) GTEST_SKIP() << "this CPU has no AVX-512";
  auto loaded = LlamaModel::load(testing::default_model_path());
  ASSERT_TRUE(loaded.ok());
  LlamaModel& m = **loaded;
  for (const at::ScalarType pages : {at::kFloat, at::kBFloat16}) {
    ASSERT_TRUE(m.set_kv_dtype(pages).ok());
    m.set_kernels(cpu::portable_kernels());
    const at::Tensor portable = window_after_prefix(m);
    for (const cpu::KernelTable* table : tables) {
      m.set_kernels(*table);
      EXPECT_TRUE(bitwise_equal(portable, window_after_prefix(m))) << table->isa << ", pages " << at::toString(pages);
    }
  }
}

// Attention in three phases (scores by slot ranges, softmax per query, values by channel ranges,
// each phase over all threads; what a decode step of few requests uses) gives the bits of whole
// jobs, on every kernel build: one-token decodes and a 7-row window after a prefix (300 tokens on
// AVX-512: scores span two 256-slot tasks), and a 2-request batch.
TEST(ForwardInvariance, PhasedAttentionEqualsWholeJobs) {
  auto loaded = LlamaModel::load(testing::default_model_path());
  ASSERT_TRUE(loaded.ok());
  LlamaModel& m = **loaded;
  auto pool = m.make_page_pool(16, 4096);
  ASSERT_TRUE(pool.ok());
  const std::vector<int32_t> tokens = prompt_tokens(m, 310, 11);
  for (const cpu::KernelTable* table : cpu::supported_kernels()) {
    m.set_kernels(*table);
    // The portable build is slow: a shorter prefix (one 256-slot task) keeps the test short.
    const int64_t prefix = table == &cpu::portable_kernels() ? 40 : 300, shorter = prefix - 20;
    SequenceKv kv(m.config().n_layers), other(m.config().n_layers);
    run(m, *pool, kv, std::span(tokens).first(prefix));
    run(m, *pool, other, std::span(tokens).first(shorter));
    // Two decodes, a 7-row window and a 2-request batch, then both caches back to their prefixes.
    auto logits_of = [&](AttentionSplit split) {
      const AttentionSplit before = set_attention_split(split);
      std::vector<at::Tensor> rows;
      for (int64_t i = 0; i < 2; ++i) rows.push_back(run(m, *pool, kv, std::span(tokens).subspan(prefix + i, 1)));
      rows.push_back(run(m, *pool, kv, std::span(tokens).subspan(prefix + 2, 7)));
      const std::vector<int32_t> one{tokens[shorter]}, two{tokens[prefix + 9]};
      const std::vector<int32_t> positions_one{static_cast<int32_t>(shorter)}, positions_two{static_cast<int32_t>(prefix + 9)};
      std::vector<ForwardItem> items{ForwardItem{one, positions_one, &other, &*pool, LogitRows::kLast, 1},
                                     ForwardItem{two, positions_two, &kv, &*pool, LogitRows::kLast, 0}};
      at::Tensor batch;
      EXPECT_TRUE(m.forward(items, &batch).ok());
      rows.push_back(batch);
      kv.truncate(*pool, prefix);
      other.truncate(*pool, shorter);
      set_attention_split(before);
      return at::cat(rows, 0);
    };
    const at::Tensor whole = logits_of(AttentionSplit::kNever), phased = logits_of(AttentionSplit::kAlways);
    EXPECT_EQ(whole.size(0), 11);
    EXPECT_TRUE(bitwise_equal(whole, phased)) << table->isa;
    kv.release(*pool);
    other.release(*pool);
  }
}

// Weights kept in their ggml blocks and dequantized on the fly give the same bits as weights
// dequantized to float32 at load, for decode-sized and prefill-sized forwards; and a decode step
// reads at most `max_fraction` of the float32 bytes (so the kernels really read blocks in place).
void expect_quantized_equals_dequantized(const LlamaModel* blocks, const std::string& path, double max_fraction) {
  ASSERT_NE(blocks, nullptr);
  auto floats = LlamaModel::load(path, LoadOptions{at::kCPU, at::kFloat, false});
  ASSERT_TRUE(floats.ok());
  const double fraction = static_cast<double>(blocks->decode_weight_bytes()) / static_cast<double>((*floats)->decode_weight_bytes());
  std::printf("[ %s ] a decode step reads %.1f MB of weight matrices, %.3f of float32\n", blocks->weight_type().c_str(),
              static_cast<double>(blocks->decode_weight_bytes()) / 1e6, fraction);
  EXPECT_LT(fraction, max_fraction);
  auto pool = blocks->make_page_pool(16, 1024);
  ASSERT_TRUE(pool.ok());
  const std::vector<int32_t> tokens = prompt_tokens(*blocks, 60, 5);
  at::Tensor results[2];
  for (int k = 0; k < 2; ++k) {
    const LlamaModel& m = k == 0 ? *blocks : **floats;
    SequenceKv kv(m.config().n_layers);
    const at::Tensor prefill = run(m, *pool, kv, std::span(tokens).first(57));
    results[k] = at::cat({prefill, run(m, *pool, kv, std::span(tokens).subspan(57, 2)), run(m, *pool, kv, std::span(tokens).subspan(59))});
    kv.release(*pool);
  }
  EXPECT_TRUE(bitwise_equal(results[0], results[1]));
}

// SmolLM2: Q4_1 and Q8_0 blocks.
TEST(ForwardInvariance, QuantizedWeightsEqualDequantizedWeights) {
  expect_quantized_equals_dequantized(default_model(), testing::default_model_path(), 0.25);
}

// Qwen2.5-Coder 0.5B (Q4_K_M): Q5_0, Q8_0, Q4_K and Q6_K blocks.
TEST(ForwardInvariance, Qwen2QuantizedWeightsEqualDequantizedWeights) {
  expect_quantized_equals_dequantized(testing::qwen_model(), testing::qwen_model_path(), 0.3);
}

// Integer mode reads every matrix of a decode step in integer panels of its own type on
// Qwen2.5-Coder 0.5B (Q4_K_M: Q5_0, Q8_0, Q4_K, Q6_K): the step's bytes are exactly the sum of
// int_panels_bytes over the file's matrices, K-quants with int8-coded scales, and at most 1.02x
// the file's bytes of those matrices. This fails if a QKV stack of mixed types (Q5_0 Q and K rows
// with Q8_0 V rows) is read as the float path's float32 stack, if the K-quants keep float32
// scales, or if 5- and 6-bit codes take 8 bits.
TEST(ForwardInvariance, Qwen2IntegerPanelsCoverEveryMatrixInItsOwnType) {
  const LlamaModel* m = testing::qwen_integer_model();
  ASSERT_NE(m, nullptr);
  auto file = GgufFile::open(testing::qwen_model_path());
  ASSERT_TRUE(file.ok());
  int64_t expected = 0, file_bytes = 0;
  auto add = [&](const std::string& name) {
    const GgufTensorInfo* t = file->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    const auto format = t->type == GgmlType::kQ5_0   ? std::optional(cpu::WeightFormat::kQ5_0)
                        : t->type == GgmlType::kQ8_0 ? std::optional(cpu::WeightFormat::kQ8_0)
                                                     : repacked_format(t->type);
    ASSERT_TRUE(format.has_value()) << name;
    const auto int_format = int_weight_format(*format);
    EXPECT_NE(int_format->float_bytes, 4) << name << ": no float32 scales in this file's panels";
    expected += int_panels_bytes(*int_format, t->dims[1], t->dims[0]);
    file_bytes += static_cast<int64_t>(t->n_bytes);
  };
  add(file->find_tensor("output.weight") ? "output.weight" : "token_embd.weight");
  for (int64_t l = 0; l < m->config().n_layers; ++l) {
    for (const char* name : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}) {
      add("blk." + std::to_string(l) + "." + name + ".weight");
    }
  }
  std::printf("[ info ] integer panels %.1f MB, the file's matrices %.1f MB\n",
              m->decode_weight_bytes() / 1e6, file_bytes / 1e6);
  EXPECT_EQ(m->decode_weight_bytes(), expected);
  EXPECT_LE(static_cast<double>(m->decode_weight_bytes()), 1.02 * static_cast<double>(file_bytes));
}

// The libtorch path (the GPU path, run here in float32 on the CPU) computes the same function as
// the CPU kernels up to rounding: same argmax on every row, logits within 1e-3.
TEST(ForwardTorchPath, AgreesWithTheCpuKernels) {
  auto loaded = LlamaModel::load(testing::default_model_path(), LoadOptions{at::kCPU, at::kFloat, false});
  ASSERT_TRUE(loaded.ok());
  LlamaModel& m = **loaded;
  auto pool = m.make_page_pool(16, 2048);
  ASSERT_TRUE(pool.ok());
  const std::vector<int32_t> a = prompt_tokens(m, 300, 11), b = prompt_tokens(m, 45, 12);
  at::Tensor results[2];
  for (int path = 0; path < 2; ++path) {
    ASSERT_TRUE(m.set_forward_path(path == 0 ? ForwardPath::kCpuKernels : ForwardPath::kTorch).ok());
    SequenceKv ka(m.config().n_layers), kb(m.config().n_layers);
    run(m, *pool, ka, std::span(a).first(290));
    run(m, *pool, kb, std::span(b).first(40));
    // A batch mixing a 10-token window and a 5-token window over caches of different lengths.
    const std::vector<int32_t> pa = iota_positions(290, 10), pb = iota_positions(40, 5);
    std::vector<ForwardItem> items{{std::span(a).subspan(290), pa, &ka, &*pool, LogitRows::kAll},
                                   {std::span(b).subspan(40), pb, &kb, &*pool, LogitRows::kAll}};
    ASSERT_TRUE(m.forward(items, &results[path]).ok());
    ka.release(*pool);
    kb.release(*pool);
  }
  EXPECT_LT((results[0] - results[1]).abs().max().item<float>(), 1e-3);
  EXPECT_TRUE(at::equal(results[0].argmax(1), results[1].argmax(1)));
}

TEST(ForwardErrors, BadInputChangesNothing) {
  const LlamaModel* m = default_model();
  ASSERT_NE(m, nullptr);
  auto pool = m->make_page_pool(16, 40);
  ASSERT_TRUE(pool.ok());
  SequenceKv kv(m->config().n_layers);
  const std::vector<int32_t> bad_token{5, 49152};
  const std::vector<int32_t> two_positions{0, 1};
  ForwardItem item{bad_token, two_positions, &kv, &*pool, LogitRows::kLast};
  at::Tensor logits;
  EXPECT_EQ(m->forward(std::span(&item, 1), &logits).message(),
            "forward: request 0: token id 49152 is outside the vocabulary [0, 49152)");
  const std::vector<int32_t> tokens{5, 6};
  const std::vector<int32_t> far{0, 8192};
  item = {tokens, far, &kv, &*pool, LogitRows::kLast};
  EXPECT_EQ(m->forward(std::span(&item, 1), &logits).message(),
            "forward: request 0: position 8192 is outside the model's context of 8192 tokens");
  const std::vector<int32_t> one_position{0};
  item = {tokens, one_position, &kv, &*pool, LogitRows::kLast};
  EXPECT_EQ(m->forward(std::span(&item, 1), &logits).message(), "forward: request 0: 2 tokens but 1 positions");
  // 17 tokens need 2 pages of 16 slots in each of 30 layers; the pool has 40.
  const std::vector<int32_t> many(17, 5);
  const std::vector<int32_t> many_pos = iota_positions(0, 17);
  item = {many, many_pos, &kv, &*pool, LogitRows::kLast};
  Status s = m->forward(std::span(&item, 1), &logits);
  EXPECT_EQ(s.code(), StatusCode::kOutOfPages);
  EXPECT_EQ(s.message(), "KV page pool exhausted: the batch needs 60 pages, 40 of 40 free");
  EXPECT_EQ(kv.length(0), 0);
  EXPECT_EQ(pool->num_free(), 40);
}

}  // namespace
}  // namespace vericache
