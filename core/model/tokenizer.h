// Byte-level BPE tokenizer built from GGUF metadata (tokenizer.ggml.*), as GPT-2 defines it and
// Hugging Face `tokenizers` and llama.cpp implement it.
//
// Encoding: (1) when parse_special is set, control tokens found in the text are emitted as is and
// the text between them is encoded separately; user-defined tokens are always recognised;
// (2) the pre-tokenizer named by `tokenizer.ggml.pre` splits the text into words;
// (3) each word's bytes map to byte-level symbols (a byte whose symbol is not in the vocabulary
// is dropped, as Hugging Face's BPE does without an unknown token), and merges apply in rank
// order (lowest rank first, leftmost first among equal ranks) until none applies.
// Supported pre-tokenizers: "gpt2" / "gpt-2" (the GPT-2 regex) and "smollm" (every \p{N} code
// point isolated first, then the GPT-2 regex inside each piece).
//
// Thread-safety: immutable after from_gguf(); encode/decode are const and safe to call
// concurrently. Failure: from_gguf() reports a missing key, an unsupported tokenizer model or
// pre-tokenizer, and merges or special ids that do not refer to the vocabulary.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <vericache/status.h>

#include "model/gguf_file.h"

namespace vericache {

// tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

class Tokenizer {
 public:
  static Result<Tokenizer> from_gguf(const GgufFile& file);

  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;

  // Concatenated bytes of the tokens (may end inside a UTF-8 sequence). Control tokens are
  // rendered as their text when include_control is set and skipped otherwise. Ids must be valid.
  std::string decode(std::span<const int32_t> ids, bool include_control) const;
  // The bytes one token stands for (control tokens: their text).
  const std::string& token_bytes(int32_t id) const { return token_bytes_[id]; }
  // The vocabulary entry as written in the file (byte-level symbols).
  const std::string& token_text(int32_t id) const { return tokens_[id]; }
  TokenType token_type(int32_t id) const { return types_[id]; }

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  bool is_valid(int32_t id) const { return id >= 0 && id < vocab_size(); }
  int32_t bos_id() const { return bos_id_; }  // -1 when the file names none
  int32_t eos_id() const { return eos_id_; }
  bool add_bos() const { return add_bos_; }
  // Tokens that end a generation by default: EOS, EOT and the end-of-turn control tokens of
  // common chat formats present in the vocabulary.
  const std::vector<int32_t>& end_of_generation_ids() const { return end_of_generation_; }
  // -1 when absent.
  int32_t find_token(const std::string& text) const;
  const std::string& pre_tokenizer() const { return pre_; }

  // The pre-tokenizer's split of `text` (views into it); exposed for tests.
  std::vector<std::string_view> pre_tokenize(std::string_view text) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };

  void encode_word(std::string_view word, std::vector<int32_t>* out) const;
  void encode_ordinary(std::string_view text, std::vector<int32_t>* out) const;

  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::vector<std::string> token_bytes_;
  std::unordered_map<std::string, int32_t> token_index_;
  std::unordered_map<uint64_t, Merge> merges_;  // key: left id << 32 | right id
  int32_t byte_token_[256] = {};  // byte-level symbol of each byte, -1 when not in the vocabulary
  std::vector<int32_t> special_ids_;  // control and user-defined, longest text first
  bool special_first_byte_[256] = {};  // some special token starts with this byte
  std::vector<int32_t> end_of_generation_;
  std::string pre_;
  bool isolate_digits_ = false;  // "smollm": every digit its own piece, then the GPT-2 split
  bool qwen2_split_ = false;     // "qwen2": the Qwen2 / Llama-3 split (split_qwen2 in tokenizer.cpp)
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = false;
};

}  // namespace vericache
