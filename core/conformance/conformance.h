// The conformance kit: runs a compressor on a real model and prompt the way the engine runs it and
// checks the contract (vericache/compressor.h) rule by rule, so a plugin author learns which rule
// a plugin breaks and where, not just that "something" fails later in the engine.
//
// What a plugin promises beyond the contract (its protected tokens, how its budget is spread, the
// parameters it is checked with) is data: a ConformanceSpec, read from the JSON file installed
// beside the plugin (vc_plugin_<name>.conformance.json, see parse_conformance_spec) or given by hand.
//
// Rules (ConformanceCheck::rule):
//   token dropping
//     kept-set        compress() (offline) returns one well-formed int64 [n_kv_heads, kept] tensor per
//                     layer, or the online drops apply to kept positions
//     positions       every head's kept positions are unique, increasing and in [0, n)
//     budget          every head of a layer keeps the same count; per layer floor(c * n) (at least
//                     one, at least min(n, window) for an online window), or, with "across-layers",
//                     layers * floor(c * n) in all; online, also after each of 8 decode steps
//     footprint       the kept set's slots, summed over layers, within the bound footprint() declares
//                     (admission reserves that bound before the prefill)
//     protected       the spec's first and last positions are kept by every head
//     rollback        offline: compress() leaves the full cache it was handed as it was (its extra
//                     forwards rolled back: same lengths, pages and K/V bits)
//     resident-pages  the compacted cache holds exactly the pages its kept slots need, fewer than
//                     the full cache, c * full within page rounding
//   quantization
//     packed-format   packed_format() passes the runtime's checks (engine/compression.h)
//     round-trip      unpack(pack(x)) is finite and its RMS error per (layer, KV head) at most the
//                     spec's max_relative_error times the RMS of x
//     resident-pages  the packed cache holds exactly the packed pages its whole blocks need plus the
//                     float pages of the residual
//   both
//     determinism     a second instance keeps the same positions (packs the same bytes)
//     release         after release(), the same request id gives the same result again
//     lossless        the draft-verify engine drafting with it generates exactly full-KV greedy
//                     decoding's tokens, with no compressor failure
//
// Failure behaviour: a rule a plugin breaks is a failed check naming the first offending (layer,
// head, position) where there is one; only a problem of the kit's own inputs (a bad spec, no room
// in memory) is an error Status.
// Thread-safety: one run at a time per model (it runs forwards).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <vericache/compressor.h>
#include <vericache/status.h>

#include "model/llama_model.h"

namespace vericache {

enum class BudgetRule { kPerLayer, kAcrossLayers };

struct ConformanceSpec {
  std::string params = "{}";            // a JSON object, merged under the user's parameters
  std::vector<double> ratios{0.1, 0.25, 0.5};  // token dropping: kept fractions checked
  BudgetRule budget = BudgetRule::kPerLayer;
  int64_t window = 0;                   // online: the newest tokens never dropped
  int64_t protect_first = 0;            // positions 0 .. protect_first-1 always kept
  int64_t protect_last = 0;             // the last protect_last prompt positions always kept
  double max_relative_error = 0.5;      // quantizers: the round-trip bound
};

// Parses a spec file's text. Keys: "params" (object), "ratios" (numbers in (0, 1]), "budget" ("per-layer" | "across-layers"), "window", "protected"
// ({"first": N, "last": N}), "max_relative_error". Unknown keys are InvalidArgument (a typo must
// not silently weaken a check), as are values of the wrong type or range.
Result<ConformanceSpec> parse_conformance_spec(const std::string& json_text);

// The spec file of the plugin at `plugin_path` (vc_plugin_x.so -> vc_plugin_x.conformance.json).
std::string conformance_spec_path(const std::string& plugin_path);

// `user` (a JSON object) over `spec.params`: user keys win. InvalidArgument when `user` is not an
// object.
Result<std::string> conformance_params(const ConformanceSpec& spec, const std::string& user);

struct ConformanceCheck {
  std::string rule;     // "budget", "positions", ...
  std::string setting;  // "c = 0.25", or "" for checks not tied to a ratio
  bool passed = false;
  std::string detail;   // what was found: the first offence, or what holds
};

struct ConformanceReport {
  std::string compressor;
  std::vector<ConformanceCheck> checks;
  bool passed() const;
  std::vector<std::string> broken_rules() const;  // in order of first failure, each once
};

struct ConformanceOptions {
  std::vector<int32_t> prompt;  // the prompt's token ids (positions 0 .. n-1)
  int64_t draft_length = 4;     // the lossless check's x
  int64_t new_tokens = 16;      // tokens the lossless check generates
  int64_t page_size = 16;
};

// Makes a new compressor instance, already attach()ed to the model.
using CompressorFactory = std::function<Result<std::shared_ptr<Compressor>>()>;

// Runs every rule of the compressor's family. Error only for the kit's own inputs (empty prompt,
// prompt too short for the spec's protected tokens, a factory that fails: the plugin cannot even be
// made, which the report could not describe).
Result<ConformanceReport> run_conformance(const LlamaModel& model, const CompressorFactory& make,
                                          const ConformanceSpec& spec, const ConformanceOptions& options);

}  // namespace vericache
