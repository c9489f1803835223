// K-quant rows repacked at load into the CPU kernels' float-scaled block formats
// (kernels/cpu_kernels.h), holding exactly the values model/ggml_dequant.h gives:
//   Q4_K -> WeightFormat::kNibbleF32: per 32 values d = d*sc[j], m = -(dmin*m[j]) and the same
//           nibbles (value = d*q + m, equal to (d*sc)*q - dmin*m since x - y is x + (-y) in IEEE-754);
//   Q6_K -> WeightFormat::kInt8F32: per 32 values the two scales d*scales[.] of its 16-value halves
//           and the codes q - 32 as int8 (value = scale * code).
// The kernels then decode 32 values with one table lookup or one int8 conversion, where the
// file's layout needs 6-bit scale unpacking and split bit planes per block: the packed blocks are
// larger (6 and 10 bits per value against 4.5 and 6.6) but decode at the speed of Q4_1 and Q8_0.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/cpu_kernels.h"
#include "model/ggml_types.h"

namespace vericache {

// The kernel format a type is repacked into; nullopt for a type that is not repacked.
std::optional<cpu::WeightFormat> repacked_format(GgmlType type);
// Bytes of one repacked row of `k` values (k a multiple of 256).
int64_t repacked_row_bytes(cpu::WeightFormat format, int64_t k);
// Repacks `rows` rows of `k` values of `type` (repacked_format(type) set) from `src` (ggml blocks,
// row after row) into `dst` (rows * repacked_row_bytes bytes).
void repack_rows(GgmlType type, const uint8_t* src, int64_t rows, int64_t k, uint8_t* dst);

}  // namespace vericache
