// The AVX-512 build of the CPU kernels (compiled with -mavx512f; see core/CMakeLists.txt). Its
// bfloat16 products are emulated with float32 FMAs (kernels/simd_bf16.h).
#define VC_KERNEL_NAMESPACE avx512
#include "kernels/cpu_kernels_impl.h"

namespace vericache::cpu {

const KernelTable& avx512_kernel_table() {
  static const KernelTable table = avx512::kernel_table("avx512");
  return table;
}

}  // namespace vericache::cpu
