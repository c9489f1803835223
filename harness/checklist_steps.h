// The four steps of `vericache checklist` (checklist_command.cpp says what each measures and when
// it holds), each in its own file:
//   checklist_kl_growth.cpp    step 1, KL growth on the compressed cache alone
//   checklist_acceptance.cpp   step 2, acceptance at each draft length (the engine runs steps 2-4 share)
//   checklist_sweeps.cpp       step 2's sweeps: c, temperature, context
//   checklist_throughput.cpp   step 3, Eq. 3's iteration time against the measured one
//   checklist_end_to_end.cpp   step 4, VeriCache with the draft policy against full-KV decoding, at
//                              equal batch and at a fixed device KV budget
// Every measurement goes into a Trace (columns by name, checklist_trace.h's layout).
//
// Ownership: a Setup borrows the model and the compressor. Thread-safety: one step at a time (the
// model runs one forward at a time). Failure: the engine's, the model's and the pools' errors, as
// values; a verdict that fails is a Verdict with holds = 0, not an error.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include <vericache/status.h>

#include "engine/draft_policy.h"
#include "engine/draft_verify_engine.h"
#include "engine/engine_pools.h"
#include "engine/full_kv_comparison.h"
#include "engine/generator.h"
#include "engine/test_faults.h"
#include "model/llama_model.h"
#include "util/hdf5_table.h"

namespace at {
class Tensor;
}

namespace vericache::cli {

struct Verdict {
  int step = 0;
  std::string name;
  int holds = -1;  // 1 holds, 0 fails, -1 not evaluated
  std::string summary;
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
  struct Column {
    std::string name;
    std::vector<double> values;
  };
  std::vector<Column> columns_;
};

// A progress bar on stderr: "[checklist] <what> [###.....] done/total  elapsed, ETA".
inline void progress(const char* what, int64_t done, int64_t total, std::chrono::steady_clock::time_point start) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total - done) : 0;
  const int width = 24, filled = static_cast<int>(width * done / std::max<int64_t>(total, 1));
  std::fprintf(stderr, "\r[checklist] %-22s [%s%s] %lld/%lld  %.0f s, ETA %.0f s ", what, std::string(filled, '#').c_str(),
               std::string(width - filled, '.').c_str(), static_cast<long long>(done), static_cast<long long>(total),
               elapsed, eta);
  if (done == total) std::fprintf(stderr, "\n");
}

// One number through a printf format.
inline std::string fmt(const char* format, double v) {
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

// KL(p_full || p_VeriCache) of one committed token.
struct TokenKl {
  int64_t request = 0, position = 0;
  double kl = 0;
};

// What one engine run recorded: its verify windows and decode forwards, and with `reference`
// (full-KV log-probabilities per request, [generated, vocab] double; borrowed) the KL of every
// committed token's distribution.
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
  void on_token_logits(int64_t request, int64_t position, std::span<const float> logits) override;
};

// The prompts as engine requests: `max_tokens` each, greedy at temperature 0, else sampled with a
// seed per prompt (its index + 1).
std::vector<GenerationRequest> engine_requests(const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens,
                                               double temperature);

// The engine at (ratio, x) with `policy` on `requests` (pools sized for all of them, or `pools`),
// recording into `run`, compared with `reference`. `fault`: test-only (engine/test_faults.h).
Result<FullKvComparison> run_engine(const Setup& s, double ratio, int64_t x, const DraftPolicyOptions& policy,
                                    const std::vector<GenerationRequest>& requests,
                                    const std::vector<GenerationResult>& reference, EngineRun* run,
                                    const PoolOverrides& pools = {}, const TestFault& fault = {});

// Step 1.
Result<Verdict> kl_growth(const Setup& s, int64_t steps, Trace& trace);

// Step 2 without its sweeps: fixed windows at each x in `xs`, every run against `reference`.
struct AcceptanceRuns {
  Verdict verdict;
  std::vector<EngineRun> runs;  // by draft length, in the order run
};
Result<AcceptanceRuns> acceptance(const Setup& s, const std::vector<int64_t>& xs,
                                  const std::vector<GenerationRequest>& requests,
                                  const std::vector<GenerationResult>& reference, Trace& trace);

// Step 2's sweeps at x (fixed windows): c (greedy), temperature (sampled), context (greedy).
struct Sweeps {
  bool all_identical = true;
  std::string summary;
};
Result<Sweeps> ratio_and_temperature_sweeps(const Setup& s, int64_t x, const std::vector<double>& ratios,
                                            const std::vector<double>& temperatures, int64_t max_tokens,
                                            const std::vector<GenerationRequest>& greedy,
                                            const std::vector<GenerationResult>& reference, Trace& trace);
Result<Sweeps> context_sweep(const Setup& s, const std::vector<int32_t>& corpus, const std::vector<int64_t>& contexts,
                             int64_t prompts, int64_t x, int64_t max_tokens, Trace& trace);

// Step 3, from step 2's runs.
Verdict throughput_model(const Setup& s, const std::vector<EngineRun>& runs, int64_t chosen_x, int64_t max_tokens,
                         Trace& trace);

// Step 4: VeriCache at (c, x, policy) on the prompt set against full-KV decoding (`reference`, made
// at one batch with `full_stats`), and, when budget_full_requests > 0, at a fixed device KV budget
// of that many of the longest request's whole caches: full-KV decoding at the largest batch that
// budget holds against VeriCache at the largest its compressed caches allow (in place), on the
// first prompts of `budget_prompts` (distinct prompts of the same set).
struct EndToEndOptions {
  int64_t x = 0;
  DraftPolicyOptions policy;
  int64_t max_tokens = 0;
  double budget_full_requests = 0;
  TestFault test_fault;  // test-only: makes step 4's runs wrong on purpose (VERICACHE_TEST_FAULT)
};
Result<Verdict> end_to_end(const Setup& s, const EndToEndOptions& o, const std::vector<GenerationRequest>& greedy,
                           const std::vector<GenerationResult>& reference, const GenerationStats& full_stats,
                           const std::vector<std::vector<int32_t>>& budget_prompts, Trace& trace);

}  // namespace vericache::cli
