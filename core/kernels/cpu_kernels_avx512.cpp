// The AVX-512 build of the CPU kernels (compiled with -mavx512f; see core/CMakeLists.txt).
#define VC_KERNEL_NAMESPACE avx512
#include "kernels/cpu_kernels_impl.h"

namespace vericache::cpu {

const KernelTable& avx512_kernel_table() {
  static const KernelTable table{"avx512",         avx512::linear,   avx512::weight_row,
                                 avx512::rms_norm, avx512::silu_mul, avx512::attention,
                                 avx512::attention_scores_phase, avx512::softmax_numerators,
                                 avx512::attention_values_phase};
  return table;
}

}  // namespace vericache::cpu
