// vericache bench: prefill and decode throughput of full-KV generation over a grid of context
// lengths and batch sizes. Prompts are real text (consecutive slices of a text file, a different
// slice per request); decoding runs a fixed number of greedy steps past end-of-generation.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "engine/generator.h"
#include "util/mapped_file.h"
#include "util/thread_pool.h"

namespace po = boost::program_options;

namespace vericache::cli {
namespace {


}  // namespace

int run_bench(int argc, char** argv) {
  std::string model_arg, text_file, contexts_arg, batches_arg;
  int64_t decode_tokens = 32, page_size = 16, prefill_chunk = 512;
  int threads = 0;
  std::string device_arg, dtype_arg;
  bool json = false;
  po::options_description desc(
      "vericache bench: prefill and decode tokens/s of full-KV generation\n\n"
      "For every context C and batch B: B requests, each a different C-token slice of real text,\n"
      "are prefilled together (chunks of --prefill-chunk tokens per request), then decoded for\n"
      "--decode-tokens greedy steps ignoring end-of-generation. Prefill tok/s = B*C / prefill time;\n"
      "decode tok/s = B * steps / decode time.\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("text-file", po::value(&text_file)->default_value(VC_DEFAULT_BENCH_TEXT), "text the prompts are cut from")
    ("contexts", po::value(&contexts_arg)->default_value("512,2048,8192"),
     "comma-separated context lengths (prompt tokens; decoding adds --decode-tokens)")
    ("batches", po::value(&batches_arg)->default_value("1,8"), "comma-separated batch sizes")
    ("decode-tokens", po::value(&decode_tokens)->default_value(32), "greedy decode steps per configuration")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores")
    ("device", po::value(&device_arg)->default_value("cpu"), "cpu, or cuda[:N] for the GPU forward")
    ("dtype", po::value(&dtype_arg)->default_value("auto"), "float32, bfloat16 or float16; auto: float32 on cpu, bfloat16 on cuda")
    ("page-size", po::value(&page_size)->default_value(16), "KV cache page size in tokens (a multiple of 16)")
    ("prefill-chunk", po::value(&prefill_chunk)->default_value(512), "prompt tokens per request per prefill forward")
    ("json", po::bool_switch(&json), "print one JSON object per configuration instead of a table");
  // clang-format on
  po::variables_map vm;
  const std::string example = "Example:\n  vericache bench --contexts 512,2048 --batches 1,8 --decode-tokens 32\n";
  if (auto done = parse_command_line("bench", desc, example, argc, argv, &vm,
                                     {{"decode-tokens", 2, 1 << 20}, kThreadsRange, kPageSizeRange, kPrefillChunkRange}))
    return *done;
  std::vector<int64_t> contexts, batches;
  try {
    contexts = parse_positive_list(contexts_arg, "contexts", kMaxContextLength);
    batches = parse_positive_list(batches_arg, "batches", 4096);
  } catch (const po::error& e) {
    return report_usage_error("bench", e.what());
  }
  auto load_options = parse_load_options(device_arg, dtype_arg);
  if (!load_options.ok()) return report_usage_error("bench", load_options.status().message());
  set_threads(threads);
  auto loaded = load_model(model_arg, *load_options);
  if (!loaded.ok()) return report_error(loaded.status());
  const LlamaModel& m = **loaded;

  std::stringstream text;
  {
    auto file = MappedFile::open(text_file);
    if (!file.ok()) return report_error(file.status());
    text.write(reinterpret_cast<const char*>(file->data()), static_cast<std::streamsize>(file->size()));
  }
  const std::vector<int32_t> corpus = m.tokenizer().encode(text.str(), false);
  const std::string engine = m.forward_path() == ForwardPath::kCpuKernels ? std::string(m.kernels().isa) + " kernels"
                                                                          : "torch forward";
  // Bytes a decode step must read at least: every weight matrix once, as held, plus each request's K/V.
  const int64_t elem = c10::elementSize(m.dtype());
  const int64_t weight_bytes = m.decode_weight_bytes();
  const int64_t kv_bytes_per_token = 2 * m.config().n_layers * m.config().n_kv_heads * m.config().head_dim * elem;

  if (!json) {
    std::printf("model %s (%s), %s %s, %d threads, %s\n", m.path().c_str(), m.weight_type().c_str(),
                m.device().str().c_str(), c10::toString(m.dtype()), ThreadPool::global().threads(), engine.c_str());
    std::printf("%8s %6s %14s %14s %12s\n", "context", "batch", "prefill tok/s", "decode tok/s", "ms/step");
  }
  for (int64_t context : contexts) {
    for (int64_t batch : batches) {
      if (context + decode_tokens > m.config().context_length) {
        return report_usage_error("bench", "context " + std::to_string(context) + " + " + std::to_string(decode_tokens) +
                                               " decode tokens exceeds the model's context of " +
                                               std::to_string(m.config().context_length));
      }
      if (static_cast<int64_t>(corpus.size()) < context * batch) {
        return report_error(Status::invalid_argument(text_file + " has " + std::to_string(corpus.size()) +
                                                     " tokens, fewer than context x batch = " +
                                                     std::to_string(context * batch)));
      }
      std::fprintf(stderr, "[bench] context %lld, batch %lld: prefill %lld tokens, then %lld decode steps\n",
                   static_cast<long long>(context), static_cast<long long>(batch),
                   static_cast<long long>(context * batch), static_cast<long long>(decode_tokens - 1));
      std::vector<GenerationRequest> requests(batch);
      for (int64_t i = 0; i < batch; ++i) {
        requests[i].prompt.assign(corpus.begin() + i * context, corpus.begin() + (i + 1) * context);
        requests[i].max_new_tokens = decode_tokens;
        requests[i].ignore_eos = true;
      }
      auto pool = m.make_page_pool(page_size, Generator::pages_needed(m, page_size, requests));
      if (!pool.ok()) return report_error(pool.status());
      Generator generator(m, *pool, GeneratorOptions{prefill_chunk});
      GenerationStats stats;
      auto results = generator.generate(requests, {}, &stats);
      if (!results.ok()) return report_error(results.status());
      const double prefill_tok_s = static_cast<double>(context * batch) / stats.prefill_seconds;
      const double decode_tok_s = static_cast<double>(stats.decode_steps * batch) / stats.decode_seconds;
      const double ms_per_step = 1000.0 * stats.decode_seconds / static_cast<double>(stats.decode_steps);
      if (json) {
        nlohmann::json out{{"system", "vericache"},
                           {"model", m.path()},
                           {"weight_type", m.weight_type()},
                           {"context", context},
                           {"batch", batch},
                           {"prefill_seconds", stats.prefill_seconds},
                           {"prefill_tok_s", prefill_tok_s},
                           {"decode_steps", stats.decode_steps},
                           {"decode_seconds", stats.decode_seconds},
                           {"decode_tok_s", decode_tok_s},
                           {"ms_per_step", ms_per_step},
                           {"threads", ThreadPool::global().threads()},
                           {"engine", engine},
                           {"device", m.device().str()},
                           {"dtype", c10::toString(m.dtype())},
                           {"weight_bytes", weight_bytes},
                           // mean over the decode steps
                           {"kv_bytes_per_step", kv_bytes_per_token * batch * (context + decode_tokens / 2)}};
        std::cout << out.dump() << std::endl;
      } else {
        std::printf("%8lld %6lld %14.1f %14.1f %12.2f\n", static_cast<long long>(context), static_cast<long long>(batch),
                    prefill_tok_s, decode_tok_s, ms_per_step);
        std::fflush(stdout);
      }
    }
  }
  return kExitOk;
}

}  // namespace vericache::cli
