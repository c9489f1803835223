// UTF-8 decoding and the Unicode code point classes used by pre-tokenizers.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vericache {

struct CodePointRange {
  uint32_t first;
  uint32_t last;  // inclusive
};

namespace unicode_tables {
extern const CodePointRange kLetter[];
extern const size_t kLetter_size;
extern const CodePointRange kNumber[];
extern const size_t kNumber_size;
extern const CodePointRange kWhitespace[];
extern const size_t kWhitespace_size;
extern const char kUnicodeVersion[];
}  // namespace unicode_tables

// One decoded code point and where its bytes are in the source string.
struct CodePoint {
  uint32_t value;
  uint32_t offset;  // byte offset in the source
  uint32_t length;  // bytes, 1..4
};

// Decodes `text`. A byte that does not start a valid, shortest-form sequence becomes its own
// code point with value kInvalidCodePoint and length 1, so byte-level tokenizers still see it.
constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFFu;
std::vector<CodePoint> decode_utf8(std::string_view text);

// \p{L}, \p{N} and \s (the Unicode White_Space property, as Oniguruma and llama.cpp use it).
bool is_letter(uint32_t cp);
bool is_number(uint32_t cp);
bool is_whitespace(uint32_t cp);

// Appends the UTF-8 encoding of `cp` (must be a valid scalar value).
void append_utf8(uint32_t cp, std::string* out);

// Length of the longest prefix of `bytes` that does not end inside a UTF-8 sequence: what can
// be printed now when streaming bytes out token by token.
size_t complete_utf8_prefix(std::string_view bytes);

}  // namespace vericache
