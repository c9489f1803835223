// Launchers of the CUDA kernels over paged KV (paged_attention.cu). Raw device pointers, no
// libtorch types, so the .cu file compiles without ATen; kernels/cuda_ops.h wraps them for tensors.
// Every pointer is device memory; launches are asynchronous on `stream`; the return value is the
// launch error (cudaSuccess when queued).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace vericache::cuda {

enum class DType { kFloat32, kFloat16, kBFloat16 };

struct PagedAttentionParams {
  const void* q = nullptr;               // [rows, n_heads, head_dim]
  void* out = nullptr;                   // [rows, n_heads, head_dim]
  const void* k_pages = nullptr;         // [num_pages, n_kv_heads, head_dim, page_size]
  const void* v_pages = nullptr;         // [num_pages, n_kv_heads, page_size, head_dim]
  const int64_t* pages = nullptr;        // page ids; row r's table starts at pages[row_page_start[r]]
  const int64_t* row_page_start = nullptr;  // [rows]
  const int64_t* row_len = nullptr;      // [rows] slots row r attends to (its own included)
  int64_t rows = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;                  // 64 or 128
  int64_t page_size = 0;
  int64_t max_len = 0;                   // >= every row_len: sizes the buffers
  float scale = 0;
  // Device scratch for the split kernels (split_attention_applies): at least
  // split_attention_workspace_floats(params, 1) floats; rows run in passes of as many as fit.
  float* workspace = nullptr;
  int64_t workspace_floats = 0;
};

// Whether paged_attention takes the split kernels for these shapes (query-head groups of 1 to 8).
bool split_attention_applies(const PagedAttentionParams& params);
// Floats of workspace that `rows` rows of these shapes need in one pass.
int64_t split_attention_workspace_floats(const PagedAttentionParams& params, int64_t rows);

struct WriteKvParams {
  const void* k = nullptr;               // row r: n_kv_heads * head_dim values at k + r * k_row_stride
  const void* v = nullptr;
  int64_t k_row_stride = 0;              // elements
  int64_t v_row_stride = 0;
  void* k_pages = nullptr;
  void* v_pages = nullptr;
  const int64_t* slot_page = nullptr;    // [rows] page of each row's slot
  const int64_t* slot_offset = nullptr;  // [rows] offset within the page
  int64_t rows = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t page_size = 0;
};

cudaError_t paged_attention(const PagedAttentionParams& params, DType dtype, cudaStream_t stream);
cudaError_t write_kv_pages(const WriteKvParams& params, DType dtype, cudaStream_t stream);

}  // namespace vericache::cuda
