// Tokenizer agreement with Hugging Face `tokenizers` (cross-checked with llama.cpp) on the 1.2 MB
// corpus, pre-tokenizer rules, special tokens, the chat template and UTF-8 helpers.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <optional>

#include "model/chat_template.h"
#include "model/gguf_file.h"
#include "model/tokenizer.h"
#include "model/unicode.h"
#include "test_support.h"

namespace vericache {
namespace {

using testing::default_model;
using testing::source_path;

const Tokenizer* tokenizer() {
  const LlamaModel* m = default_model();
  return m != nullptr ? &m->tokenizer() : nullptr;
}

// Fails with the first differing token and the reference tokens around it.
void expect_same_tokens(const Tokenizer& tok, const std::vector<int32_t>& ours, const std::vector<int32_t>& expected) {
  size_t first = 0;
  while (first < ours.size() && first < expected.size() && ours[first] == expected[first]) ++first;
  if (first < ours.size() || first < expected.size()) {
    const size_t from = first >= 8 ? first - 8 : 0;
    std::string context;
    for (size_t i = from; i < first + 8 && i < expected.size(); ++i) context += "[" + tok.token_bytes(expected[i]) + "]";
    ADD_FAILURE() << "first difference at token " << first << " of " << expected.size() << " (ours: " << ours.size()
                  << " tokens); reference tokens around it: " << context;
  }
}

TEST(Tokenizer, CorpusMatchesReferenceTokenForToken) {
  const Tokenizer* tok = tokenizer();
  ASSERT_NE(tok, nullptr);
  const std::string corpus = testing::read_file(source_path("datasets/tokenizer_corpus/corpus.txt"));
  const std::string raw = testing::read_file(source_path("tests/fixtures/tokenizer/corpus_ids.u16"));
  const auto meta = nlohmann::json::parse(testing::read_file(source_path("tests/fixtures/tokenizer/corpus_ids.json")));
  ASSERT_GE(corpus.size(), 1u << 20) << "the corpus must hold at least 1 MiB";
  ASSERT_EQ(corpus.size(), meta["corpus_bytes"].get<size_t>()) << "corpus.txt changed: regenerate the fixture";
  std::vector<int32_t> expected(raw.size() / 2);
  for (size_t i = 0; i < expected.size(); ++i) {
    expected[i] = static_cast<uint8_t>(raw[2 * i]) | (static_cast<uint8_t>(raw[2 * i + 1]) << 8);
  }
  ASSERT_EQ(expected.size(), meta["tokens"].get<size_t>());

  expect_same_tokens(*tok, tok->encode(corpus, /*parse_special=*/false), expected);
}

// Qwen2.5-Coder's tokenizer and chat template, read from its GGUF without loading the weights
// (seconds per test process otherwise); a failure is reported and gives nullopt.
struct QwenText {
  Tokenizer tokenizer;
  ChatTemplate chat;
};

std::optional<QwenText> qwen_text() {
  auto file = GgufFile::open(testing::qwen_model_path());
  if (!file.ok()) {
    ADD_FAILURE() << file.status().message();
    return std::nullopt;
  }
  auto tok = Tokenizer::from_gguf(*file);
  if (!tok.ok()) {
    ADD_FAILURE() << tok.status().message();
    return std::nullopt;
  }
  auto chat = ChatTemplate::from_gguf(*file);
  if (!chat.ok()) {
    ADD_FAILURE() << chat.status().message();
    return std::nullopt;
  }
  return QwenText{std::move(*tok), std::move(*chat)};
}

// Qwen2's pre-tokenizer (single digits, letters with one leading non-letter, newline runs) against
// the tokenizer transformers builds from the same GGUF.
TEST(Tokenizer, QwenCorpusMatchesTransformers) {
  auto qwen = qwen_text();
  ASSERT_TRUE(qwen.has_value());
  const Tokenizer* tok = &qwen->tokenizer;
  EXPECT_EQ(tok->pre_tokenizer(), "qwen2");
  const std::string corpus = testing::read_file(source_path("datasets/tokenizer_corpus/corpus.txt"));
  const std::string raw = testing::read_file(source_path("tests/fixtures/reference/qwen_corpus_ids.u32"));
  const auto meta = nlohmann::json::parse(testing::read_file(source_path("tests/fixtures/reference/qwen_logits.json")));
  std::vector<int32_t> expected(raw.size() / 4);
  std::memcpy(expected.data(), raw.data(), expected.size() * 4);  // little-endian uint32, ids < 2^31
  ASSERT_EQ(expected.size(), meta["corpus_tokens"].get<size_t>());
  expect_same_tokens(*tok, tok->encode(corpus, /*parse_special=*/false), expected);
}

// Qwen2.5's template (attribute syntax, escaped newlines, a tools branch) renders as ChatML with its
// default system message, as transformers' apply_chat_template does without tools.
TEST(ChatTemplate, QwenTemplateRendersWithItsDefaultSystemMessage) {
  auto qwen = qwen_text();
  ASSERT_TRUE(qwen.has_value());
  const ChatTemplate* chat = &qwen->chat;
  EXPECT_EQ(chat->render({{"user", "hi"}}, true),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(chat->render({{"system", "Be brief."}, {"user", "hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
}

TEST(Tokenizer, DecodeInvertsEncodeOnTheCorpus) {
  const Tokenizer* tok = tokenizer();
  ASSERT_NE(tok, nullptr);
  const std::string corpus = testing::read_file(source_path("datasets/tokenizer_corpus/corpus.txt"));
  EXPECT_TRUE(tok->decode(tok->encode(corpus, false), true) == corpus);
}

std::vector<std::string> words(const Tokenizer& tok, const std::string& text) {
  std::vector<std::string> out;
  for (std::string_view w : tok.pre_tokenize(text)) out.emplace_back(w);
  return out;
}

TEST(Tokenizer, SmolLmPreTokenizerRules) {
  const Tokenizer* tok = tokenizer();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->pre_tokenizer(), "smollm");
  using V = std::vector<std::string>;
  EXPECT_EQ(words(*tok, "Hello world!"), (V{"Hello", " world", "!"}));
  // Every digit is its own word, and the space before a number stays alone.
  EXPECT_EQ(words(*tok, "abc 123"), (V{"abc", " ", "1", "2", "3"}));
  // Contractions split off (lower case only), as in GPT-2.
  EXPECT_EQ(words(*tok, "don't we'll DON'T"), (V{"don", "'t", " we", "'ll", " DON", "'", "T"}));
  // A run of spaces keeps its last space for the next word.
  EXPECT_EQ(words(*tok, "a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(words(*tok, "x \n\ny"), (V{"x", " \n", "\n", "y"}));
  EXPECT_EQ(words(*tok, "end  "), (V{"end", "  "}));
  EXPECT_EQ(words(*tok, "Ωμέγα, мир"), (V{"Ωμέγα", ",", " мир"}));
  EXPECT_EQ(words(*tok, "½ ٣"), (V{"½", " ", "٣"}));
}

TEST(Tokenizer, SpecialTokensOnlyWhenAsked) {
  const Tokenizer* tok = tokenizer();
  ASSERT_NE(tok, nullptr);
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const std::vector<int32_t> special = tok->encode(text, true);
  ASSERT_GE(special.size(), 3u);
  EXPECT_EQ(special.front(), tok->find_token("<|im_start|>"));
  EXPECT_EQ(special.back(), tok->find_token("<|im_end|>"));
  const std::vector<int32_t> plain = tok->encode(text, false);
  EXPECT_GT(plain.size(), special.size());
  EXPECT_EQ(tok->decode(plain, true), text);
  EXPECT_EQ(tok->decode(special, true), text);
  EXPECT_EQ(tok->decode(special, false), "user\nhi");
  EXPECT_EQ(tok->eos_id(), tok->find_token("<|im_end|>"));
  EXPECT_EQ(tok->end_of_generation_ids(), (std::vector<int32_t>{2, 0}));
}

TEST(ChatTemplate, RendersTheSmolLm2TemplateAsTheReferenceDoes) {
  const LlamaModel* m = default_model();
  ASSERT_NE(m, nullptr);
  auto chat = m->chat_template();
  ASSERT_TRUE(chat.ok()) << chat.status().message();
  EXPECT_EQ(chat->format_name(), "chatml+default-system");
  EXPECT_EQ(chat->default_system_message(), "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  // The reference fixture's chat prompts were rendered by the reference script; ours must agree.
  const auto fixture = nlohmann::json::parse(testing::read_file(source_path("tests/fixtures/reference/logits.json")));
  const auto prompts = nlohmann::json::parse(testing::read_file(source_path("datasets/reference_prompts/prompts.json")));
  int checked = 0;
  for (size_t i = 0; i < prompts["prompts"].size(); ++i) {
    const auto& p = prompts["prompts"][i];
    if (!p["chat"].get<bool>()) continue;
    const std::string rendered = chat->render({{"user", p["text"].get<std::string>()}}, true);
    EXPECT_EQ(rendered, fixture["cases"][i]["text"].get<std::string>()) << p["name"];
    ++checked;
  }
  EXPECT_GE(checked, 10);
  EXPECT_EQ(chat->render({{"system", "Be brief."}, {"user", "Hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, UnknownTemplateIsNotSupported) {
  auto t = ChatTemplate::from_string("{{ bos_token }}{% for m in messages %}[INST] {{ m.content }}{% endfor %}", "x.gguf");
  EXPECT_EQ(t.status().message(),
            "x.gguf: chat template not recognised (ChatML is supported); run without the chat template "
            "(--no-chat-template)");
}

TEST(Unicode, ClassesAndUtf8Helpers) {
  EXPECT_TRUE(is_letter('a'));
  EXPECT_TRUE(is_letter(0x4E2D));  // 中
  EXPECT_FALSE(is_letter('1'));
  EXPECT_TRUE(is_number(0x0663));  // Arabic-Indic three
  EXPECT_TRUE(is_number(0x00BD));  // ½ (No)
  EXPECT_TRUE(is_whitespace(0x3000));
  EXPECT_FALSE(is_whitespace(0x200B));  // zero width space is not White_Space
  EXPECT_FALSE(is_letter(0x1F600));
  const std::string euro = "\xE2\x82\xAC";
  EXPECT_EQ(complete_utf8_prefix("ab" + euro.substr(0, 2)), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab" + euro), 5u);
  const auto cps = decode_utf8("a\xFF" + euro);
  ASSERT_EQ(cps.size(), 3u);
  EXPECT_EQ(cps[1].value, kInvalidCodePoint);
  EXPECT_EQ(cps[2].value, 0x20ACu);
  EXPECT_EQ(cps[2].offset, 2u);
}

}  // namespace
}  // namespace vericache
