#include "model/int8_repack.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/check.h"
#include "util/half.h"

namespace vericache {
namespace {

using cpu::kPanelColumns;
using cpu::kQuantBlock;

float read_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return fp16_to_fp32(h);
}

float read_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// One block's integer form: codes (unsigned, zero point applied by the kernel), scales, minimum.
struct IntBlock {
  uint8_t codes[kQuantBlock];
  float scales[2] = {0, 0};
  float minimum = 0;
  uint16_t half_scale = 0, half_minimum = 0;  // the f16 bits, for formats with half scales
};

uint16_t read_u16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return h;
}

void unpack_nibbles(const uint8_t* qs, uint8_t* codes) {
  for (int i = 0; i < 16; ++i) {
    codes[i] = qs[i] & 0x0f;
    codes[16 + i] = static_cast<uint8_t>(qs[i] >> 4);
  }
}

IntBlock read_block(cpu::WeightFormat format, const uint8_t* b) {
  IntBlock out;
  switch (format) {
    case cpu::WeightFormat::kQ8_0:
      out.half_scale = read_u16(b);
      out.scales[0] = read_f16(b);
      for (int i = 0; i < kQuantBlock; ++i) out.codes[i] = static_cast<uint8_t>(static_cast<int8_t>(b[2 + i]) + 128);
      break;
    case cpu::WeightFormat::kQ4_0:
      out.half_scale = read_u16(b);
      out.scales[0] = read_f16(b);
      unpack_nibbles(b + 2, out.codes);
      break;
    case cpu::WeightFormat::kQ4_1:
      out.half_scale = read_u16(b);
      out.half_minimum = read_u16(b + 2);
      out.scales[0] = read_f16(b);
      out.minimum = read_f16(b + 2);
      unpack_nibbles(b + 4, out.codes);
      break;
    case cpu::WeightFormat::kQ5_0: {
      out.half_scale = read_u16(b);
      out.scales[0] = read_f16(b);
      uint32_t high;
      std::memcpy(&high, b + 2, sizeof high);
      unpack_nibbles(b + 6, out.codes);
      for (int i = 0; i < kQuantBlock; ++i) out.codes[i] |= static_cast<uint8_t>(((high >> i) & 1u) << 4);
      break;
    }
    case cpu::WeightFormat::kNibbleF32:
      out.scales[0] = read_f32(b);
      out.minimum = read_f32(b + 4);
      unpack_nibbles(b + 8, out.codes);
      break;
    case cpu::WeightFormat::kInt8F32:
      out.scales[0] = read_f32(b);
      out.scales[1] = read_f32(b + 4);
      for (int i = 0; i < kQuantBlock; ++i) out.codes[i] = static_cast<uint8_t>(static_cast<int8_t>(b[8 + i]) + 32);
      break;
    case cpu::WeightFormat::kF32: VC_CHECK(false, "float32 weights have no integer form");
  }
  return out;
}

int64_t format_block_bytes(cpu::WeightFormat format) {
  switch (format) {
    case cpu::WeightFormat::kQ8_0: return 34;
    case cpu::WeightFormat::kQ4_0: return 18;
    case cpu::WeightFormat::kQ4_1: return 20;
    case cpu::WeightFormat::kQ5_0: return 22;
    case cpu::WeightFormat::kNibbleF32: return 24;
    case cpu::WeightFormat::kInt8F32: return 40;
    case cpu::WeightFormat::kF32: break;
  }
  VC_CHECK(false, "float32 weights have no integer form");
  return 0;
}

// A factor F with F * c == v exactly in float32 for an int8 code c of every value v (F = 0 when all
// are 0); nullopt when none of +-max|v| / 1 .. 128 works (Q6_K files code their scales in
// [-128, 127] with a factor of either sign).
std::optional<float> int8_factor(const float* v, int count) {
  float amax = 0.0f;
  for (int i = 0; i < count; ++i) amax = std::max(amax, std::fabs(v[i]));
  if (amax == 0.0f) return 0.0f;
  for (int divisor = -128; divisor <= 128; ++divisor) {
    if (divisor == 0) continue;
    const float factor = amax / static_cast<float>(divisor);
    bool exact = true;
    for (int i = 0; i < count && exact; ++i) {
      const float code = std::nearbyint(v[i] / factor);
      exact = code >= -128.0f && code <= 127.0f && factor * code == v[i];
    }
    if (exact) return factor;
  }
  return std::nullopt;
}

// Group g (kScaleGroupBlocks blocks) of column j of `row`, in the panel at `panel`: its factors into
// the group header and the int8 codes of its scales and minimums into its blocks. False when the
// scales or minimums have no exact coding.
bool code_group_scales(cpu::WeightFormat source, const cpu::IntWeightFormat& format, const uint8_t* row, int64_t g,
                       int64_t j, uint8_t* panel) {
  constexpr int kBlocks = static_cast<int>(cpu::kScaleGroupBlocks);
  float scales[2 * kBlocks], minimums[kBlocks];
  for (int b = 0; b < kBlocks; ++b) {
    const IntBlock block = read_block(source, row + (g * kBlocks + b) * format_block_bytes(source));
    for (int s = 0; s < format.scales; ++s) scales[format.scales * b + s] = block.scales[s];
    minimums[b] = block.minimum;
  }
  const auto scale_factor = int8_factor(scales, format.scales * kBlocks);
  const auto min_factor = format.has_min ? int8_factor(minimums, kBlocks) : std::optional<float>(0.0f);
  if (!scale_factor || !min_factor) return false;
  uint8_t* header = panel + cpu::int_block_offset(format, g * kBlocks) - cpu::int_group_header_bytes(format);
  std::memcpy(header + 4 * j, &*scale_factor, 4);
  if (format.has_min) std::memcpy(header + 4 * (kPanelColumns + j), &*min_factor, 4);
  auto code = [](float v, float factor) {
    return static_cast<uint8_t>(static_cast<int8_t>(factor == 0.0f ? 0.0f : std::nearbyint(v / factor)));
  };
  for (int b = 0; b < kBlocks; ++b) {
    uint8_t* out = panel + cpu::int_block_offset(format, g * kBlocks + b);
    for (int s = 0; s < format.scales; ++s) out[kPanelColumns * s + j] = code(scales[format.scales * b + s], *scale_factor);
    if (format.has_min) out[kPanelColumns * format.scales + j] = code(minimums[b], *min_factor);
  }
  return true;
}

}  // namespace

std::optional<cpu::IntWeightFormat> int_weight_format(cpu::WeightFormat format) {
  switch (format) {
    case cpu::WeightFormat::kQ8_0: return cpu::IntWeightFormat{8, 1, false, 128, 2};
    case cpu::WeightFormat::kQ4_0: return cpu::IntWeightFormat{4, 1, false, 8, 2};
    case cpu::WeightFormat::kQ4_1: return cpu::IntWeightFormat{4, 1, true, 0, 2};
    case cpu::WeightFormat::kQ5_0: return cpu::IntWeightFormat{5, 1, false, 16, 2};
    case cpu::WeightFormat::kNibbleF32: return cpu::IntWeightFormat{4, 1, true, 0, 1};
    case cpu::WeightFormat::kInt8F32: return cpu::IntWeightFormat{6, 2, false, 32, 1};
    case cpu::WeightFormat::kF32: break;
  }
  return std::nullopt;
}

cpu::IntWeightFormat with_float_scales(cpu::IntWeightFormat format) {
  if (format.float_bytes == 1) format.float_bytes = 4;
  return format;
}

int64_t int_panels_bytes(const cpu::IntWeightFormat& format, int64_t n, int64_t k) {
  const int64_t panels = (n + kPanelColumns - 1) / kPanelColumns;
  return panels * cpu::int_panel_bytes(format, k);
}

std::optional<cpu::IntWeightView> repack_int_panels(const cpu::WeightView& w, const cpu::IntWeightFormat& format,
                                                    uint8_t* dst) {
  VC_CHECK(int_weight_format(w.format).has_value() && w.k % kQuantBlock == 0,
           "repack_int_panels: a matrix with no integer form");
  const bool coded = format.float_bytes == 1;
  if (coded && w.k % (kQuantBlock * cpu::kScaleGroupBlocks) != 0) return std::nullopt;
  const int64_t blocks = w.k / kQuantBlock;
  const int64_t source_block = format_block_bytes(w.format);
  const int64_t fb = format.float_bytes;
  const int64_t scale_bytes = fb * kPanelColumns * (format.scales + (format.has_min ? 1 : 0));
  cpu::IntWeightView view{format, dst, w.n, w.k, cpu::int_panel_bytes(format, w.k)};
  std::memset(dst, 0, int_panels_bytes(format, w.n, w.k));
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t p = 0; p < view.panels(); ++p) {
    uint8_t* panel = dst + p * view.panel_bytes;
    for (int64_t j = 0; j < kPanelColumns && p * kPanelColumns + j < w.n; ++j) {
      const uint8_t* row = src + (p * kPanelColumns + j) * w.row_bytes;
      for (int64_t g = 0; coded && g < blocks / cpu::kScaleGroupBlocks; ++g) {
        if (!code_group_scales(w.format, format, row, g, j, panel)) return std::nullopt;
      }
      for (int64_t b = 0; b < blocks; ++b) {
        uint8_t* out = panel + cpu::int_block_offset(format, b);
        uint8_t* codes = out + scale_bytes;
        const IntBlock block = read_block(w.format, row + b * source_block);
        if (fb == 2) {  // formats with one f16 scale: the file's own bits
          std::memcpy(out + 2 * j, &block.half_scale, 2);
          if (format.has_min) std::memcpy(out + 2 * (kPanelColumns + j), &block.half_minimum, 2);
        } else if (fb == 4) {
          for (int s = 0; s < format.scales; ++s) std::memcpy(out + 4 * (kPanelColumns * s + j), &block.scales[s], 4);
          if (format.has_min) std::memcpy(out + 4 * (kPanelColumns * format.scales + j), &block.minimum, 4);
        }
        for (int i = 0; i < kQuantBlock; ++i) {
          const int group = i / 4, t = i % 4;
          if (format.code_bits == 8) {
            codes[64 * group + 4 * j + t] = block.codes[i];
            continue;
          }
          const uint8_t low = block.codes[i] & 0x0f;
          codes[64 * (group % 4) + 4 * j + t] |= static_cast<uint8_t>(group < 4 ? low : low << 4);
          if (format.code_bits > 4) {  // the high-bit plane after the 4 nibble vectors
            const int h = format.code_bits - 4;
            codes[256 + 64 * (group % h) + 4 * j + t] |= static_cast<uint8_t>((block.codes[i] >> 4) << (h * (group / h)));
          }
        }
      }
    }
  }
  return view;
}

cpu::IntWeightView repack_int_panels(const cpu::WeightView& w, const std::function<uint8_t*(int64_t)>& allocate) {
  const auto format = int_weight_format(w.format);
  VC_CHECK(format.has_value(), "repack_int_panels: a matrix with no integer form");
  if (auto view = repack_int_panels(w, *format, allocate(int_panels_bytes(*format, w.n, w.k)))) return *view;
  const cpu::IntWeightFormat fallback = with_float_scales(*format);
  return *repack_int_panels(w, fallback, allocate(int_panels_bytes(fallback, w.n, w.k)));
}

}  // namespace vericache
