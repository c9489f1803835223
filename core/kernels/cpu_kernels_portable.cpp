// The portable build of the CPU kernels: plain C++ doing what the AVX-512 build does, lane by lane.
#define VC_KERNEL_NAMESPACE portable
#include "kernels/cpu_kernels_impl.h"

#if defined(__AVX512F__)
#error "cpu_kernels_portable.cpp must be compiled without AVX-512"
#endif

namespace vericache::cpu {

const KernelTable& portable_kernels() {
  static const KernelTable table = portable::kernel_table("portable");
  return table;
}

const KernelTable& avx512_kernel_table();
const KernelTable& avx512_bf16_kernel_table();

const KernelTable* avx512_kernels() {
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported ? &avx512_kernel_table() : nullptr;
}

const KernelTable* avx512_bf16_kernels() {
  static const bool supported =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
  return supported ? &avx512_bf16_kernel_table() : nullptr;
}

std::vector<const KernelTable*> supported_kernels() {
  std::vector<const KernelTable*> tables{&portable_kernels()};
  for (const KernelTable* t : {avx512_kernels(), avx512_bf16_kernels()}) {
    if (t != nullptr) tables.push_back(t);
  }
  return tables;
}

const KernelTable& best_kernels() {
  static const KernelTable* const best = supported_kernels().back();
  return *best;
}

}  // namespace vericache::cpu
