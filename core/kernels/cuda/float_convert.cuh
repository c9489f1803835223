// Conversions between the kernels' element types (float32, float16, bfloat16) and float32, the
// type every CUDA kernel here accumulates in. Device code only; included by the .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace vericache::cuda {

template <typename T>
__device__ inline float to_float(T v);
template <>
__device__ inline float to_float(float v) { return v; }
template <>
__device__ inline float to_float(__half v) { return __half2float(v); }
template <>
__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline float from_float(float v) { return v; }
template <>
__device__ inline __half from_float(float v) { return __float2half(v); }
template <>
__device__ inline __nv_bfloat16 from_float(float v) { return __float2bfloat16(v); }

}  // namespace vericache::cuda
