// Tensor wrappers of the CUDA kernels (paged KV, row-count-invariant linear and RMSNorm), for the
// libtorch forward on a GPU. Available only
// in CUDA builds (VC_WITH_CUDA). Shapes as in kernels/cuda/paged_attention.h; all tensors on one
// CUDA device, contiguous, in one of float32 / float16 / bfloat16; index tensors int64. Runs on
// the current CUDA stream. A bad argument or launch failure throws c10::Error (the model turns it
// into a Status).
#pragma once

#include <ATen/core/Tensor.h>

namespace vericache::cuda {

// Writes k, v ([rows, n_kv_heads, head_dim]; row stride may exceed the row) into the pages at
// (slot_page[r], slot_offset[r]).
void write_kv_pages_tensor(const at::Tensor& k, const at::Tensor& v, const at::Tensor& slot_page,
                           const at::Tensor& slot_offset, at::Tensor& k_pages, at::Tensor& v_pages);

// out[r, h] = softmax(q[r, h] . K_r^T * scale) V_r over the row_len[r] slots of row r's pages.
at::Tensor paged_attention_tensor(const at::Tensor& q, const at::Tensor& k_pages, const at::Tensor& v_pages,
                                  const at::Tensor& pages, const at::Tensor& row_page_start,
                                  const at::Tensor& row_len, int64_t max_len, double scale);

// x [..., in] times w [out, in] transposed, plus bias [out] when defined, in x's dtype: at::linear's
// result, computed by kernels/cuda/row_invariant.h so that no output row depends on how many rows
// x has. x is made contiguous and 16-byte aligned first (copied when it is not), so the kernel
// chosen depends only on the dtype and `in`.
at::Tensor invariant_linear_tensor(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);

// x [rows, dim] * rsqrt(mean(x^2, -1) + eps) * weight [dim], float32, each row reduced the same way
// whatever the number of rows.
at::Tensor invariant_rms_norm_tensor(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace vericache::cuda
