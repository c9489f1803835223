// Standard packed-page layouts: a quantizer whose PackedFormat names one lets the runtime's
// attention kernels read its codes in place (dequantizing in registers) instead of calling
// unpack() on every packed page of every layer at every step. unpack() must still work and give the
// same floats (it is the reference the fused kernels are tested against, and the path for forwards
// of many rows, such as a prefill chunk over a packed prefix).
//
// Header-only, no torch; plugins and the core share these offsets.
#pragma once

#include <cstdint>
#include <string>

namespace vericache {

enum class PackedLayout : uint32_t {
  kOpaque = 0,      // only the quantizer knows the layout: attention reads through unpack()
  kMinMaxGroups = 1,  // MinMaxGroupsLayout below (KIVI's arrangement)
};

// kMinMaxGroups: asymmetric min-max codes (x = code * scale + minimum, the product rounded to
// float32 before the sum, never fused; scale and minimum float16), keys grouped along tokens per
// channel, values grouped along channels per token. For one page of P slots, H KV heads, head
// dimension d, b bits per code, key groups of Gk tokens, value groups of Gv channels:
//   key codes      [H][d][P]  b bits each, LSB first (channel-major, like a float K page)
//   value codes    [H][P][d]  b bits each, LSB first
//   key groups     H*d*P/Gk (scale, minimum) float16 pairs. The layer's key groups, ordered
//                  (token group, head, channel), are striped over its packed pages in slot order:
//                  group index i lives in the layer's packed page i / (H*d*P/Gk), entry
//                  i % (H*d*P/Gk). (A token group of Gk > P slots spreads its groups over the
//                  Gk/P pages it covers; no byte is wasted.)
//   value groups   [P][H][d/Gv] (scale, minimum) float16 pairs
// Requirements (checked when the runtime reads the format): b in {2, 3, 4, 8}; Gk and Gv multiples
// of 16; Gk a multiple or a divisor of P; Gv divides d; bytes_per_page == bytes().
struct MinMaxGroupsLayout {
  int64_t page_size = 0, n_kv_heads = 0, head_dim = 0, key_group = 0, value_group = 0;
  int bits = 0;

  int64_t code_bytes() const { return (n_kv_heads * head_dim * page_size * bits + 7) / 8; }
  int64_t key_codes_offset() const { return 0; }
  int64_t value_codes_offset() const { return code_bytes(); }
  int64_t key_groups_offset() const { return 2 * code_bytes(); }
  int64_t key_groups_per_page() const { return n_kv_heads * head_dim * page_size / key_group; }
  int64_t value_groups_offset() const { return key_groups_offset() + 4 * key_groups_per_page(); }
  int64_t value_groups_per_page() const { return page_size * n_kv_heads * (head_dim / value_group); }
  int64_t bytes() const { return value_groups_offset() + 4 * value_groups_per_page(); }

  // Empty when the requirements above hold, else what is wrong.
  std::string violation() const {
    if (bits != 2 && bits != 3 && bits != 4 && bits != 8) return "bits must be 2, 3, 4 or 8, got " + std::to_string(bits);
    if (key_group < 16 || key_group % 16 != 0) return "key group (" + std::to_string(key_group) + ") must be a multiple of 16";
    if (key_group % page_size != 0 && page_size % key_group != 0) {
      return "key group (" + std::to_string(key_group) + ") must be a multiple or a divisor of the page size " +
             std::to_string(page_size);
    }
    if (value_group < 16 || value_group % 16 != 0 || head_dim % value_group != 0) {
      return "value group (" + std::to_string(value_group) + ") must be a multiple of 16 dividing the head dimension " +
             std::to_string(head_dim);
    }
    return "";
  }
};

}  // namespace vericache
