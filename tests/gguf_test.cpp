// GGUF reading and dequantization against the PyPI `gguf` package (fixtures from
// tests/reference/make_fixtures.py), and the errors for broken files.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <tuple>

#include "model/ggml_dequant.h"
#include "model/gguf_file.h"
#include "model/chat_template.h"
#include "model/llama_config.h"
#include "model/tokenizer.h"
#include "test_support.h"

namespace vericache {
namespace {

using testing::model_path;
using testing::source_path;

std::vector<float> dequantized(const GgufTensorInfo& t) {
  std::vector<float> out(t.n_elements);
  Status s = dequantize(t.type, t.data, t.n_elements, out.data());
  EXPECT_TRUE(s.ok()) << t.name << ": " << s.message();
  return out;
}

// Must match fingerprint() in tests/reference/make_fixtures.py.
uint64_t fingerprint(const std::vector<float>& v) {
  uint64_t h = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    uint64_t k = static_cast<uint64_t>(i + 1) * 0x9E3779B97F4A7C15ull;
    k ^= k >> 30;
    k *= 0xBF58476D1CE4E5B9ull;
    k ^= k >> 27;
    k *= 0x94D049BB133111EBull;
    k ^= k >> 31;
    k |= 1;
    uint32_t bits;
    std::memcpy(&bits, &v[i], sizeof bits);
    h += (static_cast<uint64_t>(bits) + 1) * k;
  }
  return h;
}

TEST(GgufDequant, EveryTypeMatchesGgufPyBitwise) {
  auto file = GgufFile::open(source_path("tests/fixtures/gguf/all_types.gguf"));
  auto expected = GgufFile::open(source_path("tests/fixtures/gguf/all_types_expected.gguf"));
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_TRUE(expected.ok()) << expected.status().message();
  std::set<std::string> types;
  for (const GgufTensorInfo& t : file->tensors()) {
    const GgufTensorInfo* e = expected->find_tensor(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    ASSERT_EQ(e->type, GgmlType::kF32);
    ASSERT_EQ(t.n_elements, e->n_elements);
    const std::vector<float> ours = dequantized(t);
    const std::vector<float> theirs = dequantized(*e);
    for (int64_t i = 0; i < t.n_elements; ++i) {
      ASSERT_EQ(std::memcmp(&ours[i], &theirs[i], sizeof(float)), 0)
          << t.name << "[" << i << "]: ours " << ours[i] << ", gguf-py " << theirs[i];
    }
    types.insert(ggml_type_name(t.type));
  }
  EXPECT_EQ(types, (std::set<std::string>{"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K",
                                          "Q5_K", "Q6_K"}));
}

TEST(GgufDequant, RealModelFilesMatchGgufPy) {
  const auto fixture = nlohmann::json::parse(testing::read_file(source_path("tests/fixtures/gguf/real_models.json")));
  for (const auto& [file_name, model] : fixture["models"].items()) {
    auto file = GgufFile::open(model_path(file_name));
    ASSERT_TRUE(file.ok()) << file.status().message();
    ASSERT_EQ(file->tensors().size(), model["tensors"].size()) << file_name;
    for (const GgufTensorInfo& t : file->tensors()) {
      const auto& ref = model["tensors"].at(t.name);
      EXPECT_EQ(ggml_type_name(t.type), ref["type"].get<std::string>()) << t.name;
      ASSERT_EQ(t.n_elements, ref["n_elements"].get<int64_t>()) << t.name;
      const std::vector<float> v = dequantized(t);
      for (size_t i = 0; i < ref["first"].size(); ++i) EXPECT_EQ(v[i], ref["first"][i].get<float>()) << t.name;
      EXPECT_EQ(std::to_string(fingerprint(v)), ref["fingerprint"].get<std::string>())
          << file_name << ": tensor " << t.name << " (" << ggml_type_name(t.type) << ") differs from gguf-py";
    }
  }
}

TEST(GgufFile, ReadsMetadataOfTheDefaultModel) {
  auto file = GgufFile::open(testing::default_model_path());
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(file->alignment(), 32u);
  EXPECT_EQ(*file->get_string("general.architecture"), "llama");
  EXPECT_EQ(*file->get_int("llama.block_count"), 30);
  EXPECT_FLOAT_EQ(static_cast<float>(*file->get_float("llama.rope.freq_base")), 100000.0f);
  EXPECT_FALSE(*file->get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(file->get_string_array("tokenizer.ggml.tokens")->size(), 49152u);
  EXPECT_EQ(file->get_int_array("tokenizer.ggml.token_type")->size(), 49152u);
  EXPECT_EQ(file->get_string_array("tokenizer.ggml.merges")->size(), 48900u);
  EXPECT_EQ(file->tensors().size(), 272u);
  const GgufTensorInfo* embd = file->find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(embd->type, GgmlType::kQ8_0);

  auto config = LlamaConfig::from_gguf(*file);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->n_layers, 30);
  EXPECT_EQ(config->d_model, 576);
  EXPECT_EQ(config->n_heads, 9);
  EXPECT_EQ(config->n_kv_heads, 3);
  EXPECT_EQ(config->head_dim, 64);
  EXPECT_EQ(config->d_ff, 1536);
  EXPECT_EQ(config->context_length, 8192);
  EXPECT_EQ(config->vocab_size, 49152);
}

TEST(GgufFile, TypedGettersNameTheKeyOnError) {
  auto file = GgufFile::open(testing::default_model_path());
  ASSERT_TRUE(file.ok());
  const std::string p = file->path();
  EXPECT_EQ(file->get_int("llama.no_such_key").status().message(), p + ": missing metadata key 'llama.no_such_key'");
  EXPECT_EQ(file->get_int("general.architecture").status().message(),
            p + ": metadata 'general.architecture' is string, expected an integer");
  EXPECT_EQ(file->get_string_array("tokenizer.ggml.token_type").status().message(),
            p + ": metadata 'tokenizer.ggml.token_type' is array, expected an array of strings");
}

// ---------------------------------------------------------------------------------------------
// Broken files: each gives one error naming the file and the problem.

std::string write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string fixture_bytes() { return testing::read_file(source_path("tests/fixtures/gguf/all_types.gguf")); }

std::string open_error(const std::string& path) {
  auto file = GgufFile::open(path);
  EXPECT_FALSE(file.ok());
  return file.ok() ? "" : file.status().message();
}

TEST(GgufErrors, MissingFile) {
  const std::string path = testing::temp_dir() + "/absent.gguf";
  EXPECT_EQ(open_error(path), path + ": no such file");
  EXPECT_EQ(GgufFile::open(path).status().code(), StatusCode::kNotFound);
}

TEST(GgufErrors, TooShort) {
  const std::string path = write_file(testing::temp_dir() + "/short.gguf", "GG");
  EXPECT_EQ(open_error(path), path + ": file is 2 bytes, too short for a GGUF header");
}

TEST(GgufErrors, WrongMagic) {
  std::string bytes = fixture_bytes();
  bytes[3] = 'X';
  const std::string path = write_file(testing::temp_dir() + "/magic.gguf", bytes);
  EXPECT_EQ(open_error(path), path + ": not a GGUF file (magic 0x58554747, expected 0x46554747 \"GGUF\")");
  EXPECT_EQ(GgufFile::open(path).status().code(), StatusCode::kCorruption);
}

TEST(GgufErrors, UnsupportedVersion) {
  std::string bytes = fixture_bytes();
  bytes[4] = 1;
  const std::string path = write_file(testing::temp_dir() + "/v1.gguf", bytes);
  EXPECT_EQ(open_error(path), path + ": GGUF version 1 is not supported (2 and 3 are)");
}

TEST(GgufErrors, TruncatedInMetadata) {
  const std::string path = write_file(testing::temp_dir() + "/trunc.gguf", fixture_bytes().substr(0, 100));
  EXPECT_EQ(open_error(path), path + ": truncated: reading length of value of metadata 'vericache.fixture' at byte 98 "
                                     "needs 8 bytes, the file has 100");
}

TEST(GgufErrors, TruncatedInTensorData) {
  const std::string bytes = fixture_bytes();
  const std::string path = write_file(testing::temp_dir() + "/trunc_data.gguf", bytes.substr(0, bytes.size() - 100));
  const std::string message = open_error(path);
  EXPECT_EQ(message.rfind(path + ": truncated: tensor 'bf16' needs bytes [", 0), 0u) << message;
  EXPECT_NE(message.find("but the file has " + std::to_string(bytes.size() - 100) + " bytes"), std::string::npos)
      << message;
}

TEST(GgufErrors, UnknownTensorType) {
  std::string bytes = fixture_bytes();
  // The first tensor entry: u64 name length 4, "q4_0", u32 rank 2, u64 dims x2, u32 type.
  const std::string name = std::string("\x04\0\0\0\0\0\0\0", 8) + "q4_0";
  const size_t at = bytes.find(name);
  ASSERT_NE(at, std::string::npos);
  const size_t type_at = at + name.size() + 4 + 16;
  ASSERT_EQ(bytes[type_at], 2);  // Q4_0
  bytes[type_at] = 99;
  const std::string path = write_file(testing::temp_dir() + "/type.gguf", bytes);
  EXPECT_EQ(open_error(path), path + ": tensor 'q4_0' has unknown ggml type 99");
  EXPECT_EQ(GgufFile::open(path).status().code(), StatusCode::kNotSupported);
}

TEST(GgufErrors, MissingConfigKey) {
  auto file = GgufFile::open(source_path("tests/fixtures/gguf/all_types.gguf"));
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(LlamaConfig::from_gguf(*file).status().message(),
            file->path() + ": missing metadata key 'llama.block_count'");
}

TEST(GgufErrors, UnsupportedArchitecture) {
  auto file = GgufFile::open(model_path("gemma-3-270m-q4_k_m.gguf"));
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(LlamaConfig::from_gguf(*file).status().message(),
            file->path() + ": architecture 'gemma3' is not supported (llama and qwen2 are)");
}

// Every metadata value the model uses is range-checked before anything is sized by it, with one
// line naming the key and the range; strings from the file are printed escaped.
TEST(ModelMetadata, OutOfRangeValuesAreRefusedWithTheKeyAndRange) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"llama.context_length", testing::bytes_of<uint32_t>(4'000'000'000u),
       "metadata 'llama.context_length' = 4000000000 is out of range [1, 262144]"},
      {"llama.context_length", testing::bytes_of<uint32_t>(0), "metadata 'llama.context_length' = 0 is out of range [1, 262144]"},
      {"llama.attention.layer_norm_rms_epsilon", testing::bytes_of<float>(nan),
       "metadata 'llama.attention.layer_norm_rms_epsilon' = nan is out of range [1e-12, 0.1]"},
      {"llama.rope.freq_base", testing::bytes_of<float>(0.0f), "metadata 'llama.rope.freq_base' = 0 is out of range [1, 1000000000]"},
      {"llama.attention.head_count_kv", testing::bytes_of<uint32_t>(27),
       "metadata 'llama.attention.head_count_kv' = 27 is out of range [1, 9]"},
      {"llama.embedding_length", testing::bytes_of<uint32_t>(1u << 30),
       "metadata 'llama.embedding_length' = 1073741824 is out of range [1, 65536]"},
      {"llama.block_count", testing::bytes_of<uint32_t>(29),
       "metadata 'llama.block_count' = 29 but the file has attention weights for 30 layers (blk.N.attn_q.weight)"},
      {"llama.block_count", testing::bytes_of<uint32_t>(31),
       "metadata 'llama.block_count' = 31 but the file has attention weights for 30 layers (blk.N.attn_q.weight)"},
      {"llama.rope.dimension_count", testing::bytes_of<uint32_t>(96),
       "rope.dimension_count 96 differs from head_dim 64; only RoPE over the whole head is supported"},
      {"general.architecture", std::string("ll\x01'a", 5), "architecture 'll\\x01\\x27a' is not supported (llama and qwen2 are)"},
  };
  for (const auto& [key, value, message] : cases) {
    const std::string path = testing::patched_default_model(key, value, "patched.gguf");
    auto file = GgufFile::open(path);
    ASSERT_TRUE(file.ok()) << file.status().message();
    EXPECT_EQ(LlamaConfig::from_gguf(*file).status().message(), path + ": " + message) << key;
    std::filesystem::remove(path);
  }
}

// The fuzzers' regression inputs (tests/fuzz/regressions/gguf): each class refused with its line.
TEST(ModelMetadata, FuzzRegressionInputsAreRefusedWithTheirReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"huge_context_length.gguf", "metadata 'llama.context_length' = 4000000000 is out of range [1, 262144]"},
      {"nan_rms_epsilon.gguf", "metadata 'llama.attention.layer_norm_rms_epsilon' = nan is out of range [1e-12, 0.1]"},
      {"more_layers_than_tensors.gguf",
       "metadata 'llama.block_count' = 2 but the file has attention weights for 1 layers (blk.N.attn_q.weight)"},
      {"control_bytes_in_architecture.gguf", "architecture 'll\\x00\\x1b[2Ja' is not supported (llama and qwen2 are)"},
  };
  for (const auto& [name, message] : cases) {
    const std::string path = source_path("tests/fuzz/regressions/gguf/" + name);
    auto file = GgufFile::open(path);
    ASSERT_TRUE(file.ok()) << file.status().message();
    EXPECT_EQ(LlamaConfig::from_gguf(*file).status().message(), path + ": " + message);
  }
}

// The fuzzer's model seeds pass every check it runs, so mutations start deep in the reader: the
// configuration (llama, and qwen2 with its biases and pre-tokenizer), the tokenizer, the chat
// template and every tensor's dequantization (F32, F16, Q8_0, Q4_K, Q6_K).
TEST(ModelMetadata, FuzzSeedsPassEveryCheck) {
  for (const char* name : {"tiny_llama_f32", "tiny_llama_f16", "tiny_llama_q8_0", "tiny_qwen2_q8_0", "tiny_qwen2_q4_k",
                           "tiny_qwen2_q6_k"}) {
    const std::string path = source_path(std::string("tests/fuzz/seeds/gguf/") + name + ".gguf");
    auto file = GgufFile::open(path);
    ASSERT_TRUE(file.ok()) << file.status().message();
    auto config = LlamaConfig::from_gguf(*file);
    ASSERT_TRUE(config.ok()) << name << ": " << config.status().message();
    EXPECT_EQ(config->attention_bias, std::string(name).find("qwen2") != std::string::npos) << name;
    auto tok = Tokenizer::from_gguf(*file);
    ASSERT_TRUE(tok.ok()) << name << ": " << tok.status().message();
    EXPECT_FALSE(tok->encode("hello world", false).empty()) << name;
    EXPECT_TRUE(ChatTemplate::from_gguf(*file).ok()) << name;
    for (const GgufTensorInfo& t : file->tensors()) {
      std::vector<float> out(static_cast<size_t>(t.n_elements));
      EXPECT_TRUE(dequantize(t.type, t.data, t.n_elements, out.data()).ok()) << name << ": " << t.name;
    }
  }
}

TEST(ModelMetadata, AFifoIsRefusedBeforeOpeningIt) {
  const std::string path = testing::temp_dir() + "/model.gguf";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  EXPECT_EQ(GgufFile::open(path).status().message(),
            path + ": not a regular file (a FIFO, socket or device), expected a file");
}

TEST(GgufErrors, DequantizeRejectsPartialBlocks) {
  std::vector<float> out(40);
  std::vector<uint8_t> in(40);
  EXPECT_EQ(dequantize(GgmlType::kQ8_0, in.data(), 40, out.data()).message(),
            "dequantize: 40 values is not a multiple of the Q8_0 block size 32");
  EXPECT_EQ(dequantize(GgmlType::kQ2_K, in.data(), 256, out.data()).message(), "cannot dequantize tensor type Q2_K");
}

}  // namespace
}  // namespace vericache
