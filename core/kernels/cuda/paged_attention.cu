// CUDA kernels over the paged KV layout of kv/page_pool.h:
//   K pages [num_pages][n_kv_heads][head_dim][page_size], V pages [num_pages][n_kv_heads][page_size][head_dim].
//
// paged_attention: a row's result never depends on how many rows the launch holds or how they are
// split into passes; every reduction runs in a fixed order that depends only on the row's length.
// Models whose query-head groups have at most 8 heads (every model here) take the split kernels
// (chunks of 256 slots, then an ordered combine: attention_chunk_kernel); others the one-pass kernel
// (one block per (row, query head), scores in shared memory, max_len floats). Float32 accumulation.
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

// Split attention (flash decoding) for query-head groups of up to kMaxGroup heads. Pass 1: one block
// per (row, KV head, chunk of kChunk slots) scores the chunk for the group's query heads (each K and
// V element read once for the group), and writes per head the chunk's max score m_c, its sum
// s_c = sum exp(score - m_c) and its unnormalized output a_c = sum exp(score - m_c) v. Pass 2: one
// block per (row, head) combines the chunks in ascending order: M = max m_c,
// out = sum exp(m_c - M) a_c / sum exp(m_c - M) s_c. Chunk boundaries are slot positions, so a row's
// arithmetic depends only on its length: any rows, batch or launch split give the same bits.
constexpr int kChunk = 256;
constexpr int kMaxGroup = 8;

struct SplitWorkspace {
  float* acc;  // [rows][n_heads][max_chunks][head_dim]
  float* max;  // [rows][n_heads][max_chunks]
  float* sum;  // [rows][n_heads][max_chunks]
  int64_t max_chunks;
};

template <typename T, int HD>
__global__ void __launch_bounds__(kThreads) attention_chunk_kernel(PagedAttentionParams p, SplitWorkspace ws) {
  constexpr int kParts = kThreads / HD;  // threads per dimension in the V pass (1 or 2)
  __shared__ float q[kMaxGroup][HD];
  __shared__ float scores[kMaxGroup][kChunk];
  __shared__ float stats[kMaxGroup][2];  // max, sum
  __shared__ float part_acc[kParts][kMaxGroup][HD];
  const int64_t row = blockIdx.x, g = blockIdx.y, chunk = blockIdx.z;
  const int64_t len = p.row_len[row], first = chunk * kChunk;
  if (first >= len) return;  // the whole block: this row is shorter
  const int n = static_cast<int>(len - first < kChunk ? len - first : kChunk);
  const int group = static_cast<int>(p.n_heads / p.n_kv_heads);
  const int64_t head0 = g * group;
  const int64_t* pages = p.pages + p.row_page_start[row];
  const T* k_pages = static_cast<const T*>(p.k_pages);
  const T* v_pages = static_cast<const T*>(p.v_pages);
  const T* qp = static_cast<const T*>(p.q) + (row * p.n_heads + head0) * HD;
  for (int e = threadIdx.x; e < group * HD; e += kThreads) q[e / HD][e % HD] = to_float(qp[e]);
  __syncthreads();

  for (int j = threadIdx.x; j < n; j += kThreads) {  // a slot's score: its dims in order, as the one-pass kernel
    const int64_t slot = first + j;
    const T* kt = k_pages + ((pages[slot / p.page_size] * p.n_kv_heads + g) * HD) * p.page_size + slot % p.page_size;
    float dot[kMaxGroup] = {};
#pragma unroll 8
    for (int d = 0; d < HD; ++d) {
      const float k = to_float(kt[d * p.page_size]);
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h)
        if (h < group) dot[h] = fmaf(q[h][d], k, dot[h]);
    }
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h)
      if (h < group) scores[h][j] = dot[h] * p.scale;
  }
  __syncthreads();

  // Warp w: heads w, w + kWarps, ...; lane l: slots l, l + 32, ... in order, then a fixed xor tree.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int h = warp; h < group; h += kWarps) {
    float m = -FLT_MAX;
    for (int j = lane; j < n; j += 32) m = fmaxf(m, scores[h][j]);
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    float sum = 0.0f;
    for (int j = lane; j < n; j += 32) {
      const float e = expf(scores[h][j] - m);
      scores[h][j] = e;
      sum += e;
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) {
      stats[h][0] = m;
      stats[h][1] = sum;
    }
  }
  __syncthreads();

  // Thread t: dim t % HD over slots t / HD, t / HD + kParts, ...; the parts added in order.
  const int d = threadIdx.x % HD, part = threadIdx.x / HD;
  float acc[kMaxGroup] = {};
#pragma unroll 8
  for (int j = part; j < n; j += kParts) {
    const int64_t slot = first + j;
    const float v =
        to_float(v_pages[((pages[slot / p.page_size] * p.n_kv_heads + g) * p.page_size + slot % p.page_size) * HD + d]);
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h)
      if (h < group) acc[h] = fmaf(scores[h][j], v, acc[h]);
  }
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h)
    if (h < group) part_acc[part][h][d] = acc[h];
  __syncthreads();
  for (int e = threadIdx.x; e < group * HD; e += kThreads) {
    const int h = e / HD, dd = e % HD;
    float a = part_acc[0][h][dd];
    for (int i = 1; i < kParts; ++i) a += part_acc[i][h][dd];
    const int64_t at = (row * p.n_heads + head0 + h) * ws.max_chunks + chunk;
    ws.acc[at * HD + dd] = a;
    if (dd == 0) {
      ws.max[at] = stats[h][0];
      ws.sum[at] = stats[h][1];
    }
  }
}

template <typename T, int HD>
__global__ void __launch_bounds__(HD) attention_combine_kernel(PagedAttentionParams p, SplitWorkspace ws) {
  const int64_t row = blockIdx.x, head = blockIdx.y;
  const int64_t chunks = (p.row_len[row] + kChunk - 1) / kChunk;
  const int64_t base = (row * p.n_heads + head) * ws.max_chunks;
  float m = -FLT_MAX;
  for (int64_t c = 0; c < chunks; ++c) m = fmaxf(m, ws.max[base + c]);
  float total = 0.0f, o = 0.0f;
  const int d = threadIdx.x;
  for (int64_t c = 0; c < chunks; ++c) {
    const float scale = expf(ws.max[base + c] - m);
    total = fmaf(scale, ws.sum[base + c], total);
    o = fmaf(scale, ws.acc[(base + c) * HD + d], o);
  }
  static_cast<T*>(p.out)[(row * p.n_heads + head) * HD + d] = from_float<T>(o / total);
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

// Split attention in passes of as many rows as the workspace holds (a row's result does not depend on
// which pass computes it).
template <typename T, int HD>
cudaError_t launch_split_attention(const PagedAttentionParams& p, cudaStream_t stream) {
  const int64_t max_chunks = (p.max_len + kChunk - 1) / kChunk;
  const int64_t per_row = p.n_heads * max_chunks * (HD + 2);
  const int64_t pass_rows = p.workspace_floats / per_row;
  if (pass_rows < 1) return cudaErrorInvalidValue;
  for (int64_t r0 = 0; r0 < p.rows; r0 += pass_rows) {
    PagedAttentionParams pass = p;
    pass.rows = p.rows - r0 < pass_rows ? p.rows - r0 : pass_rows;
    pass.q = static_cast<const T*>(p.q) + r0 * p.n_heads * HD;
    pass.out = static_cast<T*>(p.out) + r0 * p.n_heads * HD;
    pass.row_page_start = p.row_page_start + r0;
    pass.row_len = p.row_len + r0;
    SplitWorkspace ws;
    ws.max_chunks = max_chunks;
    ws.acc = p.workspace;
    ws.max = ws.acc + pass.rows * p.n_heads * max_chunks * HD;
    ws.sum = ws.max + pass.rows * p.n_heads * max_chunks;
    const dim3 chunks(static_cast<unsigned>(pass.rows), static_cast<unsigned>(p.n_kv_heads),
                      static_cast<unsigned>(max_chunks));
    attention_chunk_kernel<T, HD><<<chunks, kThreads, 0, stream>>>(pass, ws);
    const dim3 heads(static_cast<unsigned>(pass.rows), static_cast<unsigned>(p.n_heads));
    attention_combine_kernel<T, HD><<<heads, HD, 0, stream>>>(pass, ws);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <typename T, int HD>
cudaError_t launch_attention(const PagedAttentionParams& p, cudaStream_t stream) {
  if (split_attention_applies(p)) return launch_split_attention<T, HD>(p, stream);
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

bool split_attention_applies(const PagedAttentionParams& p) {
  const int64_t group = p.n_kv_heads > 0 ? p.n_heads / p.n_kv_heads : 0;
  return group >= 1 && group <= kMaxGroup && p.n_heads % p.n_kv_heads == 0;
}

int64_t split_attention_workspace_floats(const PagedAttentionParams& p, int64_t rows) {
  return rows * p.n_heads * ((p.max_len + kChunk - 1) / kChunk) * (p.head_dim + 2);
}

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
