// Weight matrices in the CPU kernels' block formats (kernels/cpu_kernels.h) repacked into the
// integer kernels' 16-column panels (kernels/int8_linear.h), keeping each block's integer codes
// and its float scale(s) and minimum exactly:
//   Q8_0       codes q + 128, z = 128, scale d
//   Q4_0       the nibbles, z = 8, scale d
//   Q4_1       the nibbles, z = 0, scale d, minimum m
//   Q5_0       the 5-bit codes (nibble | fifth bit << 4), z = 16, scale d
//   kNibbleF32 (Q4_K) the nibbles, z = 0, scale d, minimum m
//   kInt8F32   (Q6_K) 6-bit codes q + 32, z = 32, one scale per 16-value half
// so that s * (code - z) + mn is the block's value as the float kernels compute it (up to the one
// rounding of their multiply-add). float32 matrices have no integer form.
// The two K-quant forms code their scales and minimums as int8 times one float32 factor per
// 256 values and column (a super-block's scales are d * sc[j] with small integers sc[j]), checked
// exact product by product; 5- and 6-bit codes are stored as nibbles plus a plane of their high
// bits. So the panels hold 5.5 (Q5_0), 4.75 (Q4_K) and 6.6 (Q6_K) bits per weight, about the
// file's, with the arithmetic unchanged; a super-block with no exact coding makes the matrix keep
// float32 scales.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "kernels/cpu_kernels.h"
#include "kernels/int8_linear.h"

namespace vericache {

// The integer format of a kernel weight format (int8-coded scales for the K-quants); nullopt for kF32.
std::optional<cpu::IntWeightFormat> int_weight_format(cpu::WeightFormat format);
// `format` with its scales and minimums as float32 instead of int8 codes (the fallback).
cpu::IntWeightFormat with_float_scales(cpu::IntWeightFormat format);
// Bytes of the panels of a matrix of `n` rows and `k` columns (k a multiple of 32).
int64_t int_panels_bytes(const cpu::IntWeightFormat& format, int64_t n, int64_t k);
// Writes `w`'s panels in `format` (int_weight_format(w.format) or with_float_scales of it) into
// `dst` (int_panels_bytes bytes) and returns their view, which borrows `dst`; nullopt when the
// format codes scales as int8 and some super-block's scales have no exact coding (or k is not a
// multiple of 256).
std::optional<cpu::IntWeightView> repack_int_panels(const cpu::WeightView& w, const cpu::IntWeightFormat& format,
                                                    uint8_t* dst);
// The panels of `w` in int_weight_format(w.format), or with float32 scales where that has no exact
// coding: `allocate(bytes)` returns the destination (called once, or twice on the fallback, the
// second call replacing the first). The view borrows the last destination.
cpu::IntWeightView repack_int_panels(const cpu::WeightView& w, const std::function<uint8_t*(int64_t)>& allocate);

}  // namespace vericache
