// vericache bench-reload: the reload-policy ablation, measured on this machine and predicted by
// the simulator for the same configuration.
//
// B requests decode B different prompts (consecutive stretches of the corpus), each prefilled and
// compressed once before the runs. Each verify reads KV_full from a
// copy in transient pages that crosses an *emulated link*: the TransferEngine paced to --link-gb-s
// (this CPU has no link between host and device memory; the pacing plays its role). The reload
// scheduler places the copies and verifies under each policy; every run is checked token for token
// against full-KV decoding.
//
// The simulator's CPU profile and acceptance model come from a calibration in the same run, before
// the policies and independent of them: full-KV decoding of the B prompts and the engine without a
// scheduler or copies (windows of x drafts, verifying in place). With M the weights read per
// forward, F a full cache and C a compressed one, a forward of n requests (d drafting, v verifying)
// and r rows takes
//   t = n * t_req + (r - n) * t_row + (M + d*C + v*F) / BW
// and t_req, t_row and 1/BW are the non-negative least-squares fit, in relative error, over every
// calibration forward and the full-KV steps (their mean, weighted by their count): a draft forward
// of 30 ms counts as much as a verify forward of 300 ms. The requests' windows drift apart
// (each verify yields a different number of tokens), so forwards carry anything from one verify to
// B, which is what pins t_row down. (A verify row beyond the first costs what a decode row does
// not: its attention over the whole full cache, where a decode row's is paid by reading the cache
// once.)
// Acceptance: each draft accepted with probability alpha_i until the first rejection, alpha_i chosen
// so that the model's mean accepted drafts of x equal request i's calibration windows' mean.
#include <ATen/ATen.h>
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "bench_support.h"
#include "cli_common.h"
#include "commands.h"
#include "engine/compression.h"
#include "engine/draft_verify_engine.h"
#include "engine/engine_pools.h"
#include "sim/forward_cost_fit.h"
#include "sim/simulator.h"
#include "sim/throughput_model.h"
#include "util/output_file.h"
#include "util/system_memory.h"
#include "util/thread_pool.h"
#include "window_trace.h"

namespace po = boost::program_options;

namespace vericache::cli {
namespace {

// Accepted drafts of the windows that drafted all x, per request, for the acceptance fit.
class WindowCounts : public StepTimes {
 public:
  explicit WindowCounts(int64_t x) : x_(x) {}
  void on_window(const WindowRecord& w) override {
    StepTimes::on_window(w);
    all.push_back(w);
    if (w.drafted != x_) return;  // the last windows of a request draft fewer
    Count& c = per_request[w.request_id];
    c.accepted += w.accepted;
    ++c.windows;
  }
  struct Count {
    int64_t accepted = 0, windows = 0;
  };
  std::map<int64_t, Count> per_request;
  std::vector<WindowRecord> all;  // every window, for --windows-out
  void on_step(const StepRecord& s) override {
    StepTimes::on_step(s);
    if (s.prefill_items == 0) steps.push_back(s);
  }
  std::vector<StepRecord> steps;  // every decode forward, for the cost fit

 private:
  int64_t x_;
};

// The alpha whose geometric model (each draft accepted with probability alpha until the first
// rejection) gives `mean_accepted` of x drafts: the model then matches the calibration's mean.
double alpha_for_mean_accepted(double mean_accepted, int64_t x) {
  double lo = 0, hi = 1;
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (sim::gamma_for_alpha(mid, x) * static_cast<double>(x) < mean_accepted ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// Stands for "reading the cache costs nothing measurable" (bytes / this is below a nanosecond).
constexpr double kUnresolvedBandwidth = 1e18;

struct CpuProfile {
  double bandwidth = 0, request_s = 0, verify_row_s = 0;
  double copy_slowdown = 0;  // extra forward seconds per second of copying beside it
  std::vector<double> alphas;  // per request
  double draft_ms = 0, verify_ms = 0, full_kv_ms = 0;
};

// Copies of one full cache into transient pages of a pool of its own, with nothing pacing them.
class CopyBench {
 public:
  static Result<std::unique_ptr<CopyBench>> create(const LlamaModel& m, const SequenceKv& kv, const PagePool& kv_pool,
                                                   int64_t page_size) {
    const int64_t pages = kv.n_layers() * kv_pool.spec().pages_for(kv.length(0) + 1);
    VC_ASSIGN_OR_RETURN(PagePool device, PagePool::create(m.kv_page_spec(page_size),
                                                          PagePoolOptions{1, pages, at::kFloat, at::kCPU, false}));
    device.k_pages().zero_();  // resident before the first copy (see run_engine)
    device.v_pages().zero_();
    return std::unique_ptr<CopyBench>(new CopyBench(kv, kv_pool, std::move(device)));
  }
  // Copies the cache once; its bytes per second.
  Result<double> copy_once() {
    SequenceKv copy(kv_.n_layers(), PageKind::kTransient);
    const double start = now_seconds();
    VC_ASSIGN_OR_RETURN(const uint64_t ticket, transfer_.submit(kv_, kv_pool_, &copy, device_, 1));
    transfer_.wait(ticket);
    const double seconds = now_seconds() - start;
    VC_RETURN_IF_ERROR(transfer_.status());
    copy.release(device_);
    return static_cast<double>(kv_.pages_held() * kv_pool_.page_bytes()) / seconds;
  }

 private:
  CopyBench(const SequenceKv& kv, const PagePool& kv_pool, PagePool device)
      : kv_(kv), kv_pool_(kv_pool), device_(std::move(device)) {}
  const SequenceKv& kv_;
  const PagePool& kv_pool_;
  PagePool device_;
  TransferEngine transfer_;
};

// Bytes/s this machine copies a full cache into transient pages with nothing pacing it (the median
// of five copies, after one that warms the pages and the worker): the fastest an emulated link can
// be here.
Result<double> measure_copy_bandwidth(CopyBench& bench) {
  std::vector<double> rates;
  for (int i = 0; i < 6; ++i) {
    VC_ASSIGN_OR_RETURN(const double rate, bench.copy_once());
    if (i > 0) rates.push_back(rate);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// Keeps `bench` copying, back to back, on the transfer engine's thread until destroyed: the memory
// traffic of a copy that never rests, beside the forwards (the contention calibration).
class CopyLoad {
 public:
  explicit CopyLoad(CopyBench& bench) : thread_([this, &bench] {
      while (!stop_.load()) {
        auto r = bench.copy_once();
        if (!r.ok()) {
          status_ = r.status();
          return;
        }
      }
    }) {}
  // Stops after the copy in flight; the first copy error, if any.
  Status stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return status_;
  }
  ~CopyLoad() { static_cast<void>(stop()); }

 private:
  std::atomic<bool> stop_{false};
  Status status_;
  std::thread thread_;
};

struct PolicyRun {
  double seconds = 0, stall_seconds = 0, link_busy_seconds = 0, peak_transient_bytes = 0;
  int64_t iterations = 0, verifies = 0, draft_tokens = 0, mismatches = 0;
  double mean_acceptance_length = 0;
};

}  // namespace

int run_bench_reload(int argc, char** argv) {
  ComputeArgs compute_arg;
  std::string model_arg, text_file, compressor_arg, policies_arg, profile_out, windows_out, links_arg;
  std::vector<std::string> params_args;
  int64_t context = 0, batch = 0, draft_length = 0, window = 0, decode_tokens = 0, page_size = 16, prefill_chunk = 512;
  int64_t device_copies = 0, seed = 1, simulations = 0;
  double ratio = 0;
  int threads = 0;
  bool json = false;
  po::options_description desc(
      "vericache bench-reload: lockstep vs staggered vs no-overlap reloads of KV_full, measured on this\n"
      "machine with the engine (verification from copies over an EMULATED link: a paced copy engine\n"
      "standing in for PCIe) and predicted by the simulator on a CPU profile calibrated in the same run,\n"
      "before and after the policies.\n"
      "B requests decode B different prompts (consecutive stretches of --text-file, each prefilled and\n"
      "compressed once); every run is checked token for token against full-KV decoding.\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&model_arg), kModelOptionHelp)
    ("text-file", po::value(&text_file)->default_value(VC_DEFAULT_BENCH_TEXT), "text the prompts are cut from (needs batch x context tokens)")
    ("context", po::value(&context)->default_value(4000), "prompt tokens")
    ("batch,b", po::value(&batch)->default_value(4), "requests decoding at once")
    ("compressor", po::value(&compressor_arg)->default_value("snapkv"), "offline compressor")
    ("params", po::value(&params_args)->composing(), "NAME=JSON: parameters of the compressor")
    ("ratio,c", po::value(&ratio)->default_value(0.1), "kept fraction c")
    ("draft-length,x", po::value(&draft_length)->default_value(8), "x: target drafts per verify")
    ("window", po::value(&window)->default_value(48), "W: iterations the scheduler plans ahead")
    ("decode-tokens", po::value(&decode_tokens)->default_value(64), "tokens generated per request (EOS ignored)")
    ("link-gb-s", po::value(&links_arg)->default_value("2"),
     "bandwidths of the emulated link in GB/s, comma-separated (every policy runs over each)")
    ("device-copies", po::value(&device_copies)->default_value(0),
     "transient device memory, in full-cache copies (the scheduler's memory ring and the transient pages); 0: the batch")
    ("policies", po::value(&policies_arg)->default_value("staggered,lockstep,no-overlap"), "comma-separated policies")
    ("seed", po::value(&seed)->default_value(1), "the simulator's first acceptance seed")
    ("simulations", po::value(&simulations)->default_value(100), "simulations averaged per policy (seeds seed, seed + 1, ...)")
    ("threads", po::value(&threads)->default_value(0),
     "CPU threads for the forwards; 0: all cores but one, left to the emulated link's copy thread (a DMA engine "
     "takes nothing from the forwards)")
    ("page-size", po::value(&page_size)->default_value(16), "KV page size in tokens (a multiple of 16)")
    ("prefill-chunk", po::value(&prefill_chunk)->default_value(512), "prompt tokens per prefill forward")
    ("profile-out", po::value(&profile_out), "write the calibrated CPU hardware profile (JSON) to this file")
    ("windows-out", po::value(&windows_out),
     "write the calibration's verify windows (request, drafted, accepted) to this HDF5 file, for "
     "`vericache simulate --acceptance-trace`")
    ("json", po::bool_switch(&json), "print one JSON object per policy instead of a table");
  // clang-format on
  add_compute_options(desc, compute_arg);
  po::variables_map vm;
  const std::string example = "Example:\n  vericache bench-reload --context 4000 -b 4 -x 8 --link-gb-s 2,20 --threads 1\n";
  if (auto done = parse_command_line("bench-reload", desc, example, argc, argv, &vm,
                                     {{"context", 16, kMaxContextLength},
                                      {"batch", 1, 256},
                                      kRatioRange,
                                      {"draft-length", 1, 256},
                                      {"window", 4, 4096},
                                      {"decode-tokens", 2, 1 << 20},
                                      {"device-copies", 0, 4096},
                                      {"seed", 0, 9e15},
                                      {"simulations", 1, 1e5},
                                      kThreadsRange,
                                      kPageSizeRange,
                                      kPrefillChunkRange}))
    return *done;
  if (draft_length + 2 >= window) {
    return report_usage_error("bench-reload",
                              "--draft-length + 2 must be below --window (" + std::to_string(window) + ")");
  }
  std::vector<double> links_gb_s;
  try {
    links_gb_s = parse_number_list(links_arg, "link-gb-s", 1e-3, 1e4);
  } catch (const po::error& e) {
    return report_usage_error("bench-reload", e.what());
  }
  std::vector<sched::ReloadPolicy> policies;
  for (const std::string& name : split_list(policies_arg)) {
    auto p = sched::parse_policy(name);
    if (!p.ok()) return report_usage_error("bench-reload", "--policies: " + p.status().message());
    policies.push_back(*p);
  }
  if (device_copies == 0) device_copies = batch;
  if (threads == 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
  set_threads(0);  // every core for the prefills; --threads for the timed decoding
  auto loaded = load_model(model_arg, compute_arg);
  if (!loaded.ok()) return report_error(loaded.status());
  const LlamaModel& m = **loaded;
  const int64_t layers = m.config().n_layers;
  auto compressors = load_offline_compressors(compressor_arg, params_args, m);
  if (!compressors.ok()) return report_status("bench-reload", compressors.status());
  if (compressors->size() != 1) return report_usage_error("bench-reload", "--compressor takes one name");
  Compressor& compressor = *(*compressors)[0];
  if (Status s = check_contexts_fit(m, {context}, decode_tokens, window); !s.ok())
    return report_status("bench-reload", s);
  auto corpus = bench_corpus(m, text_file, batch * context);
  if (!corpus.ok()) return report_status("bench-reload", corpus.status());

  // Request i's prompt: corpus tokens [i * context, (i + 1) * context), prefilled and compressed
  // once, shared by every run.
  auto base_pool = m.make_page_pool(page_size, batch * layers * (context / page_size + 2));
  if (!base_pool.ok()) return report_error(base_pool.status());
  std::vector<SequenceKv> bases(batch, SequenceKv(layers));
  std::vector<std::vector<float>> next_logits(batch);
  std::vector<CompressedKV> compressed(batch);
  std::vector<GenerationRequest> requests(batch);
  for (int64_t i = 0; i < batch; ++i) {
    std::fprintf(stderr, "[bench-reload] prompt %lld of %lld: prefill of %lld tokens, %s compress\n",
                 static_cast<long long>(i + 1), static_cast<long long>(batch), static_cast<long long>(context),
                 compressor.name().c_str());
    GenerationRequest& request = requests[i];
    request.prompt.assign(corpus->begin() + i * context, corpus->begin() + (i + 1) * context);
    request.max_new_tokens = decode_tokens;
    request.ignore_eos = true;
    if (Status s = prefill_observed(m, *base_pool, bases[i], request.prompt, prefill_chunk, *compressors, ratio,
                                    &next_logits[i]);
        !s.ok())
      return report_error(s);
    if (Status s = compute_kept(m, *base_pool, compressor, ratio, request.prompt, 0, bases[i], &compressed[i]);
        !s.ok())
      return report_error(s);
    compressor.release(0);
  }
  set_threads(threads);
  std::vector<PrefilledPrompt> prefilled;
  for (int64_t i = 0; i < batch; ++i) prefilled.push_back({&bases[i], next_logits[i]});
  auto probe = m.make_page_pool(page_size, 1);  // one page, for its size
  if (!probe.ok()) return report_error(probe.status());
  const int64_t page_bytes = probe->page_bytes();
  // Runs the engine on the B prompts (options.transfer and options.scheduler may be null); `seconds`
  // gets the decode time, `peak_transient_bytes` the most transient memory in use at once.
  auto run_engine = [&](EngineOptions options, int64_t transient_pages, StatsSink* sink, double* seconds,
                        double* peak_transient_bytes) -> Result<std::vector<EngineResult>> {
    options.compressor = &compressor;
    options.ratio = ratio;
    options.draft_length = draft_length;
    options.sink = sink;
    VC_ASSIGN_OR_RETURN(EnginePools pools,
                        make_engine_pools(m, options, page_size, std::vector<GenerationRequest>(batch, requests[0]),
                                          PoolOverrides{0, transient_pages, 0}));
    PagePool& device = pools.device;
    PagePool& host = pools.host;
    // Device memory is resident; fresh host memory is not: touch every page now, or the first copy
    // into each page pays its page faults (several times the copy itself) inside the timed run.
    device.k_pages().zero_();
    device.v_pages().zero_();
    host.k_pages().zero_();
    host.v_pages().zero_();
    std::vector<EngineResult> results;
    {
      DraftVerifyEngine engine(m, device, host, options);
      for (int64_t i = 0; i < batch; ++i) {
        VC_RETURN_IF_ERROR(
            engine.add_prefilled(requests[i], bases[i], *base_pool, next_logits[i], compressed[i].kept).status());
      }
      engine.admit();  // copies the prefill and builds KV_comp: not decode time
      const double start = now_seconds();
      VC_RETURN_IF_ERROR(engine.run());
      *seconds = now_seconds() - start;
      results = engine.take_finished();
    }
    *peak_transient_bytes = static_cast<double>(device.peak_in_use(PageKind::kTransient) * page_bytes);
    return results;
  };

  // Calibration, before the policies and again after them (the pooled fit cancels a machine that
  // drifts in between): full-KV decoding, the copy speed, and the engine with fixed windows verifying
  // in place, alone and beside a copy that never rests.
  std::vector<std::vector<int32_t>> want;  // full-KV decoding's tokens, per request
  WindowCounts calibration(draft_length), beside_copy(draft_length);
  double full_kv_seconds = 0, fixed_window_seconds = 0, unused = 0;
  int64_t calibration_passes = 0, total_mismatches = 0;
  std::vector<double> copy_rates;
  auto copy_bench = CopyBench::create(m, bases[0], *base_pool, page_size);
  if (!copy_bench.ok()) return report_error(copy_bench.status());
  auto calibrate = [&]() -> Status {
    std::fprintf(stderr, "[bench-reload] calibration %lld of 2: full-KV decoding and fixed windows of %lld drafts\n",
                 static_cast<long long>(calibration_passes + 1), static_cast<long long>(draft_length));
    VC_ASSIGN_OR_RETURN(FullKvDecode full, decode_full_kv(m, prefilled, *base_pool, decode_tokens, page_size));
    if (want.empty()) want = full.tokens;
    if (full.tokens != want) return Status::internal("full-KV decoding differs between its two runs");
    full_kv_seconds += full.seconds;
    VC_ASSIGN_OR_RETURN(const double rate, measure_copy_bandwidth(**copy_bench));
    copy_rates.push_back(rate);
    double seconds = 0;
    VC_ASSIGN_OR_RETURN(auto plain, run_engine(EngineOptions{}, 0, &calibration, &seconds, &unused));
    fixed_window_seconds += seconds;
    total_mismatches += count_mismatches(plain, want);
    CopyLoad load(**copy_bench);
    auto loaded = run_engine(EngineOptions{}, 0, &beside_copy, &seconds, &unused);
    VC_RETURN_IF_ERROR(load.stop());
    VC_RETURN_IF_ERROR(loaded.status());
    total_mismatches += count_mismatches(*loaded, want);
    ++calibration_passes;
    return Status();
  };
  if (Status s = calibrate(); !s.ok()) return report_error(s);
  const double B = static_cast<double>(batch);
  const double decode_steps = static_cast<double>(decode_tokens - 1);
  // The link the engine gets: the emulated one, unless this machine cannot copy that fast.
  auto link_for = [](double asked_gb_s, double copy_rate) { return std::min(asked_gb_s * 1e9, copy_rate); };
  for (double asked : links_gb_s) {
    if (link_for(asked, copy_rates[0]) < asked * 1e9) {
      std::fprintf(stderr,
                   "[bench-reload] warning: this machine copies %.2f GB/s, below the %.2f GB/s asked for: the "
                   "emulated link runs at the copy speed (and the simulator is told so)\n",
                   copy_rates[0] / 1e9, asked);
    }
  }
  if (!windows_out.empty()) {
    if (Status s = write_window_trace(windows_out, calibration.all, command_line(argc, argv)); !s.ok())
      return report_error(s);
  }

  // The policies, for each link.
  struct Measured {
    double link_gb_s = 0;
    sched::ReloadPolicy policy{};
    std::string link;
    PolicyRun run;
    StepTimes steps;
    double memory_capacity_bytes = 0;
  };
  std::vector<Measured> measured;
  for (double asked : links_gb_s) {
    for (sched::ReloadPolicy policy : policies) {
      std::fprintf(stderr, "[bench-reload] %s over an emulated link at %.2f GB/s\n", sched::policy_name(policy),
                   asked);
      Measured& row = measured.emplace_back();
      row.link_gb_s = asked;
      row.policy = policy;
      TransferEngine transfer(TransferOptions{asked * 1e9});
      sched::ReloadSchedulerOptions so;
      so.policy = policy;
      so.window = window;
      so.draft_length = draft_length;
      so.iteration_seconds = calibration.draft_ms() / 1e3;
      so.link_bandwidth = link_for(asked, copy_rates[0]);
      sched::ReloadScheduler sizing(so);  // the window decides how many drafts a copy must make room for
      EngineOptions options;
      options.transfer = &transfer;
      options.scheduler = &sizing;
      options.draft_length = draft_length;
      const int64_t copy_pages =
          DraftVerifyEngine::pages_for_request(m, options, page_size, page_size, requests[0]).transient;
      so.memory_capacity_bytes = static_cast<double>(device_copies * copy_pages * page_bytes);
      row.memory_capacity_bytes = so.memory_capacity_bytes;
      sched::ReloadScheduler scheduler(so);
      options.scheduler = &scheduler;
      PolicyRun& run = row.run;
      auto results =
          run_engine(options, device_copies * copy_pages, &row.steps, &run.seconds, &run.peak_transient_bytes);
      if (!results.ok()) return report_error(results.status());
      run.mismatches = count_mismatches(*results, want);
      total_mismatches += run.mismatches;
      RequestMetrics totals;
      for (const EngineResult& r : *results) totals.add(r.metrics);
      run.stall_seconds = row.steps.stall_seconds;
      run.link_busy_seconds = transfer.stats().busy_seconds;
      run.iterations = scheduler.now();
      run.verifies = totals.verify_windows;
      run.draft_tokens = totals.draft_tokens;
      run.mean_acceptance_length = run.verifies ? B * decode_steps / static_cast<double>(run.verifies) : 0;
      row.link = transfer.describe();
    }
  }
  if (Status s = calibrate(); !s.ok()) return report_error(s);

  // The CPU profile from both calibrations.
  const double b = static_cast<double>(layers * page_bytes) / static_cast<double>(page_size);
  const double weights = static_cast<double>(m.decode_weight_bytes());
  int64_t kept_slots = 0;  // mean over the prompts
  for (const CompressedKV& c : compressed) {
    for (const auto& k : c.kept) kept_slots += k.size(1);
  }
  kept_slots /= batch;
  const double full_bytes = static_cast<double>(context) * b;
  const double comp_bytes = static_cast<double>(kept_slots) / static_cast<double>(layers) * b;
  const double passes = static_cast<double>(calibration_passes);
  CpuProfile cpu;
  cpu.draft_ms = calibration.draft_ms();
  cpu.verify_ms = calibration.verify_ms();
  cpu.full_kv_ms = 1e3 * full_kv_seconds / (passes * decode_steps);
  std::vector<sim::ForwardSample> samples;
  for (const StepRecord& s : calibration.steps) {
    const double n = static_cast<double>(s.draft_items + s.verify_items);
    samples.push_back({n, static_cast<double>(s.rows) - n,
                       weights + static_cast<double>(s.draft_items) * comp_bytes +
                           static_cast<double>(s.verify_items) * full_bytes,
                       s.seconds, 1.0});
  }
  samples.push_back({B, 0, weights + B * full_bytes, cpu.full_kv_ms / 1e3, passes * decode_steps});
  const sim::ForwardCosts costs = sim::fit_forward_costs(samples);
  int64_t verify_forwards = 0, verify_items = 0;
  for (const StepRecord& st : calibration.steps) {
    verify_forwards += st.verify_items > 0 ? 1 : 0;
    verify_items += st.verify_items;
  }
  std::fprintf(stderr, "[bench-reload] calibration: %zu forwards, %lld with verifies (%.2f verifying in each)\n",
               calibration.steps.size(), static_cast<long long>(verify_forwards),
               verify_forwards ? static_cast<double>(verify_items) / static_cast<double>(verify_forwards) : 0.0);
  // A bytes term fitted to zero (short contexts, noise) leaves the bandwidth unresolved: the
  // forward is then modelled by its requests and rows alone.
  cpu.bandwidth = costs.seconds_per_byte > 0 ? 1.0 / costs.seconds_per_byte : kUnresolvedBandwidth;
  cpu.verify_row_s = costs.row_s;
  cpu.request_s = costs.request_s;
  cpu.copy_slowdown = std::max(0.0, (beside_copy.draft_seconds + beside_copy.verify_seconds) /
                                        (calibration.draft_seconds + calibration.verify_seconds) -
                                    1);
  for (int64_t i = 0; i < batch; ++i) {
    const WindowCounts::Count& n = calibration.per_request[i];
    cpu.alphas.push_back(n.windows > 0 ? alpha_for_mean_accepted(static_cast<double>(n.accepted) /
                                                                     static_cast<double>(n.windows),
                                                                 draft_length)
                                       : 1.0);
  }
  double mean_alpha = 0;
  for (double a : cpu.alphas) mean_alpha += a / B;
  std::sort(copy_rates.begin(), copy_rates.end());
  const double copy_rate = 0.5 * (copy_rates.front() + copy_rates.back());
  if (costs.seconds_per_byte == 0) {
    std::fprintf(stderr,
                 "[bench-reload] warning: the fit gives the bytes read no cost (full-KV step %.1f ms, draft step %.1f "
                 "ms): the bandwidth term is unresolved (a longer --context resolves it)\n",
                 cpu.full_kv_ms, cpu.draft_ms);
  }
  std::fprintf(stderr,
               "[bench-reload] CPU profile: %.2f GB/s, %.2f ms per request, %.2f ms per further verify row, copies at "
               "%.2f GB/s, forwards %.0f%% slower beside a copy; mean alpha %.3f (draft %.1f ms, verify %.1f ms, "
               "full-KV %.1f ms per step)\n",
               cpu.bandwidth / 1e9, 1e3 * cpu.request_s, 1e3 * cpu.verify_row_s, copy_rate / 1e9,
               100 * cpu.copy_slowdown, mean_alpha, cpu.draft_ms, cpu.verify_ms, cpu.full_kv_ms);
  if (!profile_out.empty()) {
    nlohmann::json p{
        {"name", "cpu-this-machine"},
        {"description",
         "this CPU, calibrated by vericache bench-reload (forward = requests x request + "
         "further verify rows x verify row + bytes / bandwidth); the link is the run's "
         "first emulated one"},
        {"memory_gb", physical_memory_bytes() / 1e9},
        {"memory_bandwidth_gb_s", cpu.bandwidth / 1e9},
        {"link_bandwidth_gb_s", link_for(links_gb_s[0], copy_rate) / 1e9},
        {"request_us", 1e6 * cpu.request_s},
        {"verify_row_us", 1e6 * cpu.verify_row_s},
        {"source", "vericache bench-reload --threads " + std::to_string(ThreadPool::global().threads()) + " on " +
                       m.path() + ", context " + std::to_string(context) + ", batch " + std::to_string(batch)}};
    std::ofstream(profile_out) << p.dump(2) << "\n";
  }

  // The simulator's prediction of each measured row.
  if (!json) {
    std::printf(
        "| link GB/s | policy | measured tok/s | simulated tok/s | error | stall s (measured / simulated) | link busy "
        "(measured / simulated) | peak transient MB (measured / simulated) | tokens per verify (measured / "
        "simulated) | iterations (measured / simulated) | mismatches |\n");
    std::printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  }
  const double fixed_window_tok_s = passes * B * decode_steps / fixed_window_seconds;
  const double full_kv_tok_s = passes * B * decode_steps / full_kv_seconds;
  for (const Measured& row : measured) {
    const PolicyRun& run = row.run;
    const double link_bandwidth = link_for(row.link_gb_s, copy_rate);
    const double tok_s = B * decode_steps / run.seconds;
    sim::SimulationConfig c;
    c.weight_bytes = weights;
    c.kv_bytes_per_token = b;
    c.hbm_bandwidth = cpu.bandwidth;
    c.link_bandwidth = link_bandwidth;
    c.request_s = cpu.request_s;
    c.verify_row_s = cpu.verify_row_s;
    c.copy_slowdown = cpu.copy_slowdown;
    c.copy_bandwidth = copy_rate;
    c.streamed_capacity_bytes = row.memory_capacity_bytes;
    c.memory_bytes = physical_memory_bytes();
    c.context = context;
    c.output_tokens = decode_tokens - 1;
    c.batch = batch;
    c.requests = batch;
    c.ratio = comp_bytes / full_bytes;
    c.alpha = mean_alpha;
    c.request_alphas = cpu.alphas;
    c.policy = row.policy;
    c.draft_length = draft_length;
    c.window = window;
    // The expectation over acceptance draws: the mean of --simulations seeds.
    sim::SimulationResult p;
    double simulated_iterations = 0;
    for (int64_t k = 0; k < simulations; ++k) {
      c.seed = static_cast<uint64_t>(seed + k);
      auto one = sim::simulate(c);
      if (!one.ok()) return report_status("bench-reload", one.status());
      const double w = 1.0 / static_cast<double>(simulations);
      p.tok_s += w * one->tok_s;
      p.seconds += w * one->seconds;
      p.stall_seconds += w * one->stall_seconds;
      p.link_busy_fraction += w * one->link_busy_fraction;
      p.peak_streamed_bytes += w * one->peak_streamed_bytes;
      p.mean_acceptance_length += w * one->mean_acceptance_length;
      p.mean_drafts_per_verify += w * one->mean_drafts_per_verify;
      simulated_iterations += w * static_cast<double>(one->iterations);
    }
    const double error = p.tok_s / tok_s - 1;
    if (json) {
      nlohmann::json out{{"policy", sched::policy_name(row.policy)},
                         {"link", row.link},
                         {"context", context},
                         {"batch", batch},
                         {"compressor", compressor.name()},
                         {"ratio", ratio},
                         {"draft_length", draft_length},
                         {"window", window},
                         {"decode_tokens", decode_tokens},
                         {"device_copies", device_copies},
                         {"measured_tok_s", tok_s},
                         {"simulated_tok_s", p.tok_s},
                         {"error", error},
                         {"measured_stall_s", run.stall_seconds},
                         {"simulated_stall_s", p.stall_seconds},
                         {"measured_seconds", run.seconds},
                         {"simulated_seconds", p.seconds},
                         {"measured_link_busy", run.link_busy_seconds / run.seconds},
                         {"simulated_link_busy", p.link_busy_fraction},
                         {"measured_peak_transient_bytes", run.peak_transient_bytes},
                         {"simulated_peak_streamed_bytes", p.peak_streamed_bytes},
                         {"measured_tokens_per_verify", run.mean_acceptance_length},
                         {"simulated_tokens_per_verify", p.mean_acceptance_length},
                         {"measured_drafts_per_verify",
                          run.verifies ? static_cast<double>(run.draft_tokens) / static_cast<double>(run.verifies) : 0},
                         {"simulated_drafts_per_verify", p.mean_drafts_per_verify},
                         {"measured_iterations", run.iterations},
                         {"measured_draft_step_ms", row.steps.draft_ms()},
                         {"measured_verify_step_ms", row.steps.verify_ms()},
                         {"simulated_iteration_ms", 1e3 * p.seconds / simulated_iterations},
                         {"simulated_iterations", simulated_iterations},
                         {"simulations", simulations},
                         {"mismatches", run.mismatches},
                         {"full_kv_tok_s", full_kv_tok_s},
                         {"fixed_window_tok_s", fixed_window_tok_s},
                         {"cpu_bandwidth_gb_s", cpu.bandwidth / 1e9},
                         {"copy_bandwidth_gb_s", copy_rate / 1e9},
                         {"copy_bandwidth_range_gb_s", {copy_rates.front() / 1e9, copy_rates.back() / 1e9}},
                         {"link_bandwidth_gb_s", link_bandwidth / 1e9},
                         {"cpu_request_ms", 1e3 * cpu.request_s},
                         {"cpu_verify_row_ms", 1e3 * cpu.verify_row_s},
                         {"copy_slowdown", cpu.copy_slowdown},
                         {"alpha", mean_alpha},
                         {"request_alphas", cpu.alphas},
                         {"kv_full_bytes", full_bytes},
                         {"threads", ThreadPool::global().threads()},
                         {"model", m.path()}, {"compute", compute_name(m.compute())}, {"kv_cache", kv_cache_name(m)}};
      std::cout << out.dump() << std::endl;
    } else {
      std::printf(
          "| %.2f | %s | %.1f | %.1f | %+.1f%% | %.2f / %.2f | %.0f%% / %.0f%% | %.0f / %.0f | %.2f / %.2f | %lld / "
          "%lld | %lld |\n",
          row.link_gb_s, sched::policy_name(row.policy), tok_s, p.tok_s, 100 * error, run.stall_seconds,
          p.stall_seconds, 100 * run.link_busy_seconds / run.seconds, 100 * p.link_busy_fraction,
          run.peak_transient_bytes / 1e6, p.peak_streamed_bytes / 1e6, run.mean_acceptance_length,
          p.mean_acceptance_length, static_cast<long long>(run.iterations),
          static_cast<long long>(std::lround(simulated_iterations)), static_cast<long long>(run.mismatches));
    }
  }
  if (!json) {
    std::printf(
        "\nFull-KV decoding %.1f tok/s; fixed windows of %lld drafts verifying in place %.1f tok/s (same run).\n",
        full_kv_tok_s, static_cast<long long>(draft_length), fixed_window_tok_s);
  }
  for (SequenceKv& kv : bases) kv.release(*base_pool);
  if (total_mismatches > 0) {
    return report_error(Status::internal(std::to_string(total_mismatches) + " tokens differ from full-KV decoding"));
  }
  return kExitOk;
}

}  // namespace vericache::cli
