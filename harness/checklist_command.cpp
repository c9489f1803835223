// vericache checklist: the paper's checklist for one model and compressor, each step ending in a
// verdict, every measurement in one HDF5 trace (checklist_trace.h) in a new run folder.
//   1. KL growth: decoding on the compressed cache alone along the full-KV greedy continuation
//      (teacher forced); per-step KL(p_full || p_compressed) and argmax agreement; the cumulative KL
//      (mean over prompts) against the step with a least-squares line. Holds: slope > 0, R^2 >= 0.9.
//   2. Acceptance: the draft-verify engine at each draft length x: accepted length per verify,
//      acceptance per draft position, gamma(x, c) = accepted / drafted; then at x, gamma as c falls
//      (the acceptance cliff), as the temperature rises (sampled) and as the context grows (a few
//      prompts per length cut from a long text). Holds: every greedy run's tokens are full-KV
//      greedy decoding's, and gamma at each x is at most a stated band below the committed
//      baseline for this configuration (checklist_baseline.h; not judged without one).
//   3. Throughput model: Eq. 3's iteration time at each x, its constants fitted to the forwards of
//      the runs at the other draft lengths, against the measured one. Holds: median |error| <= 15%
//      (not judged when this machine's speed moved by more than that between the runs, measured).
//   4. End-to-end: VeriCache at (c, x) against full-KV decoding on the prompt set: token mismatches,
//      and KL(p_full || p_VeriCache) of every output token's distribution. Holds: 0 mismatches and
//      every KL < 0.01 nats.
// Exit status 1 when a verdict fails.
#include <ATen/ATen.h>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>

#include <csignal>
#include <unistd.h>

#include "bench_support.h"
#include "checklist_baseline.h"
#include "checklist_figures.h"
#include "checklist_trace.h"
#include "cli_common.h"
#include "prompt_set.h"
#include "commands.h"
#include "engine/compression.h"
#include "engine/compression_divergence.h"
#include "engine/full_kv_comparison.h"
#include "kv/packed_page_pool.h"
#include "sim/forward_cost_fit.h"
#include "sim/throughput_model.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace vericache::cli {
namespace {

// The run folder, empty until the trace is written at the end: an interrupted run removes it and
// says so (only async-signal-safe calls in the handler).
char g_run_folder[4096] = {0};
extern "C" void on_interrupt(int signal) {
  if (g_run_folder[0] != 0) rmdir(g_run_folder);
  const char message[] = "\n[checklist] interrupted: no trace written (the run folder was empty and is removed)\n";
  [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, message, sizeof(message) - 1);
  _exit(128 + signal);
}

struct Verdict {
  int step = 0;
  std::string name;
  int holds = -1;  // 1 holds, 0 fails, -1 not evaluated
  std::string summary;
};

struct Column {
  std::string name;
  std::vector<double> values;
};

// Columns gathered by name, in the order first used.
class Trace {
 public:
  std::vector<double>& operator[](const std::string& name) {
    for (Column& c : columns_) {
      if (c.name == name) return c.values;
    }
    return columns_.emplace_back(Column{name, {}}).values;
  }
  Hdf5Table table() const {
    Hdf5Table t;
    for (const Column& c : columns_) {
      t.names.push_back(c.name);
      t.columns.push_back(c.values);
    }
    return t;
  }

 private:
  std::vector<Column> columns_;
};

void progress(const char* what, int64_t done, int64_t total, std::chrono::steady_clock::time_point start) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total - done) : 0;
  const int width = 24, filled = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  std::fprintf(stderr, "\r[checklist] %-22s [%s%s] %lld/%lld  %.0f s, ETA %.0f s ", what, std::string(filled, '#').c_str(),
               std::string(width - filled, '.').c_str(), static_cast<long long>(done), static_cast<long long>(total),
               elapsed, eta);
  if (done == total) std::fprintf(stderr, "\n");
}

std::string hardware() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " threads";
}

// A new folder under `root` named after the time and the compressor (-2, -3, ... when taken).
Result<std::string> new_run_folder(const std::string& root, const std::string& compressor) {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::gmtime(&now));
  const std::string base = root + "/checklist-" + stamp + "-" + compressor;
  std::error_code ec;
  fs::create_directories(root, ec);
  for (int i = 1; i < 1000; ++i) {
    const std::string path = i == 1 ? base : base + "-" + std::to_string(i);
    if (fs::create_directory(path, ec)) return path;
    if (ec) return Status::io_error(path + ": cannot create the run folder (" + ec.message() + ")");
  }
  return Status::io_error(base + ": every run folder name is taken");
}

struct LineFit {
  double intercept = 0, slope = 0, r2 = 0;
};
// Least squares y = a + b t over t = 1..n.
LineFit linear_fit(const std::vector<double>& y) {
  const auto n = static_cast<double>(y.size());
  double st = 0, sy = 0, stt = 0, sty = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double t = static_cast<double>(i + 1);
    st += t, sy += y[i], stt += t * t, sty += t * y[i];
  }
  const double b = (n * sty - st * sy) / (n * stt - st * st), a = (sy - b * st) / n;
  double sse = 0, sst = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double fit = a + b * static_cast<double>(i + 1);
    sse += (y[i] - fit) * (y[i] - fit);
    sst += (y[i] - sy / n) * (y[i] - sy / n);
  }
  return {a, b, sst > 0 ? 1.0 - sse / sst : 0.0};
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

struct Setup {
  const LlamaModel* model = nullptr;
  Compressor* compressor = nullptr;
  double ratio = 0.25;  // a quantizer keeps every token: 1
  std::vector<std::vector<int32_t>> prompts;
  bool quantizer() const { return compressor->family() == CompressorFamily::kQuantization; }
};

// The compressed cache of one prompt, as the engine holds it: a token dropper's kept slots, or a
// quantizer's slots packed in whole blocks (into `packed`, made here) and its float tail.
Status compress_prompt(const Setup& s, PagePool& pool, std::span<const int32_t> ids, SequenceKv& compressed,
                       std::optional<PackedPagePool>& packed, std::optional<Packing>& packing) {
  const LlamaModel& m = *s.model;
  if (!s.quantizer()) return prefill_and_compress(m, pool, *s.compressor, s.ratio, ids, 0, compressed);
  VC_ASSIGN_OR_RETURN(const PackedFormat format, checked_packed_format(*s.compressor, pool.spec()));
  VC_ASSIGN_OR_RETURN(packed, PackedPagePool::create(pool.num_pages(), format.bytes_per_page));
  packing = Packing{s.compressor, format, &*packed, /*request_id=*/0};
  std::vector<int32_t> positions(ids.size());
  std::iota(positions.begin(), positions.end(), 0);
  const ForwardItem item{ids, positions, &compressed, &pool, LogitRows::kLast, 0};
  at::Tensor logits;
  return forward_with_quantizer(m, std::span(&item, 1), pool, &logits, *s.compressor, format, *packed, /*observe=*/true);
}

Result<Verdict> kl_growth(const Setup& s, int64_t steps, Trace& trace) {
  const LlamaModel& m = *s.model;
  const int64_t layers = m.config().n_layers;
  std::vector<double> mean_cumulative(steps, 0.0);
  double kl_sum = 0, agree = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t p = 0; p < s.prompts.size(); ++p) {
    const std::vector<int32_t>& ids = s.prompts[p];
    const auto n = static_cast<int64_t>(ids.size());
    VC_ASSIGN_OR_RETURN(PagePool pool, m.make_page_pool(16, 2 * layers * ((3 * n + steps + 2200) / 16 + 2)));
    SequenceKv full(layers), compressed(layers);
    std::vector<int32_t> positions(n);
    std::iota(positions.begin(), positions.end(), 0);
    const ForwardItem item{ids, positions, &full, &pool, LogitRows::kLast, 0};
    at::Tensor logits;
    VC_RETURN_IF_ERROR(m.forward(std::span(&item, 1), &logits));
    const auto first = static_cast<int32_t>(logits[0].argmax().item<int64_t>());
    std::optional<PackedPagePool> packed;
    std::optional<Packing> packing;
    Status compressing = compress_prompt(s, pool, ids, compressed, packed, packing);
    Compressor* online = s.compressor->mode() == CompressionMode::kOnline && !s.quantizer() ? s.compressor : nullptr;
    auto divergence = compressing.ok() ? divergence_along_full_kv_greedy(m, pool, full, pool, compressed, first, n, steps,
                                                                         online, s.ratio, packing ? &*packing : nullptr)
                                       : Result<std::vector<DivergenceStep>>(compressing);
    s.compressor->release(0);
    full.release(pool);
    if (packed) compressed.release_packed(*packed);
    compressed.release(pool);
    VC_RETURN_IF_ERROR(divergence.status());
    double cumulative = 0;
    for (int64_t t = 0; t < steps; ++t) {
      const DivergenceStep& d = (*divergence)[t];
      cumulative += d.kl;
      trace["kl_growth/prompt"].push_back(static_cast<double>(p));
      trace["kl_growth/step"].push_back(static_cast<double>(t + 1));
      trace["kl_growth/kl"].push_back(d.kl);
      trace["kl_growth/same_argmax"].push_back(d.same_argmax ? 1.0 : 0.0);
      trace["kl_growth/cumulative_kl"].push_back(cumulative);
      mean_cumulative[t] += cumulative / static_cast<double>(s.prompts.size());
      kl_sum += d.kl;
      agree += d.same_argmax;
    }
    progress("1. KL growth", static_cast<int64_t>(p + 1), static_cast<int64_t>(s.prompts.size()), start);
  }
  const auto [intercept, slope, r2] = linear_fit(mean_cumulative);
  for (int64_t t = 0; t < steps; ++t) {
    trace["kl_growth_mean/step"].push_back(static_cast<double>(t + 1));
    trace["kl_growth_mean/mean_cumulative_kl"].push_back(mean_cumulative[t]);
    trace["kl_growth_mean/fit"].push_back(intercept + slope * static_cast<double>(t + 1));
  }
  const double samples = static_cast<double>(steps * s.prompts.size());
  Verdict v{1, "KL growth", slope > 0 && r2 >= 0.9 ? 1 : 0,
            "mean KL " + fmt("%.4f", kl_sum / samples) + " nats/step, argmax agreement " + fmt("%.3f", agree / samples) +
                "; cumulative KL after " + std::to_string(steps) + " steps " + fmt("%.3f", mean_cumulative.back()) +
                " nats, linear fit slope " + fmt("%.4f", slope) + "/step, R^2 " + fmt("%.3f", r2) +
                " (holds: slope > 0 and R^2 >= 0.9)"};
  return v;
}

// The prompt set as engine requests: `max_tokens` each, greedy at temperature 0, else sampled with
// a seed per prompt (its index + 1).
std::vector<GenerationRequest> engine_requests(const Setup& s, int64_t max_tokens, double temperature) {
  std::vector<GenerationRequest> requests;
  for (size_t p = 0; p < s.prompts.size(); ++p) {
    GenerationRequest r;
    r.prompt = s.prompts[p];
    r.max_new_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.seed = p + 1;
    requests.push_back(r);
  }
  return requests;
}

// Full-KV log-probabilities of each generated token's position: one forward over the prompt and the
// full-KV greedy output (teacher forced), row k the distribution the k-th output token was chosen
// from. [generated, vocab] float.
Result<at::Tensor> full_kv_log_probs(const LlamaModel& m, const std::vector<int32_t>& prompt,
                                     const std::vector<int32_t>& generated) {
  std::vector<int32_t> ids = prompt;
  ids.insert(ids.end(), generated.begin(), generated.end());
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t layers = m.config().n_layers;
  VC_ASSIGN_OR_RETURN(PagePool pool, m.make_page_pool(16, layers * (n / 16 + 2)));
  SequenceKv kv(layers);
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  const ForwardItem item{ids, positions, &kv, &pool, LogitRows::kAll, 0};
  at::Tensor logits;
  const Status status = m.forward(std::span(&item, 1), &logits);
  kv.release(pool);
  VC_RETURN_IF_ERROR(status);
  const auto first = static_cast<int64_t>(prompt.size()) - 1;
  return logits.narrow(0, first, static_cast<int64_t>(generated.size())).to(at::kDouble).log_softmax(-1);
}

// KL(p_full || p_VeriCache) of one committed token.
struct TokenKl {
  int64_t request = 0, position = 0;
  double kl = 0;
};

// What one engine run at draft length x recorded: its verify windows and decode forwards, and with
// `reference` (full_kv_log_probs per request) the KL of every committed token's distribution.
struct EngineRun : public StatsSink {
  int64_t x = 0;
  std::vector<WindowRecord> windows;
  std::vector<StepRecord> decode_steps;  // forwards without prefill rows
  double gamma = 0;
  const std::vector<at::Tensor>* reference = nullptr;
  const Setup* setup = nullptr;
  std::vector<TokenKl> kls;
  RequestMetrics totals;
  // From the first decode forward's start to the last one's end: the decode phase's wall time.
  double decode_wall_seconds() const {
    if (decode_steps.empty()) return 0;
    return decode_steps.back().start_seconds + decode_steps.back().seconds - decode_steps.front().start_seconds;
  }
  double decode_seconds() const {
    double total = 0;
    for (const StepRecord& st : decode_steps) total += st.seconds;
    return total;
  }
  void on_window(const WindowRecord& w) override { windows.push_back(w); }
  void on_step(const StepRecord& st) override {
    if (st.prefill_items == 0) decode_steps.push_back(st);
  }
  void on_token_logits(int64_t request, int64_t position, std::span<const float> logits) override {
    if (reference == nullptr || request < 0 || request >= static_cast<int64_t>(reference->size())) return;
    const at::Tensor& full = (*reference)[request];
    const int64_t k = position - static_cast<int64_t>(setup->prompts[request].size());
    if (k < 0 || k >= full.size(0)) return;  // past full-KV decoding's end (a stop the engine runs over)
    const at::Tensor ours =
        at::from_blob(const_cast<float*>(logits.data()), {static_cast<int64_t>(logits.size())}, at::kFloat)
            .to(at::kDouble)
            .log_softmax(-1);
    const at::Tensor p = full[k];
    kls.push_back({request, position, (p.exp() * (p - ours)).sum().item<double>()});
  }
};

// The engine at (ratio, x) on `requests`, recording into `run`, compared with `reference`.
Result<FullKvComparison> run_engine(const Setup& s, double ratio, int64_t x, const std::vector<GenerationRequest>& requests,
                                    const std::vector<GenerationResult>& reference, EngineRun* run) {
  EngineOptions options;
  options.compressor = s.compressor;
  options.ratio = ratio;
  options.draft_length = x;
  options.sink = run;
  return compare_with_full_kv(*s.model, options, requests, reference);
}

struct EngineSteps {
  Verdict acceptance, end_to_end;
  std::vector<EngineRun> runs;  // by draft length, in the order run
};

// Step 2 (every x) and step 4 (x = the chosen one): engine runs against full-KV greedy decoding.
// Step 4 also compares every output token's distribution with full-KV decoding's: the paper calls
// outputs identical at KL < 0.01 nats; our kernels are row-count invariant, so it is 0 here.
constexpr double kMaxKl = 0.01;
Result<EngineSteps> acceptance_and_end_to_end(const Setup& s, const std::vector<int64_t>& xs, int64_t chosen_x,
                                              const std::vector<GenerationRequest>& requests,
                                              const std::vector<GenerationResult>& reference, Trace& trace) {
  const LlamaModel& m = *s.model;
  std::vector<at::Tensor> reference_log_probs;
  for (size_t p = 0; p < requests.size(); ++p) {
    VC_ASSIGN_OR_RETURN(at::Tensor lp, full_kv_log_probs(m, s.prompts[p], reference[p].tokens));
    reference_log_probs.push_back(std::move(lp));
  }
  bool all_identical = true;
  std::string gammas;
  EngineSteps out{{}, {4, "End-to-end", -1, ""}, {}};
  Verdict& end_to_end = out.end_to_end;
  out.runs.reserve(xs.size());
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t x = xs[i];
    EngineRun& engine_run = out.runs.emplace_back();
    engine_run.x = x;
    if (x == chosen_x) {
      engine_run.reference = &reference_log_probs;
      engine_run.setup = &s;
    }
    VC_ASSIGN_OR_RETURN(const FullKvComparison run, run_engine(s, s.ratio, x, requests, reference, &engine_run));
    const RequestMetrics& totals = run.totals;
    engine_run.totals = totals;
    int64_t mismatches = 0, tokens = 0, prompts_differing = 0;
    std::string failures;
    for (size_t p = 0; p < requests.size(); ++p) {
      const int64_t count = run.diffs[p].mismatches();
      if (!run.results[p].compressor_failure.empty()) failures += " " + run.results[p].compressor_failure;
      mismatches += count;
      prompts_differing += count > 0;
      tokens += static_cast<int64_t>(run.results[p].generation.tokens.size());
      if (x == chosen_x) {
        trace["end_to_end/prompt"].push_back(static_cast<double>(p));
        trace["end_to_end/prompt_tokens"].push_back(static_cast<double>(requests[p].prompt.size()));
        trace["end_to_end/generated"].push_back(static_cast<double>(run.results[p].generation.tokens.size()));
        trace["end_to_end/mismatches"].push_back(static_cast<double>(count));
        trace["end_to_end/first_mismatch"].push_back(static_cast<double>(run.diffs[p].first_mismatch));
      }
    }
    for (const WindowRecord& w : engine_run.windows) {
      trace["acceptance/x"].push_back(static_cast<double>(x));
      trace["acceptance/request"].push_back(static_cast<double>(w.request_id));
      trace["acceptance/drafted"].push_back(static_cast<double>(w.drafted));
      trace["acceptance/accepted"].push_back(static_cast<double>(w.accepted));
    }
    for (size_t pos = 0; pos < totals.drafted_per_position.size(); ++pos) {
      trace["acceptance_position/x"].push_back(static_cast<double>(x));
      trace["acceptance_position/position"].push_back(static_cast<double>(pos));
      trace["acceptance_position/drafted"].push_back(static_cast<double>(totals.drafted_per_position[pos]));
      trace["acceptance_position/accepted"].push_back(static_cast<double>(totals.accepted_per_position[pos]));
    }
    const double gamma = totals.acceptance_rate();
    engine_run.gamma = gamma;
    for (const StepRecord& st : engine_run.decode_steps) {
      trace["iterations/x"].push_back(static_cast<double>(x));
      trace["iterations/seconds"].push_back(st.seconds);
      trace["iterations/draft_items"].push_back(static_cast<double>(st.draft_items));
      trace["iterations/verify_items"].push_back(static_cast<double>(st.verify_items));
      trace["iterations/rows"].push_back(static_cast<double>(st.rows));
      trace["iterations/kv_slots_read"].push_back(static_cast<double>(st.kv_slots_read));
    }
    trace["acceptance_summary/x"].push_back(static_cast<double>(x));
    trace["acceptance_summary/gamma"].push_back(gamma);
    trace["acceptance_summary/mean_accepted"].push_back(totals.mean_acceptance_length());
    trace["acceptance_summary/tokens"].push_back(static_cast<double>(tokens));
    trace["acceptance_summary/mismatches"].push_back(static_cast<double>(mismatches));
    all_identical = all_identical && mismatches == 0 && failures.empty();
    gammas += (gammas.empty() ? "" : ", ") + std::to_string(x) + ": " + fmt("%.3f", gamma);
    if (x == chosen_x) {
      double kl_sum = 0, kl_max = 0;
      for (const TokenKl& k : engine_run.kls) {
        trace["end_to_end_kl/prompt"].push_back(static_cast<double>(k.request));
        trace["end_to_end_kl/position"].push_back(static_cast<double>(k.position));
        trace["end_to_end_kl/kl"].push_back(k.kl);
        kl_sum += k.kl;
        kl_max = std::max(kl_max, k.kl);
      }
      // Every output token's distribution is compared: tokens without one (a request that ran past
      // full-KV decoding's end is a mismatch already) fail the step.
      const auto compared = static_cast<int64_t>(engine_run.kls.size());
      end_to_end.holds = mismatches == 0 && failures.empty() && compared == tokens && kl_max < kMaxKl ? 1 : 0;
      end_to_end.summary =
          std::to_string(mismatches) + " token mismatches in " + std::to_string(tokens) + " tokens of " +
          std::to_string(requests.size()) + " prompts (" + std::to_string(prompts_differing) + " prompts differ)" +
          (failures.empty() ? "" : "; compressor failures:" + failures) + "; KL(full-KV || VeriCache) per token over " +
          std::to_string(compared) + " tokens: mean " + fmt("%.3g", compared ? kl_sum / static_cast<double>(compared) : 0.0) +
          ", max " + fmt("%.3g", kl_max) + " nats; mean accepted length " + fmt("%.2f", totals.mean_acceptance_length()) +
          " at x = " + std::to_string(x) + " (holds: 0 mismatches and every token's KL < 0.01 nats)";
    }
    progress("2. Acceptance", static_cast<int64_t>(i + 1), static_cast<int64_t>(xs.size()), start);
  }
  out.acceptance = Verdict{2, "Acceptance", all_identical ? 1 : 0,
                     "gamma(x, c = " + fmt("%g", s.ratio) + ") for x = " + gammas +
                         (all_identical ? "; every run identical to full-KV decoding" : "; a run differs from full-KV decoding")};
  return out;
}

// Beyond the paper (part of step 2): acceptance at the chosen x as c falls (greedy; every run
// checked against full-KV decoding like the others) and as the temperature rises (sampled, seeded;
// their tokens follow the full-KV sampling distribution, which the engine tests check, so they are
// not compared here), with the decode tokens/s of each run on this machine.
struct Sweeps {
  bool all_identical = true;
  std::string summary;
};
Result<Sweeps> ratio_and_temperature_sweeps(const Setup& s, int64_t x, const std::vector<double>& ratios,
                                            const std::vector<double>& temperatures, int64_t max_tokens,
                                            const std::vector<GenerationRequest>& greedy,
                                            const std::vector<GenerationResult>& reference, Trace& trace) {
  Sweeps out;
  const auto start = std::chrono::steady_clock::now();
  const auto total = static_cast<int64_t>(ratios.size() + temperatures.size());
  std::string by_ratio, by_temperature;
  for (int64_t i = 0; i < total; ++i) {
    const bool sweep_ratio = i < static_cast<int64_t>(ratios.size());
    const double ratio = sweep_ratio ? ratios[i] : s.ratio;
    const double temperature = sweep_ratio ? 0.0 : temperatures[i - ratios.size()];
    EngineRun run;
    const std::vector<GenerationRequest> requests = sweep_ratio ? greedy : engine_requests(s, max_tokens, temperature);
    // For a sampled run the reference only sizes the comparison; its mismatches are not read.
    VC_ASSIGN_OR_RETURN(const FullKvComparison result, run_engine(s, ratio, x, requests, reference, &run));
    int64_t tokens = 0, mismatches = 0, failed = 0;
    for (size_t p = 0; p < requests.size(); ++p) {
      tokens += static_cast<int64_t>(result.results[p].generation.tokens.size());
      mismatches += result.diffs[p].mismatches();
      failed += result.results[p].compressor_failure.empty() ? 0 : 1;
    }
    const double decode_seconds = run.decode_seconds();
    const double tok_s = decode_seconds > 0 ? static_cast<double>(tokens - static_cast<int64_t>(requests.size())) / decode_seconds : 0;
    const double gamma = result.totals.acceptance_rate(), accepted = result.totals.mean_acceptance_length();
    if (sweep_ratio) {
      trace["ratio_sweep/ratio"].push_back(ratio);
      trace["ratio_sweep/x"].push_back(static_cast<double>(x));
      trace["ratio_sweep/gamma"].push_back(gamma);
      trace["ratio_sweep/mean_accepted"].push_back(accepted);
      trace["ratio_sweep/tokens"].push_back(static_cast<double>(tokens));
      trace["ratio_sweep/mismatches"].push_back(static_cast<double>(mismatches));
      trace["ratio_sweep/compressor_failures"].push_back(static_cast<double>(failed));
      trace["ratio_sweep/tok_s"].push_back(tok_s);
      out.all_identical = out.all_identical && mismatches == 0;
      by_ratio += (by_ratio.empty() ? "" : ", ") + fmt("%g", ratio) + ": " + fmt("%.3f", gamma) +
                  (failed ? " (" + std::to_string(failed) + " requests' compressor failed)" : "");
    } else {
      trace["temperature_sweep/temperature"].push_back(temperature);
      trace["temperature_sweep/ratio"].push_back(ratio);
      trace["temperature_sweep/x"].push_back(static_cast<double>(x));
      trace["temperature_sweep/gamma"].push_back(gamma);
      trace["temperature_sweep/mean_accepted"].push_back(accepted);
      trace["temperature_sweep/tokens"].push_back(static_cast<double>(tokens));
      trace["temperature_sweep/tok_s"].push_back(tok_s);
      trace["temperature_sweep/compressor_failures"].push_back(static_cast<double>(failed));
      by_temperature += (by_temperature.empty() ? "" : ", ") + fmt("%g", temperature) + ": " + fmt("%.3f", gamma);
    }
    progress("2. Sweeps (c, T)", i + 1, total, start);
  }
  if (!by_ratio.empty()) {
    out.summary += "; at x = " + std::to_string(x) + ", gamma by c " + by_ratio +
                   (out.all_identical ? " (every run identical)" : " (a run differs from full-KV decoding)");
  }
  if (!by_temperature.empty()) out.summary += "; gamma by temperature (sampled) " + by_temperature;
  return out;
}

// Beyond the paper (part of step 2): acceptance at (c, x) against context length: per context N,
// `prompts` prompts of N tokens, the corpus's consecutive stretches [jN, (j + 1)N), run together
// (greedy, checked against full-KV decoding); gamma pooled over them and per prompt.
Result<Sweeps> context_sweep(const Setup& s, const std::vector<int32_t>& corpus, const std::vector<int64_t>& contexts,
                             int64_t prompts, int64_t x, int64_t max_tokens, Trace& trace) {
  Sweeps out;
  const LlamaModel& m = *s.model;
  const auto start = std::chrono::steady_clock::now();
  std::string by_context;
  for (size_t i = 0; i < contexts.size(); ++i) {
    Setup one = s;
    one.prompts.clear();
    for (int64_t j = 0; j < prompts; ++j) {
      const std::vector<int32_t> stretch(corpus.begin() + j * contexts[i], corpus.end());
      VC_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, bench_prompt(m, stretch, contexts[i], ""));
      one.prompts.push_back(std::move(prompt));
    }
    const std::vector<GenerationRequest> requests = engine_requests(one, max_tokens, 0.0);
    VC_ASSIGN_OR_RETURN(const std::vector<GenerationResult> reference, full_kv_reference(m, requests));
    EngineRun run;
    VC_ASSIGN_OR_RETURN(const FullKvComparison result, run_engine(s, s.ratio, x, requests, reference, &run));
    int64_t mismatches = 0, tokens = 0, failed = 0;
    std::string failures;
    for (int64_t j = 0; j < prompts; ++j) {
      const EngineResult& r = result.results[j];
      mismatches += result.diffs[j].mismatches();
      tokens += static_cast<int64_t>(r.generation.tokens.size());
      // A compressor that fails leaves the request on full KV (still lossless, nothing drafted): said, not hidden.
      if (!r.compressor_failure.empty()) {
        ++failed;
        if (failures.empty()) failures = r.compressor_failure;
      }
      double drafted = 0, accepted = 0;
      for (const WindowRecord& w : run.windows) {
        if (w.request_id != r.request_id) continue;
        drafted += static_cast<double>(w.drafted);
        accepted += static_cast<double>(w.accepted);
      }
      trace["context_sweep_prompt/context"].push_back(static_cast<double>(contexts[i]));
      trace["context_sweep_prompt/prompt"].push_back(static_cast<double>(j));
      trace["context_sweep_prompt/gamma"].push_back(drafted > 0 ? accepted / drafted : 0.0);
      trace["context_sweep_prompt/mismatches"].push_back(static_cast<double>(result.diffs[j].mismatches()));
    }
    const double decode_seconds = run.decode_seconds();
    const double gamma = result.totals.acceptance_rate();
    trace["context_sweep/context"].push_back(static_cast<double>(contexts[i]));
    trace["context_sweep/prompt_tokens"].push_back(static_cast<double>(requests[0].prompt.size()));
    trace["context_sweep/prompts"].push_back(static_cast<double>(prompts));
    trace["context_sweep/ratio"].push_back(s.ratio);
    trace["context_sweep/x"].push_back(static_cast<double>(x));
    trace["context_sweep/gamma"].push_back(gamma);
    trace["context_sweep/mean_accepted"].push_back(result.totals.mean_acceptance_length());
    trace["context_sweep/tokens"].push_back(static_cast<double>(tokens));
    trace["context_sweep/mismatches"].push_back(static_cast<double>(mismatches));
    trace["context_sweep/compressor_failures"].push_back(static_cast<double>(failed));
    trace["context_sweep/tok_s"].push_back(decode_seconds > 0 ? static_cast<double>(tokens - prompts) / decode_seconds : 0.0);
    out.all_identical = out.all_identical && mismatches == 0;
    by_context += (by_context.empty() ? "" : ", ") + std::to_string(contexts[i]) + ": " + fmt("%.3f", gamma) +
                  (failed ? " (" + std::to_string(failed) + " requests' compressor failed: " + failures + ")" : "");
    progress("2. Contexts", static_cast<int64_t>(i + 1), static_cast<int64_t>(contexts.size()), start);
  }
  if (!by_context.empty()) {
    out.summary = "; gamma by context (tokens, " + (prompts == 1 ? std::string("1 prompt") : std::to_string(prompts) + " prompts each") +
                  ") " + by_context +
                  (out.all_identical ? " (every run identical)" : " (a run differs from full-KV decoding)");
  }
  return out;
}

// Part of step 4: decode speed at (c, x) on the prompt set, every request in one batch, on this
// machine: full-KV decoding (the reference run), decoding on the compressed cache alone (the lossy
// baseline a compressor paper serves; its greedy tokens compared with full-KV decoding's) and
// VeriCache (the end-to-end run). Tokens after each request's first (which prefill gives) over the
// decode phase's wall time. Returns the verdict's sentence.
Result<std::string> decode_speeds(const Setup& s, const std::vector<GenerationRequest>& greedy,
                                  const std::vector<GenerationResult>& reference, const GenerationStats& full,
                                  const EngineRun& vericache, Trace& trace) {
  const LlamaModel& m = *s.model;
  const auto requests = static_cast<int64_t>(greedy.size());
  int64_t longest = 0;
  for (const GenerationRequest& r : greedy) longest = std::max<int64_t>(longest, static_cast<int64_t>(r.prompt.size()));
  // An offline compressor's scoring forwards (KVzip's reconstruction) need room beside the cache.
  const int64_t extra = s.compressor->mode() == CompressionMode::kOffline ? longest + 2200 : 0;
  VC_ASSIGN_OR_RETURN(PagePool pool, m.make_page_pool(16, Generator::pages_needed(m, 16, greedy, extra)));
  GeneratorOptions options;
  options.compressor = s.compressor;
  options.ratio = s.ratio;
  Generator generator(m, pool, options);
  GenerationStats lossy;
  VC_ASSIGN_OR_RETURN(const std::vector<GenerationResult> lossy_out, generator.generate(greedy, {}, &lossy));
  int64_t lossy_mismatches = 0, reference_tokens = 0;
  for (size_t p = 0; p < greedy.size(); ++p) {
    reference_tokens += static_cast<int64_t>(reference[p].tokens.size());
    lossy_mismatches += diff_tokens(lossy_out[p].tokens, reference[p].tokens).mismatched_tokens;
  }
  struct Mode {
    double tokens, seconds, mismatches, kv_bytes;
  };
  const Mode modes[] = {
      {static_cast<double>(full.generated_tokens - requests), full.decode_seconds, 0, static_cast<double>(full.full_kv_bytes)},
      {static_cast<double>(lossy.generated_tokens - requests), lossy.decode_seconds, static_cast<double>(lossy_mismatches),
       static_cast<double>(lossy.resident_kv_bytes)},
      {static_cast<double>(vericache.totals.generated_tokens - requests), vericache.decode_wall_seconds(), 0,
       static_cast<double>(vericache.totals.resident_kv_bytes)}};
  double tok_s[3];
  for (int i = 0; i < 3; ++i) {
    tok_s[i] = modes[i].seconds > 0 ? modes[i].tokens / modes[i].seconds : 0;
    trace["decode_speed/mode"].push_back(i);
    trace["decode_speed/requests"].push_back(static_cast<double>(requests));
    trace["decode_speed/tokens"].push_back(modes[i].tokens);
    trace["decode_speed/seconds"].push_back(modes[i].seconds);
    trace["decode_speed/tok_s"].push_back(tok_s[i]);
    trace["decode_speed/mismatches"].push_back(modes[i].mismatches);
    trace["decode_speed/kv_bytes"].push_back(modes[i].kv_bytes);
  }
  return "; decode tok/s, " + std::to_string(requests) + " requests in one batch on this machine: full KV " +
         fmt("%.1f", tok_s[0]) + ", the compressed cache alone " + fmt("%.1f", tok_s[1]) + " (lossy: " +
         std::to_string(lossy_mismatches) + " of " + std::to_string(reference_tokens) +
         " greedy tokens differ from full-KV decoding), VeriCache " + fmt("%.1f", tok_s[2]) + " (" +
         fmt("%.2f", tok_s[0] > 0 ? tok_s[2] / tok_s[0] : 0.0) + "x full KV)";
}

// Step 3: Eq. 3's iteration time against the engine's, at every draft length. Eq. 3 reads bytes
// only; a forward on this CPU also costs time per request and per further verify row, so the
// constants are fitted (sim/forward_cost_fit.h) to the decode forwards of the runs at the *other*
// draft lengths (leave one out), and the prediction at x is Eq. 3's bytes over the fitted
// bandwidth plus those two terms for B requests drafting or verifying, B/x of them verifying x
// further rows:
//   T_iter(x) = (M + B*KV_full*(c + 1/x)) / BW + B*t_req + (B/x)*x*t_row
// with KV_full the mean full cache (prompt + half the output) and c the ratio. No link term: the
// engine here verifies in place (bench-reload measures reloads over an emulated link). Measured:
// the mean of a run's forwards that carried every request. Holds: the median |error| over the
// draft lengths <= 15%. Not judged (NOT MEASURED, with the measured reason) when the error is
// larger, this machine's own speed moved by more than 15% between the runs, and the error is
// within 15% plus that drift (a larger error fails whatever the drift): on this 2-core VM
// whole runs switch between ~7.5 ms and ~12 ms draft-only forwards (same shapes, with or without
// torch's OpenMP threads), which a fit to the other runs cannot absorb. The drift is measured by
// the median draft-only forward of each run (the same work in every run), printed beside the errors.
Verdict throughput_model(const Setup& s, const std::vector<EngineRun>& runs, int64_t chosen_x, int64_t max_tokens,
                         Trace& trace) {
  constexpr double kHoldsWithin = 0.15;
  const LlamaModel& m = *s.model;
  const LlamaConfig& cfg = m.config();
  const double slot_bytes = 2.0 * static_cast<double>(cfg.n_kv_heads * cfg.head_dim * at::elementSize(m.dtype()));
  const double weight_bytes = static_cast<double>(m.decode_weight_bytes());
  const auto batch = static_cast<int64_t>(s.prompts.size());
  const auto b = static_cast<double>(batch);
  if (runs.size() < 2) {
    return Verdict{3, "Throughput model", -1,
                   "not measured: each draft length is predicted from the runs at the others, and --draft-lengths "
                   "has one"};
  }
  double mean_prompt = 0;
  for (const auto& ids : s.prompts) mean_prompt += static_cast<double>(ids.size()) / b;
  std::vector<double> abs_errors, draft_medians;
  std::string per_x, chosen;
  for (const EngineRun& run : runs) {
    std::vector<double> draft_only;
    for (const StepRecord& st : run.decode_steps) {
      if (st.verify_items == 0 && st.draft_items == batch) draft_only.push_back(st.seconds);
    }
    if (!draft_only.empty()) {
      std::nth_element(draft_only.begin(), draft_only.begin() + draft_only.size() / 2, draft_only.end());
      draft_medians.push_back(draft_only[draft_only.size() / 2]);
    }
    std::vector<sim::ForwardSample> samples;
    for (const EngineRun& other : runs) {
      if (other.x == run.x) continue;
      for (const StepRecord& st : other.decode_steps) {
        const auto n = static_cast<double>(st.draft_items + st.verify_items);
        samples.push_back({n, static_cast<double>(st.rows) - n,
                           weight_bytes + static_cast<double>(st.kv_slots_read) * slot_bytes, st.seconds, 1.0});
      }
    }
    double measured = 0;
    int64_t full_forwards = 0;
    for (const StepRecord& st : run.decode_steps) {
      if (st.draft_items + st.verify_items != batch) continue;
      measured += st.seconds;
      ++full_forwards;
    }
    if (full_forwards == 0) continue;
    measured /= static_cast<double>(full_forwards);
    const sim::ForwardCosts costs = sim::fit_forward_costs(samples);
    sim::LongContextInputs in;
    in.weight_bytes = weight_bytes;
    in.kv_full_bytes = (mean_prompt + 0.5 * static_cast<double>(max_tokens)) * static_cast<double>(cfg.n_layers) * slot_bytes;
    in.hbm_bandwidth = costs.seconds_per_byte > 0 ? 1.0 / costs.seconds_per_byte : 1e18;  // 1e18: reads cost nothing measurable
    in.link_bandwidth = 1e18;
    in.batch = batch;
    in.ratio = s.ratio;
    in.draft_length = run.x;
    in.gamma = run.gamma;
    const sim::LongContextEstimate eq3 = sim::estimate_long_context(in);
    const double predicted = eq3.t_gpu_s + b * costs.request_s + b * costs.row_s;
    const double error = (predicted - measured) / measured;
    abs_errors.push_back(std::abs(error));
    trace["throughput_model/x"].push_back(static_cast<double>(run.x));
    trace["throughput_model/measured_iteration_s"].push_back(measured);
    trace["throughput_model/predicted_iteration_s"].push_back(predicted);
    trace["throughput_model/error"].push_back(error);
    trace["throughput_model/eq3_bytes_s"].push_back(eq3.t_gpu_s);
    trace["throughput_model/request_s"].push_back(costs.request_s);
    trace["throughput_model/row_s"].push_back(costs.row_s);
    trace["throughput_model/bandwidth_bytes_per_s"].push_back(costs.seconds_per_byte > 0 ? 1.0 / costs.seconds_per_byte : 0.0);
    trace["throughput_model/weight_bytes"].push_back(weight_bytes);
    trace["throughput_model/kv_full_bytes"].push_back(in.kv_full_bytes);
    trace["throughput_model/calibration_forwards"].push_back(static_cast<double>(samples.size()));
    trace["throughput_model/measured_forwards"].push_back(static_cast<double>(full_forwards));
    per_x += (per_x.empty() ? "" : ", ") + std::to_string(run.x) + ": " + fmt("%+.1f%%", 100 * error);
    if (run.x == chosen_x) {
      const std::string bandwidth = costs.seconds_per_byte > 0 ? fmt("%.1f GB/s", 1e-9 / costs.seconds_per_byte)
                                                               : std::string("unresolved (reads too small to time)");
      chosen = "; at x = " + std::to_string(run.x) + " Eq. 3 predicts " + fmt("%.1f", 1e3 * predicted) +
               " ms, measured " + fmt("%.1f", 1e3 * measured) + " ms (mean of " + std::to_string(full_forwards) +
               " forwards; fitted to " + std::to_string(samples.size()) + " forwards: bandwidth " + bandwidth + ", " +
               fmt("%.2f", 1e3 * costs.request_s) + " ms per request, " + fmt("%.2f", 1e3 * costs.row_s) +
               " ms per further verify row)";
    }
  }
  if (abs_errors.size() < 2) return Verdict{3, "Throughput model", -1, "not measured: too few runs carried every request"};
  std::sort(abs_errors.begin(), abs_errors.end());
  const size_t n = abs_errors.size();
  const double median = n % 2 ? abs_errors[n / 2] : 0.5 * (abs_errors[n / 2 - 1] + abs_errors[n / 2]);
  // The runs' median draft-only forward: the same work in every run, so its spread is how far this
  // machine's own speed moved between the runs.
  double drift = 0;
  std::string spread;
  if (!draft_medians.empty()) {
    const auto [fastest, slowest] = std::minmax_element(draft_medians.begin(), draft_medians.end());
    drift = *slowest / *fastest - 1.0;
    spread = "; the runs' median draft-only forward ranged " + fmt("%.1f", 1e3 * *fastest) + "-" +
             fmt("%.1f", 1e3 * *slowest) + " ms (" + fmt("%.0f%%", 100 * drift) + ")";
  }
  int holds = median <= kHoldsWithin ? 1 : 0;
  std::string reason;
  // Excused only when the machine's own drift can account for the error: an error beyond the bound
  // plus the drift fails whatever the drift.
  if (holds == 0 && drift > kHoldsWithin && median <= kHoldsWithin + drift) {
    holds = -1;
    reason = "; not judged: this machine's speed moved by more than the bound between the runs (the draft-only "
             "forwards above), so their leave-one-out fit cannot resolve 15%; rerun on an idle machine";
  }
  return Verdict{3, "Throughput model", holds,
                 "iteration time, B = " + std::to_string(batch) + ", each x predicted from the other runs: error " + per_x +
                     "; median |error| " + fmt("%.1f%%", 100 * median) + chosen + spread + reason +
                     " (holds: median |error| <= 15%)"};
}

}  // namespace

int run_checklist(int argc, char** argv) {
  std::string model_arg, compressor_arg, params = "{}", xs_arg, ratios_arg, temperatures_arg, contexts_arg, out_dir,
      prompt_set_path, python, context_text, baselines_path;
  std::vector<std::string> plugin_dirs;
  double ratio = 0.25;
  int64_t x = 25, n_prompts = 0, kl_steps = 0, max_tokens = 0, context_prompts = 0;
  bool quick = false;
  int threads = 0;
  po::options_description desc(
      "vericache checklist: the paper's four-step checklist (KL growth, acceptance, throughput model,\n"
      "end-to-end) on one model and compressor; every measurement goes to an HDF5 trace in a new run\n"
      "folder, with the figures drawn from it. Exit status 1 when a verdict fails.\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("compressor", po::value(&compressor_arg)->default_value("kvzip"),
     "plugin name or path: a token dropper, or a quantizer (which keeps every token: no -c, no c sweep)")
    ("params", po::value(&params)->default_value("{}"), "the compressor's parameters as a JSON object")
    ("ratio,c", po::value(&ratio)->default_value(0.25), "kept fraction c in (0, 1]")
    ("draft-length,x", po::value(&x)->default_value(25), "the end-to-end step's draft length")
    ("draft-lengths", po::value(&xs_arg), "the acceptance step's draft lengths (default 5,10,15,20,25,30,40; --quick 5,10,25)")
    ("ratios", po::value(&ratios_arg),
     "kept fractions c of the acceptance-cliff sweep at x, greedy (default 0.5,0.35,0.25,0.15,0.1,0.05; --quick 0.1; "
     "none: skip); the run's own c is measured once, by the acceptance step")
    ("temperatures", po::value(&temperatures_arg),
     "sampling temperatures of the sweep at (c, x) (default 0.3,0.7,1.0; --quick 0.7; none: skip)")
    ("contexts", po::value(&contexts_arg),
     "prompt lengths (tokens) of the context sweep at (c, x), greedy (default 1024,2048,4096,6000; --quick 1024; "
     "none: skip)")
    ("context-prompts", po::value(&context_prompts),
     "prompts per length in the context sweep, run together (default 2; --quick 1)")
    ("context-text", po::value(&context_text)->default_value(VC_DEFAULT_BENCH_TEXT),
     "the text the context sweep's prompts are cut from (for length N, prompt j is its tokens [jN, (j + 1)N))")
    ("baselines", po::value(&baselines_path)->default_value(VC_SOURCE_DIR "/harness/checklist/acceptance_baselines.json"),
     "step 2's committed gamma(x) per configuration, which a run may fall below by at most the file's band")
    ("prompt-set", po::value(&prompt_set_path)->default_value(VC_CHECKLIST_PROMPTS),
     "prompt set (JSON: {\"prompts\": [{\"name\", \"chat\", \"text\"}]}), e.g. datasets/long_code/prompts.json")
    ("prompts", po::value(&n_prompts), "the set's first N prompts to run (default 4; --quick 2)")
    ("kl-steps", po::value(&kl_steps), "decode steps of the KL growth step (default 128; --quick 32)")
    ("max-tokens", po::value(&max_tokens), "tokens per prompt in the engine steps (default 64; --quick 24)")
    ("quick", po::bool_switch(&quick), "a short run (CI): fewer prompts, steps and draft lengths")
    ("out-dir", po::value(&out_dir)->default_value(VC_RESULTS_RUNS_DIR), "where the run folder is made")
    ("python", po::value(&python)->default_value(default_figures_python()),
     "the Python (with h5py and matplotlib) that draws the figures into the run folder")
    ("plugin-dir", po::value(&plugin_dirs)->composing(), "also search this folder for plugins (repeatable)")
    ("threads", po::value(&threads)->default_value(0), "CPU threads; 0 uses all cores");
  // clang-format on
  po::variables_map vm;
  const std::string example = "Examples:\n  vericache checklist --quick\n  vericache checklist --compressor snapkv -c 0.1 -x 16\n";
  const std::vector<OptionRange> ranges{kRatioRange, kThreadsRange, {"draft-length", 1, 256}, {"prompts", 1, 50},
                                        {"kl-steps", 2, 4096}, {"max-tokens", 1, 4096}, {"context-prompts", 1, 16}};
  if (auto done = parse_command_line("checklist", desc, example, argc, argv, &vm, ranges)) return *done;
  if (n_prompts == 0) n_prompts = quick ? 2 : 4;
  if (kl_steps == 0) kl_steps = quick ? 32 : 128;
  if (max_tokens == 0) max_tokens = quick ? 24 : 64;
  if (context_prompts == 0) context_prompts = quick ? 1 : 2;
  std::vector<int64_t> xs;
  std::vector<double> ratios, temperatures;
  std::vector<int64_t> contexts;
  try {
    if (contexts_arg.empty()) contexts_arg = quick ? "1024" : "1024,2048,4096,6000";
    if (contexts_arg != "none") contexts = parse_positive_list(contexts_arg, "contexts", 1 << 20);
    xs = parse_positive_list(xs_arg.empty() ? (quick ? "5,10,25" : "5,10,15,20,25,30,40") : xs_arg, "draft-lengths", 256);
    if (ratios_arg.empty()) ratios_arg = quick ? "0.1" : "0.5,0.35,0.25,0.15,0.1,0.05";
    if (ratios_arg != "none") ratios = parse_number_list(ratios_arg, "ratios", 1e-3, 1.0);
    if (temperatures_arg.empty()) temperatures_arg = quick ? "0.7" : "0.3,0.7,1.0";
    if (temperatures_arg != "none") temperatures = parse_number_list(temperatures_arg, "temperatures", 1e-3, 10.0);
  } catch (const po::error& e) {
    return report_usage_error("checklist", e.what());
  }
  if (std::find(xs.begin(), xs.end(), x) == xs.end()) xs.push_back(x);
  ratios.erase(std::remove(ratios.begin(), ratios.end(), ratio), ratios.end());
  auto prompt_set = read_prompt_set(prompt_set_path, n_prompts);
  if (!prompt_set.ok()) return report_status("checklist", prompt_set.status());
  set_threads(threads);

  auto model = load_model(model_arg);
  if (!model.ok()) return report_error(model.status());
  const LlamaModel& m = **model;
  std::string plugin_path;
  auto compressor = load_compressor_for(compressor_arg, params, plugin_dirs, m, &plugin_path);
  if (!compressor.ok()) return report_status("checklist", compressor.status());
  // A quantizer keeps every token (c = 1): no kept fraction to set or sweep; its bits are parameters.
  if ((*compressor)->family() == CompressorFamily::kQuantization) {
    if (!vm["ratio"].defaulted()) return report_usage_error("checklist", quantizer_ratio_error((*compressor)->name()));
    if (vm.count("ratios") && ratios_arg != "none") {
      return report_usage_error("checklist", quantizer_ratio_error((*compressor)->name(), "--ratios"));
    }
    ratio = 1.0;
    ratios.clear();
  }
  if (Status fit = check_contexts_fit(m, contexts, max_tokens, x + 1); !fit.ok()) return report_status("checklist", fit);
  // Step 2's baseline, read now: a bad file is reported before the run, not after it.
  const auto baseline = find_acceptance_baseline(
      baselines_path, BaselineKey{m.path(), (*compressor)->name(), params, ratio, prompt_set_path, n_prompts, max_tokens});
  if (!baseline.ok()) return report_status("checklist", baseline.status());
  std::vector<int32_t> corpus;
  if (!contexts.empty()) {
    auto text = bench_corpus(m, context_text, *std::max_element(contexts.begin(), contexts.end()) * context_prompts);
    if (!text.ok()) return report_status("checklist", text.status());
    corpus = std::move(*text);
  }
  Setup setup{&m, compressor->get(), ratio, {}};
  for (const PromptEntry& p : *prompt_set) {
    auto ids = prompt_tokens(m, p.text, !p.chat, "");
    if (!ids.ok()) return report_error(ids.status());
    setup.prompts.push_back(*ids);
  }
  auto folder = new_run_folder(out_dir, (*compressor)->name());
  if (!folder.ok()) return report_error(folder.status());
  std::snprintf(g_run_folder, sizeof g_run_folder, "%s", folder->c_str());
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);

  Trace trace;
  std::vector<Verdict> verdicts;
  auto kl = kl_growth(setup, kl_steps, trace);
  if (!kl.ok()) return report_error(kl.status());
  verdicts.push_back(*kl);
  // The full-KV greedy reference the engine runs of steps 2 and 4 are compared with, made once.
  const std::vector<GenerationRequest> greedy = engine_requests(setup, max_tokens, 0.0);
  GenerationStats full_stats;
  auto reference = full_kv_reference(m, greedy, 16, &full_stats);
  if (!reference.ok()) return report_error(reference.status());
  auto engine_steps = acceptance_and_end_to_end(setup, xs, x, greedy, *reference, trace);
  if (!engine_steps.ok()) return report_error(engine_steps.status());
  auto sweeps = ratio_and_temperature_sweeps(setup, x, ratios, temperatures, max_tokens, greedy, *reference, trace);
  if (!sweeps.ok()) return report_error(sweeps.status());
  auto by_context = context_sweep(setup, corpus, contexts, context_prompts, x, max_tokens, trace);
  if (!by_context.ok()) return report_error(by_context.status());
  Verdict acceptance = engine_steps->acceptance;
  const bool identical = acceptance.holds == 1 && sweeps->all_identical && by_context->all_identical;
  std::map<int64_t, double> gammas;
  for (const EngineRun& run : engine_steps->runs) gammas[run.x] = run.gamma;
  const AcceptanceJudgement judged = judge_acceptance(gammas, *baseline, baselines_path);
  acceptance.holds = identical ? judged.holds : 0;
  acceptance.summary += sweeps->summary + by_context->summary + judged.summary +
                        " (holds: every greedy run identical, and gamma at each x at most the band below the "
                        "committed baseline)";
  verdicts.push_back(acceptance);
  verdicts.push_back(throughput_model(setup, engine_steps->runs, x, max_tokens, trace));
  const auto chosen = std::find_if(engine_steps->runs.begin(), engine_steps->runs.end(),
                                   [&](const EngineRun& r) { return r.x == x; });
  auto speeds = decode_speeds(setup, greedy, *reference, full_stats, *chosen, trace);
  if (!speeds.ok()) return report_error(speeds.status());
  verdicts.push_back(engine_steps->end_to_end);
  verdicts.back().summary += *speeds;

  nlohmann::json verdict_json = nlohmann::json::array();
  for (const Verdict& v : verdicts) {
    verdict_json.push_back({{"step", v.step}, {"name", v.name}, {"holds", v.holds < 0 ? nlohmann::json() : nlohmann::json(v.holds == 1)},
                            {"summary", v.summary}});
  }
  const nlohmann::json config{{"compressor", compressor_arg}, {"params", params}, {"ratio", ratio}, {"draft_length", x},
                              {"draft_lengths", xs}, {"ratios", ratios}, {"temperatures", temperatures},
                              {"contexts", contexts}, {"context_prompts", context_prompts},
                              {"context_text", context_text},
                              {"prompts", n_prompts}, {"kl_steps", kl_steps},
                              {"max_tokens", max_tokens}, {"quick", quick}, {"prompt_set", prompt_set_path}};
  Hdf5Table table = trace.table();
  table.attributes = {{"command", command_line(argc, argv)},
                      {"git_commit", [] {
                         std::string c;
                         if (run_shell("git -C " + shell_quoted(VC_SOURCE_DIR) + " rev-parse HEAD", &c) != 0) return std::string("unknown");
                         while (!c.empty() && c.back() == '\n') c.pop_back();
                         return c;
                       }()},
                      {"model_file", m.path()},
                      {"model_fingerprint", m.shape().fingerprint},
                      {"compressor", (*compressor)->name()},
                      {"plugin_path", plugin_path},
                      {"config", config.dump()},
                      {"seed", "0 (greedy)"},
                      {"hardware", hardware()},
                      {"libraries", nlohmann::json{{"vericache", VC_VERSION}, {"torch", TORCH_VERSION}, {"hdf5", hdf5_library_version()}}.dump()},
                      {"verdicts", verdict_json.dump()}};
  const std::string trace_path = *folder + "/trace.h5";
  std::signal(SIGINT, SIG_DFL);  // from here the trace is written whole (beside, then renamed) or not at all
  std::signal(SIGTERM, SIG_DFL);
  if (Status s = write_checklist_trace(trace_path, table); !s.ok()) return report_error(s);

  bool failed = false;
  std::printf("vericache checklist: %s on %s, c = %g, x = %lld, %zu prompts\n", (*compressor)->name().c_str(),
              fs::path(m.path()).filename().c_str(), ratio, static_cast<long long>(x), setup.prompts.size());
  for (const Verdict& v : verdicts) {
    std::printf("%d. %-17s %-13s %s\n", v.step, v.name.c_str(), v.holds < 0 ? "NOT MEASURED" : v.holds ? "HOLDS" : "FAILS",
                v.summary.c_str());
    failed = failed || v.holds == 0;
  }
  std::printf("trace: %s\n", trace_path.c_str());
  // Figures are not a verdict: a run whose figures cannot be drawn says why and how to redraw them.
  if (auto pngs = draw_checklist_figures(trace_path, *folder + "/figures", python); pngs.ok()) {
    std::printf("figures: %s/figures (%zu PNG, each with its data as CSV)\n", folder->c_str(), pngs->size());
  } else {
    std::printf("figures: not drawn (%s); redraw with: vericache figures %s\n", pngs.status().message().c_str(),
                folder->c_str());
  }
  return failed ? kExitFailure : kExitOk;
}

}  // namespace vericache::cli
