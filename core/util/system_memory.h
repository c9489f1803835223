// The machine's physical memory, for refusing work that cannot fit before it starts.
#pragma once

#include <unistd.h>

namespace vericache {

// Bytes of physical memory (sysconf); thread-safe, never fails on Linux.
inline double physical_memory_bytes() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

}  // namespace vericache
