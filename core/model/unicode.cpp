#include "model/unicode.h"

#include <algorithm>

namespace vericache {
namespace {

bool in_ranges(const CodePointRange* ranges, size_t n, uint32_t cp) {
  const CodePointRange* end = ranges + n;
  const CodePointRange* it =
      std::upper_bound(ranges, end, cp, [](uint32_t v, const CodePointRange& r) { return v < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

// Expected sequence length from a lead byte; 0 for a byte that cannot start one.
int sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

}  // namespace

std::vector<CodePoint> decode_utf8(std::string_view text) {
  std::vector<CodePoint> out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const int len = sequence_length(s[i]);
    uint32_t cp = kInvalidCodePoint;
    if (len == 1) {
      cp = s[i];
    } else if (len > 1 && i + len <= n) {
      bool ok = true;
      uint32_t v = s[i] & (0xFF >> (len + 1));
      for (int k = 1; k < len; ++k) {
        if ((s[i + k] & 0xC0) != 0x80) ok = false;
        v = (v << 6) | (s[i + k] & 0x3F);
      }
      // Reject overlong forms, surrogates and values past U+10FFFF.
      const uint32_t min_value[] = {0, 0, 0x80, 0x800, 0x10000};
      if (ok && v >= min_value[len] && v <= 0x10FFFF && !(v >= 0xD800 && v <= 0xDFFF)) cp = v;
    }
    if (cp == kInvalidCodePoint) {
      out.push_back({kInvalidCodePoint, static_cast<uint32_t>(i), 1});
      ++i;
    } else {
      out.push_back({cp, static_cast<uint32_t>(i), static_cast<uint32_t>(len)});
      i += len;
    }
  }
  return out;
}

bool is_letter(uint32_t cp) {
  return in_ranges(unicode_tables::kLetter, unicode_tables::kLetter_size, cp);
}

bool is_number(uint32_t cp) {
  return in_ranges(unicode_tables::kNumber, unicode_tables::kNumber_size, cp);
}

bool is_whitespace(uint32_t cp) {
  return in_ranges(unicode_tables::kWhitespace, unicode_tables::kWhitespace_size, cp);
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t complete_utf8_prefix(std::string_view bytes) {
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  // Look back at most 3 bytes for the lead byte of an unfinished sequence.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t c = s[n - back];
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const int len = sequence_length(c);
    if (len > static_cast<int>(back)) return n - back;  // lead of a sequence still missing bytes
    return n;
  }
  return n;
}

}  // namespace vericache
