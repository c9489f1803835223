// vericache bench-budget: decode tokens/s at a fixed device KV budget (the paper's Fig. 13, measured).
// Full-KV decoding runs the largest batch whose whole caches fit the budget; VeriCache runs the
// largest batch its compressed caches allow (engine/device_budget.h), verifying in place (the CPU's
// own case: KV_full read where the host store holds it) or from transient pages filled over an
// EMULATED link (the TransferEngine's copy paced to the given bandwidth), whose ring of copies is
// part of the budget. Requests are different stretches of the repository's prompt sets, each
// prefilled once and compressed once; every VeriCache run is checked token for token against the
// full-KV decoding of the same prompts.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "bench_support.h"
#include "cli_common.h"
#include "commands.h"
#include "draft_policy_options.h"
#include "engine/compression.h"
#include "engine/device_budget.h"
#include "engine/draft_verify_engine.h"
#include "engine/engine_pools.h"
#include "engine/generator.h"
#include "kv/transfer_engine.h"
#include "util/thread_pool.h"

#include <c10/core/ScalarType.h>

namespace po = boost::program_options;

namespace vericache::cli {
namespace {

// One way VeriCache verifies: in place (link_gb_s = 0) or over an emulated link.
struct Link {
  std::string name;
  double gb_s = 0;
};

Result<std::vector<Link>> parse_links(const std::string& text) {
  std::vector<Link> links;
  for (const std::string& item : split_list(text)) {
    if (item == "in-place") {
      links.push_back({"in place", 0});
      continue;
    }
    try {
      size_t used = 0;
      const double gb_s = std::stod(item, &used);
      if (used != item.size() || !(gb_s > 0 && gb_s <= 1e4)) throw std::invalid_argument(item);
      char name[48];
      std::snprintf(name, sizeof name, "%g GB/s emulated link", gb_s);
      links.push_back({name, gb_s});
    } catch (const std::exception&) {
      return Status::invalid_argument("--links: '" + item + "' is neither in-place nor a bandwidth in GB/s (0, 1e4]");
    }
  }
  if (links.empty()) return Status::invalid_argument("--links is empty");
  return links;
}

}  // namespace

int run_bench_budget(int argc, char** argv) {
  ComputeArgs compute_arg;
  std::string model_arg, text_file, compressor_arg, links_arg;
  DraftPolicyArgs policy_args;
  std::vector<std::string> params_args;
  int64_t context = 8000, decode_tokens = 64, page_size = 16, prefill_chunk = 512, draft_length = 16, max_batch = 16,
          transient_requests = 1;
  double ratio = 0.25, budget_full_requests = 2, budget_gb = 0;
  int threads = 0;
  bool json = false;
  po::options_description desc(
      "vericache bench-budget: decode tokens/s of VeriCache against full-KV decoding at one device KV budget.\n"
      "Full-KV decoding runs the most requests whose whole caches fit the budget; VeriCache the most whose\n"
      "compressed caches fit (with a ring of transient pages for KV_full copies when verifying over a link).\n"
      "Links are EMULATED: the copy into transient pages is paced to the bandwidth given. Each request has its\n"
      "own prompt; every run is checked token for token against full-KV decoding. In place, the JSON also\n"
      "gives the steady state (full_batch_*): tokens per second in the steps that carried every request,\n"
      "apart from the tail of a static batch whose requests finish at different steps.\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("text-file", po::value(&text_file)->default_value(VC_ENGINE_BENCH_TEXT),
     "text the prompts are cut from (as bench-engine: files joined by commas; the default is the four built "
     "prompt sets, not text the model has memorized)")
    ("context", po::value(&context)->default_value(8000), "prompt tokens per request")
    ("decode-tokens", po::value(&decode_tokens)->default_value(64), "tokens generated per request (EOS ignored)")
    ("compressor", po::value(&compressor_arg)->default_value("kvzip"), "an offline token dropper or a quantizer")
    ("params", po::value(&params_args)->composing(), "NAME=JSON: the compressor's parameters")
    ("ratio,c", po::value(&ratio)->default_value(0.25), "kept fraction c")
    ("budget-full-requests", po::value(&budget_full_requests)->default_value(2),
     "the device KV budget as the whole caches of this many requests (context + decode tokens)")
    ("budget-gb", po::value(&budget_gb)->default_value(0), "the device KV budget in GB (1e9 bytes); overrides "
     "--budget-full-requests")
    ("links", po::value(&links_arg)->default_value("in-place,20,2"),
     "how VeriCache verifies, comma-separated: in-place, or an emulated link's GB/s")
    ("transient-requests", po::value(&transient_requests)->default_value(1),
     "over a link: KV_full copies the transient ring holds at once (taken from the budget)")
    ("draft-length,x", po::value(&draft_length)->default_value(16), "the longest window")
    ("max-batch", po::value(&max_batch)->default_value(16),
     "the most requests either side runs (prefill time grows with it); a capped batch is marked")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores")
    ("page-size", po::value(&page_size)->default_value(16), "KV page size in tokens (a multiple of 16)")
    ("prefill-chunk", po::value(&prefill_chunk)->default_value(512), "prompt tokens per prefill forward")
    ("json", po::bool_switch(&json), "print one JSON object per link instead of a table");
  // clang-format on
  add_compute_options(desc, compute_arg);
  add_draft_policy_options(desc, policy_args);
  po::variables_map vm;
  const std::string example =
      "Example:\n  vericache bench-budget --context 8000 --compressor kvzip -c 0.25 --links in-place,20,2\n";
  std::vector<OptionRange> ranges = {{"context", 16, kMaxContextLength}, {"decode-tokens", 2, 1 << 20},
                                     kRatioRange, {"budget-full-requests", 0, 1e6, true}, {"budget-gb", 0, 1e6},
                                     {"transient-requests", 1, 1024}, {"draft-length", 1, 256},
                                     {"max-batch", 1, 4096}, kThreadsRange, kPageSizeRange, kPrefillChunkRange};
  ranges.insert(ranges.end(), kDraftPolicyTuningRanges.begin(), kDraftPolicyTuningRanges.end());
  if (auto done = parse_command_line("bench-budget", desc, example, argc, argv, &vm, ranges)) return *done;
  auto links = parse_links(links_arg);
  if (!links.ok()) return report_usage_error("bench-budget", links.status().message());
  auto policy = draft_policy_options(policy_args);
  if (!policy.ok()) return report_status("bench-budget", policy.status());
  set_threads(threads);
  auto loaded = load_model(model_arg, compute_arg);
  if (!loaded.ok()) return report_error(loaded.status());
  const LlamaModel& m = **loaded;
  auto compressors = load_offline_compressors(compressor_arg, params_args, m);
  if (!compressors.ok()) return report_status("bench-budget", compressors.status());
  if (compressors->size() != 1) return report_usage_error("bench-budget", "--compressor takes one compressor");
  Compressor& compressor = *compressors->front();
  if (Status s = check_contexts_fit(m, {context}, decode_tokens, draft_length + 1); !s.ok()) {
    return report_status("bench-budget", s);
  }

  EngineOptions options;
  options.compressor = &compressor;
  options.ratio = ratio;
  options.draft_length = draft_length;
  options.draft_policy = *policy;
  GenerationRequest shape;
  shape.prompt.assign(context, 0);
  shape.max_new_tokens = decode_tokens;
  shape.ignore_eos = true;
  // One page: page_size slots of K and V of one layer.
  const int64_t page_bytes = m.kv_bytes_per_slot() * page_size;
  const int64_t full_pages = Generator::pages_needed(m, page_size, std::span(&shape, 1));
  const int64_t budget_pages = budget_gb > 0 ? static_cast<int64_t>(budget_gb * 1e9) / page_bytes
                                             : static_cast<int64_t>(budget_full_requests * static_cast<double>(full_pages));
  // The batches for each link (a link's ring of transient pages comes out of the budget).
  TransferEngine sizing_link;
  std::vector<BudgetBatches> batches;
  int64_t prompt_count = 0;
  for (const Link& link : *links) {
    EngineOptions o = options;
    o.transfer = link.gb_s > 0 ? &sizing_link : nullptr;
    batches.push_back(batches_within_budget(m, o, page_size, shape, budget_pages, transient_requests));
    prompt_count = std::max({prompt_count, batches.back().full_kv, batches.back().vericache});
  }
  if (batches.front().full_kv == 0) {
    return report_usage_error("bench-budget", "the budget (" + std::to_string(budget_pages) +
                                                  " pages) holds no full-KV request of " + std::to_string(full_pages) +
                                                  " pages: raise --budget-full-requests or --budget-gb");
  }
  prompt_count = std::min(prompt_count, max_batch);
  auto corpus = bench_corpus(m, text_file, context * prompt_count);
  if (!corpus.ok()) return report_status("bench-budget", corpus.status());

  // One prefill per prompt (the compressor observing), then its kept set.
  const int64_t layers = m.config().n_layers;
  auto base_pool = m.make_page_pool(page_size, (prompt_count + 1) * layers * ((context + 160) / page_size + 2));
  if (!base_pool.ok()) return report_error(base_pool.status());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SequenceKv> bases(prompt_count, SequenceKv(layers));
  std::vector<std::vector<float>> next_logits(prompt_count);
  std::vector<std::vector<at::Tensor>> kept(prompt_count);
  for (int64_t i = 0; i < prompt_count; ++i) {
    std::fprintf(stderr, "[bench-budget] prefill and compress prompt %lld of %lld (%lld tokens)\n",
                 static_cast<long long>(i + 1), static_cast<long long>(prompt_count), static_cast<long long>(context));
    prompts.emplace_back(corpus->begin() + i * context, corpus->begin() + (i + 1) * context);
    if (Status s = prefill_observed(m, *base_pool, bases[i], prompts[i], prefill_chunk, *compressors, ratio,
                                    &next_logits[i]);
        !s.ok()) {
      return report_error(s);
    }
    if (compressor.family() == CompressorFamily::kQuantization) continue;  // the engine packs it
    CompressedKV out;
    const Status s = compute_kept(m, *base_pool, compressor, ratio, prompts[i], 0, bases[i], &out);
    compressor.release(0);
    if (!s.ok()) return report_error(s);
    kept[i] = std::move(out.kept);
  }

  // Full-KV decoding at its batch: the reference tokens of every prompt and the baseline rate.
  const int64_t full_batch = std::min(batches.front().full_kv, max_batch);
  std::fprintf(stderr, "[bench-budget] full-KV decoding, batch %lld\n", static_cast<long long>(full_batch));
  std::vector<PrefilledPrompt> all;
  for (int64_t i = 0; i < prompt_count; ++i) all.push_back({&bases[i], next_logits[i]});
  auto full = decode_full_kv(m, std::span(all).first(full_batch), *base_pool, decode_tokens, page_size);
  if (!full.ok()) return report_error(full.status());
  // The reference tokens: the baseline's, then those of the prompts beyond its batch (decoded apart,
  // untimed).
  std::vector<std::vector<int32_t>> reference = full->tokens;
  if (full_batch < prompt_count) {
    auto rest = decode_full_kv(m, std::span(all).subspan(full_batch), *base_pool, decode_tokens, page_size);
    if (!rest.ok()) return report_error(rest.status());
    reference.insert(reference.end(), rest->tokens.begin(), rest->tokens.end());
  }

  const double budget_gb_used = static_cast<double>(budget_pages * page_bytes) / 1e9;
  if (!json) {
    std::printf("device KV budget: %.3f GB (%lld pages of %lld bytes; a full-KV request takes %lld pages)\n",
                budget_gb_used, static_cast<long long>(budget_pages), static_cast<long long>(page_bytes),
                static_cast<long long>(full_pages));
    std::printf(
        "| verification | full-KV batch | full-KV tok/s | VeriCache batch | VeriCache tok/s | ratio | resident pages per "
        "request | transient pages | mean acceptance length | drafts per window | windows of none | draft s | "
        "verify s | waiting s | link GB/s achieved | mismatches |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  }
  int64_t total_mismatches = 0;
  for (size_t li = 0; li < links->size(); ++li) {
    const Link& link = (*links)[li];
    const BudgetBatches& b = batches[li];
    const int64_t batch = std::min(b.vericache, max_batch);
    if (batch == 0) {
      std::fprintf(stderr, "[bench-budget] %s: the budget holds no VeriCache request\n", link.name.c_str());
      continue;
    }
    std::fprintf(stderr, "[bench-budget] VeriCache, %s, batch %lld\n", link.name.c_str(), static_cast<long long>(batch));
    TransferEngine transfer(TransferOptions{link.gb_s * 1e9});
    EngineOptions o = options;
    o.transfer = link.gb_s > 0 ? &transfer : nullptr;
    StepTimes times;
    // In place every running request is in every forward, so a step without all of them is the
    // tail; over a link a request waiting for its copy sits a step out, so no steady state there.
    if (o.transfer == nullptr) times.full_batch = batch;
    o.sink = &times;
    // Device pool: the budget, split into the resident pages and the ring; host: every full cache.
    std::vector<GenerationRequest> shapes(batch, shape);
    const int64_t host_pages = DraftVerifyEngine::pages_for_requests(m, o, page_size, page_size, shapes).host;
    auto pools = make_engine_pools(m, o, page_size, shapes,
                                   PoolOverrides{budget_pages - b.transient_pages, b.transient_pages, host_pages});
    if (!pools.ok()) return report_error(pools.status());
    DraftVerifyEngine engine(m, pools->device, pools->host, o);
    for (int64_t i = 0; i < batch; ++i) {
      GenerationRequest r = shape;
      r.prompt = prompts[i];
      auto id = engine.add_prefilled(r, bases[i], *base_pool, next_logits[i], kept[i]);
      if (!id.ok()) return report_error(id.status());
    }
    engine.admit();  // copies the prefills, builds KV_comp, takes the first tokens: not decode time
    if (engine.active() != batch) {
      return report_error(Status::internal("the budget admitted " + std::to_string(engine.active()) + " of the " +
                                           std::to_string(batch) + " requests it was sized for"));
    }
    const double t0 = now_seconds();
    if (Status s = engine.run(); !s.ok()) return report_error(s);
    const double seconds = now_seconds() - t0;
    const int64_t mismatches = count_mismatches(engine.take_finished(), reference);
    total_mismatches += mismatches;
    const RequestMetrics& t = engine.totals();
    const double tok_s = static_cast<double>(batch * (decode_tokens - 1)) / seconds;
    const double waiting = std::max(0.0, seconds - times.draft_seconds - times.verify_seconds);
    const double steady_tok_s = times.full_batch_tok_s();  // 0 over a link
    const double steady_share = times.full_batch_seconds / seconds;
    const TransferStats link_stats = transfer.stats();
    const double achieved =
        link_stats.busy_seconds > 0 ? static_cast<double>(link_stats.bytes) / link_stats.busy_seconds / 1e9 : 0;
    char achieved_text[32] = "-";
    if (link.gb_s > 0) std::snprintf(achieved_text, sizeof achieved_text, "%.2f", achieved);
    const bool capped = b.vericache > max_batch || b.full_kv > max_batch;
    if (json) {
      nlohmann::json out{{"verification", link.name},
                         {"link_gb_s", link.gb_s},
                         {"link_gb_s_achieved", achieved},
                         {"budget_bytes", budget_pages * page_bytes},
                         {"budget_pages", budget_pages},
                         {"full_kv_pages_per_request", full_pages},
                         {"resident_pages_per_request", b.resident_pages_per_request},
                         {"transient_pages", b.transient_pages},
                         {"full_kv_batch", full_batch},
                         {"full_kv_batch_fitting", b.full_kv},
                         {"vericache_batch", batch},
                         {"vericache_batch_fitting", b.vericache},
                         {"full_kv_tok_s", full->tok_s()},
                         {"vericache_tok_s", tok_s},
                         {"ratio", tok_s / full->tok_s()},
                         {"full_batch_tok_s", steady_tok_s},
                         {"full_batch_ratio", steady_tok_s / full->tok_s()},
                         {"full_batch_time_share", steady_share},
                         {"mean_acceptance_length", t.mean_acceptance_length()},
                         {"mean_window", t.mean_window()},
                         {"windows_of_none", t.verify_windows - t.drafts},
                         {"draft_seconds", times.draft_seconds},
                         {"verify_seconds", times.verify_seconds},
                         {"waiting_seconds", waiting},
                         {"seconds", seconds},
                         {"mismatches", mismatches},
                         {"context", context},
                         {"decode_tokens", decode_tokens},
                         {"compressor", compressor.name()},
                         {"ratio_c", ratio},
                         {"draft_policy", policy_args.policy},
                         {"draft_length", draft_length},
                         {"threads", ThreadPool::global().threads()},
                         {"capped", capped},
                         {"model", m.path()}, {"compute", compute_name(m.compute())}, {"kv_cache", kv_cache_name(m)}};
      std::cout << out.dump() << std::endl;
    } else {
      std::printf("| %s | %lld%s | %.1f | %lld%s | %.1f | %.2fx | %lld | %lld | %.2f | %.2f | %lld | %.2f | %.2f | %.2f | %s "
                  "| %lld |\n",
                  link.name.c_str(), static_cast<long long>(full_batch), b.full_kv > max_batch ? " (capped)" : "",
                  full->tok_s(), static_cast<long long>(batch), b.vericache > max_batch ? " (capped)" : "", tok_s,
                  tok_s / full->tok_s(), static_cast<long long>(b.resident_pages_per_request),
                  static_cast<long long>(b.transient_pages), t.mean_acceptance_length(), t.mean_window(),
                  static_cast<long long>(t.verify_windows - t.drafts), times.draft_seconds, times.verify_seconds,
                  waiting, achieved_text,
                  static_cast<long long>(mismatches));
      std::fflush(stdout);
    }
  }
  for (SequenceKv& kv : bases) kv.release(*base_pool);
  if (total_mismatches > 0) {
    return report_error(Status::internal(std::to_string(total_mismatches) + " tokens differ from full-KV decoding"));
  }
  return kExitOk;
}

}  // namespace vericache::cli
