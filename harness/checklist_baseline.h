// Step 2's acceptance criterion: committed baselines of gamma(x) per configuration
// (harness/checklist/acceptance_baselines.json, made from committed run traces by
// harness/checklist/make_baselines.py), and the judgement of a run against them.
//
// A run's gamma at a draft length may fall below the baseline's by at most the file's stated band
// (absolute). Greedy acceptance is deterministic: the same build on any CPU gives the same gamma to
// the last digit (the kernels compute identical bits on every instruction set and thread count), so
// the band only allows deliberate changes that move a tie or a rounding; the file says how it was
// measured. A configuration is the model file's name, the compressor with its parameters (file
// paths reduced to file names), the ratio, the prompt set's file, the number of prompts and the
// tokens per prompt.
//
// Thread-safety: pure functions. Failure: a baselines file that cannot be read or parsed is an
// error value naming the file.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <vericache/status.h>

namespace vericache::cli {

struct BaselineKey {
  std::string model_file;  // any path; compared by file name
  std::string compressor;
  std::string params;      // JSON; paths compared by file name
  double ratio = 0;
  std::string prompt_set;  // any path; compared by its last two components (folder/file)
  int64_t prompts = 0;
  int64_t max_tokens = 0;
};

struct AcceptanceBaseline {
  std::map<int64_t, double> gamma;  // by draft length
  double band = 0;                  // how far below the baseline a run's gamma may fall
  std::string source;               // the run and commit it was measured at
};

// The baseline for `key` in the file at `path`, or nullopt when the file has none.
Result<std::optional<AcceptanceBaseline>> find_acceptance_baseline(const std::string& path, const BaselineKey& key);

struct AcceptanceJudgement {
  int holds = -1;  // 1: every compared x within the band; 0: some x below it; -1: nothing to compare
  std::string summary;
};

// `measured` against `baseline` at the draft lengths both have.
AcceptanceJudgement judge_acceptance(const std::map<int64_t, double>& measured,
                                     const std::optional<AcceptanceBaseline>& baseline, const std::string& baselines_path);

}  // namespace vericache::cli
