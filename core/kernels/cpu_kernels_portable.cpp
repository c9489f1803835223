// The portable build of the CPU kernels: plain C++ doing what the AVX-512 build does, lane by lane.
#define VC_KERNEL_NAMESPACE portable
#include "kernels/cpu_kernels_impl.h"

#if defined(__AVX512F__)
#error "cpu_kernels_portable.cpp must be compiled without AVX-512"
#endif

namespace vericache::cpu {

const KernelTable& portable_kernels() {
  static const KernelTable table{"portable", portable::linear, portable::weight_row, portable::rms_norm,
                                 portable::silu_mul, portable::attention,
                                 portable::attention_scores_phase, portable::softmax_numerators,
                                 portable::attention_values_phase};
  return table;
}

const KernelTable& avx512_kernel_table();

const KernelTable* avx512_kernels() {
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported ? &avx512_kernel_table() : nullptr;
}

const KernelTable& best_kernels() {
  const KernelTable* fast = avx512_kernels();
  return fast != nullptr ? *fast : portable_kernels();
}

}  // namespace vericache::cpu
