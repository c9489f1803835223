#include "cli_common.h"

#include <ATen/Parallel.h>
#include <c10/core/Device.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "loader/plugin_loader.h"
#include "util/thread_pool.h"

namespace vericache::cli {

std::string default_model_dir() {
  if (const char* dir = std::getenv("VERICACHE_MODEL_DIR"); dir != nullptr && *dir != '\0') return dir;
  return VC_DEFAULT_MODEL_DIR;
}

Result<std::string> resolve_model_path(const std::string& requested) {
  if (!requested.empty()) return requested;
  if (const char* env = std::getenv("VERICACHE_MODEL"); env != nullptr && *env != '\0') return std::string(env);
  const std::string path = (std::filesystem::path(default_model_dir()) / kDefaultModelFile).string();
  if (!std::filesystem::exists(path)) {
    return Status::not_found("the default model " + path +
                             " is missing; run harness/setup.sh to fetch it, or pass --model PATH");
  }
  return path;
}

Result<std::unique_ptr<LlamaModel>> load_model(const std::string& requested, const LoadOptions& options) {
  VC_ASSIGN_OR_RETURN(const std::string path, resolve_model_path(requested));
  return LlamaModel::load(path, options);
}

Result<LoadOptions> parse_load_options(const std::string& device, const std::string& dtype) {
  LoadOptions options;
  try {
    options.device = at::Device(device);
  } catch (const std::exception&) {
    return Status::invalid_argument("--device '" + device + "' is not a device (cpu, cuda, cuda:N)");
  }
  if (!options.device.is_cpu() && !options.device.is_cuda()) {
    return Status::invalid_argument("--device '" + device + "': only cpu and cuda are supported");
  }
  if (dtype == "auto") {
    options.dtype = options.device.is_cpu() ? at::kFloat : at::kBFloat16;
  } else if (dtype == "float32") {
    options.dtype = at::kFloat;
  } else if (dtype == "bfloat16") {
    options.dtype = at::kBFloat16;
  } else if (dtype == "float16") {
    options.dtype = at::kHalf;
  } else {
    return Status::invalid_argument("--dtype '" + dtype + "' is not one of auto, float32, bfloat16, float16");
  }
  if (options.device.is_cpu() && options.dtype != at::kFloat) {
    return Status::invalid_argument("--dtype " + dtype + ": the CPU forward computes in float32");
  }
  return options;
}

Result<std::string> read_prompt(const std::string& prompt, const std::string& prompt_file) {
  if (!prompt.empty() && !prompt_file.empty()) return Status::invalid_argument("give --prompt or --prompt-file, not both");
  if (prompt_file.empty()) {
    if (prompt.empty()) return Status::invalid_argument("no prompt: give --prompt TEXT or --prompt-file PATH");
    return prompt;
  }
  std::stringstream ss;
  if (prompt_file == "-") {
    ss << std::cin.rdbuf();
  } else {
    std::ifstream in(prompt_file, std::ios::binary);
    if (!in) return Status::not_found(prompt_file + ": cannot read the prompt file");
    ss << in.rdbuf();
  }
  return ss.str();
}

Result<std::vector<int32_t>> prompt_tokens(const LlamaModel& model, const std::string& text, bool raw,
                                           const std::string& system) {
  const Tokenizer& tok = model.tokenizer();
  std::string rendered = text;
  if (!raw) {
    VC_ASSIGN_OR_RETURN(ChatTemplate chat, model.chat_template());
    std::vector<ChatMessage> messages;
    if (!system.empty()) messages.push_back({"system", system});
    messages.push_back({"user", text});
    rendered = chat.render(messages, /*add_generation_prompt=*/true);
  }
  std::vector<int32_t> ids = tok.encode(rendered, /*parse_special=*/!raw);
  if (tok.add_bos() && tok.bos_id() >= 0) ids.insert(ids.begin(), tok.bos_id());
  return ids;
}

void set_threads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  ThreadPool::set_global_threads(threads);
}

std::optional<int> parse_command_line(const std::string& command, const boost::program_options::options_description& desc,
                                      const std::string& examples, int argc, char** argv,
                                      boost::program_options::variables_map* vm) {
  namespace po = boost::program_options;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), *vm);
    po::notify(*vm);
  } catch (const po::error& e) {
    return report_usage_error(command, e.what());
  }
  if (vm->count("help")) {
    std::cout << desc << (examples.empty() ? "" : "\n" + examples);
    return kExitOk;
  }
  return std::nullopt;
}

int report_error(const Status& status) {
  std::fprintf(stderr, "vericache: error: %s\n", status.message().c_str());
  return kExitFailure;
}

int report_usage_error(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "vericache %s: %s\nRun 'vericache %s --help' for the options.\n", command.c_str(),
               message.c_str(), command.c_str());
  return kExitUsage;
}

Result<std::shared_ptr<Compressor>> load_compressor_for(const std::string& name_or_path, const std::string& json_params,
                                                        std::vector<std::string> extra_dirs, const LlamaModel& model,
                                                        std::string* path) {
  for (const std::string& d : default_plugin_dirs()) extra_dirs.push_back(d);
  VC_ASSIGN_OR_RETURN(PluginInfo plugin, resolve_plugin(name_or_path, extra_dirs));
  VC_ASSIGN_OR_RETURN(std::shared_ptr<Compressor> compressor, load_compressor(plugin.path, json_params));
  VC_RETURN_IF_ERROR(compressor->attach(model.shape()));
  if (path != nullptr) *path = plugin.path;
  return compressor;
}

std::vector<int64_t> parse_positive_list(const std::string& text, const char* option) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const int64_t v = std::stoll(item, &used);
      if (used != item.size() || v <= 0) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      throw boost::program_options::error(std::string("--") + option + ": '" + item + "' is not a positive integer");
    }
  }
  if (out.empty()) throw boost::program_options::error(std::string("--") + option + " needs at least one value");
  return out;
}

}  // namespace vericache::cli
