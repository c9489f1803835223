// The portable build of the integer linear kernels: plain C++ computing, lane by lane, the same
// exact integers and the same float operations as the AVX-512 VNNI build (int8_linear.h).
#define VC_INT_KERNEL_NAMESPACE portable_int
#include "kernels/int8_linear_impl.h"

#if defined(__AVX512F__)
#error "int8_linear_portable.cpp must be compiled without AVX-512"
#endif

namespace vericache::cpu {

const IntKernelTable& portable_int_kernels() {
  static const IntKernelTable table{"portable", portable_int::quantize_rows, portable_int::linear};
  return table;
}

const IntKernelTable& vnni_int_kernel_table();

const IntKernelTable* vnni_int_kernels() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vnni");
  return supported ? &vnni_int_kernel_table() : nullptr;
}

const IntKernelTable& best_int_kernels() {
  const IntKernelTable* fast = vnni_int_kernels();
  return fast != nullptr ? *fast : portable_int_kernels();
}

}  // namespace vericache::cpu
