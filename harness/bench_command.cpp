// vericache bench: prefill and decode throughput of full-KV generation over a grid of context
// lengths and batch sizes. Prompts are real text (consecutive slices of a text file, a different
// slice per request); decoding runs a fixed number of greedy steps past end-of-generation. With
// --random-weights the model is a named shape with random weights, the caches random K/V and each
// timed forward a decode step or a verify window: timing at a size no model file here has, named as
// such in every line of output. --window on a model file runs the same timing with its weights.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>

#include "bench_support.h"
#include "cli_common.h"
#include "commands.h"
#include "engine/generator.h"
#include "model/cpu_attention.h"
#include "model/model_shapes.h"
#include "util/mapped_file.h"
#include "util/thread_pool.h"

namespace po = boost::program_options;

namespace vericache::cli {
namespace {

// The known shapes, one per line, for the help text.
std::string shape_list() {
  std::string list;
  for (const NamedShape& s : named_shapes()) list += "  " + s.name + "  " + s.description + "\n";
  return list;
}

// Seeded uniform token ids (the random-weights model has no tokenizer; the ids only have to be valid).
std::vector<int32_t> random_token_ids(int64_t count, int64_t vocab_size) {
  std::mt19937 rng(20261203);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab_size - 1));
  std::vector<int32_t> ids(static_cast<size_t>(count));
  for (int32_t& t : ids) t = id(rng);
  return ids;
}

// FLOPs of one forward of `window` new tokens for each of `batch` requests over `context` cached
// tokens: 2 per weight per row (the output matrix too: a decode step asks for its one row's logits,
// a window for every row's), and QK^T plus PV over the cached and earlier window tokens.
double forward_flops(const LlamaConfig& c, int64_t batch, int64_t window, int64_t context) {
  const double q = static_cast<double>(c.n_heads * c.head_dim), kv = static_cast<double>(c.n_kv_heads * c.head_dim);
  const double d = static_cast<double>(c.d_model), layers = static_cast<double>(c.n_layers);
  const double rows = static_cast<double>(batch * window);
  const double per_row_weights = layers * (d * (q + 2 * kv) + q * d + 3 * d * static_cast<double>(c.d_ff)) +
                                 d * static_cast<double>(c.vocab_size);
  const double attention = 4.0 * layers * q * (static_cast<double>(context) + static_cast<double>(window + 1) / 2.0);
  return rows * (2.0 * per_row_weights + attention);
}

// One configuration of the random-weights timing: no prefill (its K/V would be as meaningless as
// the weights); each request's cache holds `context` slots of N(0, 1) K/V, and every measured step
// is one forward of `window` new tokens per request (1: a decode step; x + 1: a verify window),
// whose slots are then truncated so that every step sees exactly `context` cached tokens. The
// first forward warms up and is not timed; the logits reaching the host ends each step.
struct RandomKvTiming {
  int64_t steps = 0;
  double seconds = 0;
  ForwardTimes times;  // summed over the timed forwards (CPU kernels)
};
Result<RandomKvTiming> time_forwards_on_random_kv(const LlamaModel& m, int64_t context, int64_t batch, int64_t window,
                                                  int64_t steps, int64_t page_size) {
  const KvPageSpec spec = m.kv_page_spec(page_size);
  SequenceKv probe(m.config().n_layers);
  VC_ASSIGN_OR_RETURN(PagePool pool, m.make_page_pool(page_size, batch * probe.pages_needed(spec, context + window)));
  pool.k_pages().normal_();
  pool.v_pages().normal_();
  std::vector<SequenceKv> caches(batch, SequenceKv(m.config().n_layers));
  for (SequenceKv& kv : caches) {
    VC_RETURN_IF_ERROR(kv.reserve(pool, context));
    kv.advance(context);
  }
  std::vector<int32_t> tokens = random_token_ids(window, m.config().vocab_size), positions(window);
  for (int64_t i = 0; i < window; ++i) positions[i] = static_cast<int32_t>(context + i);
  std::vector<ForwardItem> items(batch);
  for (int64_t r = 0; r < batch; ++r) {
    items[r] = ForwardItem{tokens, positions, &caches[r], &pool, window == 1 ? LogitRows::kLast : LogitRows::kAll, r};
  }
  RandomKvTiming timing;
  at::Tensor logits;
  for (int64_t step = 0; step <= steps; ++step) {
    ForwardTimes times;
    const double start = now_seconds();
    VC_RETURN_IF_ERROR(m.forward(items, &logits, {}, &times));
    if (step > 0) {
      timing.seconds += now_seconds() - start;
      timing.times.attention_seconds += times.attention_seconds;
      timing.times.linear_seconds += times.linear_seconds;
      timing.times.logits_seconds += times.logits_seconds;
    }
    for (SequenceKv& kv : caches) kv.truncate(pool, context);
  }
  timing.steps = steps;
  return timing;
}

// What the window timing of one run shares (time_windows).
struct WindowTimingSetup {
  const LlamaModel& m;
  const std::string& model_name;
  bool random_weights;
  const std::string& engine;
  int64_t weight_bytes, kv_bytes_per_token, steps, page_size;
  bool json;
};

// The forwards-over-random-K/V timing of every (context, batch, window), windows in the order
// given; each line splits ms/step into the weight matrices, attention and the output head (CPU
// kernels; zeros on the torch forward) and, where window 1 ran before it in the same configuration,
// gives the step in decode steps.
int time_windows(const WindowTimingSetup& s, const std::vector<int64_t>& contexts, const std::vector<int64_t>& batches,
                 const std::vector<int64_t>& windows) {
  const LlamaModel& m = s.m;
  const char* weights = s.random_weights ? "random (timing only)" : "the model file's";
  if (!s.json) {
    std::printf("model %s, %s %s, %d threads, %s, compute %s; K/V %s, random (no prefill), %s weights\n",
                s.model_name.c_str(), m.device().str().c_str(), c10::toString(m.dtype()), ThreadPool::global().threads(),
                s.engine.c_str(), compute_name(m.compute()), kv_cache_name(m).c_str(), weights);
    std::printf("%8s %6s %7s %12s %10s %10s %10s %10s %12s %12s\n", "context", "batch", "window", "rows/s", "ms/step",
                "linear ms", "attn ms", "logits ms", "GFLOP/step", "decode steps");
  }
  for (int64_t context : contexts) {
    const int64_t longest = *std::max_element(windows.begin(), windows.end());
    if (context + longest > m.config().context_length) {
      return report_usage_error("bench", "context " + std::to_string(context) + " + a window of " + std::to_string(longest) +
                                             " exceeds the model's context of " + std::to_string(m.config().context_length));
    }
    for (int64_t batch : batches) {
      double decode_ms = 0;  // window 1's ms/step in this configuration, once timed
      for (int64_t window : windows) {
        std::fprintf(stderr, "[bench] %s: context %lld, batch %lld, window %lld: %lld timed forwards\n",
                     m.path().c_str(), static_cast<long long>(context), static_cast<long long>(batch),
                     static_cast<long long>(window), static_cast<long long>(s.steps));
        auto timing = time_forwards_on_random_kv(m, context, batch, window, s.steps, s.page_size);
        if (!timing.ok()) return report_error(timing.status());
        const double per_step = 1000.0 / static_cast<double>(timing->steps);
        const double ms_per_step = per_step * timing->seconds;
        if (window == 1) decode_ms = ms_per_step;
        const double rows_per_s = static_cast<double>(batch * window) * 1000.0 / ms_per_step;
        const double flops = forward_flops(m.config(), batch, window, context);
        const double linear_ms = per_step * timing->times.linear_seconds;
        const double attention_ms = per_step * timing->times.attention_seconds;
        const double logits_ms = per_step * timing->times.logits_seconds;
        if (s.json) {
          nlohmann::json out{{"system", "vericache"},
                             {"model", s.model_name}, {"compute", compute_name(m.compute())}, {"kv_cache", kv_cache_name(m)},
                             {"weights", weights},
                             {"kv", "random (no prefill)"},
                             {"context", context},
                             {"batch", batch},
                             {"window", window},
                             {"steps", timing->steps},
                             {"ms_per_step", ms_per_step},
                             {"linear_ms", linear_ms},
                             {"attention_ms", attention_ms},
                             {"logits_ms", logits_ms},
                             {"rows_per_s", rows_per_s},
                             {"threads", ThreadPool::global().threads()},
                             {"engine", s.engine},
                             {"device", m.device().str()},
                             {"dtype", c10::toString(m.dtype())},
                             {"weight_bytes", s.weight_bytes},
                             {"kv_bytes_per_step", s.kv_bytes_per_token * batch * (context + window)},
                             {"flops_per_step", flops}};
          if (decode_ms > 0) out["decode_steps"] = ms_per_step / decode_ms;
          std::cout << out.dump() << std::endl;
        } else {
          std::printf("%8lld %6lld %7lld %12.1f %10.3f %10.3f %10.3f %10.3f %12.1f", static_cast<long long>(context),
                      static_cast<long long>(batch), static_cast<long long>(window), rows_per_s, ms_per_step, linear_ms,
                      attention_ms, logits_ms, flops / 1e9);
          if (decode_ms > 0) {
            std::printf(" %12.2f\n", ms_per_step / decode_ms);
          } else {
            std::printf(" %12s\n", "-");
          }
          std::fflush(stdout);
        }
      }
    }
  }
  return kExitOk;
}

}  // namespace

int run_bench(int argc, char** argv) {
  ComputeArgs compute_arg;
  std::string model_arg, random_shape, text_file, contexts_arg, batches_arg;
  int64_t decode_tokens = 32, page_size = 16, prefill_chunk = 512;
  std::string window_arg, split_arg;
  int threads = 0;
  std::string device_arg, dtype_arg;
  bool json = false;
  po::options_description desc(
      "vericache bench: prefill and decode tokens/s of full-KV generation\n\n"
      "For every context C and batch B: B requests, each a different C-token slice of real text,\n"
      "are prefilled together (chunks of --prefill-chunk tokens per request), then decoded for\n"
      "--decode-tokens greedy steps ignoring end-of-generation. Prefill tok/s = B*C / prefill time;\n"
      "decode tok/s = B * steps / decode time.\n\n"
      "With --random-weights SHAPE: a model of that shape with random weights (for timing a size no\n"
      "model file here has; every output line says so), no prefill: each request's cache holds C\n"
      "slots of random K/V and each timed forward adds --window tokens per request, then drops them.\n"
      "The same timing runs on a model file's weights when --window is given (--window 1,17: a decode\n"
      "step and a 17-row verify window, adjacent; the time of a forward does not depend on the K/V\n"
      "values). Each line splits ms/step into the weight matrices, attention and the output head, and\n"
      "gives the forward in decode steps once window 1 ran in the same configuration.\n"
      "The JSON lines carry bytes and FLOPs per step for harness/bench/roofline.py. Shapes:\n" +
      shape_list() + "\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("random-weights", po::value(&random_shape)->value_name("SHAPE"),
     "instead of --model: a model of SHAPE (listed above) with random weights, for timing only")
    ("text-file", po::value(&text_file)->default_value(VC_DEFAULT_BENCH_TEXT), "text the prompts are cut from")
    ("contexts", po::value(&contexts_arg)->default_value("512,2048,8192"),
     "comma-separated context lengths (prompt tokens; decoding adds --decode-tokens)")
    ("batches", po::value(&batches_arg)->default_value("1,8"), "comma-separated batch sizes")
    ("decode-tokens", po::value(&decode_tokens)->default_value(32),
     "greedy decode steps per configuration (with --random-weights: timed forwards, after one untimed)")
    ("window", po::value(&window_arg)->default_value("1"),
     "comma-separated new tokens per request in each timed forward over random K/V (1: decode steps; "
     "x + 1: verify windows); with a model file this replaces prefill and decoding by that timing")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores")
    ("attention-split", po::value(&split_arg)->default_value("auto"),
     "CPU attention over threads, an ablation (same bits either way): auto (in phases by slots and channels "
     "when there are fewer (request, KV head) jobs than twice the threads), phases, or whole (one job per "
     "request, KV head and row tile)")
    ("device", po::value(&device_arg)->default_value("cpu"), "cpu, or cuda[:N] for the GPU forward")
    ("dtype", po::value(&dtype_arg)->default_value("auto"), "float32, bfloat16 or float16; auto: float32 on cpu, bfloat16 on cuda")
    ("page-size", po::value(&page_size)->default_value(16), "KV cache page size in tokens (a multiple of 16)")
    ("prefill-chunk", po::value(&prefill_chunk)->default_value(512), "prompt tokens per request per prefill forward")
    ("json", po::bool_switch(&json), "print one JSON object per configuration instead of a table");
  // clang-format on
  add_compute_options(desc, compute_arg);
  po::variables_map vm;
  const std::string example =
      "Examples:\n  vericache bench --contexts 512,2048 --batches 1,8 --decode-tokens 32\n"
      "  vericache bench --random-weights llama-3.1-8b --device cuda --contexts 8192 --batches 1,8\n"
      "  vericache bench --window 1,17 --contexts 2048 --batches 1   (a verify window in decode steps)\n";
  if (auto done = parse_command_line("bench", desc, example, argc, argv, &vm,
                                     {{"decode-tokens", 2, 1 << 20}, kThreadsRange, kPageSizeRange, kPrefillChunkRange}))
    return *done;
  std::vector<int64_t> contexts, batches, windows;
  try {
    contexts = parse_positive_list(contexts_arg, "contexts", kMaxContextLength);
    batches = parse_positive_list(batches_arg, "batches", 4096);
    windows = parse_positive_list(window_arg, "window", 1024);
  } catch (const po::error& e) {
    return report_usage_error("bench", e.what());
  }
  auto load_options = parse_load_options(device_arg, dtype_arg);
  if (!load_options.ok()) return report_usage_error("bench", load_options.status().message());
  if (split_arg == "phases") {
    set_attention_split(AttentionSplit::kAlways);
  } else if (split_arg == "whole") {
    set_attention_split(AttentionSplit::kNever);
  } else if (split_arg != "auto") {
    return report_usage_error("bench", "--attention-split " + split_arg + ": give auto, phases or whole");
  }
  const bool random = vm.count("random-weights") > 0;
  if (random && (vm.count("model") || !vm["text-file"].defaulted())) {
    return report_usage_error("bench", "--random-weights replaces --model and --text-file; pass one or the other");
  }
  if (random) {
    if (auto shape = find_named_shape(random_shape); !shape.ok()) {
      return report_usage_error("bench", "--random-weights: " + shape.status().message());
    }
  }
  set_threads(threads);
  auto loaded = random ? LlamaModel::with_random_weights(random_shape, 1, *load_options) : load_model(model_arg, compute_arg, *load_options);
  if (!loaded.ok()) return report_error(loaded.status());
  if (random) {
    if (Status s = apply_kv_cache(**loaded, compute_arg.kv_cache); !s.ok()) return report_error(s);
  }
  const LlamaModel& m = **loaded;
  const std::string model_name = random ? m.path() + " (random weights, timing only)" : m.path();

  std::vector<int32_t> corpus;
  if (!random && vm["window"].defaulted()) {
    std::stringstream text;
    auto file = MappedFile::open(text_file);
    if (!file.ok()) return report_error(file.status());
    text.write(reinterpret_cast<const char*>(file->data()), static_cast<std::streamsize>(file->size()));
    corpus = m.tokenizer().encode(text.str(), false);
  }
  const std::string engine = m.forward_path() == ForwardPath::kCpuKernels ? std::string(m.kernels().isa) + " kernels"
                                                                          : "torch forward";
  // Bytes a decode step must read at least: every weight matrix once, as held, plus each request's K/V.
  const int64_t weight_bytes = m.decode_weight_bytes();
  const int64_t kv_bytes_per_token = m.config().n_layers * m.kv_bytes_per_slot();
  if (random || !vm["window"].defaulted()) {
    const WindowTimingSetup setup{m, model_name, random, engine, weight_bytes, kv_bytes_per_token, decode_tokens, page_size, json};
    return time_windows(setup, contexts, batches, windows);
  }
  if (!json) {
    std::printf("model %s (%s), %s %s, %d threads, %s, compute %s, K/V %s\n", model_name.c_str(),
                m.weight_type().c_str(), m.device().str().c_str(), c10::toString(m.dtype()), ThreadPool::global().threads(),
                engine.c_str(), compute_name(m.compute()), kv_cache_name(m).c_str());
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
                           {"model", model_name}, {"compute", compute_name(m.compute())}, {"kv_cache", kv_cache_name(m)},
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
