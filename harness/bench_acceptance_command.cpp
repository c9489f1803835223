// vericache bench-acceptance: what a compressed cache is worth as a drafter. For each context,
// compressor and kept fraction c it reports the mean acceptance length of VeriCache (draft length
// x, greedy) and the per-step KL(p_full || p_compressed) of decoding on the compressed cache along
// the full-KV greedy continuation (teacher forced), on the same prompt and tokens. No timings: the
// answer to how acceptance scales with model size and context, not to how fast a run is.
//
// Per context, one prompt is cut from the text and prefilled once with every compressor observing
// it; each (compressor, c) keeps its set from that prefill. The full-KV greedy continuation the KL
// follows is also what every VeriCache run is checked against, token for token.
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "bench_support.h"
#include "cli_common.h"
#include "commands.h"
#include "engine/compression.h"
#include "engine/compression_divergence.h"
#include "engine/draft_verify_engine.h"
#include "engine/engine_pools.h"
#include "engine/sampler.h"
#include "util/thread_pool.h"

namespace po = boost::program_options;

namespace vericache::cli {
namespace {

// "0.1,0.25" as kept fractions in (0, 1]; throws po::error naming the bad item.
std::vector<double> parse_ratios(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t used = 0;
    double r = 0;
    try {
      r = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || !(r > 0 && r <= 1)) {
      throw po::error("--ratios: '" + item + "' is not a kept fraction in (0, 1]");
    }
    out.push_back(r);
  }
  if (out.empty()) throw po::error("--ratios is empty");
  return out;
}

struct Row {
  int64_t context = 0;
  int64_t prompt_tokens = 0;
  std::string compressor;
  double ratio = 0;
  double kept_fraction = 0;  // a quantizer: resident bytes over full-precision bytes, at the end
  int bits = 0;              // a quantizer's bit width; 0 for token dropping
  RequestMetrics metrics;
  std::vector<DivergenceStep> divergence;
  int64_t mismatches = 0;
};

double mean_kl(const Row& r) {
  double sum = 0;
  for (const DivergenceStep& d : r.divergence) sum += d.kl;
  return r.divergence.empty() ? 0.0 : sum / static_cast<double>(r.divergence.size());
}

double top1_agreement(const Row& r) {
  int64_t same = 0;
  for (const DivergenceStep& d : r.divergence) same += d.same_argmax ? 1 : 0;
  return r.divergence.empty() ? 0.0 : static_cast<double>(same) / static_cast<double>(r.divergence.size());
}

void print(const Row& r, int64_t x, bool json, const LlamaModel& m) {
  if (json) {
    std::vector<double> kl;
    std::vector<int32_t> tokens;
    for (const DivergenceStep& d : r.divergence) {
      kl.push_back(d.kl);
      tokens.push_back(d.token);
    }
    nlohmann::json out{{"model", m.path()}, {"compute", compute_name(m.compute())}, {"kv_cache", kv_cache_name(m)},
                       {"context", r.context},
                       {"prompt_tokens", r.prompt_tokens},
                       {"compressor", r.compressor},
                       {"ratio", r.ratio},
                       {"kept_fraction", r.kept_fraction},
                       {"bits", r.bits},
                       {"draft_length", x},
                       {"mean_acceptance_length", r.metrics.mean_acceptance_length()},
                       {"acceptance_rate", r.metrics.acceptance_rate()},
                       {"drafts", r.metrics.drafts},
                       {"accepted_per_position", r.metrics.accepted_per_position},
                       {"drafted_per_position", r.metrics.drafted_per_position},
                       {"mean_kl", mean_kl(r)},
                       {"kl_per_step", kl},
                       {"top1_agreement", top1_agreement(r)},
                       {"output", m.tokenizer().decode(tokens, false)},
                       {"mismatches", r.mismatches},
                       {"threads", ThreadPool::global().threads()}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;  // output may cut UTF-8
  } else {
    std::printf("| %lld | %s | %.2f | %.3f | %lld | %.2f | %.3f | %.4f | %.3f | %lld |\n",
                static_cast<long long>(r.context), r.compressor.c_str(), r.ratio, r.kept_fraction,
                static_cast<long long>(x), r.metrics.mean_acceptance_length(), r.metrics.acceptance_rate(), mean_kl(r),
                top1_agreement(r), static_cast<long long>(r.mismatches));
    std::fflush(stdout);
  }
}

}  // namespace

int run_bench_acceptance(int argc, char** argv) {
  ComputeArgs compute_arg;
  std::string model_arg, text_file, contexts_arg, compressors_arg, ratios_arg, question;
  std::vector<std::string> params_args;
  int64_t draft_length = 16, decode_tokens = 64, page_size = 16, prefill_chunk = 512;
  int threads = 0;
  bool json = false;
  po::options_description desc(
      "vericache bench-acceptance: mean acceptance length and per-step KL of each compressor's cache,\n"
      "per context and kept fraction c, on one model. Per context one prompt (the first C tokens of\n"
      "--text-file) is prefilled once; each compressor keeps its set at each c from that prefill. The\n"
      "KL is KL(p_full || p_compressed) of the next token, teacher forced along the full-KV greedy\n"
      "continuation of --decode-tokens tokens; VeriCache (batch 1, greedy, verify in place) decodes\n"
      "the same tokens and is checked against them.\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("text-file", po::value(&text_file)->default_value(VC_DEFAULT_BENCH_TEXT), "text the prompts are cut from")
    ("contexts", po::value(&contexts_arg)->default_value("2048"), "comma-separated prompt lengths in tokens")
    ("question", po::value(&question),
     "ask this about the text in a chat-template user message (the model answers) instead of letting it continue "
     "the raw text; the text is cut so the prompt holds about C tokens")
    ("compressors", po::value(&compressors_arg)->default_value("snapkv,expected_attention,kvzip"),
     "comma-separated offline compressors or quantizers (one row per context: a quantizer keeps every token)")
    ("params", po::value(&params_args)->composing(),
     "NAME=JSON: parameters of one compressor, e.g. kvzip='{\"chunk_size\": 128}' (repeatable)")
    ("ratios", po::value(&ratios_arg)->default_value("0.1,0.25,0.5"), "comma-separated kept fractions c")
    ("draft-length,x", po::value(&draft_length)->default_value(16), "tokens drafted per verify window")
    ("decode-tokens", po::value(&decode_tokens)->default_value(64), "tokens generated (EOS ignored); also the KL steps")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores")
    ("page-size", po::value(&page_size)->default_value(16), "KV page size in tokens (a multiple of 16)")
    ("prefill-chunk", po::value(&prefill_chunk)->default_value(512), "prompt tokens per prefill forward")
    ("json", po::bool_switch(&json), "print one JSON object per (context, compressor, c) instead of a table");
  // clang-format on
  add_compute_options(desc, compute_arg);
  po::variables_map vm;
  const std::string example =
      "Example:\n  vericache bench-acceptance --model qwen2.5-coder-0.5b --contexts 2048 --compressors snapkv "
      "--ratios 0.25\n";
  if (auto done = parse_command_line("bench-acceptance", desc, example, argc, argv, &vm,
                                     {{"draft-length", 1, 256}, {"decode-tokens", 2, 1 << 16}, kThreadsRange,
                                      kPageSizeRange, kPrefillChunkRange}))
    return *done;
  std::vector<int64_t> contexts;
  std::vector<double> ratios;
  try {
    contexts = parse_positive_list(contexts_arg, "contexts", kMaxContextLength);
    ratios = parse_ratios(ratios_arg);
  } catch (const po::error& e) {
    return report_usage_error("bench-acceptance", e.what());
  }
  set_threads(threads);
  auto loaded = load_model(model_arg, compute_arg);
  if (!loaded.ok()) return report_error(loaded.status());
  const LlamaModel& m = **loaded;
  const int64_t layers = m.config().n_layers;
  auto compressors = load_offline_compressors(compressors_arg, params_args, m);
  if (!compressors.ok()) return report_status("bench-acceptance", compressors.status());
  if (Status s = check_contexts_fit(m, contexts, decode_tokens, draft_length + 1); !s.ok()) {
    return report_status("bench-acceptance", s);
  }
  auto corpus = bench_corpus(m, text_file, *std::max_element(contexts.begin(), contexts.end()));
  if (!corpus.ok()) return report_status("bench-acceptance", corpus.status());
  if (!json) {
    std::printf("| context | compressor | c | kept | x | mean acceptance length | acceptance rate | mean KL (nats/step) "
                "| top-1 agreement | mismatches |\n");
    std::printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  }

  int64_t total_mismatches = 0;
  for (int64_t context : contexts) {
    auto cut = bench_prompt(m, *corpus, context, question);
    if (!cut.ok()) return report_status("bench-acceptance", cut.status());
    const std::vector<int32_t>& prompt = *cut;
    const auto n = static_cast<int64_t>(prompt.size());  // `context`, or a token or two off with --question
    if (n + decode_tokens + draft_length + 1 > m.config().context_length) {
      return report_usage_error("bench-acceptance", "the prompt of context " + std::to_string(context) + " holds " +
                                                        std::to_string(n) + " tokens: too long for the model");
    }
    const int64_t cache_pages = layers * ((n + decode_tokens + draft_length) / page_size + 2);
    auto base_pool = m.make_page_pool(page_size, 2 * cache_pages);  // kvzip's scoring forwards need room
    if (!base_pool.ok()) return report_error(base_pool.status());
    SequenceKv base(layers);
    std::vector<float> next_logits;
    std::fprintf(stderr, "[bench-acceptance] context %lld: prefill\n", static_cast<long long>(context));
    if (Status s = prefill_observed(m, *base_pool, base, prompt, prefill_chunk, *compressors, ratios[0], &next_logits);
        !s.ok()) {
      return report_error(s);
    }
    // The full-KV greedy continuation, once per context: the KL's reference and the expected output.
    std::fprintf(stderr, "[bench-acceptance] context %lld: full-KV greedy continuation\n",
                 static_cast<long long>(context));
    const int32_t first = argmax(next_logits.data(), m.config().vocab_size);
    GreedyReference reference;
    {
      auto full_pool = m.make_page_pool(page_size, cache_pages);
      if (!full_pool.ok()) return report_error(full_pool.status());
      SequenceKv full(layers);
      Status s = full.append_range(*full_pool, base, *base_pool, 0, n);
      auto greedy = s.ok() ? full_kv_greedy_reference(m, *full_pool, full, first, n, decode_tokens)
                           : Result<GreedyReference>(s);
      full.release(*full_pool);
      if (!greedy.ok()) return report_error(greedy.status());
      reference = std::move(*greedy);
    }
    auto compressed_pool = m.make_page_pool(page_size, cache_pages);
    if (!compressed_pool.ok()) return report_error(compressed_pool.status());

    for (const std::shared_ptr<Compressor>& compressor : *compressors) {
      // A quantizer keeps every token (one row per context, whatever --ratios says); its cache is
      // packed as the engine packs one.
      const bool quantizer = compressor->family() == CompressorFamily::kQuantization;
      PackedFormat format;
      if (quantizer) {
        auto f = checked_packed_format(*compressor, compressed_pool->spec());
        if (!f.ok()) return report_error(f.status());
        format = *f;
      }
      const std::vector<double> row_ratios = quantizer ? std::vector<double>{1.0} : ratios;
      // Every kept set first: the engine releases the compressor's state of the request it finishes.
      std::vector<CompressedKV> kept_sets(row_ratios.size());
      for (size_t i = 0; i < row_ratios.size(); ++i) {
        if (quantizer) {
          const at::Tensor all = at::arange(n, at::kLong).unsqueeze(0).expand({m.config().n_kv_heads, n}).contiguous();
          kept_sets[i].kept.assign(layers, all);
          continue;
        }
        std::fprintf(stderr, "[bench-acceptance] context %lld: %s compress at c = %.2f\n",
                     static_cast<long long>(context), compressor->name().c_str(), row_ratios[i]);
        if (Status s = compute_kept(m, *base_pool, *compressor, row_ratios[i], prompt, 0, base, &kept_sets[i]); !s.ok()) {
          return report_error(s);
        }
      }
      compressor->release(0);
      for (size_t i = 0; i < row_ratios.size(); ++i) {
        const double ratio = row_ratios[i];
        const CompressedKV& kept = kept_sets[i];
        std::fprintf(stderr, "[bench-acceptance] context %lld: %s at c = %.2f: KL and VeriCache\n",
                     static_cast<long long>(context), compressor->name().c_str(), ratio);
        Row row;
        row.context = context;
        row.prompt_tokens = static_cast<int64_t>(prompt.size());
        row.compressor = quantizer ? compressor->name() + " " + std::to_string(format.bit_scheme) + "-bit"
                                   : compressor->name();
        row.bits = quantizer ? format.bit_scheme : 0;
        row.ratio = ratio;
        int64_t kept_slots = 0;
        for (const at::Tensor& k : kept.kept) kept_slots += k.size(1);
        row.kept_fraction = static_cast<double>(kept_slots) / static_cast<double>(layers * n);

        SequenceKv compressed(layers);
        if (Status s = compressed.assign_kept(*compressed_pool, base, *base_pool, kept.kept); !s.ok()) {
          return report_error(s);
        }
        Result<std::vector<DivergenceStep>> divergence = Status::internal("not measured");
        if (quantizer) {
          auto packed_pool = PackedPagePool::create(cache_pages, format.bytes_per_page);
          if (!packed_pool.ok()) return report_error(packed_pool.status());
          const Packing packing{compressor.get(), format, &*packed_pool, /*request_id=*/0};  // prefill_observed's id
          const Status s = pack_front(*compressor, format, *compressed_pool, *packed_pool, compressed, packing.request_id);
          divergence = s.ok() ? divergence_along(m, reference, *compressed_pool, compressed, n, nullptr, 1.0, &packing)
                              : Result<std::vector<DivergenceStep>>(s);
          compressed.release_packed(*packed_pool);
        } else {
          divergence = divergence_along(m, reference, *compressed_pool, compressed, n);
        }
        compressed.release(*compressed_pool);
        if (!divergence.ok()) return report_error(divergence.status());
        row.divergence = std::move(*divergence);

        EngineOptions options;
        options.draft_length = draft_length;
        options.ratio = ratio;
        options.compressor = compressor.get();
        GenerationRequest request;
        request.prompt = prompt;
        request.max_new_tokens = decode_tokens;
        request.ignore_eos = true;
        auto pools = make_engine_pools(m, options, page_size, std::span(&request, 1));
        if (!pools.ok()) return report_error(pools.status());
        DraftVerifyEngine engine(m, pools->device, pools->host, options);
        // The engine's first request gets id 0, the id prefill_observed reported the prompt under: what
        // a compressor recorded at prefill (RotateKV's sink tokens) is found under the engine's id.
        auto id = engine.add_prefilled(request, base, *base_pool, next_logits, kept.kept);
        if (!id.ok()) return report_error(id.status());
        if (Status r = engine.run(); !r.ok()) return report_error(r);
        const std::vector<EngineResult> results = engine.take_finished();
        const std::vector<int32_t>& got = results.at(0).generation.tokens;
        const std::vector<int32_t>& want = reference.tokens;
        for (size_t j = 0; j < std::max(got.size(), want.size()); ++j) {
          row.mismatches += (j >= got.size() || j >= want.size() || got[j] != want[j]);
        }
        total_mismatches += row.mismatches;
        row.metrics = engine.totals();
        if (quantizer) {
          row.kept_fraction = static_cast<double>(row.metrics.resident_kv_bytes) /
                              static_cast<double>(std::max<int64_t>(row.metrics.full_kv_bytes, 1));
        }
        print(row, draft_length, json, m);
      }
    }
    base.release(*base_pool);
  }
  if (total_mismatches > 0) {
    return report_error(Status::internal(std::to_string(total_mismatches) + " tokens differ from full-KV decoding"));
  }
  return kExitOk;
}

}  // namespace vericache::cli
