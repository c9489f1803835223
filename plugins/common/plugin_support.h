// Helpers the bundled plugins share: JSON parameters with precise errors, bit widths and
// calibration paths. (The kept-count rule, dense per-layer keys and values and per-head top-k are
// in the installed vericache/token_scorer.h.) Header-only (compiled into each plugin). Not part of
// the installed contract.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include <vericache/compressor.h>
#include <vericache/kv_view.h>
#include <vericache/token_scorer.h>

namespace vericache::plugin {

// Reads a JSON object of parameters. Each getter records the first problem; finish() also
// rejects keys no getter asked for, listing the known ones.
class ParamReader {
 public:
  explicit ParamReader(const std::string& json) {
    params_ = nlohmann::json::parse(json.empty() ? "{}" : json, nullptr, false);
    if (params_.is_discarded() || !params_.is_object()) fail("parameters must be a JSON object, got: " + json);
  }

  int64_t integer(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number_integer() || v->get<int64_t>() < lo || v->get<int64_t>() > hi) {
      fail("'" + key + "' must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v->dump());
      return fallback;
    }
    return v->get<int64_t>();
  }
  double number(const std::string& key, double fallback, double lo, double hi) {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !(v->get<double>() >= lo && v->get<double>() <= hi)) {
      fail("'" + key + "' must be a number in [" + format(lo) + ", " + format(hi) + "], got " + v->dump());
      return fallback;
    }
    return v->get<double>();
  }
  bool boolean(const std::string& key, bool fallback) {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) {
      fail("'" + key + "' must be true or false, got " + v->dump());
      return fallback;
    }
    return v->get<bool>();
  }
  std::string text(const std::string& key, const std::string& fallback, const std::set<std::string>& allowed = {}) {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_string() || (!allowed.empty() && !allowed.count(v->get<std::string>()))) {
      std::string choices;
      for (const std::string& a : allowed) choices += (choices.empty() ? "" : ", ") + a;
      fail("'" + key + "' must be " + (allowed.empty() ? "a string" : "one of " + choices) + ", got " + v->dump());
      return fallback;
    }
    return v->get<std::string>();
  }

  Status finish() {
    if (error_.empty() && params_.is_object()) {
      for (const auto& [key, value] : params_.items()) {
        if (!known_.count(key)) {
          std::string names;
          for (const std::string& k : known_) names += (names.empty() ? "" : ", ") + k;
          fail("unknown parameter '" + key + "' (known: " + names + ")");
          break;
        }
      }
    }
    return error_.empty() ? Status() : Status::invalid_argument(error_);
  }

 private:
  const nlohmann::json* find(const std::string& key) {
    known_.insert(key);
    if (!params_.is_object()) return nullptr;
    const auto it = params_.find(key);
    return it == params_.end() ? nullptr : &*it;
  }
  void fail(const std::string& message) {
    if (error_.empty()) error_ = message;
  }
  static std::string format(double x) {
    std::string s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }

  nlohmann::json params_;
  std::set<std::string> known_;
  std::string error_;
};

// A quantizer's bit width: 2, 3, 4 or 8 (the contract's bit schemes).
inline Status check_bit_width(int64_t bits) {
  if (bits == 2 || bits == 3 || bits == 4 || bits == 8) return Status();
  return Status::invalid_argument("'bits' must be 2, 3, 4 or 8, got " + std::to_string(bits));
}

// A calibrated quantizer's file: the "calibration" parameter, else the environment variable
// `env_var`, else empty (attach() then says how to make one).
inline std::string calibration_path(ParamReader& p, const char* env_var) {
  const char* env = std::getenv(env_var);
  return p.text("calibration", env != nullptr ? env : "");
}

}  // namespace vericache::plugin
