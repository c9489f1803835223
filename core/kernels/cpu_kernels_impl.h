// Kernel bodies shared by the AVX-512 and portable builds. Included once per build by
// cpu_kernels_avx512.cpp / cpu_kernels_portable.cpp, which define VC_KERNEL_NAMESPACE.
// See cpu_kernels.h for the invariance contract each function keeps.
#pragma once

#ifndef VC_KERNEL_NAMESPACE
#error "define VC_KERNEL_NAMESPACE before including cpu_kernels_impl.h"
#endif

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/attention_bf16_impl.h"
#include "kernels/cpu_kernels.h"
#include "kernels/simd.h"
#include "util/check.h"

namespace vericache::cpu::VC_KERNEL_NAMESPACE {

using simd::Vec16;

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

constexpr int kMaxQueries = static_cast<int>(kAttentionQueryTile);

// ---------------------------------------------------------------------------------------------
// linear: each y[m, n] is one 16-lane accumulator running over k in order, then reduce_add.

template <int MR, int NR>
void linear_tile(const float* x, int64_t ldx, int64_t k_total, const float* w, float* y, int64_t ldy) {
  Vec16 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) acc[m][n] = simd::zero();
  int64_t k = 0;
  for (; k + simd::kLanes <= k_total; k += simd::kLanes) {
    Vec16 wv[NR];
    for (int n = 0; n < NR; ++n) wv[n] = simd::load(w + n * k_total + k);
    for (int m = 0; m < MR; ++m) {
      const Vec16 xv = simd::load(x + m * ldx + k);
      for (int n = 0; n < NR; ++n) acc[m][n] = simd::fma(xv, wv[n], acc[m][n]);
    }
  }
  if (k < k_total) {
    const int rest = static_cast<int>(k_total - k);
    Vec16 wv[NR];
    for (int n = 0; n < NR; ++n) wv[n] = simd::load_partial(w + n * k_total + k, rest);
    for (int m = 0; m < MR; ++m) {
      const Vec16 xv = simd::load_partial(x + m * ldx + k, rest);
      for (int n = 0; n < NR; ++n) acc[m][n] = simd::fma(xv, wv[n], acc[m][n]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) y[m * ldy + n] = simd::reduce_add(acc[m][n]);
}

template <int MR>
void linear_row_tile(const float* x, int64_t ldx, int64_t k, const float* w, int64_t n0, int64_t n1, float* y,
                     int64_t ldy) {
  // Few rows: wider column tiles keep enough independent accumulators in flight.
  constexpr int kNR = MR >= 3 ? 4 : 8;
  int64_t n = n0;
  for (; n + kNR <= n1; n += kNR) linear_tile<MR, kNR>(x, ldx, k, w + n * k, y + n, ldy);
  for (; n < n1; ++n) linear_tile<MR, 1>(x, ldx, k, w + n * k, y + n, ldy);
}

// Rows [0, m_total) against columns [n0, n1) of float32 weights w: [n][k].
inline void linear_f32(const float* x, int64_t ldx, int64_t m_total, int64_t k, const float* w, int64_t n0,
                       int64_t n1, float* y, int64_t ldy) {
  int64_t m = 0;
  for (; m + 4 <= m_total; m += 4) linear_row_tile<4>(x + m * ldx, ldx, k, w, n0, n1, y + m * ldy, ldy);
  switch (m_total - m) {
    case 3: linear_row_tile<3>(x + m * ldx, ldx, k, w, n0, n1, y + m * ldy, ldy); break;
    case 2: linear_row_tile<2>(x + m * ldx, ldx, k, w, n0, n1, y + m * ldy, ldy); break;
    case 1: linear_row_tile<1>(x + m * ldx, ldx, k, w, n0, n1, y + m * ldy, ldy); break;
    default: break;
  }
}

// Exact dequantization (the formulas of model/ggml_dequant.cpp: one float32 multiply, then one
// add, never fused). A 4-bit block first builds its 16 possible values, table[q] = d*q + m,
// and then looks each code up: the same floats as computing each value, at half the work.
template <WeightFormat F>
struct BlockTraits;
template <>
struct BlockTraits<WeightFormat::kQ8_0> {
  static constexpr int64_t kBytes = 34;
};
template <>
struct BlockTraits<WeightFormat::kQ4_0> {
  static constexpr int64_t kBytes = 18;
};
template <>
struct BlockTraits<WeightFormat::kQ4_1> {
  static constexpr int64_t kBytes = 20;
};
template <>
struct BlockTraits<WeightFormat::kQ5_0> {
  static constexpr int64_t kBytes = 22;
};
template <>
struct BlockTraits<WeightFormat::kNibbleF32> {
  static constexpr int64_t kBytes = 24;
};
template <>
struct BlockTraits<WeightFormat::kInt8F32> {
  static constexpr int64_t kBytes = 40;
};

inline float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The 32 values of block b of a row (values 32b .. 32b + 31): lo = the first 16, hi = the rest.
template <WeightFormat F>
inline void dequant_block(const uint8_t* row, int64_t b, Vec16* lo, Vec16* hi) {
  const uint8_t* block = row + b * BlockTraits<F>::kBytes;
  if constexpr (F == WeightFormat::kNibbleF32) {
    const Vec16 table = simd::add(simd::mul(simd::set1(load_f32(block)), simd::iota()), simd::set1(load_f32(block + 4)));
    *lo = simd::lookup_nibbles(table, block + 8, 0);
    *hi = simd::lookup_nibbles(table, block + 8, 4);
  } else if constexpr (F == WeightFormat::kInt8F32) {
    const auto* q = reinterpret_cast<const int8_t*>(block + 8);
    *lo = simd::mul(simd::set1(load_f32(block)), simd::signed_bytes(q));
    *hi = simd::mul(simd::set1(load_f32(block + 4)), simd::signed_bytes(q + 16));
  } else {
    const Vec16 d = simd::set1(simd::half_to_float(load_u16(block)));
    if constexpr (F == WeightFormat::kQ8_0) {
      const auto* q = reinterpret_cast<const int8_t*>(block + 2);
      *lo = simd::mul(simd::signed_bytes(q), d);
      *hi = simd::mul(simd::signed_bytes(q + 16), d);
    } else if constexpr (F == WeightFormat::kQ5_0) {
      // 16 bytes of nibbles after 32 fifth bits: value = d * (q - 16), from a 32-entry table.
      uint32_t high;
      std::memcpy(&high, block + 2, sizeof high);
      const Vec16 table_lo = simd::mul(d, simd::sub(simd::iota(), simd::set1(16.0f)));
      const Vec16 table_hi = simd::mul(d, simd::iota());
      *lo = simd::lookup_five_bits(table_lo, table_hi, block + 6, 0, high);
      *hi = simd::lookup_five_bits(table_lo, table_hi, block + 6, 4, high >> 16);
    } else if constexpr (F == WeightFormat::kQ4_0) {
      const Vec16 table = simd::mul(d, simd::sub(simd::iota(), simd::set1(8.0f)));
      *lo = simd::lookup_nibbles(table, block + 2, 0);
      *hi = simd::lookup_nibbles(table, block + 2, 4);
    } else {
      static_assert(F == WeightFormat::kQ4_1);
      const Vec16 table = simd::add(simd::mul(d, simd::iota()), simd::set1(simd::half_to_float(load_u16(block + 2))));
      *lo = simd::lookup_nibbles(table, block + 4, 0);
      *hi = simd::lookup_nibbles(table, block + 4, 4);
    }
  }
}

template <WeightFormat F>
void dequant_row(const uint8_t* row, int64_t k, float* out) {
  for (int64_t b = 0; b < k / 32; ++b) {
    Vec16 lo, hi;
    dequant_block<F>(row, b, &lo, &hi);
    simd::store(out + 32 * b, lo);
    simd::store(out + 32 * b + 16, hi);
  }
}

// Rows [n0, n1) of w dequantized into out ([n1 - n0][k]).
inline void dequant_rows(const WeightView& w, int64_t n0, int64_t n1, float* out) {
  const auto* data = static_cast<const uint8_t*>(w.data);
  for (int64_t n = n0; n < n1; ++n, out += w.k) {
    const uint8_t* row = data + n * w.row_bytes;
    switch (w.format) {
      case WeightFormat::kF32: std::memcpy(out, row, w.k * sizeof(float)); break;
      case WeightFormat::kQ8_0: dequant_row<WeightFormat::kQ8_0>(row, w.k, out); break;
      case WeightFormat::kQ4_0: dequant_row<WeightFormat::kQ4_0>(row, w.k, out); break;
      case WeightFormat::kQ4_1: dequant_row<WeightFormat::kQ4_1>(row, w.k, out); break;
      case WeightFormat::kQ5_0: dequant_row<WeightFormat::kQ5_0>(row, w.k, out); break;
      case WeightFormat::kNibbleF32: dequant_row<WeightFormat::kNibbleF32>(row, w.k, out); break;
      case WeightFormat::kInt8F32: dequant_row<WeightFormat::kInt8F32>(row, w.k, out); break;
    }
  }
}

inline void weight_row(const WeightView& w, int64_t r, float* out) { dequant_rows(w, r, r + 1, out); }

// Few rows against quantized weights, dequantizing in registers: the same values and the same
// fused multiply-add sequence per output as linear_tile over the dequantized floats.
template <WeightFormat F, int MR, int NR>
void linear_quant_tile(const float* x, int64_t ldx, int64_t k, const uint8_t* w, int64_t row_bytes, float* y,
                       int64_t ldy) {
  Vec16 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) acc[m][n] = simd::zero();
  for (int64_t b = 0; b < k / 32; ++b) {
    Vec16 lo[NR], hi[NR];
    for (int n = 0; n < NR; ++n) dequant_block<F>(w + n * row_bytes, b, &lo[n], &hi[n]);
    for (int m = 0; m < MR; ++m) {
      const Vec16 xl = simd::load(x + m * ldx + 32 * b), xh = simd::load(x + m * ldx + 32 * b + 16);
      for (int n = 0; n < NR; ++n) acc[m][n] = simd::fma(xh, hi[n], simd::fma(xl, lo[n], acc[m][n]));
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) y[m * ldy + n] = simd::reduce_add(acc[m][n]);
}

template <WeightFormat F, int MR>
void linear_quant_rows(const float* x, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  constexpr int kNR = MR >= 3 ? 4 : 8;
  const auto* data = static_cast<const uint8_t*>(w.data);
  int64_t n = n0;
  for (; n + kNR <= n1; n += kNR) linear_quant_tile<F, MR, kNR>(x, ldx, w.k, data + n * w.row_bytes, w.row_bytes, y + n, ldy);
  for (; n < n1; ++n) linear_quant_tile<F, MR, 1>(x, ldx, w.k, data + n * w.row_bytes, w.row_bytes, y + n, ldy);
}

template <WeightFormat F>
void linear_quant_small(const float* x, int64_t ldx, int64_t m, const WeightView& w, int64_t n0, int64_t n1, float* y,
                        int64_t ldy) {
  switch (m) {
    case 1: linear_quant_rows<F, 1>(x, ldx, w, n0, n1, y, ldy); break;
    case 2: linear_quant_rows<F, 2>(x, ldx, w, n0, n1, y, ldy); break;
    case 3: linear_quant_rows<F, 3>(x, ldx, w, n0, n1, y, ldy); break;
    case 4: linear_quant_rows<F, 4>(x, ldx, w, n0, n1, y, ldy); break;
    default: break;
  }
}

inline void linear(const float* x, int64_t ldx, int64_t m_total, const WeightView& w, int64_t n0, int64_t n1,
                   float* y, int64_t ldy) {
  // Up to 4 rows (decoding): quantized weights are dequantized in registers, once per use.
  if (m_total <= 4) {
    switch (w.format) {
      case WeightFormat::kQ8_0: return linear_quant_small<WeightFormat::kQ8_0>(x, ldx, m_total, w, n0, n1, y, ldy);
      case WeightFormat::kQ4_0: return linear_quant_small<WeightFormat::kQ4_0>(x, ldx, m_total, w, n0, n1, y, ldy);
      case WeightFormat::kQ4_1: return linear_quant_small<WeightFormat::kQ4_1>(x, ldx, m_total, w, n0, n1, y, ldy);
      case WeightFormat::kQ5_0: return linear_quant_small<WeightFormat::kQ5_0>(x, ldx, m_total, w, n0, n1, y, ldy);
      case WeightFormat::kNibbleF32:
        return linear_quant_small<WeightFormat::kNibbleF32>(x, ldx, m_total, w, n0, n1, y, ldy);
      case WeightFormat::kInt8F32:
        return linear_quant_small<WeightFormat::kInt8F32>(x, ldx, m_total, w, n0, n1, y, ldy);
      case WeightFormat::kF32: break;
    }
  }
  // Otherwise rows go in blocks that stay in L2, and within one, columns in blocks whose weights
  // stay in L1 while the block's rows stream past them; quantized columns are dequantized into a
  // small float buffer once per row block.
  constexpr int64_t kRowBlock = 128;
  constexpr int64_t kColumnBlock = 32;
  const int64_t k = w.k;
  thread_local std::vector<float> buffer;
  for (int64_t mb = 0; mb < m_total; mb += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, m_total - mb);
    const float* xb = x + mb * ldx;
    float* yb = y + mb * ldy;
    for (int64_t nb = n0; nb < n1; nb += kColumnBlock) {
      const int64_t ne = std::min(n1, nb + kColumnBlock);
      if (w.format == WeightFormat::kF32) {
        linear_f32(xb, ldx, rows, k, static_cast<const float*>(w.data), nb, ne, yb, ldy);
        continue;
      }
      buffer.resize(kColumnBlock * k);
      dequant_rows(w, nb, ne, buffer.data());
      linear_f32(xb, ldx, rows, k, buffer.data(), 0, ne - nb, yb + nb, ldy);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Row-wise element kernels.

// Sum over [0, n) with 16-lane accumulation in index order and the fixed reduction tree.
template <typename LoadFn>
float ordered_sum(int64_t n, LoadFn load_at) {
  Vec16 acc = simd::zero();
  int64_t i = 0;
  for (; i + simd::kLanes <= n; i += simd::kLanes) acc = simd::add(acc, load_at(i, simd::kLanes));
  if (i < n) acc = simd::add(acc, load_at(i, static_cast<int>(n - i)));
  return simd::reduce_add(acc);
}

inline void rms_norm(const float* x, int64_t d, const float* weight, float eps, float* y) {
  const float sum_sq = ordered_sum(d, [&](int64_t i, int lanes) {
    const Vec16 v = lanes == simd::kLanes ? simd::load(x + i) : simd::load_partial(x + i, lanes);
    return simd::mul(v, v);
  });
  const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(d) + eps);
  const Vec16 vinv = simd::set1(inv);
  int64_t i = 0;
  for (; i + simd::kLanes <= d; i += simd::kLanes) {
    simd::store(y + i, simd::mul(simd::mul(simd::load(x + i), vinv), simd::load(weight + i)));
  }
  if (i < d) {
    const int rest = static_cast<int>(d - i);
    simd::store_partial(y + i,
                        simd::mul(simd::mul(simd::load_partial(x + i, rest), vinv), simd::load_partial(weight + i, rest)),
                        rest);
  }
}

inline Vec16 silu_mul_vec(Vec16 g, Vec16 u) {
  const Vec16 one = simd::set1(1.0f);
  const Vec16 e = simd::exp(simd::sub(simd::zero(), g));
  return simd::mul(simd::div(g, simd::add(one, e)), u);
}

inline void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + simd::kLanes <= n; i += simd::kLanes) {
    simd::store(out + i, silu_mul_vec(simd::load(gate + i), simd::load(up + i)));
  }
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    simd::store_partial(out + i, silu_mul_vec(simd::load_partial(gate + i, rest), simd::load_partial(up + i, rest)), rest);
  }
}

// ---------------------------------------------------------------------------------------------
// Paged attention. For one (row, head): scores s_j = (q . k_j) * scale with the dot product a
// chain of fused multiply-adds over d in order; softmax with max, e_j = exp(s_j - max) and an
// ordered 16-lane sum; out = (sum_j e_j v_j in slot order) / sum. Only the row's own length
// enters, so neither the number of rows nor the tiling changes a bit. Over bfloat16 pages both
// products are bfloat16 pairs instead (attention_bf16_impl.h).

// Where slot `slot` lives: its page and its offset in that page. Slots below prefix_len are in the
// prefix pages (in order), the others in the cache's pages through the block table; each caller
// knows which storage it indexes.
struct SlotPlace {
  int64_t page;
  int64_t offset;
};
inline SlotPlace place_of(const PagedAttentionArgs& a, int64_t slot) {
  if (slot < a.prefix_len) return {slot / a.page_size, slot % a.page_size};
  slot -= a.prefix_len;
  return {a.block_table[slot / a.page_size], slot % a.page_size};
}

// Packed slots read in place (PagedAttentionArgs::packed_layout), dequantized as unpack() does:
// x = code * scale + minimum, the product rounded before the sum. Each min-max group becomes a
// 16-entry table once (simd::code_table; for 8 bits its scale and minimum), and each code a lookup.
//
// One group's dequantizer: a code table (2-4 bits) or the scale and minimum (8 bits).
template <int B>
struct GroupDequantizer {
  Vec16 table_or_scale, minimum;

  static GroupDequantizer at(const uint8_t* group) {
    const Vec16 scale = simd::set1(simd::half_to_float(load_u16(group)));
    const Vec16 minimum = simd::set1(simd::half_to_float(load_u16(group + 2)));
    if constexpr (B == 8) {
      return {scale, minimum};
    } else {
      return {simd::code_table<B>(scale, minimum), minimum};
    }
  }
  // The 16 codes packed from `codes`, dequantized.
  Vec16 operator()(const uint8_t* codes) const {
    if constexpr (B == 8) {
      return simd::add(simd::mul(simd::bytes16(codes), table_or_scale), minimum);
    } else {
      return simd::lookup_codes<B>(table_or_scale, codes);
    }
  }
};

// Packed pages are read in short runs (a head's codes of 16 slots are 128-512 bytes of a page of
// kilobytes), too short for the hardware prefetcher: each block asks for the block this far ahead.
constexpr int64_t kPrefetchSlots = 8 * simd::kLanes;

inline void prefetch(const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i);
}

// The dequantizers of one (key group, KV head): one per channel, kept while the blocks of 16 slots
// that attention_scores reads stay in that group (a group of 32 tokens serves two blocks).
template <int HD, int B>
struct KeyGroupCache {
  int64_t group = -1, kv_head = -1;
  GroupDequantizer<B> channel[HD];
};

// 16 slots from `slot` (a multiple of 16: within one page and, key groups being multiples of 16,
// within one key group) of one KV head, keys channel-major into out [HD][16].
template <int HD, int B>
void decode_keys(const PagedAttentionArgs& a, int64_t kv_head, int64_t slot, KeyGroupCache<HD, B>& cache,
                 float* out) {
  const MinMaxGroupsLayout& L = *a.packed_layout;
  const int64_t bytes = L.bytes();
  if (slot / L.key_group != cache.group || kv_head != cache.kv_head) {
    cache.group = slot / L.key_group;
    cache.kv_head = kv_head;
    // The group's entries are consecutive in the layer's striped list (no division per channel).
    const int64_t per_page = L.key_groups_per_page();
    const int64_t first = (cache.group * L.n_kv_heads + kv_head) * HD;
    int64_t p = first / per_page, e = first % per_page;
    const uint8_t* groups = a.packed_storage + a.packed_pages[p] * bytes + L.key_groups_offset();
    for (int c = 0; c < HD; ++c) {
      cache.channel[c] = GroupDequantizer<B>::at(groups + 4 * e);
      if (++e == per_page) {
        e = 0;
        groups = a.packed_storage + a.packed_pages[++p] * bytes + L.key_groups_offset();
      }
    }
  }
  const int64_t channel_bytes = L.page_size * B / 8;
  auto codes_at = [&](int64_t s) {
    return a.packed_storage + a.packed_pages[s / L.page_size] * bytes + L.key_codes_offset() +
           (kv_head * HD * L.page_size + s % L.page_size) * B / 8;
  };
  if (const int64_t ahead = slot + kPrefetchSlots; ahead < a.prefix_len) {
    // That block's codes (one run when a page is one block) and its key groups.
    prefetch(codes_at(ahead), HD * channel_bytes);
    const int64_t first = (ahead / L.key_group * L.n_kv_heads + kv_head) * HD;
    const int64_t per_page = L.key_groups_per_page();
    prefetch(a.packed_storage + a.packed_pages[first / per_page] * bytes + L.key_groups_offset() + 4 * (first % per_page),
             4 * HD);
  }
  const uint8_t* codes = codes_at(slot);
  for (int c = 0; c < HD; ++c) simd::store(out + c * simd::kLanes, cache.channel[c](codes + c * channel_bytes));
}

// The same 16 slots' values, token-major into out [16][HD].
template <int HD, int B>
void decode_values(const PagedAttentionArgs& a, int64_t kv_head, int64_t slot, float* out) {
  const MinMaxGroupsLayout& L = *a.packed_layout;
  if (const int64_t ahead = slot + kPrefetchSlots; ahead < a.prefix_len) {
    const uint8_t* page = a.packed_storage + a.packed_pages[ahead / L.page_size] * L.bytes();
    const int64_t offset = ahead % L.page_size;
    prefetch(page + L.value_codes_offset() + (kv_head * L.page_size + offset) * HD * B / 8, simd::kLanes * HD * B / 8);
    prefetch(page + L.value_groups_offset() + 4 * offset * L.n_kv_heads * (HD / L.value_group),
             4 * simd::kLanes * L.n_kv_heads * (HD / L.value_group));
  }
  const uint8_t* page = a.packed_storage + a.packed_pages[slot / L.page_size] * L.bytes();
  const int64_t offset = slot % L.page_size, group_size = L.value_group, groups_per_row = HD / group_size;
  const uint8_t* codes = page + L.value_codes_offset() + (kv_head * L.page_size + offset) * HD * B / 8;
  const uint8_t* groups = page + L.value_groups_offset() + 4 * (offset * L.n_kv_heads + kv_head) * groups_per_row;
  for (int t = 0; t < simd::kLanes; ++t, codes += HD * B / 8, groups += 4 * L.n_kv_heads * groups_per_row) {
    for (int64_t g = 0; g < groups_per_row; ++g) {
      const GroupDequantizer<B> dequantize = GroupDequantizer<B>::at(groups + 4 * g);
      for (int64_t c = g * group_size; c < (g + 1) * group_size; c += simd::kLanes) {
        simd::store(out + t * HD + c, dequantize(codes + c * B / 8));
      }
    }
  }
}

// The keys of the 16 slots from a multiple of 16 at `p` in `pages` (float prefix pages, or the
// cache's pages of E), channel-major: channel c's 16 values at the result + c * page_size.
template <int HD, typename E>
inline const E* key_block(const E* pages, const PagedAttentionArgs& a, int64_t kv_head, SlotPlace p) {
  return pages + ((p.page * a.n_kv_heads + kv_head) * HD) * a.page_size + p.offset;
}

// The values of the 16 slots from a multiple of 16 at `p` in `pages`: slot t at the result + t * HD.
template <int HD, typename E>
inline const E* value_rows(const E* pages, const PagedAttentionArgs& a, int64_t kv_head, SlotPlace p) {
  return pages + ((p.page * a.n_kv_heads + kv_head) * a.page_size + p.offset) * HD;
}

// Packed slots read in place, dequantized into `scratch` ([16][HD]): the 16 slots from `slot`.
template <int HD>
inline const float* packed_value_rows(const PagedAttentionArgs& a, int64_t kv_head, int64_t slot, float* scratch) {
  switch (a.packed_layout->bits) {
    case 2: decode_values<HD, 2>(a, kv_head, slot, scratch); break;
    case 3: decode_values<HD, 3>(a, kv_head, slot, scratch); break;
    case 4: decode_values<HD, 4>(a, kv_head, slot, scratch); break;
    default: decode_values<HD, 8>(a, kv_head, slot, scratch); break;
  }
  return scratch;
}

// Scores of T query vectors for the 16 slots from s0 whose float keys are channel-major at
// keys + c * stride: one chain of fused multiply-adds over the channels in order per slot.
template <int HD, int T>
inline void block_scores(const float* keys, int64_t stride, const float* const* q, Vec16 vscale, int64_t s0,
                         float* const* scores) {
  Vec16 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = simd::zero();
  for (int d = 0; d < HD; ++d) {
    const Vec16 kv = simd::load(keys + d * stride);
    for (int t = 0; t < T; ++t) acc[t] = simd::fma(simd::set1(q[t][d]), kv, acc[t]);
  }
  for (int t = 0; t < T; ++t) simd::store(scores[t] + s0, simd::mul(acc[t], vscale));
}

template <int HD, int T, int B>
void packed_scores(const PagedAttentionArgs& a, int64_t kv_head, const float* const* q, Vec16 vscale, int64_t slot0,
                   int64_t slot1, float* const* scores) {
  KeyGroupCache<HD, B> cache;
  alignas(64) float keys[HD * simd::kLanes];
  for (int64_t s0 = slot0; s0 < slot1; s0 += simd::kLanes) {
    decode_keys<HD, B>(a, kv_head, s0, cache, keys);
    block_scores<HD, T>(keys, simd::kLanes, q, vscale, s0, scores);
  }
}

// Scores over slots [slot0, slot1) that all live in `pages` (the float prefix pages, or the
// cache's): q is the T query vectors as floats for float pages, as QueryPairs for bfloat16 pages.
template <int HD, int T, typename E, typename Q>
void page_scores(const PagedAttentionArgs& a, const E* pages, int64_t kv_head, const Q& q, Vec16 vscale,
                 int64_t slot0, int64_t slot1, float* const* scores) {
  for (int64_t s0 = slot0; s0 < slot1; s0 += simd::kLanes) {
    if (const int64_t ahead = s0 + kPrefetchSlots; ahead < slot1) {
      // Each block of 16 slots starts a page of its own (page_size 16): too short a run for the
      // hardware prefetcher, so ask for the block this far ahead (no effect on any result).
      const E* next = key_block<HD>(pages, a, kv_head, place_of(a, ahead));
      for (int c = 0; c < HD; ++c) __builtin_prefetch(next + c * a.page_size);
    }
    block_scores<HD, T>(key_block<HD>(pages, a, kv_head, place_of(a, s0)), a.page_size, q, vscale, s0, scores);
  }
}

// Scores for T query vectors (rows x heads of one KV head) over slots [slot0, slot1) (multiples of
// 16), in blocks of 16 slots; a block never straddles pages because page_size is a multiple of 16.
// Each score is its own chain over the channels, so any split of the slots gives the same bits.
template <int HD, int T, typename E>
void attention_scores_of(const PagedAttentionArgs& a, int64_t kv_head, const float* const* q, int64_t slot0,
                         int64_t slot1, float* const* scores) {
  const Vec16 vscale = simd::set1(a.scale);
  int64_t s0 = slot0;
  if (const int64_t end = std::min(slot1, a.prefix_len); s0 < end) {
    if (a.packed_layout == nullptr) {
      page_scores<HD, T>(a, a.prefix_k_pages, kv_head, q, vscale, s0, end, scores);
    } else {
      switch (a.packed_layout->bits) {
        case 2: packed_scores<HD, T, 2>(a, kv_head, q, vscale, s0, end, scores); break;
        case 3: packed_scores<HD, T, 3>(a, kv_head, q, vscale, s0, end, scores); break;
        case 4: packed_scores<HD, T, 4>(a, kv_head, q, vscale, s0, end, scores); break;
        default: packed_scores<HD, T, 8>(a, kv_head, q, vscale, s0, end, scores); break;
      }
    }
    s0 = end;
  }
  if (s0 >= slot1) return;
  if constexpr (std::is_same_v<E, uint16_t>) {
    const QueryPairs<HD, T> pairs(q);
    page_scores<HD, T>(a, static_cast<const uint16_t*>(a.k_pages), kv_head, pairs, vscale, s0, slot1, scores);
  } else {
    page_scores<HD, T>(a, static_cast<const float*>(a.k_pages), kv_head, q, vscale, s0, slot1, scores);
  }
}

template <int HD, int T>
void attention_scores(const PagedAttentionArgs& a, int64_t kv_head, const float* const* q, int64_t slot0,
                      int64_t slot1, float* const* scores) {
  if (a.kv_element == KvElement::kBFloat16) {
    attention_scores_of<HD, T, uint16_t>(a, kv_head, q, slot0, slot1, scores);
  } else {
    attention_scores_of<HD, T, float>(a, kv_head, q, slot0, slot1, scores);
  }
}

// In place: scores[0, len) -> exp(s - max). Returns the ordered sum of the exponentials.
inline float softmax_numerators(float* scores, int64_t len) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < len; ++j) m = scores[j] > m ? scores[j] : m;
  const Vec16 vm = simd::set1(m);
  int64_t j = 0;
  for (; j + simd::kLanes <= len; j += simd::kLanes) {
    simd::store(scores + j, simd::exp(simd::sub(simd::load(scores + j), vm)));
  }
  if (j < len) {
    const int rest = static_cast<int>(len - j);
    simd::store_partial(scores + j, simd::exp(simd::sub(simd::load_partial(scores + j, rest), vm)), rest);
  }
  return ordered_sum(len, [&](int64_t i, int lanes) {
    return lanes == simd::kLanes ? simd::load(scores + i) : simd::load_partial(scores + i, lanes);
  });
}

// acc[t] += e_t[j0 + j] * v_j for the n slots whose float value rows are at rows + j * HD,
// channels [c0, c0 + 16 * kVecs): slot by slot in order, one fused multiply-add per channel.
// (bfloat16 rows: the overload in attention_bf16_impl.h.)
template <int HD, int NQ, int kVecs>
inline void accumulate_values(const float* rows, int64_t n, const float* const* e, int64_t j0, int64_t c0,
                              Vec16 (&acc)[NQ][kVecs]) {
  for (int64_t j = 0; j < n; ++j) {
    Vec16 vv[kVecs];
    for (int v = 0; v < kVecs; ++v) vv[v] = simd::load(rows + j * HD + c0 + v * simd::kLanes);
    for (int t = 0; t < NQ; ++t) {
      const Vec16 w = simd::set1(e[t][j0 + j]);
      for (int v = 0; v < kVecs; ++v) acc[t][v] = simd::fma(w, vv[v], acc[t][v]);
    }
  }
}

// The lines of one call's channels of the 16 value rows at `rows` (a block this far ahead).
template <int HD, int kVecs, typename E>
inline void prefetch_value_rows(const E* rows, int64_t c0) {
  for (int t = 0; t < simd::kLanes; ++t) {
    prefetch(reinterpret_cast<const uint8_t*>(rows + t * HD + c0), kVecs * simd::kLanes * sizeof(E));
  }
}

// acc[t] += e_t[j] v_j for NQ query vectors over the blocks of 16 slots from j_begin (a multiple
// of 16) up to len, channels [c0, c0 + 16 * kVecs): every channel is its own chain over the slots,
// so any split of the channels gives the same bits. `scratch` holds [16][HD] floats.
template <int HD, int NQ, int kVecs, typename E>
void accumulate_blocks(const PagedAttentionArgs& a, int64_t kv_head, int64_t j_begin, int64_t len,
                       const float* const* e, int64_t c0, Vec16 (*acc_out)[kVecs], float* scratch) {
  // The accumulators in a local array, so that they stay in registers over the loop.
  Vec16 acc[NQ][kVecs];
  for (int t = 0; t < NQ; ++t)
    for (int v = 0; v < kVecs; ++v) acc[t][v] = acc_out[t][v];
  const E* pages = static_cast<const E*>(a.v_pages);
  for (int64_t j0 = j_begin; j0 < len; j0 += simd::kLanes) {
    if (const int64_t ahead = j0 + kPrefetchSlots; ahead < len) {  // as for keys; packed slots excepted
      if (ahead >= a.prefix_len) {
        prefetch_value_rows<HD, kVecs>(value_rows<HD>(pages, a, kv_head, place_of(a, ahead)), c0);
      } else if (a.packed_layout == nullptr) {
        prefetch_value_rows<HD, kVecs>(value_rows<HD>(a.prefix_v_pages, a, kv_head, place_of(a, ahead)), c0);
      }
    }
    const int64_t n = std::min<int64_t>(simd::kLanes, len - j0);
    if (j0 >= a.prefix_len) {
      accumulate_values<HD, NQ, kVecs>(value_rows<HD>(pages, a, kv_head, place_of(a, j0)), n, e, j0, c0, acc);
    } else if (a.packed_layout == nullptr) {
      accumulate_values<HD, NQ, kVecs>(value_rows<HD>(a.prefix_v_pages, a, kv_head, place_of(a, j0)), n, e, j0, c0,
                                       acc);
    } else {
      accumulate_values<HD, NQ, kVecs>(packed_value_rows<HD>(a, kv_head, j0, scratch), n, e, j0, c0, acc);
    }
  }
  for (int t = 0; t < NQ; ++t)
    for (int v = 0; v < kVecs; ++v) acc_out[t][v] = acc[t][v];
}

// out_t = acc[t] / sums[t], channels [c0, c0 + 16 * kVecs).
template <int NQ, int kVecs>
inline void store_outputs(const Vec16 (*acc)[kVecs], const float* sums, float* const* out, int64_t c0) {
  for (int t = 0; t < NQ; ++t) {
    const Vec16 s = simd::set1(sums[t]);
    for (int v = 0; v < kVecs; ++v) simd::store(out[t] + c0 + v * simd::kLanes, simd::div(acc[t][v], s));
  }
}

// out_t = (sum_j e_t[j] v_j) / sum_t for NQ query vectors of one row (same length), channels
// [c0, c0 + 16 * kVecs).
template <int HD, int NQ, int kVecs, typename E>
void attention_values_of(const PagedAttentionArgs& a, int64_t kv_head, int64_t len, const float* const* e,
                         const float* sums, float* const* out, int64_t c0) {
  Vec16 acc[NQ][kVecs];
  for (int t = 0; t < NQ; ++t)
    for (int v = 0; v < kVecs; ++v) acc[t][v] = simd::zero();
  alignas(64) float scratch[simd::kLanes * HD];
  accumulate_blocks<HD, NQ, kVecs, E>(a, kv_head, 0, len, e, c0, acc, scratch);
  store_outputs<NQ, kVecs>(acc, sums, out, c0);
}

// attention_values_of for R consecutive rows of G query vectors each (e, sums and out row-major:
// row r's vectors at r * G), the first row of length len0 and each next one slot longer: the
// blocks every row fills completely are read once for all R * G vectors, the rest row by row, so
// each vector's chain is the one attention_values_of gives it, with a verify window's rows sharing
// the reads of the values (a decode step is one row).
template <int HD, int G, int R, int kVecs, typename E>
void attention_values_rows(const PagedAttentionArgs& a, int64_t kv_head, int64_t len0, const float* const* e,
                           const float* sums, float* const* out, int64_t c0) {
  Vec16 acc[R * G][kVecs];
  for (int t = 0; t < R * G; ++t)
    for (int v = 0; v < kVecs; ++v) acc[t][v] = simd::zero();
  alignas(64) float scratch[simd::kLanes * HD];
  const int64_t shared = len0 / simd::kLanes * simd::kLanes;
  accumulate_blocks<HD, R * G, kVecs, E>(a, kv_head, 0, shared, e, c0, acc, scratch);
  for (int r = 0; r < R; ++r) {
    accumulate_blocks<HD, G, kVecs, E>(a, kv_head, shared, len0 + r, e + r * G, c0, acc + r * G, scratch);
  }
  store_outputs<R * G, kVecs>(acc, sums, out, c0);
}

template <int HD, int NQ, int kVecs = HD / simd::kLanes>
void attention_values(const PagedAttentionArgs& a, int64_t kv_head, int64_t len, const float* const* e,
                      const float* sums, float* const* out, int64_t c0 = 0) {
  if (a.kv_element == KvElement::kBFloat16) {
    attention_values_of<HD, NQ, kVecs, uint16_t>(a, kv_head, len, e, sums, out, c0);
  } else {
    attention_values_of<HD, NQ, kVecs, float>(a, kv_head, len, e, sums, out, c0);
  }
}

template <int HD>
void attention_scores_dispatch(const PagedAttentionArgs& a, int64_t kv_head, const float* const* q, int count,
                               int64_t slot0, int64_t slot1, float* const* scores) {
  switch (count) {
#define VC_CASE(T) \
  case T: attention_scores<HD, T>(a, kv_head, q, slot0, slot1, scores); break;
    VC_CASE(1) VC_CASE(2) VC_CASE(3) VC_CASE(4) VC_CASE(5) VC_CASE(6) VC_CASE(7) VC_CASE(8)
    VC_CASE(9) VC_CASE(10) VC_CASE(11) VC_CASE(12) VC_CASE(13) VC_CASE(14) VC_CASE(15) VC_CASE(16)
#undef VC_CASE
    default: break;
  }
}

template <int HD>
void attention_values_dispatch(const PagedAttentionArgs& a, int64_t kv_head, int64_t len, const float* const* e,
                               const float* sums, int count, float* const* out) {
  switch (count) {
    case 1: attention_values<HD, 1>(a, kv_head, len, e, sums, out); break;
    case 2: attention_values<HD, 2>(a, kv_head, len, e, sums, out); break;
    case 3: attention_values<HD, 3>(a, kv_head, len, e, sums, out); break;
    case 4: attention_values<HD, 4>(a, kv_head, len, e, sums, out); break;
    default: break;
  }
}

// How many rows share one pass over the values in attention_values_rows: 12 query vectors of two
// channel vectors each keep 24 accumulators in registers; 0 when a row alone has more than 4.
inline int64_t rows_sharing_values(int64_t group) { return group <= 4 ? 12 / group : 0; }

template <int HD, int G, typename E>
void attention_values_rows_of(const PagedAttentionArgs& a, int64_t kv_head, int64_t len0, const float* const* e,
                              const float* sums, float* const* out) {
  for (int64_t c0 = 0; c0 < HD; c0 += 2 * simd::kLanes) {
    attention_values_rows<HD, G, 12 / G, 2, E>(a, kv_head, len0, e, sums, out, c0);
  }
}

// rows_sharing_values(group) rows from one of length len0 (query vectors row-major).
template <int HD>
void attention_values_rows_dispatch(const PagedAttentionArgs& a, int64_t kv_head, int64_t group, int64_t len0,
                                    const float* const* e, const float* sums, float* const* out) {
  const bool bf16 = a.kv_element == KvElement::kBFloat16;
  switch (group) {
#define VC_CASE(G)                                                                     \
  case G:                                                                              \
    if (bf16) {                                                                        \
      attention_values_rows_of<HD, G, uint16_t>(a, kv_head, len0, e, sums, out);       \
    } else {                                                                           \
      attention_values_rows_of<HD, G, float>(a, kv_head, len0, e, sums, out);          \
    }                                                                                  \
    break;
    VC_CASE(1) VC_CASE(2) VC_CASE(3) VC_CASE(4)
#undef VC_CASE
    default: VC_CHECK(false, "attention_values_rows_dispatch: a group of more than 4 query heads");
  }
}

// Requires n_heads / n_kv_heads <= kMaxQueries (checked when the model loads).
template <int HD>
void attention_hd(const PagedAttentionArgs& a, int64_t kv_head, int64_t row0, int64_t row1) {
  const int64_t group = a.n_heads / a.n_kv_heads;
  const int64_t rows_per_tile = attention_rows_per_tile(a.n_heads, a.n_kv_heads);
  const int64_t stride = (a.cached_len + row1 + simd::kLanes - 1) / simd::kLanes * simd::kLanes;
  thread_local std::vector<float> scratch;
  const int64_t tile_queries = std::min<int64_t>(kMaxQueries, rows_per_tile * group);
  if (static_cast<int64_t>(scratch.size()) < tile_queries * stride) scratch.resize(tile_queries * stride);

  for (int64_t r0 = row0; r0 < row1; r0 += rows_per_tile) {
    const int64_t r1 = std::min(row1, r0 + rows_per_tile);
    // Query vectors (row-major over rows, then heads of the group) and their score rows.
    const float* q[kMaxQueries];
    float* scores[kMaxQueries];
    int count = 0;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t g = 0; g < group; ++g, ++count) {
        q[count] = a.q + r * a.q_row_stride + (kv_head * group + g) * HD;
        scores[count] = scratch.data() + count * stride;
      }
    }
    const int64_t n_slots = a.cached_len + r1;  // the longest row in the tile
    attention_scores_dispatch<HD>(a, kv_head, q, count, 0, (n_slots + simd::kLanes - 1) / simd::kLanes * simd::kLanes,
                                  scores);
    float sums[kMaxQueries];
    float* out[kMaxQueries];
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t g = 0; g < group; ++g) {
        const int64_t t = (r - r0) * group + g;
        sums[t] = softmax_numerators(scores[t], a.cached_len + r + 1);
        out[t] = a.out + r * a.out_row_stride + (kv_head * group + g) * HD;
      }
    }
    // Rows in runs that share the reads of the values where the runs' vectors fit the registers,
    // the rest one by one: the same bits either way (attention_values_rows).
    int64_t r = r0;
    if (const int64_t run = rows_sharing_values(group); run > 0) {
      for (; r + run <= r1; r += run) {
        const int64_t first = (r - r0) * group;
        attention_values_rows_dispatch<HD>(a, kv_head, group, a.cached_len + r + 1, scores + first, sums + first,
                                           out + first);
      }
    }
    for (; r < r1; ++r) {
      const int64_t len = a.cached_len + r + 1;
      const int64_t first = (r - r0) * group;
      for (int64_t g = 0; g < group; g += 4) {
        const int n = static_cast<int>(std::min<int64_t>(4, group - g));
        attention_values_dispatch<HD>(a, kv_head, len, scores + first + g, sums + first + g, n, out + first + g);
      }
    }
  }
}

inline void attention(const PagedAttentionArgs& a, int64_t kv_head, int64_t row0, int64_t row1) {
  if (a.head_dim == 64) {
    attention_hd<64>(a, kv_head, row0, row1);
  } else {
    attention_hd<128>(a, kv_head, row0, row1);
  }
}

// The phases of attention_hd for one tile of rows (KernelTable::attention_scores, ::softmax_numerators,
// ::attention_values), each over a part of the slots or channels: the same operations per score,
// per exponential and per channel as attention_hd, so the same bits.
inline int tile_query_count(const PagedAttentionArgs& a, int64_t row0, int64_t row1) {
  const int64_t count = (row1 - row0) * (a.n_heads / a.n_kv_heads);
  VC_CHECK(count <= kMaxQueries, "an attention phase tile of more query vectors than kAttentionQueryTile");
  return static_cast<int>(count);
}

template <int HD>
void attention_scores_phase_hd(const PagedAttentionArgs& a, int64_t kv_head, int64_t row0, int64_t row1,
                               int64_t slot0, int64_t slot1, float* scores, int64_t stride) {
  const int64_t group = a.n_heads / a.n_kv_heads;
  const float* q[kMaxQueries];
  float* rows[kMaxQueries];
  const int count = tile_query_count(a, row0, row1);
  for (int t = 0; t < count; ++t) {
    q[t] = a.q + (row0 + t / group) * a.q_row_stride + (kv_head * group + t % group) * HD;
    rows[t] = scores + t * stride;
  }
  attention_scores_dispatch<HD>(a, kv_head, q, count, slot0, slot1, rows);
}

template <int HD>
void attention_values_phase_hd(const PagedAttentionArgs& a, int64_t kv_head, int64_t row0, int64_t row1,
                               const float* e, int64_t stride, const float* sums, int64_t c0, int64_t c1) {
  const int64_t group = a.n_heads / a.n_kv_heads;
  tile_query_count(a, row0, row1);
  for (int64_t r = row0; r < row1; ++r) {
    const int64_t len = a.cached_len + r + 1;
    for (int64_t g0 = 0; g0 < group; g0 += 4) {
      const int n = static_cast<int>(std::min<int64_t>(4, group - g0));
      const float* rows[4];
      float* out[4];
      for (int t = 0; t < n; ++t) {
        const int64_t query = (r - row0) * group + g0 + t;
        rows[t] = e + query * stride;
        out[t] = a.out + r * a.out_row_stride + (kv_head * group + g0 + t) * HD;
      }
      const float* tile_sums = sums + (r - row0) * group + g0;
      for (int64_t c = c0; c < c1; c += simd::kLanes) {
        switch (n) {
          case 1: attention_values<HD, 1, 1>(a, kv_head, len, rows, tile_sums, out, c); break;
          case 2: attention_values<HD, 2, 1>(a, kv_head, len, rows, tile_sums, out, c); break;
          case 3: attention_values<HD, 3, 1>(a, kv_head, len, rows, tile_sums, out, c); break;
          default: attention_values<HD, 4, 1>(a, kv_head, len, rows, tile_sums, out, c); break;
        }
      }
    }
  }
}

inline void attention_scores_phase(const PagedAttentionArgs& a, int64_t kv_head, int64_t row0, int64_t row1,
                                   int64_t slot0, int64_t slot1, float* scores, int64_t stride) {
  if (a.head_dim == 64) {
    attention_scores_phase_hd<64>(a, kv_head, row0, row1, slot0, slot1, scores, stride);
  } else {
    attention_scores_phase_hd<128>(a, kv_head, row0, row1, slot0, slot1, scores, stride);
  }
}

inline void attention_values_phase(const PagedAttentionArgs& a, int64_t kv_head, int64_t row0, int64_t row1,
                                   const float* e, int64_t stride, const float* sums, int64_t c0, int64_t c1) {
  if (a.head_dim == 64) {
    attention_values_phase_hd<64>(a, kv_head, row0, row1, e, stride, sums, c0, c1);
  } else {
    attention_values_phase_hd<128>(a, kv_head, row0, row1, e, stride, sums, c0, c1);
  }
}

// One lane of simd::dot_bf16, for tests of this build's arithmetic on chosen values.
inline float dot_bf16_lane(float acc, uint32_t a, uint32_t b) {
  alignas(64) float out[simd::kLanes];
  simd::store(out, simd::dot_bf16(simd::set1(acc), simd::set1_pair(a), simd::set1_pair(b)));
  return out[0];
}

// This build's kernel table, named `isa`.
inline KernelTable kernel_table(const char* isa) {
  return KernelTable{isa,      linear,    weight_row, rms_norm, silu_mul, attention, attention_scores_phase,
                     softmax_numerators, attention_values_phase, dot_bf16_lane};
}

}  // namespace vericache::cpu::VC_KERNEL_NAMESPACE
