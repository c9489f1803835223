// vericache run: lossless decoding with VeriCache — draft on a compressed KV cache, verify on the
// full one — with --check to diff against full-KV decoding in the same process.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "decoding_options.h"
#include "draft_policy_options.h"
#include "engine/draft_verify_engine.h"
#include "engine/engine_pools.h"
#include "util/system_memory.h"
#include "engine/full_kv_comparison.h"
#include "engine/generator.h"
#include "util/printable.h"
#include "util/thread_pool.h"

namespace po = boost::program_options;

namespace vericache::cli {
namespace {

struct RunOptions : DecodingOptions {
  std::string compressor = "kvzip";
  std::string params = "{}";
  double ratio = 0.25;
  int64_t draft_length = 16;
  std::string draft_kv = "verified";
  std::string draft_sampling = "sampled";
  DraftPolicyArgs draft_policy;
  int64_t resident_pages = 0;
  int64_t host_pages = 0;
  double state_memory_mb = -1;  // -1: half the machine's memory; 0: no bound
  std::string verify = "in-place";
  double link_gbps = 0;
  int64_t transient_pages = 0;
  bool check = false;
  bool progress = false;
};

po::options_description describe(RunOptions& o) {
  po::options_description d(
      "vericache run: lossless decoding with VeriCache. Each request drafts up to --draft-length tokens on\n"
      "its compressed KV cache (the compressor keeps --ratio of it; --draft-policy picks each window's\n"
      "length), then verifies them in one forward over its full KV cache: greedy output is token-identical\n"
      "to full-KV decoding, sampled output has the full-KV distribution. By default the full cache is\n"
      "verified in place (no copy); --verify transfer copies it into transient pages first, optionally\n"
      "over an emulated link (--link-gbps).\n\nOptions");
  add_decoding_options(d, o);
  // clang-format off
  d.add_options()
    ("compressor", po::value(&o.compressor)->default_value("kvzip"),
     "the compressor that makes KV_comp (plugin name or .so path); 'none' drafts on a full copy")
    ("params", po::value(&o.params)->default_value("{}"), "the compressor's parameters as a JSON object")
    ("ratio,c", po::value(&o.ratio)->default_value(0.25), "kept fraction c in (0, 1]: KV_comp = c * KV_full")
    ("draft-length,x", po::value(&o.draft_length)->default_value(16),
     "tokens drafted per verify window (with an adaptive --draft-policy: the most)")
    ("draft-kv", po::value(&o.draft_kv)->default_value("verified"),
     "K/V the accepted tokens keep in KV_comp: verified (from the full-KV forward) or drafted")
    ("draft-sampling", po::value(&o.draft_sampling)->default_value("sampled"),
     "at T > 0: drafts drawn from the compressed distribution (sampled) or its argmax (argmax)")
    ("check", po::bool_switch(&o.check), "also decode with the full KV cache and report mismatching tokens (greedy only)")
    ("resident-pages", po::value(&o.resident_pages)->default_value(0),
     "resident pages for compressed caches; 0: enough for every request at once (fewer: requests wait)")
    ("host-pages", po::value(&o.host_pages)->default_value(0), "host-store pages for full caches; 0: enough for every request at once")
    ("state-memory-mb", po::value(&o.state_memory_mb)->default_value(-1),
     "MB the compressor's per-request state may take at once (ExpectedAttention: ~9 MB per request on SmolLM2 "
     "until its compress()); requests past it wait. -1: half the machine's memory; 0: no bound")
    ("verify", po::value(&o.verify)->default_value("in-place"),
     "in-place: verify reads the full cache in the host store; transfer: the transfer engine copies it into "
     "transient device pages while the request drafts, and verification reads the copy")
    ("link-gbps", po::value(&o.link_gbps)->default_value(0.0),
     "with --verify transfer: pace the copies as an emulated link of this many GB/s (0: memory speed)")
    ("transient-pages", po::value(&o.transient_pages)->default_value(0),
     "with --verify transfer: transient pages for full-cache copies; 0: one verify window per request at once")
    ("progress", po::bool_switch(&o.progress), "print a progress line on stderr (default when stderr is a terminal)");
  // clang-format on
  add_draft_policy_options(d, o.draft_policy);
  return d;
}

Status check_options(const RunOptions& o) {
  VC_RETURN_IF_ERROR(check_decoding_options(o));
  VC_RETURN_IF_ERROR(draft_policy_options(o.draft_policy).status());
  if (o.draft_kv != "verified" && o.draft_kv != "drafted") {
    return Status::invalid_argument("--draft-kv must be 'verified' or 'drafted', got '" + o.draft_kv + "'");
  }
  if (o.draft_sampling != "sampled" && o.draft_sampling != "argmax") {
    return Status::invalid_argument("--draft-sampling must be 'sampled' or 'argmax', got '" + o.draft_sampling + "'");
  }
  if (o.verify != "in-place" && o.verify != "transfer") {
    return Status::invalid_argument("--verify must be 'in-place' or 'transfer', got '" + o.verify + "'");
  }
  if (o.verify != "transfer" && (o.link_gbps > 0 || o.transient_pages > 0)) {
    return Status::invalid_argument("--link-gbps and --transient-pages need --verify transfer");
  }
  if (o.check && o.temperature > 0) {
    return Status::invalid_argument(
        "--check compares tokens, which only greedy decoding (--temperature 0) makes identical; at T > 0 "
        "VeriCache matches the full-KV distribution, not its tokens");
  }
  if (o.compressor == "none" && o.params != "{}") return Status::invalid_argument("--params needs a compressor");
  return Status();
}

// Progress on stderr, at most about once a second: requests done, tokens, acceptance so far.
class ProgressLine : public StatsSink {
 public:
  explicit ProgressLine(bool enabled) : enabled_(enabled) {}
  void on_step(const StepRecord& s) override {
    ++steps_;
    prefilled_ += s.prefill_rows;
    if (!enabled_ || s.start_seconds - last_ < 1.0) return;
    last_ = s.start_seconds;
    std::fprintf(stderr,
                 "\r[run] step %lld: %lld prompt tokens prefilled; %lld drafts, %lld verifies in flight; windows %lld, "
                 "accepted %lld of %lld drafted   ",
                 static_cast<long long>(steps_), static_cast<long long>(prefilled_),
                 static_cast<long long>(s.draft_items), static_cast<long long>(s.verify_items),
                 static_cast<long long>(windows_), static_cast<long long>(accepted_), static_cast<long long>(drafted_));
    std::fflush(stderr);
    dirty_ = true;
  }
  void on_window(const WindowRecord& w) override {
    ++windows_;
    accepted_ += w.accepted;
    drafted_ += w.drafted;
  }
  void end() {
    if (dirty_) std::fputs("\n", stderr);
  }

 private:
  bool enabled_;
  int64_t steps_ = 0, prefilled_ = 0, windows_ = 0, accepted_ = 0, drafted_ = 0;
  double last_ = 0;
  bool dirty_ = false;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Prefill time of the engine's run: the steps that carried a prompt chunk.
class PrefillTimer : public StatsSink {
 public:
  explicit PrefillTimer(StatsSink& next) : next_(next) {}
  void on_step(const StepRecord& s) override {
    if (s.prefill_items > 0) prefill_seconds += s.seconds;
    next_.on_step(s);
  }
  void on_window(const WindowRecord& w) override { next_.on_window(w); }
  double prefill_seconds = 0;

 private:
  StatsSink& next_;
};

// The first request whose output differs from full-KV decoding, in words ("" when none does):
// the position and both tokens, or both finish reasons when only those differ.
std::string first_difference(const std::vector<EngineResult>& results, const std::vector<GenerationResult>& baseline,
                             const std::vector<OutputDiff>& diffs, const Tokenizer& tok) {
  for (size_t i = 0; i < diffs.size(); ++i) {
    if (diffs[i].identical()) continue;
    const std::vector<int32_t>& got = results[i].generation.tokens;
    const std::vector<int32_t>& want = baseline[i].tokens;
    const int64_t p = diffs[i].first_mismatch;
    auto token = [&](const std::vector<int32_t>& t, const char* ended) {
      if (p >= static_cast<int64_t>(t.size())) return std::string(ended);
      return std::to_string(t[p]) + " " + printable(tok.token_bytes(t[p]));
    };
    if (p < 0) {
      return "request " + std::to_string(i) + ": same tokens, but VeriCache ends with '" +
             finish_reason_name(results[i].generation.finish) + "' and full-KV decoding with '" +
             finish_reason_name(baseline[i].finish) + "'";
    }
    return "request " + std::to_string(i) + ", output token " + std::to_string(p) + ": VeriCache " +
           token(got, "(output ended)") + ", full-KV decoding " + token(want, "(output ended)");
  }
  return "";
}

}  // namespace

int run_run(int argc, char** argv) {
  RunOptions o;
  po::options_description desc = describe(o);
  po::variables_map vm;
  const std::string examples =
      "Examples:\n"
      "  vericache run --check -f datasets/prompts/document_2k.txt            # KVzip c = 0.25, x <= 16, goodput\n"
      "  vericache run --check --compressor snapkv -c 0.1 -x 8 -f doc.txt --json\n"
      "  vericache run -p \"Write a haiku about the sea.\" -t 0.7 --seed 3 --compressor expected_attention\n"
      "  vericache run --check --compressor none -p \"hello\"     # draft on a full copy: every draft is accepted\n"
      "  vericache run --check --verify transfer --link-gbps 8 -f doc.txt   # verify from copies over an emulated 8 "
      "GB/s link\n";
  std::vector<OptionRange> ranges = decoding_ranges();
  ranges.insert(ranges.end(), {kRatioRange,
                               {"draft-length", 1, 256},
                               {"resident-pages", 0, 1LL << 31},
                               {"host-pages", 0, 1LL << 31},
                               {"state-memory-mb", -1, 1e9},
                               {"transient-pages", 0, 1LL << 31},
                               {"link-gbps", 0, 1e6}});
  ranges.insert(ranges.end(), kDraftPolicyTuningRanges.begin(), kDraftPolicyTuningRanges.end());
  if (auto done = parse_command_line("run", desc, examples, argc, argv, &vm, ranges)) return *done;
  if (Status s = check_options(o); !s.ok()) return report_usage_error("run", s.message());
  auto prompt_text = read_prompt(o.prompt, o.prompt_file);
  if (!prompt_text.ok()) return report_status("run", prompt_text.status());
  set_threads(o.threads);
  auto model = load_model(o.model, o.compute);
  if (!model.ok()) return report_error(model.status());
  const LlamaModel& m = **model;
  auto prompt_ids = prompt_tokens(m, *prompt_text, o.no_chat_template, o.system);
  if (!prompt_ids.ok()) return report_error(prompt_ids.status());

  std::shared_ptr<Compressor> compressor;
  std::string compressor_path;
  if (o.compressor != "none") {
    auto loaded = load_compressor_for(o.compressor, o.params, o.plugin_dirs, m, &compressor_path);
    if (!loaded.ok()) return report_status("run", loaded.status());
    compressor = std::move(*loaded);
    if (compressor->family() == CompressorFamily::kQuantization && !vm["ratio"].defaulted()) {
      return report_usage_error("run", quantizer_ratio_error(compressor->name()));
    }
  }
  const std::vector<GenerationRequest> requests = make_requests(o, *prompt_ids);

  EngineOptions options;
  options.draft_length = o.draft_length;
  options.draft_policy = *draft_policy_options(o.draft_policy);
  options.compressor = compressor.get();
  options.ratio = o.ratio;
  options.prefill_chunk = o.prefill_chunk;
  options.state_budget_bytes = static_cast<int64_t>(o.state_memory_mb < 0 ? physical_memory_bytes() / 2
                                                                          : o.state_memory_mb * 1e6);
  options.draft_kv = o.draft_kv == "drafted" ? DraftKv::kDrafted : DraftKv::kVerified;
  options.draft_sampling = o.draft_sampling == "argmax" ? DraftSampling::kArgmax : DraftSampling::kSampled;
  // Test-only: a fault made on purpose so tests can see --check fail; never an option.
  auto fault = test_fault_from_environment("run");
  if (!fault.ok()) return report_status("run", fault.status());
  options.test_fault = *fault;
  std::unique_ptr<TransferEngine> transfer;
  if (o.verify == "transfer") {
    transfer = std::make_unique<TransferEngine>(TransferOptions{o.link_gbps * 1e9});
    options.transfer = transfer.get();
  }
  auto pools = make_engine_pools(m, options, o.page_size, requests,
                                 PoolOverrides{o.resident_pages, o.transient_pages, o.host_pages});
  if (!pools.ok()) return report_error(pools.status());

  ProgressLine progress(o.progress || (!o.json && isatty(STDERR_FILENO)));
  PrefillTimer timer(progress);
  options.sink = &timer;
  DraftVerifyEngine engine(m, pools->device, pools->host, options);
  for (const GenerationRequest& r : requests) {
    auto id = engine.add_request(r);
    if (!id.ok()) return report_error(id.status());
  }
  const auto start = std::chrono::steady_clock::now();
  if (Status s = engine.run(); !s.ok()) return report_error(s);
  const double total_seconds = seconds_since(start);
  progress.end();
  std::vector<EngineResult> results = engine.take_finished();
  std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) { return a.request_id < b.request_id; });
  const RequestMetrics& t = engine.totals();
  const double decode_seconds = total_seconds - timer.prefill_seconds;
  // Decode throughput counts the tokens after each request's first (which comes from the prefill),
  // for VeriCache and the baseline alike; 0 when nothing was decoded.
  auto decoded = [](const auto& token_lists) {
    int64_t n = 0;
    for (const std::vector<int32_t>& tokens : token_lists)
      n += std::max<int64_t>(0, static_cast<int64_t>(tokens.size()) - 1);
    return n;
  };
  auto rate = [](int64_t tokens, double seconds) {
    return tokens > 0 && seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0;
  };
  std::vector<std::vector<int32_t>> engine_tokens;
  for (const EngineResult& r : results) engine_tokens.push_back(r.generation.tokens);
  const double tok_s = rate(decoded(engine_tokens), decode_seconds);

  // --check: the same requests through full-KV decoding, in this process.
  int64_t mismatches = 0, mismatched_requests = 0;
  double baseline_tok_s = 0;
  std::vector<OutputDiff> diffs;
  std::vector<GenerationResult> baseline;
  if (o.check) {
    auto pool = m.make_page_pool(o.page_size, Generator::pages_needed(m, o.page_size, requests));
    if (!pool.ok()) return report_error(pool.status());
    GeneratorOptions go;
    go.prefill_chunk = o.prefill_chunk;
    Generator generator(m, *pool, go);
    GenerationStats stats;
    auto generated = generator.generate(requests, {}, &stats);
    if (!generated.ok()) return report_error(generated.status());
    baseline = std::move(*generated);
    std::vector<std::vector<int32_t>> baseline_tokens;
    for (const GenerationResult& r : baseline) baseline_tokens.push_back(r.tokens);
    baseline_tok_s = rate(decoded(baseline_tokens), stats.decode_seconds);
    for (size_t i = 0; i < results.size(); ++i) {
      diffs.push_back(diff_output(results[i].generation, baseline[i]));
      mismatches += diffs.back().mismatches();
      mismatched_requests += diffs.back().identical() ? 0 : 1;
    }
  }

  const Tokenizer& tok = m.tokenizer();
  auto text_of = [&](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += tok.token_bytes(id);
    return s;
  };
  std::vector<std::string> failures;
  for (const EngineResult& r : results) {
    if (!r.compressor_failure.empty())
      failures.push_back("request " + std::to_string(r.request_id) + ": " + r.compressor_failure);
  }
  std::vector<double> per_position;
  for (size_t i = 0; i < t.drafted_per_position.size(); ++i) {
    per_position.push_back(t.drafted_per_position[i] > 0
                               ? static_cast<double>(t.accepted_per_position[i]) / t.drafted_per_position[i]
                               : 0.0);
  }
  if (o.json) {
    nlohmann::json out;
    out["model"] = m.path();
    out["compute"] = compute_name(m.compute());
    out["kv_cache"] = kv_cache_name(m);
    out["compressor"] = compressor ? compressor->name() : "none";
    if (compressor) out["compressor_path"] = compressor_path;
    out["params"] = o.params;
    out["ratio"] = o.ratio;
    out["draft_length"] = o.draft_length;
    out["draft_policy"] = o.draft_policy.policy;
    out["draft_kv"] = o.draft_kv;
    out["draft_sampling"] = o.draft_sampling;
    out["temperature"] = o.temperature;
    out["seed"] = o.seed;
    out["batch"] = o.batch;
    out["prompt_tokens"] = static_cast<int64_t>(prompt_ids->size());
    out["verify"] = transfer ? "transfer into transient pages (" + transfer->describe() + ")"
                             : "in place (host store read by the CPU forward)";
    if (transfer) {
      const TransferStats ts = transfer->stats();
      out["transfer_bytes"] = ts.bytes;
      out["transfers"] = ts.transfers;
      out["transfer_busy_seconds"] = ts.busy_seconds;
      out["transfer_wait_seconds"] = t.transfer_wait_seconds;
      out["link"] = transfer->describe();
    }
    out["requests"] = nlohmann::json::array();
    for (size_t i = 0; i < results.size(); ++i) {
      const EngineResult& r = results[i];
      nlohmann::json j;
      j["tokens"] = r.generation.tokens;
      j["text"] = text_of(r.generation.tokens);
      j["finish_reason"] = finish_reason_name(r.generation.finish);
      j["mean_acceptance_length"] = r.metrics.mean_acceptance_length();
      j["acceptance_rate"] = r.metrics.acceptance_rate();
      j["verify_windows"] = r.metrics.verify_windows;
      if (!r.compressor_failure.empty()) j["compressor_failure"] = r.compressor_failure;
      if (o.check) {
        j["first_mismatch"] = diffs[i].first_mismatch;
        j["finish_reason_full_kv"] = finish_reason_name(baseline[i].finish);
      }
      out["requests"].push_back(j);
    }
    out["generated_tokens"] = t.generated_tokens;
    out["drafts"] = t.drafts;
    out["draft_tokens"] = t.draft_tokens;
    out["accepted_tokens"] = t.accepted_tokens;
    out["mean_acceptance_length"] = t.mean_acceptance_length();
    out["acceptance_rate"] = t.acceptance_rate();
    out["acceptance_rate_per_position"] = per_position;
    out["verify_windows"] = t.verify_windows;
    out["mean_window"] = t.mean_window();
    out["full_kv_windows"] = t.verify_windows - t.drafts;
    out["draft_steps"] = t.draft_steps;
    out["prefill_seconds"] = timer.prefill_seconds;
    out["decode_seconds"] = decode_seconds;
    out["throughput_tok_s"] = tok_s;
    out["request_draft_seconds"] = t.draft_seconds;
    out["request_verify_seconds"] = t.verify_seconds;
    out["full_kv_slots"] = t.full_kv_slots;
    out["resident_kv_slots"] = t.resident_kv_slots;
    out["full_kv_bytes"] = t.full_kv_bytes;
    out["resident_kv_bytes"] = t.resident_kv_bytes;
    out["compressor_failures"] = failures;
    out["threads"] = ThreadPool::global().threads();
    // A saved JSON of a faulted run says so (the notice on stderr does not travel with it).
    if (options.test_fault.kind != TestFaultKind::kNone) out["test_fault"] = describe_test_fault(options.test_fault);
    if (o.check) {
      const std::string difference = first_difference(results, baseline, diffs, m.tokenizer());
      out["first_difference"] = difference.empty() ? nlohmann::json() : nlohmann::json(difference);
      out["mismatches"] = mismatches;
      out["mismatched_requests"] = mismatched_requests;
      out["baseline_tok_s"] = baseline_tok_s;
      out["speedup"] = baseline_tok_s > 0 ? tok_s / baseline_tok_s : 0.0;
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    for (size_t i = 0; i < results.size(); ++i) {
      if (results.size() > 1)
        std::printf("=== request %zu (%s)\n", i, finish_reason_name(results[i].generation.finish));
      std::printf("%s\n", text_of(results[i].generation.tokens).c_str());
    }
    std::fprintf(stderr,
                 "\n[%s at c = %.3f, x = %lld (%s: %.2f drafts per window, %lld windows of none), KV_comp keeps %s "
                 "K/V | %lld tokens, %lld verify windows]\n",
                 compressor ? compressor->name().c_str() : "no compressor (full copy)", o.ratio,
                 static_cast<long long>(o.draft_length), o.draft_policy.policy.c_str(), t.mean_window(),
                 static_cast<long long>(t.verify_windows - t.drafts), o.draft_kv.c_str(),
                 static_cast<long long>(t.generated_tokens), static_cast<long long>(t.verify_windows));
    std::fprintf(stderr,
                 "[mean acceptance length %.2f (1 + accepted/drafts, bonus included) | acceptance rate %.3f | decode "
                 "%.1f tok/s]\n",
                 t.mean_acceptance_length(), t.acceptance_rate(), tok_s);
    std::fprintf(stderr, "[KV at the end: %lld slots resident (compressed) of %lld full; %.2f of %.2f MB]\n",
                 static_cast<long long>(t.resident_kv_slots), static_cast<long long>(t.full_kv_slots),
                 static_cast<double>(t.resident_kv_bytes) / 1e6, static_cast<double>(t.full_kv_bytes) / 1e6);
    if (transfer) {
      const TransferStats ts = transfer->stats();
      std::fprintf(stderr,
                   "[verification from transient pages: %lld copies of KV_full, %.1f MB over %s, %.3f s waited]\n",
                   static_cast<long long>(ts.transfers), static_cast<double>(ts.bytes) / 1e6,
                   transfer->describe().c_str(), t.transfer_wait_seconds);
    }
    for (const std::string& f : failures)
      std::fprintf(stderr, "[compressor failed, decoded on the full cache: %s]\n", f.c_str());
    if (o.check) {
      std::fprintf(stderr,
                   "[check against full-KV decoding: %lld mismatching tokens in %lld of %lld requests%s | full-KV "
                   "decode %.1f tok/s, speedup %.2fx]\n",
                   static_cast<long long>(mismatches), static_cast<long long>(mismatched_requests),
                   static_cast<long long>(results.size()), mismatches == 0 ? " (lossless)" : "", baseline_tok_s,
                   baseline_tok_s > 0 ? tok_s / baseline_tok_s : 0.0);
      if (mismatches > 0)
        std::fprintf(stderr, "[first difference: %s]\n", first_difference(results, baseline, diffs, m.tokenizer()).c_str());
    }
  }
  return o.check && mismatches > 0 ? kExitFailure : kExitOk;
}

}  // namespace vericache::cli
