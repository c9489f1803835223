// Shared helpers for the test binaries: fixture and model paths, the default model loaded once.
#pragma once

#include <string>
#include <vector>

#include "model/llama_model.h"

namespace vericache::testing {

// A path under the source tree, e.g. source_path("tests/fixtures/gguf/all_types.gguf").
std::string source_path(const std::string& relative);
// A model file in .models/ (fetched by harness/setup.sh). Fails the current test, with a hint,
// when it is missing.
std::string model_path(const std::string& file_name);
std::string default_model_path();
// Qwen2.5-Coder 0.5B Instruct (architecture qwen2), also fetched by harness/setup.sh; loaded once
// per test process like default_model().
std::string qwen_model_path();
const LlamaModel* qwen_model();
// Qwen2.5-Coder 1.5B Instruct, fetched by `harness/setup.sh --with-qwen-1.5b` (the `large` tests
// only; CI does not fetch it); loaded once per test process.
std::string qwen_1_5b_model_path();
const LlamaModel* qwen_1_5b_model();
// The default model, loaded once per test process; nullptr (and a failed test) when unavailable.
const LlamaModel* default_model();
// The default model and Qwen2.5-Coder 0.5B loaded with Compute::kInteger, once per test process.
// The default model keeps K/V in bfloat16 pages, as the CLI's `--compute auto --kv-cache auto`
// does; Qwen's integer model keeps float32 pages (its tests compare the weight panels alone).
const LlamaModel* default_integer_model();
const LlamaModel* qwen_integer_model();
// Token ids of a prompt as `vericache run` makes them: wrapped as a user message in the model's chat
// template when `chat`, a BOS token first when the model wants one.
std::vector<int32_t> prompt_ids(const LlamaModel& model, const std::string& text, bool chat);
// Reads a whole file; fails the test when it cannot.
std::string read_file(const std::string& path);
// A copy of the default model in temp_dir() whose metadata value for `key` has its bytes replaced
// by `value` (same size as the stored value: a uint32 for counts, a float32 for floats, a string of
// the same length). Returns the copy's path; fails the test when the key is not found.
std::string patched_default_model(const std::string& key, const std::string& value, const std::string& file_name);

// The bytes of a little-endian value, for patched_default_model.
template <typename T>
std::string bytes_of(T v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof(v));
}

// A directory for the calling test under the system temp dir, emptied on the test's first call.
std::string temp_dir();

}  // namespace vericache::testing
