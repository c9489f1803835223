// vericache bench-attention: one decode step of a batch at a long context, on the float cache and on
// quantized caches, with the attention part of the step timed apart (unpack + attention kernels,
// ForwardTimes). The quantizer issue's speed check: reading a fraction of the bytes must show.
//
// One prompt is cut from the text and prefilled once (full KV, in the --kv-cache pages); each of the B requests gets
// its own copy of that cache (separate pages, so no request reads another's bytes from a warm cache).
// A quantizer packs each copy's whole blocks (pack_front, as the engine does after a prefill); a
// quantizer whose pages are in a standard layout is measured twice, read in place by the fused
// kernel and through unpack(), and the two must produce the same tokens. Steps are greedy, one
// token per request; new tokens stay in the float residual (the benchmark does not pack them).
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>

#include "bench_support.h"
#include "cli_common.h"
#include "commands.h"
#include "engine/compression.h"
#include "kv/packed_page_pool.h"
#include "util/thread_pool.h"

namespace po = boost::program_options;

namespace vericache::cli {
namespace {

// One cache configuration: float32, or a quantizer's packed pages read one way.
struct Config {
  std::string label;
  std::shared_ptr<Compressor> quantizer;  // null: the float cache
  PackedFormat format;                    // as the forward sees it (kOpaque: through unpack())
  bool same_tokens_as_previous = false;   // the same pages read the other way: the tokens must agree
};

struct Measured {
  double step_ms = 0, attention_ms = 0, pack_seconds = 0;
  int64_t resident_bytes = 0;  // per request, after packing
  std::vector<std::vector<int32_t>> tokens;
};

int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

// B copies of `base`, packed as `config` says, decoded `steps` steps; the first step is a warm-up.
// Every copy is request 0 to the quantizer: the copies hold the same prompt, so whatever it kept
// from observing the prefill (RotateKV's sinks) holds for each.
Result<Measured> measure(const LlamaModel& m, const Config& config, const SequenceKv& base, const PagePool& base_pool,
                         std::span<const float> next_logits, PagePool& pool, int64_t batch, int64_t steps) {
  const int64_t layers = m.config().n_layers, context = base.length(0), vocab = m.config().vocab_size;
  std::vector<SequenceKv> caches;
  caches.reserve(batch);
  for (int64_t i = 0; i < batch; ++i) caches.emplace_back(layers);
  std::optional<PackedPagePool> packed;
  Measured out;
  auto release = [&] {
    for (SequenceKv& kv : caches) {
      if (packed) kv.release_packed(*packed);
      kv.release(pool);
    }
    if (config.quantizer) config.quantizer->release(0);
  };
  Status s;
  for (int64_t i = 0; i < batch && s.ok(); ++i) s = caches[i].append_range(pool, base, base_pool, 0, context);
  if (s.ok() && config.quantizer) {
    auto created = PackedPagePool::create(batch * layers * pool.spec().pages_for(context), config.format.bytes_per_page);
    if (!created.ok()) {
      release();
      return created.status();
    }
    packed.emplace(std::move(*created));
    const double t0 = now_seconds();
    for (int64_t i = 0; i < batch && s.ok(); ++i) {
      s = pack_front(*config.quantizer, config.format, pool, *packed, caches[i], 0);
    }
    out.pack_seconds = now_seconds() - t0;
  }
  if (s.ok()) out.resident_bytes = resident_kv_bytes(caches[0], pool, config.quantizer ? &config.format : nullptr);

  std::vector<int32_t> tokens(batch, argmax(next_logits.data(), vocab));
  std::vector<int32_t> positions(batch, static_cast<int32_t>(context));
  out.tokens.assign(batch, {});
  double step_seconds = 0;
  ForwardTimes times;
  for (int64_t step = 0; step < steps && s.ok(); ++step) {
    std::vector<ForwardItem> items;
    for (int64_t i = 0; i < batch; ++i) {
      ForwardItem item{std::span(&tokens[i], 1), std::span(&positions[i], 1), &caches[i], &pool, LogitRows::kLast, 0};
      if (config.quantizer) {
        item.packed_pool = &*packed;
        item.unpacker = config.quantizer.get();
        item.packed_format = &config.format;
      }
      items.push_back(item);
    }
    at::Tensor logits;
    ForwardTimes step_times;
    const double t0 = now_seconds();
    s = m.forward(items, &logits, {}, &step_times);
    if (step > 0) {  // the first step warms caches and allocators
      step_seconds += now_seconds() - t0;
      times.attention_seconds += step_times.attention_seconds;
    }
    for (int64_t i = 0; i < batch && s.ok(); ++i) {
      out.tokens[i].push_back(tokens[i]);
      tokens[i] = argmax(logits[i].data_ptr<float>(), vocab);
      ++positions[i];
    }
  }
  release();
  if (!s.ok()) return s;
  out.step_ms = 1e3 * step_seconds / static_cast<double>(steps - 1);
  out.attention_ms = 1e3 * times.attention_seconds / static_cast<double>(steps - 1);
  return out;
}

}  // namespace

int run_bench_attention(int argc, char** argv) {
  ComputeArgs compute_arg;
  std::string model_arg, text_file;
  std::vector<std::string> quantizer_args;
  int64_t context = 8160, batch = 8, steps = 6, page_size = 16, prefill_chunk = 512;
  int threads = 0;
  bool json = false;
  po::options_description desc(
      "vericache bench-attention: a decode step at a long context on the float cache (--kv-cache) and on quantized\n"
      "caches, the attention part of the step (unpack + attention kernels) timed apart (CPU kernels).\n\n"
      "One prompt of --context tokens is prefilled once; each of the --batch requests decodes its own\n"
      "copy of that cache. A quantizer packs each copy's whole blocks; one whose pages are in a standard\n"
      "layout is measured read in place (the fused dequantize-attention kernel) and through unpack().\n"
      "Times are means over --steps greedy steps after one warm-up step.\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("text-file", po::value(&text_file)->default_value(VC_DEFAULT_BENCH_TEXT), "text the prompt is cut from")
    ("context", po::value(&context)->default_value(8160), "prompt tokens (with --steps, within the model's context)")
    ("batch", po::value(&batch)->default_value(8), "requests decoding together")
    ("steps", po::value(&steps)->default_value(6), "decode steps per configuration, the first a warm-up")
    ("quantizer", po::value(&quantizer_args)->composing(),
     "NAME or NAME=JSON: a quantizer and its parameters (repeatable; default kivi at 4 and at 2 bits)")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores")
    ("page-size", po::value(&page_size)->default_value(16), "KV page size in tokens (a multiple of 16)")
    ("prefill-chunk", po::value(&prefill_chunk)->default_value(512), "prompt tokens per prefill forward")
    ("json", po::bool_switch(&json), "print one JSON object per configuration instead of a table");
  // clang-format on
  add_compute_options(desc, compute_arg);
  po::variables_map vm;
  const std::string example =
      "Example:\n  vericache bench-attention --context 8160 --batch 8 --quantizer 'kivi={\"bits\": 4}' "
      "--quantizer 'kivi={\"bits\": 2}'\n";
  if (auto done = parse_command_line("bench-attention", desc, example, argc, argv, &vm,
                                     {{"context", 16, kMaxContextLength}, {"batch", 1, 4096}, {"steps", 2, 1 << 16},
                                      kThreadsRange, kPageSizeRange, kPrefillChunkRange}))
    return *done;
  if (quantizer_args.empty()) quantizer_args = {R"(kivi={"bits": 4})", R"(kivi={"bits": 2})"};
  set_threads(threads);
  auto loaded = load_model(model_arg, compute_arg);
  if (!loaded.ok()) return report_error(loaded.status());
  const LlamaModel& m = **loaded;
  const int64_t layers = m.config().n_layers;
  if (Status s = check_contexts_fit(m, {context}, steps, 0); !s.ok()) return report_status("bench-attention", s);
  auto base_pool = m.make_page_pool(page_size, layers * (context / page_size + 2));
  auto pool = m.make_page_pool(page_size, batch * layers * ((context + steps) / page_size + 2));
  if (!base_pool.ok() || !pool.ok()) return report_error(base_pool.ok() ? pool.status() : base_pool.status());

  std::vector<Config> configs{{kv_cache_name(m), nullptr, {}}};
  for (const std::string& arg : quantizer_args) {
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq), params = eq == std::string::npos ? "{}" : arg.substr(eq + 1);
    auto q = load_compressor_for(name, params, {}, m);
    if (!q.ok()) return report_status("bench-attention", q.status());
    if ((*q)->family() != CompressorFamily::kQuantization) {
      return report_usage_error("bench-attention", name + " is not a quantizer (--quantizer takes kivi, kvquant, rotatekv, ...)");
    }
    auto format = checked_packed_format(**q, pool->spec());
    if (!format.ok()) return report_error(format.status());
    const std::string label = name + " " + std::to_string(format->bit_scheme) + "-bit";
    if (format->layout != PackedLayout::kOpaque) {
      configs.push_back({label + " in place", *q, *format});
      format->layout = PackedLayout::kOpaque;
      configs.push_back({label + " unpack()", *q, *format, true});
    } else {
      configs.push_back({label + " unpack()", *q, *format});
    }
  }

  auto corpus = bench_corpus(m, text_file, context);
  if (!corpus.ok()) return report_status("bench-attention", corpus.status());
  const std::vector<int32_t> prompt(corpus->begin(), corpus->begin() + context);
  SequenceKv base(layers);
  std::vector<float> next_logits;
  std::fprintf(stderr, "[bench-attention] prefill of %lld tokens\n", static_cast<long long>(context));
  const double t0 = now_seconds();
  // Quantizers that read the prefill (RotateKV's sinks) see it here, as request 0.
  std::vector<std::shared_ptr<Compressor>> observers;
  for (const Config& c : configs) {
    if (c.quantizer && std::find(observers.begin(), observers.end(), c.quantizer) == observers.end()) {
      observers.push_back(c.quantizer);
    }
  }
  if (Status s = prefill_observed(m, *base_pool, base, prompt, prefill_chunk, observers, 1.0, &next_logits); !s.ok()) {
    return report_error(s);
  }
  std::fprintf(stderr, "[bench-attention] prefill %.1f s\n", now_seconds() - t0);

  if (!json) {
    std::printf("| cache | resident KV / request (MiB) | of the float cache | step ms | attention ms | attention GB/s read | "
                "attention speedup | step speedup |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
  }
  std::optional<Measured> float_run;
  std::vector<std::vector<int32_t>> previous_tokens;
  for (const Config& c : configs) {
    std::fprintf(stderr, "[bench-attention] %s: %lld requests x %lld steps\n", c.label.c_str(),
                 static_cast<long long>(batch), static_cast<long long>(steps));
    auto r = measure(m, c, base, *base_pool, next_logits, *pool, batch, steps);
    if (!r.ok()) return report_error(r.status());
    if (!float_run) float_run = *r;
    if (c.same_tokens_as_previous && r->tokens != previous_tokens) {
      return report_error(Status::internal(c.label + ": the tokens differ from reading the same pages in place"));
    }
    previous_tokens = r->tokens;
    // Attention reads every request's resident KV once per step.
    const double gb_s = static_cast<double>(r->resident_bytes * batch) / (r->attention_ms * 1e6);
    const double fraction = static_cast<double>(r->resident_bytes) / static_cast<double>(float_run->resident_bytes);
    const double attention_speedup = float_run->attention_ms / r->attention_ms, step_speedup = float_run->step_ms / r->step_ms;
    if (json) {
      const nlohmann::json out{{"cache", c.label},          {"context", context},
                               {"batch", batch},            {"steps", steps - 1},
                               {"bits", c.quantizer ? c.format.bit_scheme : 32},
                               {"resident_kv_bytes_per_request", r->resident_bytes},
                               {"resident_fraction", fraction},
                               {"step_ms", r->step_ms},     {"attention_ms", r->attention_ms},
                               {"attention_gb_s", gb_s},    {"attention_speedup", attention_speedup},
                               {"step_speedup", step_speedup},
                               {"pack_seconds", r->pack_seconds},
                               {"threads", ThreadPool::global().threads()},
                               {"kernels", m.kernels().isa}, {"model", m.path()}, {"compute", compute_name(m.compute())}, {"kv_cache", kv_cache_name(m)}};
      std::cout << out.dump() << std::endl;
    } else {
      std::printf("| %s | %.1f | %.3f | %.1f | %.1f | %.1f | %.2fx | %.2fx |\n", c.label.c_str(),
                  static_cast<double>(r->resident_bytes) / 1048576.0, fraction, r->step_ms, r->attention_ms, gb_s,
                  attention_speedup, step_speedup);
      std::fflush(stdout);
    }
  }
  base.release(*base_pool);
  return kExitOk;
}

}  // namespace vericache::cli
