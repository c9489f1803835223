// The prompt and decoding options `vericache generate` and `vericache run` share: one declaration,
// one set of checks, so the two commands take and refuse the same values with the same words.
#pragma once

#include <boost/program_options.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <vericache/status.h>

#include "engine/generator.h"

namespace vericache::cli {

struct DecodingOptions {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  std::string system;
  bool no_chat_template = false;
  int64_t max_tokens = 128;
  double temperature = 0.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  int64_t batch = 1;
  bool ignore_eos = false;
  int threads = 0;
  int64_t page_size = 16;
  int64_t prefill_chunk = 512;
  std::vector<std::string> plugin_dirs;
  bool json = false;
};

// Adds --help and the shared options, bound to `o`, to `d`.
void add_decoding_options(boost::program_options::options_description& d, DecodingOptions& o);
// InvalidArgument naming the first bad value (NaN, negative, zero or absurdly large where it matters).
Status check_decoding_options(const DecodingOptions& o);
// --batch requests of `prompt`; request i samples with seed + i.
std::vector<GenerationRequest> make_requests(const DecodingOptions& o, const std::vector<int32_t>& prompt);

}  // namespace vericache::cli
