// The AVX-512 build with AVX512_BF16 (compiled with -mavx512f -mavx512bw -mavx512bf16; see core/CMakeLists.txt):
// attention over bfloat16 pages uses vdpbf16ps itself, the other kernels are the AVX-512 build's.
#define VC_KERNEL_NAMESPACE avx512_bf16
#include "kernels/cpu_kernels_impl.h"

#if !defined(__AVX512BF16__)
#error "cpu_kernels_avx512bf16.cpp must be compiled with -mavx512bf16"
#endif

namespace vericache::cpu {

const KernelTable& avx512_bf16_kernel_table() {
  static const KernelTable table = avx512_bf16::kernel_table("avx512_bf16");
  return table;
}

}  // namespace vericache::cpu
