// The AVX-512 VNNI build of the integer linear kernels (compiled with -mavx512f -mavx512bw
// -mavx512vnni; see core/CMakeLists.txt). Same results as the portable build (int8_linear.h).
#define VC_INT_KERNEL_NAMESPACE vnni
#include "kernels/int8_linear_impl.h"

namespace vericache::cpu {

const IntKernelTable& vnni_int_kernel_table() {
  static const IntKernelTable table{"avx512-vnni", vnni::quantize_rows, vnni::linear};
  return table;
}

}  // namespace vericache::cpu
