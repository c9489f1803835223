#include "loader/plugin_loader.h"

#include <boost/dll/shared_library.hpp>
#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>

#include <vericache/plugin_abi.h>

#include "loader/elf_check.h"
#include "util/mapped_file.h"

namespace vericache {
namespace {

using Library = boost::dll::shared_library;

const char kDescriptorSymbol[] = "vc_plugin_descriptor_v1";
const char kFactorySymbol[] = "vc_plugin_create_v1";

Status load_error(const std::string& path, const std::string& why) {
  return Status::plugin_error("plugins: failed to load " + path + ": " + why);
}

// Opens the library (RTLD_NOW | RTLD_LOCAL) once its file passed the structural checks that keep a
// truncated or foreign file away from dlopen (loader/elf_check.h), or says why not.
Result<std::shared_ptr<Library>> open_library(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return load_error(path, "no such file");
  if (S_ISDIR(st.st_mode)) return load_error(path, "is a directory");
  if (!S_ISREG(st.st_mode)) return load_error(path, "not a regular file (a FIFO, socket or device)");
  {
    auto image = MappedFile::open(path);
    if (!image.ok()) return load_error(path, image.status().message());
    if (Status s = check_elf_image(image->data(), image->size()); !s.ok()) return load_error(path, s.message());
  }
  auto lib = std::make_shared<Library>();
  boost::dll::fs::error_code ec;
  lib->load(path, ec, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  if (ec) {
    const char* err = ::dlerror();  // Boost's message is generic; dlopen's names the problem
    return load_error(path, err != nullptr ? err : ec.message());
  }
  return lib;
}

// The plugin's C++ standard library against the core's (VC_PLUGIN_CXX_LIBRARY): the same library,
// and for libstdc++ a release no newer than the core's.
Status check_cxx_library(const std::string& path, const char* recorded) {
  const std::string plugin = recorded != nullptr ? recorded : "none recorded", core = VC_PLUGIN_CXX_LIBRARY;
  const auto name = [](const std::string& s) { return s.substr(0, s.find(' ')); };
  const auto version = [](const std::string& s) {
    const size_t space = s.find(' ');
    return space == std::string::npos ? std::string() : s.substr(space + 1);
  };
  if (name(plugin) != name(core)) {
    return Status::plugin_error("plugins: " + path + ": built with the C++ library " + plugin + ", core uses " + core +
                                " (standard containers cross the plugin boundary); rebuild the plugin with " + name(core));
  }
  // libstdc++ release dates (YYYYMMDD) compare as numbers of equal length.
  const std::string v = version(plugin), cv = version(core);
  if (name(core) == "libstdc++" && (v.size() != cv.size() || v > cv)) {
    return Status::plugin_error("plugins: " + path + ": built with " + plugin + ", newer than the core's " + core +
                                "; rebuild the plugin with the core's compiler (" + __VERSION__ + ")");
  }
  return Status();
}

Result<PluginInfo> validate(const std::string& path, const Library& lib) {
  if (!lib.has(kDescriptorSymbol)) {
    return Status::plugin_error("plugins: " + path + ": missing symbol " + kDescriptorSymbol);
  }
  const vc_plugin_descriptor* d = lib.get<const vc_plugin_descriptor*()>(kDescriptorSymbol)();
  if (d == nullptr) return Status::plugin_error("plugins: " + path + ": " + kDescriptorSymbol + " returned null");
  if (d->abi_version != VC_PLUGIN_ABI_VERSION) {
    return Status::plugin_error("plugins: " + path + ": incompatible ABI (plugin: " + std::to_string(d->abi_version) +
                                ", core: " + std::to_string(VC_PLUGIN_ABI_VERSION) +
                                "); rebuild the plugin against this VeriCache's headers");
  }
  const std::string torch = d->torch_version != nullptr ? d->torch_version : "?";
  if (torch != TORCH_VERSION) {
    return Status::plugin_error("plugins: " + path + ": built against torch " + torch + ", core uses " + TORCH_VERSION);
  }
  if (d->cxx11_abi != _GLIBCXX_USE_CXX11_ABI) {
    return Status::plugin_error("plugins: " + path + ": built with _GLIBCXX_USE_CXX11_ABI=" +
                                std::to_string(d->cxx11_abi) + ", core uses " + std::to_string(_GLIBCXX_USE_CXX11_ABI));
  }
  if (Status s = check_cxx_library(path, d->cxx_library); !s.ok()) return s;
  if (d->name == nullptr || *d->name == '\0') return Status::plugin_error("plugins: " + path + ": the descriptor has no name");
  if (d->family > 1 || d->mode > 1) {
    return Status::plugin_error("plugins: " + path + ": the descriptor has an unknown family or mode");
  }
  if (!lib.has(kFactorySymbol)) return Status::plugin_error("plugins: " + path + ": missing symbol " + kFactorySymbol);
  PluginInfo info;
  info.path = path;
  info.name = d->name;
  info.description = d->description != nullptr ? d->description : "";
  info.family = static_cast<CompressorFamily>(d->family);
  info.mode = static_cast<CompressionMode>(d->mode);
  info.scenarios = d->scenarios;
  info.abi_version = d->abi_version;
  info.api_version = d->api_version;
  info.torch_version = torch;
  info.cxx11_abi = d->cxx11_abi;
  info.compiler = d->compiler != nullptr ? d->compiler : "";
  info.cxx_library = d->cxx_library;
  return info;
}

std::vector<std::string> search_dirs(const std::vector<std::string>& dirs) {
  std::vector<std::string> out;
  if (const char* env = std::getenv("VERICACHE_PLUGIN_PATH"); env != nullptr) {
    std::string list = env;
    size_t start = 0;
    while (start <= list.size()) {
      const size_t end = std::min(list.find(':', start), list.size());
      if (end > start) out.push_back(list.substr(start, end - start));
      start = end + 1;
    }
  }
  out.insert(out.end(), dirs.begin(), dirs.end());
  return out;
}

}  // namespace

const char* family_name(CompressorFamily family) {
  return family == CompressorFamily::kQuantization ? "quantization" : "token-dropping";
}

const char* mode_name(CompressionMode mode) { return mode == CompressionMode::kOnline ? "online" : "offline"; }

Result<PluginInfo> inspect_plugin(const std::string& path) {
  VC_ASSIGN_OR_RETURN(std::shared_ptr<Library> lib, open_library(path));
  return validate(path, *lib);
}

PluginSearch find_plugins(const std::vector<std::string>& dirs) {
  PluginSearch search;
  for (const std::string& dir : search_dirs(dirs)) {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) continue;
    std::vector<std::string> files;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("vc_plugin_", 0) == 0 && name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0) {
        files.push_back(dir + "/" + name);
      }
    }
    ::closedir(d);
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      auto info = inspect_plugin(f);
      if (info.ok()) {
        search.found.push_back(*info);
      } else {
        search.rejected.push_back(info.status());
      }
    }
  }
  return search;
}

Result<PluginInfo> resolve_plugin(const std::string& name_or_path, const std::vector<std::string>& dirs) {
  const bool is_path = name_or_path.find('/') != std::string::npos ||
                       (name_or_path.size() > 3 && name_or_path.compare(name_or_path.size() - 3, 3, ".so") == 0);
  if (is_path) return inspect_plugin(name_or_path);
  const PluginSearch search = find_plugins(dirs);
  std::string names;
  for (const PluginInfo& p : search.found) {
    if (p.name == name_or_path) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  return Status::not_found("plugins: no compressor named '" + name_or_path + "' (found: " +
                           (names.empty() ? "none" : names) + "; see 'vericache plugins')");
}

Result<std::shared_ptr<Compressor>> load_compressor(const std::string& path, const std::string& json_params) {
  VC_ASSIGN_OR_RETURN(std::shared_ptr<Library> lib, open_library(path));
  VC_ASSIGN_OR_RETURN(PluginInfo info, validate(path, *lib));
  auto& factory = lib->get<PluginFactory>(kFactorySymbol);
  std::unique_ptr<Compressor> made;
  Status s = factory(json_params, &made);
  if (!s.ok()) {
    if (s.code() == StatusCode::kInvalidArgument) {
      return Status::invalid_argument("plugins: " + info.name + ": bad parameters: " + s.message());
    }
    return s.with_context("plugins");
  }
  if (made == nullptr) return Status::plugin_error("plugins: " + info.name + ": the factory returned no compressor");
  // The deleter holds the library: the plugin's code (vtable, destructor) stays mapped while the
  // compressor lives.
  Compressor* raw = made.release();
  return std::shared_ptr<Compressor>(raw, [lib](Compressor* c) { delete c; });
}

std::vector<std::string> default_plugin_dirs() { return {VC_BUILD_PLUGIN_DIR, VC_INSTALL_PLUGIN_DIR}; }

}  // namespace vericache
