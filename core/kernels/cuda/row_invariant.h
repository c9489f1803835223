// Row-count-invariant building blocks of the GPU forward: every output row is computed the same way
// whatever the number of rows (the GPU counterpart of the CPU kernels' guarantee).
//
// invariant_linear: a linear layer,
// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), accumulated in float32 over k in ascending tiles,
// stored in the inputs' dtype. cuBLAS (at::linear) picks its algorithm, tile and split-K by shape,
// so a verify forward of x + 1 rows can round differently from one-row decoding and greedy output
// can diverge; here the grid is fixed tiles of 64 x 64 outputs, each reduced over all of K by one
// thread block in the same order, with no split-K. Row m sits at the same place of the same tile
// shape for every M, so y[m, :] depends only on x[m, :], w and bias.
//
// invariant_rms_norm: y[m] = x[m] * rsqrt(mean(x[m]^2) + eps) * weight, float32, one thread block
// per row reducing in a fixed order (torch's reduction picks its launch by shape).
//
// Raw device pointers (the .cu file compiles without ATen); kernels/cuda_ops.h wraps them for
// tensors. Launches are asynchronous on `stream`; the return value is the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/paged_attention.h"  // DType

namespace vericache::cuda {

struct InvariantLinearParams {
  const void* x = nullptr;     // [rows, in_features], row-major, contiguous
  const void* w = nullptr;     // [out_features, in_features], row-major, contiguous
  const void* bias = nullptr;  // [out_features] or nullptr
  void* y = nullptr;           // [rows, out_features]
  int64_t rows = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
};

// bfloat16 and float16 run on tensor cores (WMMA 16x16x16, float32 accumulators) when
// in_features is a multiple of 8 and the pointers 16-byte aligned; every other case (float32
// included) on a plain kernel with the same tiles and the same per-element order.
cudaError_t invariant_linear(const InvariantLinearParams& params, DType dtype, cudaStream_t stream);

struct InvariantRmsNormParams {
  const float* x = nullptr;       // [rows, dim], contiguous
  const float* weight = nullptr;  // [dim]
  float* y = nullptr;             // [rows, dim]
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 0;
};
cudaError_t invariant_rms_norm(const InvariantRmsNormParams& params, cudaStream_t stream);

}  // namespace vericache::cuda
