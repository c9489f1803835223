// CUDA kernels over the paged KV layout of kv/page_pool.h:
//   K pages [num_pages][n_kv_heads][head_dim][page_size], V pages [num_pages][n_kv_heads][page_size][head_dim].
//
// paged_attention: one thread block per (row, query head), so a row's result never depends on
// how many rows the launch holds; within the block the reductions run in a fixed order that
// depends only on the row's length (a fixed block size, strided slot ownership, a fixed tree).
// Scores live in shared memory (max_len floats), accumulation is float32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>

#include "kernels/cuda/float_convert.cuh"
#include "kernels/cuda/paged_attention.h"

namespace vericache::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

// Fixed-shape tree over the block: the result depends only on the values, never on timing.
template <bool kMax>
__device__ float block_reduce(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kWarps; ++w) r = kMax ? fmaxf(r, scratch[w]) : r + scratch[w];
  __syncthreads();
  return r;
}

template <typename T, int HD>
__global__ void paged_attention_kernel(PagedAttentionParams p) {
  extern __shared__ float scores[];  // [max_len]
  __shared__ float q[HD];
  __shared__ float scratch[kWarps];
  __shared__ float partial[kWarps][HD];
  const int64_t row = blockIdx.x, head = blockIdx.y;
  const int64_t group = p.n_heads / p.n_kv_heads, g = head / group;
  const int64_t len = p.row_len[row];
  const int64_t* pages = p.pages + p.row_page_start[row];
  const T* k_pages = static_cast<const T*>(p.k_pages);
  const T* v_pages = static_cast<const T*>(p.v_pages);
  const T* qp = static_cast<const T*>(p.q) + (row * p.n_heads + head) * HD;
  for (int d = threadIdx.x; d < HD; d += kThreads) q[d] = to_float(qp[d]);
  __syncthreads();

  float local_max = -FLT_MAX;
  for (int64_t j = threadIdx.x; j < len; j += kThreads) {
    const T* kt = k_pages + ((pages[j / p.page_size] * p.n_kv_heads + g) * HD) * p.page_size + j % p.page_size;
    float dot = 0.0f;
    for (int d = 0; d < HD; ++d) dot = fmaf(q[d], to_float(kt[d * p.page_size]), dot);
    scores[j] = dot * p.scale;
    local_max = fmaxf(local_max, scores[j]);
  }
  const float max_score = block_reduce<true>(local_max, scratch);
  float local_sum = 0.0f;
  for (int64_t j = threadIdx.x; j < len; j += kThreads) {
    scores[j] = expf(scores[j] - max_score);
    local_sum += scores[j];
  }
  const float sum = block_reduce<false>(local_sum, scratch);  // also a barrier for scores[]

  // Warp w sums slots j = w, w + kWarps, ...; lane l owns dims l, l + 32, ...
  constexpr int kDims = HD / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float acc[kDims] = {};
  for (int64_t j = warp; j < len; j += kWarps) {
    const T* vp = v_pages + ((pages[j / p.page_size] * p.n_kv_heads + g) * p.page_size + j % p.page_size) * HD;
    const float w = scores[j];
    for (int i = 0; i < kDims; ++i) acc[i] = fmaf(w, to_float(vp[lane + 32 * i]), acc[i]);
  }
  for (int i = 0; i < kDims; ++i) partial[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  T* out = static_cast<T*>(p.out) + (row * p.n_heads + head) * HD;
  for (int d = threadIdx.x; d < HD; d += kThreads) {
    float o = partial[0][d];
    for (int w = 1; w < kWarps; ++w) o += partial[w][d];
    out[d] = from_float<T>(o / sum);
  }
}

template <typename T>
__global__ void write_kv_pages_kernel(WriteKvParams p) {
  const int64_t row = blockIdx.x;
  const int64_t page = p.slot_page[row], off = p.slot_offset[row];
  const int64_t width = p.n_kv_heads * p.head_dim;
  const T* k = static_cast<const T*>(p.k) + row * p.k_row_stride;
  const T* v = static_cast<const T*>(p.v) + row * p.v_row_stride;
  T* k_pages = static_cast<T*>(p.k_pages);
  T* v_pages = static_cast<T*>(p.v_pages);
  for (int64_t e = threadIdx.x; e < width; e += blockDim.x) {
    const int64_t g = e / p.head_dim, d = e % p.head_dim;
    k_pages[((page * p.n_kv_heads + g) * p.head_dim + d) * p.page_size + off] = k[e];
    v_pages[((page * p.n_kv_heads + g) * p.page_size + off) * p.head_dim + d] = v[e];
  }
}

template <typename T, int HD>
cudaError_t launch_attention(const PagedAttentionParams& p, cudaStream_t stream) {
  const size_t shared = static_cast<size_t>(p.max_len) * sizeof(float);
  if (shared > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(paged_attention_kernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(shared));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.n_heads));
  paged_attention_kernel<T, HD><<<grid, kThreads, shared, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_attention_hd(const PagedAttentionParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return launch_attention<T, 64>(p, stream);
    case 128: return launch_attention<T, 128>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t paged_attention(const PagedAttentionParams& p, DType dtype, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat32: return launch_attention_hd<float>(p, stream);
    case DType::kFloat16: return launch_attention_hd<__half>(p, stream);
    case DType::kBFloat16: return launch_attention_hd<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t write_kv_pages(const WriteKvParams& p, DType dtype, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.rows));
  switch (dtype) {
    case DType::kFloat32: write_kv_pages_kernel<float><<<grid, 256, 0, stream>>>(p); break;
    case DType::kFloat16: write_kv_pages_kernel<__half><<<grid, 256, 0, stream>>>(p); break;
    case DType::kBFloat16: write_kv_pages_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(p); break;
  }
  return cudaGetLastError();
}

}  // namespace vericache::cuda
