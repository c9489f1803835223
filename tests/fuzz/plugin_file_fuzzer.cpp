// libFuzzer target: any bytes as a plugin file. The checks the loader runs before dlopen
// (loader/elf_check.h) must return a Status for every input, and must refuse every input whose
// headers point outside it; what passes them is handed to dlopen only by the real loader, never
// here (dlopen of a complete but corrupt library is outside what an in-process check can make safe).
#include <cstdint>

#include "loader/elf_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)vericache::check_elf_image(data, size);
  return 0;
}
