#include "kernels/cuda_ops.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cuda/row_invariant.h"
#include "kernels/cuda/paged_attention.h"

namespace vericache::cuda {
namespace {

DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default: TORCH_CHECK(false, "paged KV kernels support float32, float16 and bfloat16, got ", t.scalar_type());
  }
}

void check(cudaError_t e, const char* what) { TORCH_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e)); }

}  // namespace

void write_kv_pages_tensor(const at::Tensor& k, const at::Tensor& v, const at::Tensor& slot_page,
                           const at::Tensor& slot_offset, at::Tensor& k_pages, at::Tensor& v_pages) {
  TORCH_CHECK(k.is_cuda() && k_pages.is_cuda() && k.scalar_type() == k_pages.scalar_type(), "write_kv_pages: device/dtype");
  TORCH_CHECK(k.stride(2) == 1 && k.stride(1) == k.size(2) && v.stride(2) == 1 && v.stride(1) == v.size(2),
              "write_kv_pages: each row's heads must be contiguous");
  WriteKvParams p;
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.k_row_stride = k.stride(0);
  p.v_row_stride = v.stride(0);
  p.k_pages = k_pages.data_ptr();
  p.v_pages = v_pages.data_ptr();
  p.slot_page = slot_page.data_ptr<int64_t>();
  p.slot_offset = slot_offset.data_ptr<int64_t>();
  p.rows = k.size(0);
  p.n_kv_heads = k.size(1);
  p.head_dim = k.size(2);
  p.page_size = k_pages.size(3);
  check(write_kv_pages(p, dtype_of(k), c10::cuda::getCurrentCUDAStream()), "write_kv_pages");
}

at::Tensor paged_attention_tensor(const at::Tensor& q, const at::Tensor& k_pages, const at::Tensor& v_pages,
                                  const at::Tensor& pages, const at::Tensor& row_page_start,
                                  const at::Tensor& row_len, int64_t max_len, double scale) {
  TORCH_CHECK(q.is_cuda() && q.is_contiguous() && q.scalar_type() == k_pages.scalar_type(), "paged_attention: q");
  at::Tensor out = at::empty_like(q);
  PagedAttentionParams p;
  p.q = q.data_ptr();
  p.out = out.data_ptr();
  p.k_pages = k_pages.data_ptr();
  p.v_pages = v_pages.data_ptr();
  p.pages = pages.data_ptr<int64_t>();
  p.row_page_start = row_page_start.data_ptr<int64_t>();
  p.row_len = row_len.data_ptr<int64_t>();
  p.rows = q.size(0);
  p.n_heads = q.size(1);
  p.head_dim = q.size(2);
  p.n_kv_heads = k_pages.size(1);
  p.page_size = k_pages.size(3);
  p.max_len = max_len;
  p.scale = static_cast<float>(scale);
  at::Tensor workspace;
  if (split_attention_applies(p)) {
    // Passes of at most 64 MiB of scratch, and never fewer than one row per pass.
    constexpr int64_t kMaxWorkspaceFloats = int64_t{16} << 20;
    const int64_t per_row = split_attention_workspace_floats(p, 1);
    const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(p.rows, kMaxWorkspaceFloats / per_row));
    workspace = at::empty({rows * per_row}, q.options().dtype(at::kFloat));
    p.workspace = workspace.data_ptr<float>();
    p.workspace_floats = workspace.numel();
  }
  check(paged_attention(p, dtype_of(q), c10::cuda::getCurrentCUDAStream()), "paged_attention");
  return out;
}

at::Tensor invariant_linear_tensor(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  TORCH_CHECK(x.is_cuda() && w.is_cuda() && x.scalar_type() == w.scalar_type() && w.dim() == 2 &&
                  x.size(-1) == w.size(1),
              "invariant_linear: x [..., in] and w [out, in] on one CUDA device, one dtype");
  TORCH_CHECK(!bias.defined() || (bias.is_cuda() && bias.scalar_type() == x.scalar_type() && bias.numel() == w.size(0)),
              "invariant_linear: bias [out] in x's dtype");
  at::Tensor x2 = x.reshape({-1, x.size(-1)}).contiguous();
  if (reinterpret_cast<uintptr_t>(x2.data_ptr()) % 16 != 0) x2 = x2.clone();
  const at::Tensor wc = w.contiguous();
  const at::Tensor bc = bias.defined() ? bias.contiguous() : bias;
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  at::Tensor y = at::empty({x2.size(0), w.size(0)}, x.options());
  InvariantLinearParams p;
  p.x = x2.data_ptr();
  p.w = wc.data_ptr();
  p.bias = bc.defined() ? bc.data_ptr() : nullptr;
  p.y = y.data_ptr();
  p.rows = x2.size(0);
  p.in_features = x2.size(1);
  p.out_features = w.size(0);
  check(invariant_linear(p, dtype_of(x), c10::cuda::getCurrentCUDAStream()), "invariant_linear");
  return y.view(shape);
}

at::Tensor invariant_rms_norm_tensor(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.dim() == 2 && weight.is_cuda() &&
                  weight.scalar_type() == at::kFloat && weight.numel() == x.size(1),
              "invariant_rms_norm: x [rows, dim] and weight [dim], float32 on one CUDA device");
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor y = at::empty_like(xc);
  InvariantRmsNormParams p;
  p.x = xc.data_ptr<float>();
  p.weight = wc.data_ptr<float>();
  p.y = y.data_ptr<float>();
  p.rows = xc.size(0);
  p.dim = xc.size(1);
  p.eps = static_cast<float>(eps);
  check(invariant_rms_norm(p, c10::cuda::getCurrentCUDAStream()), "invariant_rms_norm");
  return y;
}

}  // namespace vericache::cuda
