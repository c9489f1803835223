// Shared by the compressor conformance and fidelity tests: load a bundled plugin, run it on a real
// prefilled cache the way the engine does, and decode on the result.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <vericache/compressor.h>

#include "kv/page_pool.h"
#include "loader/plugin_loader.h"
#include "kv/sequence_kv.h"
#include "model/llama_model.h"

namespace vericache::testing {

// KVzap's window in the tests: small, so short prompts are compressed too.
constexpr int64_t kKvzapWindow = 16;
// Surrogate weights for KVzap on the model at `model_path`, trained once per test process and model
// by the real `vericache train-kvzap` (small: 4 passages of 128 tokens) into a temporary file
// removed at exit.
const std::string& kvzap_weights(const std::string& model_path);
// RotateKV's calibration for the model at `model_path`, made the same way by the real `vericache
// calibrate --compressor rotatekv` (4 passages of 256 tokens).
const std::string& rotatekv_calibration(const std::string& model_path);
// KVQuant's, by `vericache calibrate --compressor kvquant` (4 passages of 256 tokens).
const std::string& kvquant_calibration(const std::string& model_path);
// The parameters the tests run a bundled plugin with on the model at `model_path` ("{}", KVzap's
// weights for that model and its window, or RotateKV's or KVQuant's calibration); without a path,
// the default model.
std::string params_for(const std::string& plugin, const std::string& model_path);
std::string params_for(const std::string& plugin);

// The bundled plugins as the loader finds them in build/plugins, sorted by file name (the list
// itself lives in plugins/CMakeLists.txt); fails the test when a file there is rejected.
std::vector<PluginInfo> bundled_plugins();
// Their names, of one family only when `family` is given.
std::vector<std::string> bundled_plugin_names(std::optional<CompressorFamily> family = std::nullopt);

// A bundled plugin from build/plugins, created with `params` and attached to `model`; fails the
// test (and returns nullptr) when that does not work.
std::shared_ptr<Compressor> bundled_compressor(const std::string& name, const std::string& params, const LlamaModel& model);

// One request prefilled (every layer reported to the compressor, its drops applied) and, for an
// offline compressor, compressed and compacted. `compressed` is empty for an online compressor.
struct CompressionRun {
  PagePool pool;
  SequenceKv kv;
  CompressedKV compressed;
  Status status;
};
std::unique_ptr<CompressionRun> run_compression(const LlamaModel& model, Compressor& compressor,
                                                const std::vector<int32_t>& ids, double ratio);

// The token ids and text of a prompt the kvpress fixtures were made on ("doc", "long").
std::vector<int32_t> kvpress_prompt_ids(const std::string& prompt);

}  // namespace vericache::testing
