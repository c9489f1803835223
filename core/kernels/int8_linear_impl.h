// Integer linear kernel bodies shared by the AVX-512 VNNI and portable builds. Included once per
// build by int8_linear_vnni.cpp / int8_linear_portable.cpp, which define VC_INT_KERNEL_NAMESPACE.
// See int8_linear.h for the arithmetic each function performs.
#pragma once

#ifndef VC_INT_KERNEL_NAMESPACE
#error "define VC_INT_KERNEL_NAMESPACE before including int8_linear_impl.h"
#endif

#include <algorithm>

#include "kernels/int8_linear.h"
#include "kernels/simd.h"
#include "kernels/simd_int.h"
#include "util/check.h"

namespace vericache::cpu::VC_INT_KERNEL_NAMESPACE {

using simd::Bytes64;
using simd::Int16;
using simd::Vec16;

inline void quantize_rows(const float* x, int64_t ldx, int64_t m, int64_t k, int8_t* codes, float* scales,
                          int32_t* half_sums) {
  const int64_t blocks = k / kQuantBlock;
  const Vec16 lowest = simd::set1(-127.0f), highest = simd::set1(127.0f);
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * ldx;
    for (int64_t b = 0; b < blocks; ++b) {
      const Vec16 lo = simd::load(row + kQuantBlock * b), hi = simd::load(row + kQuantBlock * b + 16);
      const float amax = simd::reduce_max(simd::max(simd::abs(lo), simd::abs(hi)));
      const float d = amax / 127.0f;
      const Vec16 inverse = simd::set1(d != 0.0f ? 1.0f / d : 0.0f);
      int8_t* q = codes + r * k + kQuantBlock * b;
      simd::store_codes(q, simd::min(simd::max(simd::round_nearest(simd::mul(lo, inverse)), lowest), highest));
      simd::store_codes(q + 16, simd::min(simd::max(simd::round_nearest(simd::mul(hi, inverse)), lowest), highest));
      scales[r * blocks + b] = d;
      int32_t s0 = 0, s1 = 0;
      for (int i = 0; i < 16; ++i) {
        s0 += q[i];
        s1 += q[16 + i];
      }
      half_sums[r * 2 * blocks + 2 * b] = s0;
      half_sums[r * 2 * blocks + 2 * b + 1] = s1;
    }
  }
}

// The 16 scales (or minimums) of one block at `p`, stored as floats, halves, or int8 codes times
// `factor` (exact: the repack checked every product).
template <int FloatBytes>
inline Vec16 load_scales(const uint8_t* p, Vec16 factor) {
  if constexpr (FloatBytes == 1) {
    return simd::mul(factor, simd::signed_bytes(reinterpret_cast<const int8_t*>(p)));
  } else if constexpr (FloatBytes == 2) {
    return simd::load_halves(reinterpret_cast<const uint16_t*>(p));
  } else {
    return simd::load(reinterpret_cast<const float*>(p));
  }
}

// Rows [r0, r0 + MR) against one panel (up to 16 columns, `columns` of them stored).
template <int Bits, int Scales, bool HasMin, int FloatBytes, int MR>
void panel_tile(const QuantizedRows& x, int64_t r0, const uint8_t* panel, const IntWeightFormat& format,
                float* y, int64_t ldy, int columns) {
  const int64_t blocks = x.k / kQuantBlock;
  const int32_t zero = format.zero;
  Vec16 acc[MR];
  for (int m = 0; m < MR; ++m) acc[m] = simd::zero();
  // int_block_offset, with the constants hoisted out of the loop.
  const int64_t block_bytes = int_block_bytes(format), header_bytes = int_group_header_bytes(format);
  const int64_t group_bytes = header_bytes + kScaleGroupBlocks * block_bytes;
  Vec16 scale_factor = simd::zero(), min_factor = simd::zero();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block;
    if constexpr (FloatBytes == 1) {
      const uint8_t* group = panel + (b / kScaleGroupBlocks) * group_bytes;
      block = group + header_bytes + (b % kScaleGroupBlocks) * block_bytes;
      if (b % kScaleGroupBlocks == 0) {
        scale_factor = simd::load(reinterpret_cast<const float*>(group));
        if constexpr (HasMin) min_factor = simd::load(reinterpret_cast<const float*>(group) + kPanelColumns);
      }
    } else {
      block = panel + b * block_bytes;
    }
    constexpr int64_t kScaleBytes = FloatBytes * kPanelColumns;
    const Vec16 s0 = load_scales<FloatBytes>(block, scale_factor);
    Vec16 s1 = s0, minimum = s0;
    if constexpr (Scales == 2) s1 = load_scales<FloatBytes>(block + kScaleBytes, scale_factor);
    if constexpr (HasMin) minimum = load_scales<FloatBytes>(block + Scales * kScaleBytes, min_factor);
    const uint8_t* codes = block + kScaleBytes * (Scales + (HasMin ? 1 : 0));
    Bytes64 w[8];
    if constexpr (Bits >= 4 && Bits <= 6) {
      for (int v = 0; v < 4; ++v) {
        const Bytes64 raw = simd::load_bytes64(codes + 64 * v);
        w[v] = simd::low_nibbles(raw);
        w[v + 4] = simd::high_nibbles(raw);
      }
      if constexpr (Bits > 4) {  // the high-bit plane: group g's bits in vector g % H at bit H * (g / H)
        constexpr int H = Bits - 4;
        Bytes64 plane[H];
        for (int v = 0; v < H; ++v) plane[v] = simd::load_bytes64(codes + 256 + 64 * v);
        for (int g = 0; g < 8; ++g) w[g] = simd::bytes_or(w[g], simd::high_bits(plane[g % H], H * (g / H), H));
      }
    } else {
      for (int g = 0; g < 8; ++g) w[g] = simd::load_bytes64(codes + 64 * g);
    }
    for (int m = 0; m < MR; ++m) {
      const int64_t r = r0 + m;
      const int8_t* a = x.codes + r * x.k + kQuantBlock * b;
      Int16 h0 = simd::izero(), h1 = simd::izero();
      for (int g = 0; g < 4; ++g) h0 = simd::dot4(h0, w[g], a + 4 * g);
      for (int g = 0; g < 4; ++g) h1 = simd::dot4(h1, w[4 + g], a + 16 + 4 * g);
      const int32_t* sums = x.half_sums + r * 2 * blocks + 2 * b;
      if (zero != 0) {
        h0 = simd::isub(h0, zero * sums[0]);
        h1 = simd::isub(h1, zero * sums[1]);
      }
      const Vec16 ad = simd::set1(x.scales[r * blocks + b]);
      if constexpr (Scales == 1) {
        acc[m] = simd::fma(simd::mul(s0, ad), simd::to_float(simd::iadd(h0, h1)), acc[m]);
      } else {
        acc[m] = simd::fma(simd::mul(s0, ad), simd::to_float(h0), acc[m]);
        acc[m] = simd::fma(simd::mul(s1, ad), simd::to_float(h1), acc[m]);
      }
      if constexpr (HasMin) {
        acc[m] = simd::fma(simd::mul(minimum, ad), simd::set1(static_cast<float>(sums[0] + sums[1])), acc[m]);
      }
    }
  }
  for (int m = 0; m < MR; ++m) {
    if (columns == kPanelColumns) {
      simd::store(y + (r0 + m) * ldy, acc[m]);
    } else {
      simd::store_partial(y + (r0 + m) * ldy, acc[m], columns);
    }
  }
}

template <int Bits, int Scales, bool HasMin, int FloatBytes>
void linear_format(const QuantizedRows& x, const IntWeightView& w, int64_t panel0, int64_t panel1, float* y,
                   int64_t ldy) {
  constexpr int kRowTile = 8;  // rows sharing one unpacked block of weights
  for (int64_t p = panel0; p < panel1; ++p) {
    const uint8_t* panel = w.data + p * w.panel_bytes;
    const int columns = static_cast<int>(std::min<int64_t>(kPanelColumns, w.n - p * kPanelColumns));
    float* yp = y + p * kPanelColumns;
    int64_t r = 0;
    for (; r + kRowTile <= x.m; r += kRowTile) {
      panel_tile<Bits, Scales, HasMin, FloatBytes, kRowTile>(x, r, panel, w.format, yp, ldy, columns);
    }
    switch (x.m - r) {
      case 1: panel_tile<Bits, Scales, HasMin, FloatBytes, 1>(x, r, panel, w.format, yp, ldy, columns); break;
      case 2: panel_tile<Bits, Scales, HasMin, FloatBytes, 2>(x, r, panel, w.format, yp, ldy, columns); break;
      case 3: panel_tile<Bits, Scales, HasMin, FloatBytes, 3>(x, r, panel, w.format, yp, ldy, columns); break;
      case 4: panel_tile<Bits, Scales, HasMin, FloatBytes, 4>(x, r, panel, w.format, yp, ldy, columns); break;
      case 5: panel_tile<Bits, Scales, HasMin, FloatBytes, 5>(x, r, panel, w.format, yp, ldy, columns); break;
      case 6: panel_tile<Bits, Scales, HasMin, FloatBytes, 6>(x, r, panel, w.format, yp, ldy, columns); break;
      case 7: panel_tile<Bits, Scales, HasMin, FloatBytes, 7>(x, r, panel, w.format, yp, ldy, columns); break;
      default: break;
    }
  }
}

inline void linear(const QuantizedRows& x, const IntWeightView& w, int64_t panel0, int64_t panel1, float* y,
                   int64_t ldy) {
  const IntWeightFormat& f = w.format;
  // The formats int_weight_format gives: Q4_1, Q4_0, Q8_0 and Q5_0 (halves), Q4_K and Q6_K (int8
  // codes, or floats where a super-block's scales have no exact int8 coding).
  if (f.float_bytes == 1) {
    if (f.code_bits == 4 && f.scales == 1 && f.has_min) return linear_format<4, 1, true, 1>(x, w, panel0, panel1, y, ldy);
    if (f.code_bits == 6 && f.scales == 2 && !f.has_min) return linear_format<6, 2, false, 1>(x, w, panel0, panel1, y, ldy);
  } else if (f.float_bytes == 2) {
    if (f.code_bits == 4 && f.scales == 1 && f.has_min) return linear_format<4, 1, true, 2>(x, w, panel0, panel1, y, ldy);
    if (f.code_bits == 4 && f.scales == 1 && !f.has_min) return linear_format<4, 1, false, 2>(x, w, panel0, panel1, y, ldy);
    if (f.code_bits == 8 && f.scales == 1 && !f.has_min) return linear_format<8, 1, false, 2>(x, w, panel0, panel1, y, ldy);
    if (f.code_bits == 5 && f.scales == 1 && !f.has_min) return linear_format<5, 1, false, 2>(x, w, panel0, panel1, y, ldy);
  } else {
    if (f.code_bits == 4 && f.scales == 1 && f.has_min) return linear_format<4, 1, true, 4>(x, w, panel0, panel1, y, ldy);
    if (f.code_bits == 6 && f.scales == 2 && !f.has_min) return linear_format<6, 2, false, 4>(x, w, panel0, panel1, y, ldy);
  }
  VC_CHECK(false, "an integer weight format no kernel reads");
}

}  // namespace vericache::cpu::VC_INT_KERNEL_NAMESPACE
