// The row-count-invariant kernels of row_invariant.h.
//
// Linear: both kernels tile the output in 64 x 64 blocks (block (bx, by) owns rows by*64.., columns
// bx*64..) and walk K from 0 upwards in tiles of 32, out-of-range rows, columns and K entries read as
// zeros (adding an exact zero product changes no float32 sum). An output element's value is thus a
// fixed function of its row of x, its row of w and the bias: the number of rows only decides how
// many blocks run.
//   tensor cores: 4 warps, each a 32 x 32 quarter of the tile as 2 x 2 WMMA 16x16x16 fragments with
//                 float32 accumulators, one mma per fragment per 16 of K, in order
//   plain:        16 x 16 threads, each 4 x 4 outputs, one float32 fma per k, in order
//   skinny:       launches of <= 16 rows (bf16/fp16): the tensor-core arithmetic, laid out for streaming
// RMSNorm: one block of 256 threads per row; thread t sums the squares of elements t, t + 256, ...
// in order, then a fixed tree over the block.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/float_convert.cuh"
#include "kernels/cuda/row_invariant.h"

namespace vericache::cuda {
namespace {

constexpr int kTile = 64;   // outputs per block side
constexpr int kTileK = 32;  // K per shared-memory step
constexpr int kPad = 8;     // shared-memory row padding (halves bank conflicts, keeps 16-byte rows)

// Writes the block's float32 results (row-major kTile x kTile in `acc`) with the bias added.
template <typename T>
__device__ void store_tile(const float* acc, int ld, const T* bias, T* y, int64_t row0, int64_t col0, int64_t rows,
                           int64_t cols) {
  for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
    const int r = i / kTile, c = i % kTile;
    if (row0 + r >= rows || col0 + c >= cols) continue;
    float v = acc[r * ld + c];
    if (bias != nullptr) v += to_float(bias[col0 + c]);
    y[(row0 + r) * cols + col0 + c] = from_float<T>(v);
  }
}

// Tensor cores. Shared memory: the K tiles of x (rows) and w (columns), then reused for the float
// results.
template <typename T>
__global__ void __launch_bounds__(128) linear_wmma_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                          const T* __restrict__ bias, T* __restrict__ y, int64_t rows,
                                                          int64_t in, int64_t out) {
  using namespace nvcuda;
  constexpr int ld = kTileK + kPad;
  __shared__ __align__(128) unsigned char smem[kTile * (kTile + 4) * sizeof(float)];
  T* xs = reinterpret_cast<T*>(smem);
  T* ws = xs + kTile * ld;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile, col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int warp = threadIdx.x / 32;
  const int wr = (warp / 2) * 32, wc = (warp % 2) * 32;  // the warp's quarter of the tile

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (auto& a : acc)
    for (auto& f : a) wmma::fill_fragment(f, 0.0f);

  // 64 rows x 32 K = 256 vectors of 8 per operand: two per thread each.
  for (int64_t k0 = 0; k0 < in; k0 += kTileK) {
    for (int v = threadIdx.x; v < kTile * kTileK / 8; v += blockDim.x) {
      const int r = v / (kTileK / 8), k = (v % (kTileK / 8)) * 8;
      uint4 xv = make_uint4(0, 0, 0, 0), wv = make_uint4(0, 0, 0, 0);
      if (row0 + r < rows && k0 + k < in) xv = *reinterpret_cast<const uint4*>(x + (row0 + r) * in + k0 + k);
      if (col0 + r < out && k0 + k < in) wv = *reinterpret_cast<const uint4*>(w + (col0 + r) * in + k0 + k);
      *reinterpret_cast<uint4*>(xs + r * ld + k) = xv;
      *reinterpret_cast<uint4*>(ws + r * ld + k) = wv;
    }
    __syncthreads();
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b[2];
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], xs + (wr + 16 * i) * ld + kk, ld);
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], ws + (wc + 16 * j) * ld + kk, ld);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  float* results = reinterpret_cast<float*>(smem);
  constexpr int ldr = kTile + 4;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(results + (wr + 16 * i) * ldr + wc + 16 * j, acc[i][j], ldr, wmma::mem_row_major);
  __syncthreads();
  store_tile(results, ldr, bias, y, row0, col0, rows, out);
}

// Few rows (decode, draft steps): the tiled kernel above runs out/64 blocks that each wait on one
// 64 x 32 weight tile at a time, so it streams weights at a tenth of the bandwidth. Here each warp owns
// 16 columns and all <= 16 rows, loads its weight fragments straight from global memory two stages
// ahead, and stages the rows of x per warp in shared memory (rows past `rows` read as zeros). The
// arithmetic of every element is the tiled kernel's: the same 16x16x16 fragments in ascending K from
// zero, one mma each, and the tiled kernel's trailing zero half-tile when K / 16 is odd, so a row
// comes out bitwise the same from either kernel (GpuKernels.InvariantLinearRowsDoNotDependOnTheRowCount).
constexpr int kSkinnyRows = 16;  // launches of at most this many rows take the skinny kernel
constexpr int kSkinnyWarps = 2;  // warps per block
constexpr int kStage = 8;        // K steps of 16 per stage

template <typename T>
__global__ void __launch_bounds__(32 * kSkinnyWarps)
    linear_wmma_skinny_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                              T* __restrict__ y, int64_t rows, int64_t in, int64_t out) {
  using namespace nvcuda;
  constexpr int ldx = 16 * kStage + 8;
  __shared__ __align__(32) T xs[kSkinnyWarps][16 * ldx];
  __shared__ __align__(32) float results[kSkinnyWarps][16 * 16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) * kSkinnyWarps + warp) * 16;
  if (col0 >= out) return;  // the whole warp; nothing below synchronizes more than one warp
  T* xw = xs[warp];
  const T* wcol = w + col0 * in;
  // x's K steps [step, step + n) into xw: 16 rows x 16n values as 2n vectors of 8 per row.
  auto stage_x = [&](int64_t step, int n) {
    for (int v = lane; v < 32 * n; v += 32) {
      const int r = v / (2 * n), k = (v % (2 * n)) * 8;
      uint4 value = make_uint4(0, 0, 0, 0);
      if (r < rows) value = *reinterpret_cast<const uint4*>(x + r * in + step * 16 + k);
      *reinterpret_cast<uint4*>(xw + r * ldx + k) = value;
    }
    __syncwarp();
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b[kStage], next[kStage];
  const int64_t steps = in / 16, full = steps / kStage * kStage;
  if (full > 0)
    for (int i = 0; i < kStage; ++i) wmma::load_matrix_sync(b[i], wcol + i * 16, static_cast<unsigned>(in));
  int64_t step = 0;
  for (; step < full; step += kStage) {
    const bool more = step + kStage < full;
    if (more)
      for (int i = 0; i < kStage; ++i)
        wmma::load_matrix_sync(next[i], wcol + (step + kStage + i) * 16, static_cast<unsigned>(in));
    stage_x(step, kStage);
    for (int i = 0; i < kStage; ++i) {
      wmma::load_matrix_sync(a, xw + i * 16, ldx);
      wmma::mma_sync(acc, a, b[i], acc);
    }
    __syncwarp();  // xw is rewritten by the next stage
    if (more)
      for (int i = 0; i < kStage; ++i) b[i] = next[i];
  }
  for (; step < steps; ++step) {
    wmma::load_matrix_sync(b[0], wcol + step * 16, static_cast<unsigned>(in));
    stage_x(step, 1);
    wmma::load_matrix_sync(a, xw, ldx);
    wmma::mma_sync(acc, a, b[0], acc);
    __syncwarp();
  }
  if (steps % 2 == 1) {  // the tiled kernel's last 32-wide K tile ends in 16 zeros: one more mma of zeros
    wmma::fill_fragment(a, from_float<T>(0.0f));
    wmma::fill_fragment(b[0], from_float<T>(0.0f));
    wmma::mma_sync(acc, a, b[0], acc);
  }
  wmma::store_matrix_sync(results[warp], acc, 16, wmma::mem_row_major);
  __syncwarp();
  for (int i = lane; i < 16 * 16; i += 32) {
    const int r = i / 16, c = i % 16;
    if (r >= rows) break;
    float v = results[warp][i];
    if (bias != nullptr) v += to_float(bias[col0 + c]);
    y[r * out + col0 + c] = from_float<T>(v);
  }
}

// Any dtype, any K: 256 threads, each a 4 x 4 block of outputs (rows ty + 16 i, columns tx + 16 j).
template <typename T>
__global__ void __launch_bounds__(256) linear_plain_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                                           const T* __restrict__ bias, T* __restrict__ y, int64_t rows,
                                                           int64_t in, int64_t out) {
  __shared__ float xs[kTile][kTileK + 1];
  __shared__ float ws[kTile][kTileK + 1];
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile, col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < in; k0 += kTileK) {
    for (int e = threadIdx.x; e < kTile * kTileK; e += blockDim.x) {
      const int r = e / kTileK, k = e % kTileK;
      xs[r][k] = row0 + r < rows && k0 + k < in ? to_float(x[(row0 + r) * in + k0 + k]) : 0.0f;
      ws[r][k] = col0 + r < out && k0 + k < in ? to_float(w[(col0 + r) * in + k0 + k]) : 0.0f;
    }
    __syncthreads();
    for (int k = 0; k < kTileK; ++k)
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(xs[ty + 16 * i][k], ws[tx + 16 * j][k], acc[i][j]);
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      const int64_t r = row0 + ty + 16 * i, c = col0 + tx + 16 * j;
      if (r >= rows || c >= out) continue;
      float v = acc[i][j];
      if (bias != nullptr) v += to_float(bias[c]);
      y[r * out + c] = from_float<T>(v);
    }
}

constexpr int kNormThreads = 256;

__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(const float* __restrict__ x,
                                                                const float* __restrict__ weight,
                                                                float* __restrict__ y, int64_t dim, float eps) {
  __shared__ float partial[kNormThreads];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * dim;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kNormThreads) sum = fmaf(row[i], row[i], sum);
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kNormThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  const float scale = rsqrtf(partial[0] / static_cast<float>(dim) + eps);
  float* out = y + static_cast<int64_t>(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += kNormThreads) out[i] = row[i] * scale * weight[i];
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename T>
cudaError_t launch(const InvariantLinearParams& p, bool tensor_cores, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.out_features + kTile - 1) / kTile),
                  static_cast<unsigned>((p.rows + kTile - 1) / kTile));
  const auto* x = static_cast<const T*>(p.x);
  const auto* w = static_cast<const T*>(p.w);
  const auto* bias = static_cast<const T*>(p.bias);
  auto* y = static_cast<T*>(p.y);
  if constexpr (!std::is_same_v<T, float>) {
    // The skinny kernel reads weight fragments from global memory: 16 | K, 16 | out, 32-byte aligned.
    if (tensor_cores && p.rows <= kSkinnyRows && p.in_features % 16 == 0 && p.out_features % 16 == 0 &&
        aligned(w, 32)) {
      const unsigned blocks = static_cast<unsigned>((p.out_features / 16 + kSkinnyWarps - 1) / kSkinnyWarps);
      linear_wmma_skinny_kernel<T><<<blocks, 32 * kSkinnyWarps, 0, stream>>>(x, w, bias, y, p.rows, p.in_features,
                                                                              p.out_features);
      return cudaGetLastError();
    }
    if (tensor_cores) {
      linear_wmma_kernel<T><<<grid, 128, 0, stream>>>(x, w, bias, y, p.rows, p.in_features, p.out_features);
      return cudaGetLastError();
    }
  }
  linear_plain_kernel<T><<<grid, 256, 0, stream>>>(x, w, bias, y, p.rows, p.in_features, p.out_features);
  return cudaGetLastError();
}

}  // namespace

cudaError_t invariant_linear(const InvariantLinearParams& p, DType dtype, cudaStream_t stream) {
  if (p.rows <= 0 || p.out_features <= 0) return cudaSuccess;
  if (p.rows > 65535LL * kTile) return cudaErrorInvalidValue;
  const bool tensor_cores = p.in_features % 8 == 0 && aligned(p.x, 16) && aligned(p.w, 16);
  switch (dtype) {
    case DType::kFloat32: return launch<float>(p, false, stream);
    case DType::kFloat16: return launch<__half>(p, tensor_cores, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(p, tensor_cores, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t invariant_rms_norm(const InvariantRmsNormParams& p, cudaStream_t stream) {
  if (p.rows <= 0) return cudaSuccess;
  if (p.rows > 2147483647LL) return cudaErrorInvalidValue;
  rms_norm_kernel<<<static_cast<unsigned>(p.rows), kNormThreads, 0, stream>>>(p.x, p.weight, p.y, p.dim, p.eps);
  return cudaGetLastError();
}

}  // namespace vericache::cuda
