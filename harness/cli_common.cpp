#include "cli_common.h"

#include <ATen/Parallel.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <sys/wait.h>

#include "loader/plugin_loader.h"
#include "util/check.h"
#include "util/thread_pool.h"

namespace vericache::cli {

std::string default_model_dir() {
  if (const char* dir = std::getenv("VERICACHE_MODEL_DIR"); dir != nullptr && *dir != '\0') return dir;
  return VC_DEFAULT_MODEL_DIR;
}

Result<std::string> resolve_model_path(const std::string& requested) {
  std::string wanted = requested;
  if (wanted.empty()) {
    const char* env = std::getenv("VERICACHE_MODEL");
    wanted = env != nullptr && *env != '\0' ? env : kEmbeddedModels[0].name;
  }
  std::string names;
  for (const EmbeddedModel& e : kEmbeddedModels) {
    names += std::string(names.empty() ? "" : ", ") + e.name;
    if (wanted != e.name) continue;
    const std::string path = (std::filesystem::path(default_model_dir()) / e.file).string();
    if (!std::filesystem::exists(path)) {
      return Status::not_found("the embedded model " + std::string(e.name) + " (" + path +
                               ") is missing; run harness/setup.sh to fetch it, or pass --model PATH");
    }
    return path;
  }
  const bool looks_like_a_name = wanted.find('/') == std::string::npos && wanted.find('.') == std::string::npos;
  if (looks_like_a_name && !std::filesystem::exists(wanted)) {
    return Status::not_found("no model named '" + wanted + "' (embedded: " + names + "; or a path to a GGUF file)");
  }
  return wanted;
}

void add_compute_options(boost::program_options::options_description& d, ComputeArgs& args) {
  namespace po = boost::program_options;
  d.add_options()("compute", po::value(&args.compute)->default_value("auto"), kComputeOptionHelp)(
      "kv-cache", po::value(&args.kv_cache)->default_value("auto"), kKvCacheOptionHelp);
}

Result<std::unique_ptr<LlamaModel>> load_model(const std::string& requested, const ComputeArgs& args,
                                               LoadOptions options) {
  const std::string& compute = args.compute;
  if (compute != "auto" && compute != "float32" && compute != "integer") {
    return Status::invalid_argument("--compute must be auto, float32 or integer, got '" + compute + "'");
  }
  VC_ASSIGN_OR_RETURN(const std::string path, resolve_model_path(requested));
  options.compute = compute == "integer" ? Compute::kInteger : Compute::kFloat32;
  VC_ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model, LlamaModel::load(path, options));
  // auto: integer wherever the model can run it (quantized matrices on the CPU kernels).
  if (compute == "auto" && model->forward_path() == ForwardPath::kCpuKernels) (void)model->set_compute(Compute::kInteger);
  VC_RETURN_IF_ERROR(apply_kv_cache(*model, args.kv_cache));
  return model;
}

Status apply_kv_cache(LlamaModel& model, const std::string& kv_cache) {
  if (kv_cache != "auto" && kv_cache != "float32" && kv_cache != "bfloat16") {
    return Status::invalid_argument("--kv-cache must be auto, float32 or bfloat16, got '" + kv_cache + "'");
  }
  // auto: bfloat16 pages beside integer arithmetic, the model dtype otherwise.
  const bool bf16 = kv_cache == "bfloat16" || (kv_cache == "auto" && model.compute() == Compute::kInteger);
  if (kv_cache == "auto" && !bf16) return Status();
  if (Status s = model.set_kv_dtype(bf16 ? at::kBFloat16 : at::kFloat); !s.ok()) {
    return Status::invalid_argument("--kv-cache " + kv_cache + ": " + s.message());
  }
  return Status();
}

std::string kv_cache_name(const LlamaModel& model) {
  switch (model.kv_dtype()) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return c10::toString(model.kv_dtype());
  }
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
    if (std::filesystem::is_directory(prompt_file)) {
      return Status::invalid_argument("--prompt-file " + prompt_file + " is a directory, not a file");
    }
    std::ifstream in(prompt_file, std::ios::binary);
    if (!in) return Status::not_found(prompt_file + ": cannot read the prompt file");
    ss << in.rdbuf();
  }
  if (ss.str().empty()) return Status::invalid_argument("--prompt-file " + prompt_file + " is empty");
  return ss.str();
}

Result<std::vector<int32_t>> corpus_tokens(const LlamaModel& model, const std::string& path, int64_t passages,
                                           int64_t passage_tokens) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::not_found(path + ": cannot read the calibration corpus");
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> ids = model.tokenizer().encode(text.str(), /*parse_special=*/false);
  if (static_cast<int64_t>(ids.size()) < passages * passage_tokens) {
    return Status::invalid_argument(path + " has " + std::to_string(ids.size()) + " tokens; " + std::to_string(passages) +
                                    " passages of " + std::to_string(passage_tokens) +
                                    " need more (lower --passages or --passage-tokens)");
  }
  return ids;
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

std::string quantizer_ratio_error(const std::string& compressor, const std::string& option) {
  return option + " does not apply to a quantizer: " + compressor +
         " keeps every token, its bit width sets the size (--params '{\"bits\": 4}')";
}

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

int run_shell(const std::string& command, std::string* output) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[512];
  while (fgets(buf, sizeof buf, p) != nullptr) *output += buf;
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void set_threads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  ThreadPool::set_global_threads(threads);
}

namespace {

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

// The option's value as a number, for the types the subcommands declare.
std::optional<double> numeric_value(const boost::any& value) {
  if (const auto* v = boost::any_cast<int>(&value)) return *v;
  if (const auto* v = boost::any_cast<int64_t>(&value)) return static_cast<double>(*v);
  if (const auto* v = boost::any_cast<uint64_t>(&value)) return static_cast<double>(*v);
  if (const auto* v = boost::any_cast<double>(&value)) return *v;
  return std::nullopt;
}

std::string check_range(const OptionRange& r, double v) {
  const bool above_min = r.min_exclusive ? v > r.min : v >= r.min;
  const bool multiple = r.multiple_of == 0 || std::fmod(v, static_cast<double>(r.multiple_of)) == 0;
  if (above_min && v <= r.max && multiple) return "";
  return std::string("--") + r.option + " must be " +
         (r.multiple_of ? "a multiple of " + std::to_string(r.multiple_of) + " " : std::string()) + "in " +
         (r.min_exclusive ? "(" : "[") + format_number(r.min) + ", " + format_number(r.max) + "], got " +
         format_number(v);
}

// The shared checks of parse_command_line; "" when the command line passes them.
std::string check_parsed(const boost::program_options::parsed_options& parsed,
                         const boost::program_options::variables_map& vm, const std::vector<OptionRange>& ranges,
                         bool positional_allowed) {
  for (const auto& o : parsed.options) {
    if (o.position_key >= 0 && !positional_allowed) {
      return "unexpected argument '" + (o.value.empty() ? std::string() : o.value[0]) +
             "' (options take one value each; quote values with spaces, e.g. -p \"hello world\")";
    }
  }
  for (const auto& [name, value] : vm) {
    if (value.defaulted()) continue;
    const auto* text = boost::any_cast<std::string>(&value.value());
    const auto* texts = boost::any_cast<std::vector<std::string>>(&value.value());
    const bool empty = (text != nullptr && text->empty()) ||
                       (texts != nullptr && std::find(texts->begin(), texts->end(), "") != texts->end());
    if (empty) return "--" + name + " must not be empty";
  }
  for (const OptionRange& r : ranges) {
    if (!vm.count(r.option)) continue;
    const std::optional<double> v = numeric_value(vm[r.option].value());
    VC_CHECK(v.has_value(), "an OptionRange names an option that is not numeric");
    if (std::string error = check_range(r, *v); !error.empty()) return error;
  }
  return "";
}

}  // namespace

std::string command_line(int argc, char** argv) {
  std::string command = "vericache";
  for (int i = 0; i < argc; ++i) command += std::string(" ") + argv[i];
  return command;
}

std::optional<int> parse_command_line(const std::string& command, const boost::program_options::options_description& desc,
                                      const std::string& examples, int argc, char** argv,
                                      boost::program_options::variables_map* vm, const std::vector<OptionRange>& ranges,
                                      const boost::program_options::positional_options_description* positional) {
  namespace po = boost::program_options;
  std::string error;
  try {
    po::command_line_parser parser(argc, argv);
    parser.options(desc);
    if (positional != nullptr) parser.positional(*positional);
    const po::parsed_options parsed = parser.run();
    po::store(parsed, *vm);
    po::notify(*vm);
    if (vm->count("help")) {
      std::cout << desc << (examples.empty() ? "" : "\n" + examples);
      return kExitOk;
    }
    error = check_parsed(parsed, *vm, ranges, positional != nullptr);
  } catch (const po::error& e) {
    error = e.what();
  }
  if (!error.empty()) return report_usage_error(command, error);
  return std::nullopt;
}

int report_error(const Status& status) {
  std::fprintf(stderr, "vericache: error: %s\n", status.message().c_str());
  return kExitFailure;
}

int report_status(const std::string& command, const Status& status) {
  return status.code() == StatusCode::kInvalidArgument ? report_usage_error(command, status.message())
                                                       : report_error(status);
}

Result<TestFault> test_fault_from_environment(const std::string& command) {
  const char* fault = std::getenv("VERICACHE_TEST_FAULT");
  if (fault == nullptr || *fault == '\0') return TestFault{};
  auto parsed = parse_test_fault(fault);
  if (!parsed.ok()) return Status::invalid_argument("VERICACHE_TEST_FAULT: " + parsed.status().message());
  std::fprintf(stderr, "[test-only fault injected (VERICACHE_TEST_FAULT=%s): this %s is wrong on purpose]\n", fault,
               command == "run" ? "run" : ("vericache " + command + " run").c_str());
  return *parsed;
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
  // The plugin refusing this model (or its own files) is a failed run, not a bad command line.
  if (Status s = compressor->attach(model.shape()); !s.ok()) return Status::plugin_error(s.message());
  if (path != nullptr) *path = plugin.path;
  return compressor;
}

std::vector<double> parse_number_list(const std::string& text, const char* option, double min, double max) {
  std::vector<double> out;
  for (const std::string& item : split_list(text)) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || !std::isfinite(v)) {
      throw boost::program_options::error(std::string("--") + option + ": '" + item + "' is not a number");
    }
    if (v < min || v > max) {
      throw boost::program_options::error(std::string("--") + option + ": " + item + " is outside [" + format_number(min) +
                                          ", " + format_number(max) + "]");
    }
    out.push_back(v);
  }
  if (out.empty()) throw boost::program_options::error(std::string("--") + option + " needs at least one value");
  return out;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<int64_t> parse_positive_list(const std::string& text, const char* option, int64_t max) {
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
    if (out.back() > max) {
      throw boost::program_options::error(std::string("--") + option + ": " + item + " is larger than " +
                                          std::to_string(max));
    }
  }
  if (out.empty()) throw boost::program_options::error(std::string("--") + option + " needs at least one value");
  return out;
}

}  // namespace vericache::cli
