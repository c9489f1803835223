// GPU checks (ctest label gpu; built in CUDA builds, run on a machine with a CUDA device): the
// paged-KV CUDA kernels against the CPU kernels, their row invariance, the row-count-invariant
// linear and RMSNorm kernels (bitwise), and the model's forward on the GPU: against the CPU
// kernels, and a window of rows bitwise equal to one-row decoding.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "engine/generator.h"
#include "kernels/cuda_ops.h"
#include "test_support.h"

namespace vericache {
namespace {

bool have_cuda_device() {
  try {
    at::empty({1}, at::kCUDA);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

#define REQUIRE_CUDA_DEVICE() \
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device"

struct AttentionShape {
  int64_t heads, kv_heads, hd, ps, cached, rows;
};

// Rows of one request at positions cached + 1 .. cached + rows against the CPU kernel, and each row
// alone bitwise equal to the same row in the launch of all. Shapes: SmolLM2's (one 256-slot chunk
// of the split kernels, groups of 3), Llama-3.1-8B's (groups of 4, head_dim 128, 3 chunks with a
// partial last one, and rows whose lengths straddle a chunk boundary), and groups of 9 (the one-pass kernel).
class GpuAttention : public ::testing::TestWithParam<AttentionShape> {};

TEST_P(GpuAttention, PagedAttentionMatchesCpuKernelAndIsRowInvariant) {
  REQUIRE_CUDA_DEVICE();
  const auto [heads, kv_heads, hd, ps, cached, rows] = GetParam();
  const int64_t n_pages = (cached + rows + ps - 1) / ps + 1;
  at::manual_seed(1);
  const at::Tensor k_pages = at::randn({n_pages, kv_heads, hd, ps});
  const at::Tensor v_pages = at::randn({n_pages, kv_heads, ps, hd});
  const at::Tensor q = at::randn({rows, heads, hd}) * 0.3;
  std::vector<int64_t> table(static_cast<size_t>(n_pages));
  for (int64_t i = 0; i < n_pages; ++i) table[static_cast<size_t>(i)] = (i * 5 + 3) % n_pages;  // scattered pages
  const std::vector<int32_t> table32(table.begin(), table.end());

  // CPU reference: the row-invariant CPU kernel.
  at::Tensor expected = at::empty_like(q);
  cpu::PagedAttentionArgs a;
  a.q = q.data_ptr<float>();
  a.q_row_stride = heads * hd;
  a.out = expected.data_ptr<float>();
  a.out_row_stride = heads * hd;
  a.k_pages = k_pages.data_ptr<float>();
  a.v_pages = v_pages.data_ptr<float>();
  a.block_table = table32.data();
  a.page_size = ps;
  a.n_heads = heads;
  a.n_kv_heads = kv_heads;
  a.head_dim = hd;
  a.cached_len = cached;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  for (int64_t g = 0; g < kv_heads; ++g) cpu::best_kernels().attention(a, g, 0, rows);

  const auto i64 = at::TensorOptions().dtype(at::kLong);
  const at::Tensor pages = at::tensor(table, i64).cuda();
  const at::Tensor starts = at::zeros({rows}, i64).cuda();
  const at::Tensor lens = at::arange(cached + 1, cached + rows + 1, i64).cuda();
  const at::Tensor kp = k_pages.cuda(), vp = v_pages.cuda(), qc = q.cuda();
  const double scale = a.scale;
  const at::Tensor all = cuda::paged_attention_tensor(qc, kp, vp, pages, starts, lens, cached + rows, scale).cpu();
  EXPECT_LT((all - expected).abs().max().item<float>(), 1e-5);
  for (int64_t r = 0; r < rows; ++r) {
    // A larger max_len than the row needs (more, empty chunks) must not change it either.
    const at::Tensor one = cuda::paged_attention_tensor(qc.narrow(0, r, 1).contiguous(), kp, vp, pages,
                                                        starts.narrow(0, r, 1), lens.narrow(0, r, 1),
                                                        cached + r + 1 + (r % 2) * 300, scale)
                               .cpu();
    EXPECT_EQ(std::memcmp(one.data_ptr<float>(), all[r].data_ptr<float>(), heads * hd * sizeof(float)), 0) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttention,
                         ::testing::Values(AttentionShape{9, 3, 64, 16, 70, 9}, AttentionShape{32, 8, 128, 16, 740, 26},
                                           AttentionShape{9, 1, 64, 16, 300, 5}));

TEST(GpuKernels, WriteKvPagesMatchesIndexPut) {
  REQUIRE_CUDA_DEVICE();
  const int64_t kv_heads = 3, hd = 64, ps = 16, n_pages = 4, rows = 20;
  at::Tensor k_pages = at::zeros({n_pages, kv_heads, hd, ps}, at::kCUDA), v_pages = at::zeros({n_pages, kv_heads, ps, hd}, at::kCUDA);
  const at::Tensor k = at::randn({rows, kv_heads, hd}, at::kCUDA), v = at::randn({rows, kv_heads, hd}, at::kCUDA);
  const at::Tensor slots = at::randperm(n_pages * ps, at::TensorOptions().dtype(at::kLong)).narrow(0, 0, rows).cuda();
  const at::Tensor page = slots.div(ps, "floor"), off = slots.remainder(ps);
  cuda::write_kv_pages_tensor(k, v, page, off, k_pages, v_pages);
  using at::indexing::Slice;
  at::Tensor k_ref = at::zeros_like(k_pages), v_ref = at::zeros_like(v_pages);
  k_ref.index_put_({page, Slice(), Slice(), off}, k);
  v_ref.index_put_({page, Slice(), off, Slice()}, v);
  EXPECT_TRUE(at::equal(k_pages, k_ref));
  EXPECT_TRUE(at::equal(v_pages, v_ref));
}

// Each row of a launch of M rows equals, bit for bit, the same row in launches of other sizes; and
// the result is at::linear's up to rounding. Shapes cover partial tiles, K not a multiple of the
// K tile, and K not a multiple of 8 (the plain kernel for 16-bit types).
TEST(GpuKernels, InvariantLinearRowsDoNotDependOnTheRowCount) {
  REQUIRE_CUDA_DEVICE();
  at::manual_seed(3);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    // out 1024 with K a multiple of 16 takes the skinny kernel for <= 16 rows (576: K / 16 odd, 4096 and
    // 1040: full stages, 1040 with a tail); out 1000 keeps the tiled kernel at every row count.
    for (const auto& [in, out] : {std::pair<int64_t, int64_t>{576, 1000}, {1000, 1000}, {100, 1000}, {576, 1024},
                                 {4096, 1024}, {1040, 1024}}) {
      const int64_t all_rows = 130;
      const auto o = at::TensorOptions().dtype(dtype).device(at::kCUDA);
      const at::Tensor x = (at::randn({all_rows, in}) * 0.5).to(o), w = (at::randn({out, in}) * 0.05).to(o);
      const at::Tensor bias = (at::randn({out}) * 0.1).to(o);
      const at::Tensor all = cuda::invariant_linear_tensor(x, w, bias).cpu();
      const at::Tensor reference = at::linear(x.to(at::kDouble), w.to(at::kDouble), bias.to(at::kDouble)).cpu();
      const double tolerance = dtype == at::kFloat ? 1e-4 : dtype == at::kHalf ? 5e-3 : 3e-2;
      EXPECT_LT((all.to(at::kDouble) - reference).abs().max().item<double>(), tolerance) << dtype << " in " << in << " out " << out;
      for (const int64_t rows : {1, 2, 7, 16, 17, 26, 64, 65}) {
        for (const int64_t first : {int64_t{0}, all_rows - rows}) {
          const at::Tensor part = cuda::invariant_linear_tensor(x.narrow(0, first, rows), w, bias).cpu();
          EXPECT_TRUE(at::equal(part, all.narrow(0, first, rows))) << dtype << " in " << in << " out " << out << " rows " << rows << " from " << first;
        }
      }
      const at::Tensor no_bias = cuda::invariant_linear_tensor(x, w, at::Tensor()).cpu();
      EXPECT_LT((no_bias.to(at::kDouble) - (reference - bias.to(at::kDouble).cpu())).abs().max().item<double>(), tolerance);
    }
  }
}

TEST(GpuKernels, InvariantRmsNormRowsDoNotDependOnTheRowCount) {
  REQUIRE_CUDA_DEVICE();
  at::manual_seed(4);
  const at::Tensor x = at::randn({77, 576}).cuda(), weight = (1 + 0.1 * at::randn({576})).cuda();
  const at::Tensor all = cuda::invariant_rms_norm_tensor(x, weight, 1e-5).cpu();
  const at::Tensor xd = x.cpu().to(at::kDouble);
  const at::Tensor reference = xd * at::rsqrt(xd.pow(2).mean(-1, true) + 1e-5) * weight.cpu().to(at::kDouble);
  EXPECT_LT((all.to(at::kDouble) - reference).abs().max().item<double>(), 1e-5);
  for (const int64_t rows : {1, 3, 76}) {
    EXPECT_TRUE(at::equal(cuda::invariant_rms_norm_tensor(x.narrow(0, 1, rows), weight, 1e-5).cpu(), all.narrow(0, 1, rows)))
        << rows;
  }
}

// What makes greedy VeriCache lossless on the GPU: a verify forward of a window of rows gives, for
// each row, the logits one-row decoding gives, bit for bit (bf16 weights, as served).
TEST(GpuModel, Bf16WindowForwardEqualsOneRowDecoding) {
  REQUIRE_CUDA_DEVICE();
  auto m = LlamaModel::load(testing::default_model_path(), LoadOptions{at::kCUDA, at::kBFloat16});
  ASSERT_TRUE(m.ok()) << m.status().message();
  const std::string text = testing::read_file(testing::source_path("datasets/tokenizer_corpus/corpus.txt"));
  const std::vector<int32_t> tokens = (*m)->tokenizer().encode(text.substr(9000, 3000), false);
  ASSERT_GE(tokens.size(), 226u);
  std::vector<int32_t> pos(226);
  for (int i = 0; i < 226; ++i) pos[i] = i;
  at::Tensor window_logits, step_logits;
  std::vector<at::Tensor> steps;
  for (int k = 0; k < 2; ++k) {
    auto pool = (*m)->make_page_pool(16, 1024);
    ASSERT_TRUE(pool.ok());
    SequenceKv kv((*m)->config().n_layers);
    at::Tensor ignored;
    ForwardItem prefix{std::span(tokens).first(200), std::span(pos).first(200), &kv, &*pool, LogitRows::kNone};
    ASSERT_TRUE((*m)->forward(std::span(&prefix, 1), &ignored).ok());
    if (k == 0) {  // one forward of 26 rows (x = 25 drafts and the token before them)
      ForwardItem window{std::span(tokens).subspan(200, 26), std::span(pos).subspan(200, 26), &kv, &*pool, LogitRows::kAll};
      ASSERT_TRUE((*m)->forward(std::span(&window, 1), &window_logits).ok());
    } else {
      for (int i = 200; i < 226; ++i) {
        ForwardItem one{std::span(tokens).subspan(i, 1), std::span(pos).subspan(i, 1), &kv, &*pool, LogitRows::kAll};
        ASSERT_TRUE((*m)->forward(std::span(&one, 1), &step_logits).ok());
        steps.push_back(step_logits.clone());
      }
    }
    kv.release(*pool);
  }
  for (int i = 0; i < 26; ++i) {
    EXPECT_TRUE(at::equal(window_logits[i], steps[i][0])) << "row " << i;
  }
}

// The random-weights model at the Llama-3.1-8B shape (16 GB of bf16 weights), as bench
// --random-weights times it: drawn the same from the same seed, and a 26-row window forward bitwise
// equal to 26 one-row decodes at the 8B matrix sizes (K = 4096 and 14336).
TEST(GpuModel, RandomWeights8BShapeIsReproducibleAndRowCountInvariant) {
  REQUIRE_CUDA_DEVICE();
  auto m = LlamaModel::with_random_weights("llama-3.1-8b", 1, LoadOptions{at::kCUDA, at::kBFloat16});
  ASSERT_TRUE(m.ok()) << m.status().message();
  const at::Tensor first = *(*m)->weight("blk.31.ffn_down.weight");
  {
    auto again = LlamaModel::with_random_weights("llama-3.1-8b", 1, LoadOptions{at::kCUDA, at::kBFloat16});
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_TRUE(at::equal(first, *(*again)->weight("blk.31.ffn_down.weight")));
  }
  std::vector<int32_t> tokens(226), pos(226);
  for (int i = 0; i < 226; ++i) {
    tokens[i] = (i * 7919) % 128256;
    pos[i] = i;
  }
  at::Tensor window_logits;
  std::vector<at::Tensor> steps;
  for (int k = 0; k < 2; ++k) {
    auto pool = (*m)->make_page_pool(16, 32 * 16);
    ASSERT_TRUE(pool.ok());
    SequenceKv kv((*m)->config().n_layers);
    at::Tensor ignored;
    ForwardItem prefix{std::span(tokens).first(200), std::span(pos).first(200), &kv, &*pool, LogitRows::kNone};
    ASSERT_TRUE((*m)->forward(std::span(&prefix, 1), &ignored).ok());
    if (k == 0) {
      ForwardItem window{std::span(tokens).subspan(200, 26), std::span(pos).subspan(200, 26), &kv, &*pool, LogitRows::kAll};
      ASSERT_TRUE((*m)->forward(std::span(&window, 1), &window_logits).ok());
    } else {
      for (int i = 200; i < 226; ++i) {
        at::Tensor step_logits;
        ForwardItem one{std::span(tokens).subspan(i, 1), std::span(pos).subspan(i, 1), &kv, &*pool, LogitRows::kAll};
        ASSERT_TRUE((*m)->forward(std::span(&one, 1), &step_logits).ok());
        steps.push_back(step_logits.clone());
      }
    }
    kv.release(*pool);
  }
  EXPECT_TRUE(at::isfinite(window_logits).all().item<bool>());
  for (int i = 0; i < 26; ++i) EXPECT_TRUE(at::equal(window_logits[i], steps[i][0])) << "row " << i;
}

TEST(GpuModel, Float32ForwardMatchesCpuKernels) {
  REQUIRE_CUDA_DEVICE();
  const LlamaModel* cpu_model = testing::default_model();
  ASSERT_NE(cpu_model, nullptr);
  auto gpu_model = LlamaModel::load(testing::default_model_path(), LoadOptions{at::kCUDA, at::kFloat});
  ASSERT_TRUE(gpu_model.ok()) << gpu_model.status().message();
  const std::string text = testing::read_file(testing::source_path("datasets/tokenizer_corpus/corpus.txt"));
  const std::vector<int32_t> tokens = cpu_model->tokenizer().encode(text.substr(5000, 4000), false);
  ASSERT_GE(tokens.size(), 300u);
  at::Tensor logits[2];
  for (int k = 0; k < 2; ++k) {
    const LlamaModel& m = k == 0 ? *cpu_model : **gpu_model;
    auto pool = m.make_page_pool(16, 1024);
    ASSERT_TRUE(pool.ok());
    SequenceKv kv(m.config().n_layers);
    std::vector<int32_t> pos(300);
    for (int i = 0; i < 300; ++i) pos[i] = i;
    ForwardItem prefix{std::span(tokens).first(290), std::span(pos).first(290), &kv, &*pool, LogitRows::kNone};
    ASSERT_TRUE(m.forward(std::span(&prefix, 1), &logits[k]).ok());
    ForwardItem window{std::span(tokens).subspan(290, 10), std::span(pos).subspan(290, 10), &kv, &*pool, LogitRows::kAll};
    ASSERT_TRUE(m.forward(std::span(&window, 1), &logits[k]).ok());
    kv.release(*pool);
  }
  EXPECT_LT((logits[0] - logits[1]).abs().max().item<float>(), 2e-3);
  EXPECT_TRUE(at::equal(logits[0].argmax(1), logits[1].argmax(1)));
}

TEST(GpuModel, Bf16GreedyGeneration) {
  REQUIRE_CUDA_DEVICE();
  auto m = LlamaModel::load(testing::default_model_path(), LoadOptions{at::kCUDA, at::kBFloat16});
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto chat = (*m)->chat_template();
  ASSERT_TRUE(chat.ok());
  GenerationRequest r;
  r.prompt = (*m)->tokenizer().encode(chat->render({{"user", "What is the capital of France?"}}, true), true);
  r.max_new_tokens = 32;
  auto pool = (*m)->make_page_pool(16, Generator::pages_needed(**m, 16, std::span(&r, 1)));
  ASSERT_TRUE(pool.ok());
  Generator generator(**m, *pool);
  auto result = generator.generate(std::span(&r, 1));
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ((*m)->tokenizer().decode((*result)[0].tokens, false), "The capital of France is Paris.");
}

}  // namespace
}  // namespace vericache
