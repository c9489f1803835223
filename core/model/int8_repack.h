// Weight matrices in the CPU kernels' block formats (kernels/cpu_kernels.h) repacked into the
// integer kernels' 16-column panels (kernels/int8_linear.h), keeping each block's integer codes
// and its float scale(s) and minimum exactly:
//   Q8_0       codes q + 128, z = 128, scale d
//   Q4_0       the nibbles, z = 8, scale d
//   Q4_1       the nibbles, z = 0, scale d, minimum m
//   Q5_0       the 5-bit codes (nibble | fifth bit << 4), z = 16, scale d
//   kNibbleF32 (Q4_K) the nibbles, z = 0, scale d, minimum m
//   kInt8F32   (Q6_K) codes q + 32, z = 32, one scale per 16-value half
// so that s * (code - z) + mn is the block's value as the float kernels compute it (up to the one
// rounding of their multiply-add). float32 matrices have no integer form.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/cpu_kernels.h"
#include "kernels/int8_linear.h"

namespace vericache {

// The integer format of a kernel weight format; nullopt for kF32.
std::optional<cpu::IntWeightFormat> int_weight_format(cpu::WeightFormat format);
// Bytes of the panels of a matrix of `n` rows and `k` columns (k a multiple of 32).
int64_t int_panels_bytes(const cpu::IntWeightFormat& format, int64_t n, int64_t k);
// Writes `w`'s panels (int_weight_format(w.format) set) into `dst` (int_panels_bytes bytes) and
// returns their view, which borrows `dst`.
cpu::IntWeightView repack_int_panels(const cpu::WeightView& w, uint8_t* dst);

}  // namespace vericache
