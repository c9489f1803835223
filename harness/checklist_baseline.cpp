#include "checklist_baseline.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace vericache::cli {
namespace {

std::string file_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

std::string last_two(const std::string& path) {
  const std::filesystem::path p(path);
  return (p.parent_path().filename() / p.filename()).string();
}

// Parameters with every string that names a path reduced to its file name, keys sorted (dump()).
std::string normalized_params(const std::string& params) {
  nlohmann::json j = nlohmann::json::parse(params, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return params;
  for (auto& [key, value] : j.items()) {
    if (value.is_string() && value.get<std::string>().find('/') != std::string::npos) value = file_name(value);
  }
  return j.dump();
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// The baseline for `key` in the parsed file `j`; throws on wrongly typed values.
std::optional<AcceptanceBaseline> find_in(const nlohmann::json& j, const BaselineKey& key) {
  for (const nlohmann::json& b : j.at("baselines")) {
    if (b.value("model_file", "") != file_name(key.model_file) || b.value("compressor", "") != key.compressor ||
        normalized_params(b.value("params", "{}")) != normalized_params(key.params) ||
        std::abs(b.value("ratio", -1.0) - key.ratio) > 1e-9 || b.value("prompt_set", "") != last_two(key.prompt_set) ||
        b.value("prompts", int64_t{-1}) != key.prompts || b.value("max_tokens", int64_t{-1}) != key.max_tokens) {
      continue;
    }
    AcceptanceBaseline out;
    out.band = j.at("band").get<double>();
    out.source = b.value("source", "");
    for (const auto& [x, gamma] : b.at("gamma").items()) out.gamma[std::stoll(x)] = gamma.get<double>();
    return out;
  }
  return std::nullopt;
}

}  // namespace

Result<std::optional<AcceptanceBaseline>> find_acceptance_baseline(const std::string& path, const BaselineKey& key) {
  std::ifstream in(path);
  if (!in) return Status::io_error(path + ": cannot read the acceptance baselines");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("baselines") || !j.contains("band")) {
    return Status::corruption(path + ": not an acceptance baselines file (expected keys 'band' and 'baselines')");
  }
  // A wrongly typed value (a baseline that is not an object, a gamma that is not a number, a draft
  // length that is not an integer) makes the file corrupt: reported with its path, not thrown.
  try {
    return find_in(j, key);
  } catch (const std::exception& e) {
    return Status::corruption(path + ": a malformed baseline (" + e.what() + ")");
  }
}

AcceptanceJudgement judge_acceptance(const std::map<int64_t, double>& measured,
                                     const std::optional<AcceptanceBaseline>& baseline, const std::string& baselines_path) {
  AcceptanceJudgement j;
  if (!baseline) {
    j.summary = "; acceptance not judged: no committed baseline for this configuration in " + baselines_path +
                " (harness/checklist/make_baselines.py adds one from a run's trace)";
    return j;
  }
  std::string below, compared;
  double worst = 1e9;
  int64_t worst_x = 0;
  for (const auto& [x, gamma] : measured) {
    const auto it = baseline->gamma.find(x);
    if (it == baseline->gamma.end()) continue;
    const double margin = gamma - it->second;
    compared += (compared.empty() ? "" : ", ") + std::to_string(x);
    if (margin < worst) worst = margin, worst_x = x;
    if (margin < -baseline->band) {
      below += (below.empty() ? "" : ", ") + std::to_string(x) + ": " + fmt("%.3f", gamma) + " < " +
               fmt("%.3f", it->second);
    }
  }
  if (compared.empty()) {
    j.summary = "; acceptance not judged: the baseline (" + baseline->source + ") has none of these draft lengths";
    return j;
  }
  j.holds = below.empty() ? 1 : 0;
  j.summary = below.empty() ? "; gamma within " + fmt("%.2f", baseline->band) + " of the committed baseline or above at x = " +
                                  compared + " (closest: " + fmt("%+.3f", worst) + " at x = " + std::to_string(worst_x) +
                                  "; baseline " + baseline->source + ")"
                            : "; gamma below the committed baseline by more than " + fmt("%.2f", baseline->band) +
                                  " at x = " + below + " (baseline " + baseline->source + ")";
  return j;
}

}  // namespace vericache::cli
