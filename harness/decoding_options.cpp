#include "decoding_options.h"

namespace po = boost::program_options;

namespace vericache::cli {

void add_decoding_options(po::options_description& d, DecodingOptions& o) {
  // clang-format off
  d.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&o.model), kModelOptionHelp)
    ("prompt,p", po::value(&o.prompt), "prompt text")
    ("prompt-file,f", po::value(&o.prompt_file), "read the prompt from a file ('-' for standard input)")
    ("system", po::value(&o.system), "system message (chat template only; default: the template's own)")
    ("no-chat-template", po::bool_switch(&o.no_chat_template), "tokenize the prompt as is, without the chat template")
    ("max-tokens,n", po::value(&o.max_tokens)->default_value(128), "maximum tokens to generate per request")
    ("temperature,t", po::value(&o.temperature)->default_value(0.0), "sampling temperature; 0 is greedy")
    ("top-k", po::value(&o.top_k)->default_value(0), "sample among the k most likely tokens; 0 keeps all")
    ("top-p", po::value(&o.top_p)->default_value(1.0), "sample from the smallest set with this much probability mass")
    ("seed", po::value(&o.seed)->default_value(0), "random seed; request i of a batch uses seed + i")
    ("batch,b", po::value(&o.batch)->default_value(1), "run this many requests of the prompt in one batch")
    ("ignore-eos", po::bool_switch(&o.ignore_eos), "do not stop at end-of-generation tokens")
    ("threads", po::value(&o.threads)->default_value(0), "CPU threads; 0 uses all cores")
    ("page-size", po::value(&o.page_size)->default_value(16), "KV cache page size in tokens (a multiple of 16)")
    ("prefill-chunk", po::value(&o.prefill_chunk)->default_value(512), "prompt tokens per request per prefill forward")
    ("plugin-dir", po::value(&o.plugin_dirs)->composing(), "also search this folder for plugins (repeatable)")
    ("json", po::bool_switch(&o.json), "print one JSON object with the texts and metrics");
  // clang-format on
  add_compute_options(d, o.compute);
}

std::vector<OptionRange> decoding_ranges() {
  return {{"max-tokens", 0, kMaxContextLength},
          {"temperature", 0, 100},
          {"top-k", 0, 1 << 24},
          {"top-p", 0, 1, true},
          {"batch", 1, 4096},
          kThreadsRange,
          kPageSizeRange,
          kPrefillChunkRange};
}

Status check_decoding_options(const DecodingOptions& o) {
  if (!o.system.empty() && o.no_chat_template) {
    return Status::invalid_argument("--system needs the chat template; drop --no-chat-template");
  }
  return Status();
}

std::vector<GenerationRequest> make_requests(const DecodingOptions& o, const std::vector<int32_t>& prompt) {
  std::vector<GenerationRequest> requests(o.batch);
  for (int64_t i = 0; i < o.batch; ++i) {
    requests[i].prompt = prompt;
    requests[i].max_new_tokens = o.max_tokens;
    requests[i].sampling = {o.temperature, o.top_k, o.top_p, o.seed + static_cast<uint64_t>(i)};
    requests[i].ignore_eos = o.ignore_eos;
  }
  return requests;
}

}  // namespace vericache::cli
