#include "compression_support.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <utility>

#include "engine/compression.h"
#include "loader/plugin_loader.h"
#include "test_support.h"

namespace vericache::testing {

namespace {

// The file `vericache <command> --model MODEL --out FILE` makes, made once per (command, model) in
// this process and removed at exit.
const std::string& made_by_vericache(const std::string& command, const std::string& model_path) {
  static std::map<std::pair<std::string, std::string>, std::string> made;
  static const struct RemoveAtExit {
    ~RemoveAtExit() {
      for (const auto& [key, file] : made) std::filesystem::remove(file);
    }
  } cleanup;
  auto it = made.find({command, model_path});
  if (it == made.end()) {
    const std::string out = std::filesystem::temp_directory_path() /
                            ("vericache_tests_" + std::to_string(getpid()) + "_" + std::to_string(made.size()) + ".json");
    const std::string line =
        std::string(VC_BINARY) + " " + command + " --model '" + model_path + "' --out " + out + " > /dev/null 2>&1";
    EXPECT_EQ(std::system(line.c_str()), 0) << line;
    it = made.emplace(std::make_pair(command, model_path), out).first;
  }
  return it->second;
}

}  // namespace

const std::string& kvzap_weights(const std::string& model_path) {
  return made_by_vericache("train-kvzap --passages 4 --passage-tokens 128", model_path);
}

const std::string& rotatekv_calibration(const std::string& model_path) {
  return made_by_vericache("calibrate --compressor rotatekv --passages 4 --passage-tokens 256", model_path);
}

const std::string& kvquant_calibration(const std::string& model_path) {
  return made_by_vericache("calibrate --compressor kvquant --passages 4 --passage-tokens 256", model_path);
}

std::string params_for(const std::string& plugin, const std::string& model_path) {
  if (plugin == "kvzap") {
    return R"({"weights": ")" + kvzap_weights(model_path) + R"(", "window": )" + std::to_string(kKvzapWindow) + "}";
  }
  if (plugin == "rotatekv") return R"({"calibration": ")" + rotatekv_calibration(model_path) + R"("})";
  if (plugin == "kvquant") return R"({"calibration": ")" + kvquant_calibration(model_path) + R"("})";
  return "{}";
}

std::string params_for(const std::string& plugin) { return params_for(plugin, default_model_path()); }

std::vector<PluginInfo> bundled_plugins() {
  PluginSearch search = find_plugins({VC_PLUGIN_DIR});
  for (const Status& s : search.rejected) ADD_FAILURE() << s.message();
  EXPECT_FALSE(search.found.empty()) << "no plugins in " << VC_PLUGIN_DIR;
  return search.found;
}

std::vector<std::string> bundled_plugin_names(std::optional<CompressorFamily> family) {
  std::vector<std::string> names;
  for (const PluginInfo& p : bundled_plugins()) {
    if (!family || p.family == *family) names.push_back(p.name);
  }
  return names;
}

std::shared_ptr<Compressor> bundled_compressor(const std::string& name, const std::string& params, const LlamaModel& model) {
  auto loaded = load_compressor(std::string(VC_PLUGIN_DIR) + "/vc_plugin_" + name + ".so", params);
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  if (!loaded.ok()) return nullptr;
  const Status attached = (*loaded)->attach(model.shape());
  EXPECT_TRUE(attached.ok()) << attached.message();
  return attached.ok() ? *loaded : nullptr;
}

std::unique_ptr<CompressionRun> run_compression(const LlamaModel& model, Compressor& compressor,
                                                const std::vector<int32_t>& ids, double ratio) {
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t layers = model.config().n_layers;
  auto pool = model.make_page_pool(16, layers * ((2 * n + 2200) / 16 + 2));
  EXPECT_TRUE(pool.ok());
  auto run = std::make_unique<CompressionRun>(CompressionRun{std::move(*pool), SequenceKv(layers), {}, Status()});
  run->status = prefill_and_compress(model, run->pool, compressor, ratio, ids, 0, run->kv, &run->compressed);
  return run;
}

std::vector<int32_t> kvpress_prompt_ids(const std::string& prompt) {
  const auto index = nlohmann::json::parse(read_file(source_path("tests/fixtures/reference/kvpress/index.json")));
  for (const auto& e : index.at("entries")) {
    if (e.at("prompt") == prompt) return e.at("token_ids").get<std::vector<int32_t>>();
  }
  ADD_FAILURE() << "no kvpress fixture prompt '" << prompt << "'";
  return {};
}

}  // namespace vericache::testing
