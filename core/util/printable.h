// Text read from a file (a metadata key, a tensor name, a plugin's name) made safe to print in a
// one-line message: in single quotes, bytes outside printable ASCII as \xNN, cut after `max_bytes`
// bytes of the original with "..." so that a corrupt length cannot flood or cut the message.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace vericache {

inline std::string printable(std::string_view text, size_t max_bytes = 96) {
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < max_bytes; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (text.size() > max_bytes) out += "...";
  return out + "'";
}

}  // namespace vericache
