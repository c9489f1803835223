#include "loader/elf_check.h"

#include <elf.h>

#include <cstring>


namespace vericache {
namespace {

#if defined(__x86_64__)
constexpr uint16_t kMachine = EM_X86_64;
constexpr const char* kMachineName = "x86-64";
#elif defined(__aarch64__)
constexpr uint16_t kMachine = EM_AARCH64;
constexpr const char* kMachineName = "aarch64";
#else
#error "add this CPU's ELF machine number"
#endif

// [offset, offset + count * entry) inside [0, size), without overflow.
bool table_inside(uint64_t offset, uint64_t count, uint64_t entry, uint64_t size) {
  if (count == 0) return true;
  if (offset > size || entry == 0 || count > (size - offset) / entry) return false;
  return true;
}

bool range_inside(uint64_t offset, uint64_t length, uint64_t size) { return offset <= size && length <= size - offset; }

std::string truncated(const std::string& what, uint64_t end, uint64_t size) {
  return "truncated or corrupt: " + what + " ends at byte " + std::to_string(end) + " but the file has " +
         std::to_string(size) + " bytes";
}

}  // namespace

Status check_elf_image(const uint8_t* data, size_t size) {
  Elf64_Ehdr eh;
  if (size < sizeof(eh)) {
    return Status::corruption("not a shared library: " + std::to_string(size) + " bytes, shorter than an ELF header");
  }
  std::memcpy(&eh, data, sizeof(eh));
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return Status::corruption("not a shared library (no ELF magic)");
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB) {
    return Status::corruption("not a 64-bit little-endian ELF file");
  }
  if (eh.e_type != ET_DYN) return Status::corruption("an ELF file but not a shared library (e_type " + std::to_string(eh.e_type) + ")");
  if (eh.e_machine != kMachine) {
    return Status::corruption("a shared library for another CPU (e_machine " + std::to_string(eh.e_machine) +
                              ", this machine is " + kMachineName + ")");
  }
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0) {
    return Status::corruption("corrupt ELF header: no program headers of the standard size");
  }
  if (!table_inside(eh.e_phoff, eh.e_phnum, eh.e_phentsize, size)) {
    return Status::corruption(truncated("the program header table", eh.e_phoff + uint64_t{eh.e_phnum} * eh.e_phentsize, size));
  }
  for (uint16_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, data + eh.e_phoff + uint64_t{i} * sizeof(ph), sizeof(ph));
    if (ph.p_type != PT_LOAD && ph.p_type != PT_DYNAMIC) continue;
    if (!range_inside(ph.p_offset, ph.p_filesz, size)) {
      return Status::corruption(truncated("segment " + std::to_string(i), ph.p_offset + ph.p_filesz, size));
    }
    if (ph.p_type == PT_LOAD && ph.p_memsz < ph.p_filesz) {
      return Status::corruption("corrupt segment " + std::to_string(i) + ": smaller in memory than in the file");
    }
  }
  if (eh.e_shnum != 0) {
    if (eh.e_shentsize != sizeof(Elf64_Shdr)) return Status::corruption("corrupt ELF header: section headers of a wrong size");
    if (!table_inside(eh.e_shoff, eh.e_shnum, eh.e_shentsize, size)) {
      return Status::corruption(truncated("the section header table", eh.e_shoff + uint64_t{eh.e_shnum} * eh.e_shentsize, size));
    }
    for (uint16_t i = 0; i < eh.e_shnum; ++i) {
      Elf64_Shdr sh;
      std::memcpy(&sh, data + eh.e_shoff + uint64_t{i} * sizeof(sh), sizeof(sh));
      if (sh.sh_type == SHT_NOBITS || sh.sh_type == SHT_NULL) continue;
      if (!range_inside(sh.sh_offset, sh.sh_size, size)) {
        return Status::corruption(truncated("section " + std::to_string(i), sh.sh_offset + sh.sh_size, size));
      }
    }
  }
  return Status();
}



}  // namespace vericache
