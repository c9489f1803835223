// Tensor wrappers of the CUDA paged-KV kernels, for the libtorch forward on a GPU. Available only
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

}  // namespace vericache::cuda
