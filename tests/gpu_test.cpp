// GPU checks (ctest label gpu; built in CUDA builds, run on a machine with a CUDA device): the
// paged-KV CUDA kernels against the CPU kernels, their row invariance, and the model's forward on
// the GPU against the CPU kernels.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstring>

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

TEST(GpuKernels, PagedAttentionMatchesCpuKernelAndIsRowInvariant) {
  REQUIRE_CUDA_DEVICE();
  const int64_t heads = 6, kv_heads = 2, hd = 64, ps = 16, n_pages = 8, cached = 70, rows = 9;
  at::manual_seed(1);
  const at::Tensor k_pages = at::randn({n_pages, kv_heads, hd, ps});
  const at::Tensor v_pages = at::randn({n_pages, kv_heads, ps, hd});
  const at::Tensor q = at::randn({rows, heads, hd}) * 0.3;
  const std::vector<int64_t> table{5, 2, 7, 0, 3, 1, 6, 4};
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
  a.scale = 0.125f;
  for (int64_t g = 0; g < kv_heads; ++g) cpu::best_kernels().attention(a, g, 0, rows);

  const auto i64 = at::TensorOptions().dtype(at::kLong);
  const at::Tensor pages = at::tensor(table, i64).cuda();
  const at::Tensor starts = at::zeros({rows}, i64).cuda();
  const at::Tensor lens = at::arange(cached + 1, cached + rows + 1, i64).cuda();
  const at::Tensor kp = k_pages.cuda(), vp = v_pages.cuda(), qc = q.cuda();
  const at::Tensor all = cuda::paged_attention_tensor(qc, kp, vp, pages, starts, lens, cached + rows, 0.125).cpu();
  EXPECT_LT((all - expected).abs().max().item<float>(), 1e-5);
  for (int64_t r = 0; r < rows; ++r) {
    const at::Tensor one = cuda::paged_attention_tensor(qc.narrow(0, r, 1).contiguous(), kp, vp, pages,
                                                        starts.narrow(0, r, 1), lens.narrow(0, r, 1), cached + r + 1, 0.125)
                               .cpu();
    EXPECT_EQ(std::memcmp(one.data_ptr<float>(), all[r].data_ptr<float>(), heads * hd * sizeof(float)), 0) << "row " << r;
  }
}

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
