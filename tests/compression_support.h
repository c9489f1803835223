// Shared by the compressor conformance and fidelity tests: load a bundled plugin, run it on a real
// prefilled cache the way the engine does, and decode on the result.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <vericache/compressor.h>

#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "model/llama_model.h"

namespace vericache::testing {

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
