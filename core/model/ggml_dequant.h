// Dequantization of ggml tensor data to float32, bit-for-bit as the reference dequantizers of
// the `gguf` Python package (gguf-py/gguf/quants.py) compute it: every product and sum below is
// one float32 operation in the order written, never fused.
//
// Block layouts (f16 = IEEE binary16, little-endian; y = output values of one block):
//   F32/F16/BF16  one value per element.
//   Q8_0  32 elems, 34 B: f16 d | int8 q[32]                    y[i] = d*q[i]
//   Q4_0  32 elems, 18 B: f16 d | u8 qs[16]                     y[i] = d*(nib(i)-8)
//   Q4_1  32 elems, 20 B: f16 d | f16 m | u8 qs[16]             y[i] = d*nib(i) + m
//   Q5_0  32 elems, 22 B: f16 d | u32 qh | u8 qs[16]            y[i] = d*((nib(i) | bit(qh,i)<<4)-16)
//   Q5_1  32 elems, 24 B: f16 d | f16 m | u32 qh | u8 qs[16]    y[i] = d*(nib(i) | bit(qh,i)<<4) + m
//     where nib(i) = qs[i] & 15 for i < 16 and qs[i-16] >> 4 for i >= 16.
//   Q4_K  256 elems, 144 B: f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
//     8 sub-blocks j of 32 with 6-bit scale sc[j] and min m[j] packed in `scales`;
//     y = (d*sc[j])*q - (dmin*m[j]); sub-blocks 2g / 2g+1 take the low / high nibbles of qs[32g..32g+31].
//   Q5_K  256 elems, 176 B: f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
//     as Q4_K with a fifth bit: bit j of qh[i] for element i of sub-block j.
//   Q6_K  256 elems, 210 B: u8 ql[128] | u8 qh[64] | int8 scales[16] | f16 d
//     y = (d*scales[e/16]) * (q - 32), q 6 bits from ql (4) and qh (2).
#pragma once

#include <cstdint>

#include <vericache/status.h>

#include "model/ggml_types.h"

namespace vericache {

// Dequantizes `n` consecutive values starting at a block boundary. `n` must be a multiple of the
// type's block size (checked: InvalidArgument); NotSupported for a type this build cannot decode.
Status dequantize(GgmlType type, const uint8_t* src, int64_t n, float* dst);

}  // namespace vericache
