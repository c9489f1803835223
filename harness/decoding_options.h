// The prompt and decoding options `vericache generate` and `vericache run` share: one declaration,
// one set of checks, so the two commands take and refuse the same values with the same words.
#pragma once

#include <boost/program_options.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <vericache/status.h>

#include "cli_common.h"
#include "engine/generator.h"

namespace vericache::cli {

struct DecodingOptions {
  std::string model;
  ComputeArgs compute;  // --compute, --kv-cache
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
// The ranges of the shared numeric options, for parse_command_line.
std::vector<OptionRange> decoding_ranges();
// InvalidArgument for options that contradict each other (ranges are checked while parsing).
Status check_decoding_options(const DecodingOptions& o);
// --batch requests of `prompt`; request i samples with seed + i.
std::vector<GenerationRequest> make_requests(const DecodingOptions& o, const std::vector<int32_t>& prompt);

}  // namespace vericache::cli
