// Structural checks of a plugin file before it is handed to dlopen.
//
// dlopen maps a shared library's segments as the file's headers describe them and reads through
// those mappings: a truncated file (a copy cut short, a build killed halfway) makes the first read
// past the end a SIGBUS inside the dynamic loader, which kills the whole process. These checks
// catch that class and the files that are not this machine's shared libraries at all: the file is
// regular (checked by the loader), an ELF64 little-endian shared object for this CPU, and its program headers, section
// headers, every loaded segment and every section with file contents lie inside the file.
// They do not prove the contents sound (relocations, symbol tables): a deliberately corrupted but
// complete library can still crash dlopen, which no in-process check can prevent.
//
// Thread-safety: pure functions. Failure: a Corruption / InvalidArgument status whose message says
// what is wrong, without the path (callers add it).
#pragma once

#include <cstddef>
#include <cstdint>

#include <vericache/status.h>

namespace vericache {

// Checks an ELF image held in memory (`size` bytes).
Status check_elf_image(const uint8_t* data, size_t size);

}  // namespace vericache
