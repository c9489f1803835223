// The binary contract of a compressor plugin (a shared library).
//
// Every plugin exports, with C linkage, `vc_plugin_descriptor_v1`: a function returning a static
// descriptor. The loader reads it before touching any C++ symbol and refuses the library unless
//   abi_version == VC_PLUGIN_ABI_VERSION   (bumped on any change of a signature or layout), and
//   torch_version and cxx11_abi equal the core's (tensors cross the boundary as C++ objects), and
//   cxx_library names the core's C++ standard library, for libstdc++ a release no newer than the
//   core's (the compiler is recorded and listed by `vericache plugins`, not checked).
// api_version counts additive changes (new optional hooks); an older plugin keeps loading.
// Then it looks up `vc_plugin_create_v1`, the factory, which takes the parameters as JSON text.
// No exception crosses the boundary: the factory returns a Status, and CompressorBase turns
// exceptions inside hooks into Status values.
//
//   #include <vericache/plugin_abi.h>
//   class MyCompressor : public vericache::CompressorBase { ... };
//   vericache::Status make_my_compressor(const std::string& json, std::unique_ptr<vericache::Compressor>* out);
//   VC_EXPORT_COMPRESSOR("my_compressor", "what it does", vericache::CompressorFamily::kTokenDropping,
//                        vericache::CompressionMode::kOffline, vericache::kAllScenarios, make_my_compressor)
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <torch/version.h>
#include <vericache/compressor.h>

#define VC_PLUGIN_ABI_VERSION 8u
#define VC_PLUGIN_API_VERSION 1u

extern "C" {

struct vc_plugin_descriptor {
  uint32_t abi_version;
  uint32_t api_version;
  const char* name;           // what `--compressor NAME` matches
  const char* description;
  uint32_t family;            // vericache::CompressorFamily
  uint32_t mode;              // vericache::CompressionMode
  uint32_t scenarios;         // vericache::Scenario bits
  const char* torch_version;  // TORCH_VERSION the plugin was built against
  int32_t cxx11_abi;          // _GLIBCXX_USE_CXX11_ABI at build time
  const char* compiler;       // __VERSION__ (informational: GCC and Clang share the C++ ABI)
  const char* cxx_library;    // VC_PLUGIN_CXX_LIBRARY: must be the core's library, no newer
};

}  // extern "C"

namespace vericache {

constexpr uint32_t kAllScenarios =
    static_cast<uint32_t>(Scenario::kLongContext) | static_cast<uint32_t>(Scenario::kRemotePrefix);

// The factory every plugin exports as vc_plugin_create_v1: parses `json_params` (an object; "{}"
// for the defaults) and creates the compressor, or returns why not (InvalidArgument for bad
// parameters, with the plugin's own reason).
using PluginFactory = Status(const std::string& json_params, std::unique_ptr<Compressor>* out);

}  // namespace vericache

#define VC_PLUGIN_STRINGIFY_INNER_(x) #x
#define VC_PLUGIN_STRINGIFY_(x) VC_PLUGIN_STRINGIFY_INNER_(x)

// The C++ standard library a translation unit is built with: "libstdc++ <release date>" or
// "libc++ <version>". std::string, std::vector and tensors cross the plugin boundary, so the loader
// refuses another library, or a libstdc++ newer than the core's (its symbols may be missing).
#if defined(_LIBCPP_VERSION)
#define VC_PLUGIN_CXX_LIBRARY "libc++ " VC_PLUGIN_STRINGIFY_(_LIBCPP_VERSION)
#elif defined(__GLIBCXX__)
#define VC_PLUGIN_CXX_LIBRARY "libstdc++ " VC_PLUGIN_STRINGIFY_(__GLIBCXX__)
#else
#define VC_PLUGIN_CXX_LIBRARY "unknown"
#endif

// Defines the descriptor and the factory entry point. FACTORY is a function with the PluginFactory
// signature; exceptions it throws become PluginError statuses here, inside the plugin.
#define VC_EXPORT_COMPRESSOR(NAME, DESCRIPTION, FAMILY, MODE, SCENARIOS, FACTORY)                              \
  extern "C" __attribute__((visibility("default"))) const vc_plugin_descriptor* vc_plugin_descriptor_v1() {   \
    static const vc_plugin_descriptor descriptor{VC_PLUGIN_ABI_VERSION,                                      \
                                                 VC_PLUGIN_API_VERSION,                                      \
                                                 NAME,                                                       \
                                                 DESCRIPTION,                                                \
                                                 static_cast<uint32_t>(FAMILY),                              \
                                                 static_cast<uint32_t>(MODE),                                \
                                                 static_cast<uint32_t>(SCENARIOS),                           \
                                                 TORCH_VERSION,                                              \
                                                 _GLIBCXX_USE_CXX11_ABI,                                     \
                                                 __VERSION__,                                                \
                                                 VC_PLUGIN_CXX_LIBRARY};                                     \
    return &descriptor;                                                                                      \
  }                                                                                                          \
  extern "C" __attribute__((visibility("default"))) vericache::Status vc_plugin_create_v1(                     \
      const std::string& json_params, std::unique_ptr<vericache::Compressor>* out) noexcept {                \
    try {                                                                                                    \
      return FACTORY(json_params, out);                                                                      \
    } catch (const std::exception& e) {                                                                      \
      return vericache::Status::plugin_error(std::string(NAME) + ": factory failed: " + e.what());           \
    } catch (...) {                                                                                          \
      return vericache::Status::plugin_error(std::string(NAME) + ": factory failed: unknown exception");     \
    }                                                                                                        \
  }
