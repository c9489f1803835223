#include "test_support.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

namespace vericache::testing {

std::string source_path(const std::string& relative) { return std::string(VC_SOURCE_DIR) + "/" + relative; }

std::string model_path(const std::string& file_name) {
  const std::string path = source_path(".models/" + file_name);
  if (!std::filesystem::exists(path)) ADD_FAILURE() << path << " is missing: run harness/setup.sh";
  return path;
}

std::string default_model_path() { return model_path("SmolLM2-135M-Instruct.Q4_1.gguf"); }

std::string qwen_model_path() { return model_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"); }

std::string qwen_1_5b_model_path() {
  const std::string path = source_path(".models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
  if (!std::filesystem::exists(path)) ADD_FAILURE() << path << " is missing: run harness/setup.sh --with-qwen-1.5b";
  return path;
}

namespace {

// The model at `path`, loaded on first use and kept for the process; nullptr and a failed test
// when it cannot be loaded.
const LlamaModel* cached_model(std::unique_ptr<LlamaModel>* model, Status* status, const std::string& path,
                               Compute compute = Compute::kFloat32, at::ScalarType kv_dtype = at::kFloat) {
  if (*model == nullptr && status->ok()) {
    LoadOptions options;
    options.compute = compute;
    auto loaded = LlamaModel::load(path, options);
    if (loaded.ok()) *status = (*loaded)->set_kv_dtype(kv_dtype);
    if (!loaded.ok()) {
      *status = loaded.status();
    } else if (status->ok()) {
      *model = std::move(loaded).value();
    }
  }
  if (!status->ok()) ADD_FAILURE() << "cannot load " << path << ": " << status->message();
  return model->get();
}

}  // namespace

const LlamaModel* default_model() {
  static std::unique_ptr<LlamaModel> model;
  static Status status;
  return cached_model(&model, &status, default_model_path());
}

const LlamaModel* default_integer_model() {
  static std::unique_ptr<LlamaModel> model;
  static Status status;
  return cached_model(&model, &status, default_model_path(), Compute::kInteger, at::kBFloat16);
}

const LlamaModel* qwen_integer_model() {
  static std::unique_ptr<LlamaModel> model;
  static Status status;
  return cached_model(&model, &status, qwen_model_path(), Compute::kInteger);
}

const LlamaModel* qwen_model() {
  static std::unique_ptr<LlamaModel> model;
  static Status status;
  return cached_model(&model, &status, qwen_model_path());
}

const LlamaModel* qwen_1_5b_model() {
  static std::unique_ptr<LlamaModel> model;
  static Status status;
  return cached_model(&model, &status, qwen_1_5b_model_path());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return "";
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string patched_default_model(const std::string& key, const std::string& value, const std::string& file_name) {
  static const std::string model = read_file(default_model_path());
  // A GGUF metadata entry: uint64 key length, key bytes, uint32 value type, value.
  const std::string needle = bytes_of<uint64_t>(key.size()) + key;
  const size_t at = model.find(needle);
  if (at == std::string::npos) {
    ADD_FAILURE() << "metadata key " << key << " not found in the default model";
    return "";
  }
  std::string bytes = model;
  const size_t value_at = at + needle.size() + sizeof(uint32_t);
  // A string value has its own uint64 length first; the replacement keeps it.
  const uint32_t type = *reinterpret_cast<const uint32_t*>(bytes.data() + at + needle.size());
  bytes.replace(value_at + (type == 8 ? sizeof(uint64_t) : 0), value.size(), value);
  const std::string path = temp_dir() + "/" + file_name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "vericache_tests" /
                              (std::string(info->test_suite_name()) + "." + info->name());
  static std::string prepared;  // the directory is emptied once per test, on first use
  if (prepared != dir.string()) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    prepared = dir.string();
  }
  return dir.string();
}

std::vector<int32_t> prompt_ids(const LlamaModel& model, const std::string& text, bool chat) {
  std::string rendered = text;
  if (chat) rendered = model.chat_template()->render({{"user", text}}, /*add_generation_prompt=*/true);
  std::vector<int32_t> ids = model.tokenizer().encode(rendered, /*parse_special=*/chat);
  if (model.tokenizer().add_bos() && model.tokenizer().bos_id() >= 0) ids.insert(ids.begin(), model.tokenizer().bos_id());
  return ids;
}

}  // namespace vericache::testing
