// vericache bench-engine: decode tokens/s of VeriCache (draft on the compressed cache, verify in
// place on the full one) against full-KV decoding in the same run, over contexts, batch sizes,
// compressors, draft policies and draft lengths (under an adaptive policy, the longest window).
//
// Per context, request i of a batch takes the i-th stretch of `context` tokens of the text (all the
// same stretch with --same-prompt); each prompt is prefilled once (every offline compressor sees the
// prefill through update()) and compressed once per compressor, and the engine's requests start
// from copies of those prefills. The full-KV baseline decodes the same prompts before the first
// VeriCache run of a batch size and again after each one, and a run's ratios are against the mean
// of the baselines just before and just after it (the machine's speed drifts: on a shared 2-core
// VM two baselines minutes apart differed by 25%; the table's drift column is how far apart the
// two are). Every VeriCache run is checked token for token against the baseline (greedy).
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <set>

#include "bench_support.h"
#include "cli_common.h"
#include "commands.h"
#include "draft_policy_options.h"
#include "engine/compression.h"
#include "engine/draft_verify_engine.h"
#include "engine/engine_pools.h"
#include "util/thread_pool.h"

namespace po = boost::program_options;

namespace vericache::cli {

int run_bench_engine(int argc, char** argv) {
  ComputeArgs compute_arg;
  std::string model_arg, text_file, contexts_arg, batches_arg, compressors_arg, drafts_arg, policies_arg,
      adaptive_drafts_arg;
  DraftPolicyArgs policy_args;
  std::vector<std::string> params_args;
  int64_t decode_tokens = 64, page_size = 16, prefill_chunk = 512;
  double ratio = 0.25;
  int threads = 0;
  bool json = false, same_prompt = false;
  po::options_description desc(
      "vericache bench-engine: decode tokens/s of VeriCache against full-KV decoding in the same run\n"
      "(CPU, verification in place). Per context each request of a batch has its own prompt (the next\n"
      "stretch of the text), prefilled once and compressed once per compressor. The full-KV baseline\n"
      "runs before the first VeriCache run and again after each, and each row's ratios are against\n"
      "the mean of the baselines just before and just after it (drift: how far those two differ).\n"
      "Speedup is over the whole run: a static batch ends with a tail in which requests that\n"
      "finished early leave it part empty (full-KV requests all finish together). Speedup at full\n"
      "batch is the steady state: tokens committed per second in the steps that carried every\n"
      "request of the batch, the rate continuous batching would keep up.\n"
      "Every run is checked token for token against the full-KV baseline.\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("text-file", po::value(&text_file)->default_value(VC_ENGINE_BENCH_TEXT),
     "text the prompts are cut from: files joined by commas, each plain text or a prompt set (.json); the default "
     "is the four built prompt sets (not text the model has memorized)")
    ("same-prompt", po::bool_switch(&same_prompt),
     "every request decodes a copy of one prompt (the first stretch) instead of its own stretch")
    ("contexts", po::value(&contexts_arg)->default_value("2048,8000"), "comma-separated prompt lengths in tokens")
    ("batches", po::value(&batches_arg)->default_value("1,8"), "comma-separated batch sizes")
    ("compressors", po::value(&compressors_arg)->default_value("kvzip,snapkv"), "comma-separated offline compressors or quantizers (the engine packs a quantizer's cache)")
    ("params", po::value(&params_args)->composing(),
     "NAME=JSON: parameters of one compressor, e.g. kvzip='{\"chunk_size\": 128}' (repeatable)")
    ("ratio,c", po::value(&ratio)->default_value(0.25), "kept fraction c")
    ("draft-lengths", po::value(&drafts_arg)->default_value("8,16,25"), "comma-separated draft lengths x of the fixed policy")
    ("draft-policies", po::value(&policies_arg)->default_value("fixed"),
     "comma-separated draft policies: fixed (at every --draft-lengths), confidence, tiers, goodput (at every "
     "--adaptive-draft-lengths; vericache run --help says what each does)")
    ("adaptive-draft-lengths", po::value(&adaptive_drafts_arg)->default_value("16"),
     "comma-separated longest windows the adaptive policies run at")
    ("decode-tokens", po::value(&decode_tokens)->default_value(64), "tokens generated per request (EOS ignored)")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores")
    ("page-size", po::value(&page_size)->default_value(16), "KV page size in tokens (a multiple of 16)")
    ("prefill-chunk", po::value(&prefill_chunk)->default_value(512), "prompt tokens per prefill forward")
    ("json", po::bool_switch(&json), "print one JSON object per configuration instead of a table");
  // clang-format on
  add_compute_options(desc, compute_arg);
  add_draft_policy_tuning_options(desc, policy_args);
  po::variables_map vm;
  const std::string example =
      "Example:\n  vericache bench-engine --contexts 2048 --batches 1 --compressors snapkv --draft-lengths 8\n";
  std::vector<OptionRange> ranges = {{"decode-tokens", 2, 1 << 20}, kRatioRange, kThreadsRange, kPageSizeRange,
                                     kPrefillChunkRange};
  ranges.insert(ranges.end(), kDraftPolicyTuningRanges.begin(), kDraftPolicyTuningRanges.end());
  if (auto done = parse_command_line("bench-engine", desc, example, argc, argv, &vm,
                                     ranges))
    return *done;
  std::vector<int64_t> contexts, batches, drafts, adaptive_drafts;
  std::vector<DraftPolicyOptions> policies;
  for (const std::string& name : split_list(policies_arg)) {
    policy_args.policy = name;
    if (!parse_draft_policy(name)) {
      return report_usage_error("bench-engine", "--draft-policies: '" + name + "' is not one of " + kDraftPolicyNames);
    }
    policies.push_back(*draft_policy_options(policy_args));
  }
  if (policies.empty()) return report_usage_error("bench-engine", "--draft-policies is empty");
  try {
    contexts = parse_positive_list(contexts_arg, "contexts", kMaxContextLength);
    batches = parse_positive_list(batches_arg, "batches", 4096);
    drafts = parse_positive_list(drafts_arg, "draft-lengths", 256);
    adaptive_drafts = parse_positive_list(adaptive_drafts_arg, "adaptive-draft-lengths", 256);
  } catch (const po::error& e) {
    return report_usage_error("bench-engine", e.what());
  }
  set_threads(threads);
  auto loaded = load_model(model_arg, compute_arg);
  if (!loaded.ok()) return report_error(loaded.status());
  const LlamaModel& m = **loaded;
  const int64_t layers = m.config().n_layers;
  auto compressors = load_offline_compressors(compressors_arg, params_args, m);
  if (!compressors.ok()) return report_status("bench-engine", compressors.status());
  // Every context is checked before the first one runs, so a bad one fails in seconds, not after hours.
  // (policy, x) in the order they run: fixed at each draft length, the others at each adaptive one.
  std::vector<std::pair<DraftPolicyOptions, int64_t>> runs;
  for (const DraftPolicyOptions& p : policies) {
    for (int64_t x : p.kind == DraftPolicyKind::kFixed ? drafts : adaptive_drafts) runs.emplace_back(p, x);
  }
  int64_t longest_x = 0;
  for (const auto& [p, x] : runs) longest_x = std::max(longest_x, x);
  if (Status s = check_contexts_fit(m, contexts, decode_tokens, longest_x + 1); !s.ok()) {
    return report_status("bench-engine", s);
  }
  const int64_t prompt_count = same_prompt ? 1 : *std::max_element(batches.begin(), batches.end());
  auto corpus = bench_corpus(m, text_file, *std::max_element(contexts.begin(), contexts.end()) * prompt_count);
  if (!corpus.ok()) return report_status("bench-engine", corpus.status());
  int64_t total_mismatches = 0;
  if (!json) {
    std::printf(
        "| context | batch | compressor | policy | x | drafts per window | windows of none | full-KV tok/s | VeriCache "
        "tok/s | speedup | speedup at full batch | time at full batch | mean acceptance length | acceptance rate "
        "| draft step ms | verify step ms | full-KV step ms | verify cost (decode steps) | fallback steps "
        "| fallback cost (decode steps) | full-KV drift | mismatches |\n");
    std::printf("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  }

  for (int64_t context : contexts) {
    // Request i of a batch takes the i-th stretch of `context` tokens (--same-prompt: all the first).
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t i = 0; i < prompt_count; ++i)
      prompts.emplace_back(corpus->begin() + i * context, corpus->begin() + (i + 1) * context);
    // One prefill per prompt, every compressor observing it, then each compressor's kept set.
    const int64_t pages_per_prompt = layers * ((context + 160) / page_size + 2);
    auto base_pool = m.make_page_pool(page_size, (prompt_count + 1) * pages_per_prompt + 4 * layers);
    if (!base_pool.ok()) return report_error(base_pool.status());
    std::vector<SequenceKv> bases(prompt_count, SequenceKv(layers));
    std::vector<std::vector<float>> next_logits(prompt_count);
    std::vector<std::vector<std::vector<at::Tensor>>> kept(compressors->size(),
                                                           std::vector<std::vector<at::Tensor>>(prompt_count));
    std::vector<double> compress_seconds(compressors->size());
    double prefill_seconds = 0;
    for (int64_t i = 0; i < prompt_count; ++i) {
      std::fprintf(stderr, "[bench-engine] context %lld: prefill and compress prompt %lld of %lld\n",
                   static_cast<long long>(context), static_cast<long long>(i + 1), static_cast<long long>(prompt_count));
      double t0 = now_seconds();
      if (Status s = prefill_observed(m, *base_pool, bases[i], prompts[i], prefill_chunk, *compressors, ratio,
                                      &next_logits[i]);
          !s.ok()) {
        return report_error(s);
      }
      prefill_seconds += now_seconds() - t0;
      for (size_t c = 0; c < compressors->size(); ++c) {
        if ((*compressors)[c]->family() == CompressorFamily::kQuantization) continue;  // the engine packs all
        t0 = now_seconds();
        CompressedKV out;
        const Status s = compute_kept(m, *base_pool, *(*compressors)[c], ratio, prompts[i], 0, bases[i], &out);
        (*compressors)[c]->release(0);
        if (!s.ok()) return report_error(s);
        kept[c][i] = std::move(out.kept);
        compress_seconds[c] += now_seconds() - t0;
      }
    }

    for (int64_t batch : batches) {
      // Full-KV baseline: B copies of the prefill, one token per request per step. Its tokens are
      // the reference, its timing the first run's baseline before.
      std::fprintf(stderr, "[bench-engine] context %lld, batch %lld: full-KV baseline\n",
                   static_cast<long long>(context), static_cast<long long>(batch));
      std::vector<PrefilledPrompt> copies;
      for (int64_t i = 0; i < batch; ++i) copies.push_back({&bases[i % prompt_count], next_logits[i % prompt_count]});
      auto full = decode_full_kv(m, copies, *base_pool, decode_tokens, page_size);
      if (!full.ok()) return report_error(full.status());
      double before_step_ms = full->step_ms();

      for (size_t c = 0; c < compressors->size(); ++c) {
        for (const auto& [policy, x] : runs) {
          const char* policy_name = draft_policy_name(policy.kind);
          std::fprintf(stderr, "[bench-engine] context %lld, batch %lld: %s, %s, x = %lld\n",
                       static_cast<long long>(context), static_cast<long long>(batch), (*compressors)[c]->name().c_str(),
                       policy_name, static_cast<long long>(x));
          EngineOptions options;
          options.draft_length = x;
          options.draft_policy = policy;
          options.ratio = ratio;
          options.compressor = (*compressors)[c].get();
          StepTimes times;
          times.full_batch = batch;
          options.sink = &times;
          GenerationRequest request;
          request.prompt = prompts[0];  // every prompt has `context` tokens: one request sizes them all
          request.max_new_tokens = decode_tokens;
          request.ignore_eos = true;
          auto pools = make_engine_pools(m, options, page_size, std::vector<GenerationRequest>(batch, request));
          if (!pools.ok()) return report_error(pools.status());
          DraftVerifyEngine engine(m, pools->device, pools->host, options);
          for (int64_t i = 0; i < batch; ++i) {
            const int64_t p = i % prompt_count;
            request.prompt = prompts[p];
            auto id = engine.add_prefilled(request, bases[p], *base_pool, next_logits[p], kept[c][p]);
            if (!id.ok()) return report_error(id.status());
          }
          engine.admit();  // copies the prefill, builds KV_comp, takes the first tokens: not decode time
          const double t0 = now_seconds();
          if (Status s = engine.run(); !s.ok()) return report_error(s);
          const double seconds = now_seconds() - t0;
          // The baseline again, right after this run (its tokens must be the reference's): this
          // run's ratios are against the mean of it and the one before, which the next run reuses.
          auto after = decode_full_kv(m, copies, *base_pool, decode_tokens, page_size);
          if (!after.ok()) return report_error(after.status());
          if (after->tokens != full->tokens) {
            return report_error(Status::internal("full-KV decoding gave other tokens on a second run"));
          }
          const double baseline_step_ms = 0.5 * (before_step_ms + after->step_ms());
          const double baseline_tok_s = static_cast<double>(batch) * 1e3 / baseline_step_ms;  // a token per request a step
          const double drift = (after->step_ms() - before_step_ms) / baseline_step_ms;
          before_step_ms = after->step_ms();
          const std::vector<EngineResult> results = engine.take_finished();
          const int64_t mismatches = count_mismatches(results, full->tokens);
          total_mismatches += mismatches;
          const RequestMetrics& t = engine.totals();
          const double tok_s = static_cast<double>(batch * (decode_tokens - 1)) / seconds;
          const double draft_ms = times.draft_ms(), verify_ms = times.verify_ms(), fallback_ms = times.fallback_ms();
          // The steady state: steps that carried the whole batch (the full-KV baseline always does).
          const double steady_tok_s = times.full_batch_tok_s();
          const double steady_share = times.decode_seconds() > 0 ? times.full_batch_seconds / times.decode_seconds() : 0.0;
          // Evidence of what the requests decoded: copies of one prompt give one greedy output.
          std::set<std::vector<int32_t>> outputs;
          for (const EngineResult& r : results) outputs.insert(r.generation.tokens);
          if (json) {
            nlohmann::json out{{"context", context},
                               {"batch", batch},
                               {"compressor", (*compressors)[c]->name()},
                               {"ratio", ratio},
                               {"draft_length", x},
                               {"draft_policy", policy_name},
                               {"mean_window", t.mean_window()},
                               {"windows_of_none", t.verify_windows - t.drafts},
                               {"decode_tokens", decode_tokens},
                               {"baseline_tok_s", baseline_tok_s},
                               {"throughput_tok_s", tok_s},
                               {"speedup", tok_s / baseline_tok_s},
                               {"mean_acceptance_length", t.mean_acceptance_length()},
                               {"acceptance_rate", t.acceptance_rate()},
                               {"draft_step_ms", draft_ms},
                               {"verify_step_ms", verify_ms},
                               {"full_kv_step_ms", baseline_step_ms},
                               {"full_kv_drift", drift},
                               {"verify_cost_decode_steps", verify_ms / baseline_step_ms},
                               {"verify_only_steps", times.verify_only_steps},
                               {"verify_only_cost_decode_steps", times.verify_only_ms() / baseline_step_ms},
                               {"full_batch_tok_s", steady_tok_s},
                               {"full_batch_speedup", steady_tok_s / baseline_tok_s},
                               {"full_batch_time_share", steady_share},
                               {"draft_cost_decode_steps", draft_ms / baseline_step_ms},
                               {"fallback_steps", times.fallback_steps},
                               {"fallback_cost_decode_steps", fallback_ms / baseline_step_ms},
                               {"mismatches", mismatches},
                               {"prefill_seconds", prefill_seconds},
                               {"compress_seconds", compress_seconds[c]},
                               {"threads", ThreadPool::global().threads()},
                               {"prompts", same_prompt ? "one prompt, copied to every request"
                                                       : "a different stretch of the text per request"},
                               {"text", text_file},
                               {"distinct_outputs", static_cast<int64_t>(outputs.size())},
                               {"model", m.path()}, {"compute", compute_name(m.compute())}, {"kv_cache", kv_cache_name(m)}};
            std::cout << out.dump() << std::endl;
          } else {
            char fallback_cost[32] = "-";
            if (times.fallback_steps > 0) std::snprintf(fallback_cost, sizeof fallback_cost, "%.2f", fallback_ms / baseline_step_ms);
            std::printf(
                "| %lld | %lld | %s | %s | %lld | %.2f | %lld | %.1f | %.1f | %.2fx | %.2fx | %.0f%% | %.2f | %.3f | "
                "%.1f | %.1f | %.1f | %.2f | %lld | %s | %+.0f%% | %lld |\n",
                static_cast<long long>(context), static_cast<long long>(batch), (*compressors)[c]->name().c_str(),
                policy_name, static_cast<long long>(x), t.mean_window(),
                static_cast<long long>(t.verify_windows - t.drafts), baseline_tok_s, tok_s, tok_s / baseline_tok_s,
                steady_tok_s / baseline_tok_s, 100.0 * steady_share, t.mean_acceptance_length(),
                t.acceptance_rate(), draft_ms, verify_ms, baseline_step_ms, verify_ms / baseline_step_ms,
                static_cast<long long>(times.fallback_steps),
                fallback_cost, 100.0 * drift,
                static_cast<long long>(mismatches));
            std::fflush(stdout);
          }
        }
      }
    }
    for (SequenceKv& b : bases) b.release(*base_pool);
  }
  if (total_mismatches > 0) {
    return report_error(Status::internal(std::to_string(total_mismatches) + " tokens differ from full-KV decoding"));
  }
  return kExitOk;
}

}  // namespace vericache::cli
