// Integer linear layers on the CPU: 8-bit activations against the weights' own integer codes.
//
// The integer compute mode (DESIGN.md, "Arithmetic modes"). A linear y[m, n] = sum_k x[m, k] w[n, k]
// is computed as llama.cpp does, with one fixed float order:
//   - each activation row is quantized in blocks of 32 values: scale a_d = amax / 127 and codes
//     a_q = round-to-nearest-even(x * (1 / a_d)) in [-127, 127] (quantize_rows);
//   - each weight block of 32 values is w = s * (q - z) + mn: unsigned codes q (4 to 8 bits), a
//     per-format integer zero point z, float scale s (two, one per 16-value half, for Q6_K) and
//     float minimum mn (Q4_1, Q4_K);
//   - per block, the integer sums  I_h = sum_{i in half h} q_i a_q,i - z * sum_{i in half h} a_q,i
//     are exact in int32 whatever the order or instruction set;
//   - per output, over blocks b in order:  acc = fma(s_b * a_d,b, float(I_0 + I_1), acc)
//     (with two scales: one fma per half, half 0 first), then, with a minimum,
//     acc = fma(mn_b * a_d,b, float(A_b), acc), A_b the block's code sum; acc starts at 0.
// Every output therefore depends only on its own row's values and its column's weights, in an
// order fixed by k: the results are row-count and batch invariant, equal across thread counts and
// column ranges, and bitwise equal between the AVX-512 VNNI build and the portable build.
//
// Weights are repacked once (model/int8_repack.h) into panels of 16 columns (kPanelColumns), block
// after block; within a block: the scales (16 per scale), the minimums (16, if any), as float32, as
// the file's own halves, or as int8 codes (IntWeightFormat::float_bytes), then the codes, four bytes
// of a column side by side for each group of 4 values:
//   8-bit codes: 8 groups of 64 bytes; group g holds values 4g..4g+3 of columns 0..15;
//   4-bit codes: 4 vectors of 64 bytes; the low nibbles of vector v hold group v (values 4v..4v+3),
//                the high nibbles group v + 4 (values 16 + 4v ..);
//   5- and 6-bit codes: their low 4 bits as 4-bit codes, then a plane of the H = 1 or 2 high bits:
//                H vectors of 64 bytes, group g's high bits in vector g % H at bit H * (g / H)
//                of the same byte position (Q5_0's 5-bit and Q6_K's 6-bit codes at the file's size).
// With int8-coded scales (K-quants: a 256-value super-block's scales are one float times small
// integers), each run of kScaleGroupBlocks blocks starts with a header of 16 float32 scale factors
// F (and 16 minimum factors G, if any), and a block's scale is F * code, its minimum G * code; both
// products are exact in float32 (the repack checks it), so the arithmetic below is unchanged.
// Columns past n in the last panel are zero (scale 0) and never stored.
// Thread-safety: every function may be called concurrently on disjoint outputs.
#pragma once

#include <cstdint>

namespace vericache::cpu {

constexpr int64_t kPanelColumns = 16;
constexpr int64_t kQuantBlock = 32;
constexpr int64_t kScaleGroupBlocks = 8;  // blocks sharing one header of factors (int8-coded scales)

// How a panel's blocks are coded (see the layout above).
struct IntWeightFormat {
  int code_bits = 8;      // 4, 5, 6 or 8
  int scales = 1;         // scales per block: 1, or 2 (one per 16-value half)
  bool has_min = false;   // a float minimum per block
  int32_t zero = 0;       // integer zero point z
  int float_bytes = 4;    // scales and minimums stored as 4: float32, 2: IEEE half (a file's own
                          // f16 values, converted exactly), or 1: int8 codes times the group
                          // header's float32 factors (k a multiple of 256)
};

// Bytes of one block of one panel (without the group header of int8-coded scales).
inline int64_t int_block_bytes(const IntWeightFormat& f) {
  return f.float_bytes * kPanelColumns * (f.scales + (f.has_min ? 1 : 0)) + kPanelColumns * kQuantBlock * f.code_bits / 8;
}

// Bytes of a group header: 16 float32 factors for the scales and 16 for the minimums; 0 unless
// the scales are int8-coded.
inline int64_t int_group_header_bytes(const IntWeightFormat& f) {
  return f.float_bytes == 1 ? 4 * kPanelColumns * (1 + (f.has_min ? 1 : 0)) : 0;
}

// Offset of block b within its panel.
inline int64_t int_block_offset(const IntWeightFormat& f, int64_t b) {
  if (f.float_bytes != 1) return b * int_block_bytes(f);
  const int64_t group_bytes = int_group_header_bytes(f) + kScaleGroupBlocks * int_block_bytes(f);
  return (b / kScaleGroupBlocks) * group_bytes + int_group_header_bytes(f) + (b % kScaleGroupBlocks) * int_block_bytes(f);
}

// Bytes of one panel of k values per column.
inline int64_t int_panel_bytes(const IntWeightFormat& f, int64_t k) {
  const int64_t blocks = k / kQuantBlock;
  return blocks * int_block_bytes(f) + blocks / kScaleGroupBlocks * int_group_header_bytes(f);
}

// A weight matrix [n][k] in panels; panel p at data + p * panel_bytes (k / 32 blocks).
struct IntWeightView {
  IntWeightFormat format;
  const uint8_t* data = nullptr;
  int64_t n = 0;
  int64_t k = 0;  // a multiple of 32 (of 256 with int8-coded scales)
  int64_t panel_bytes = 0;  // int_panel_bytes(format, k)
  int64_t panels() const { return (n + kPanelColumns - 1) / kPanelColumns; }
};

// Activation rows quantized by quantize_rows: row r's codes at codes + r * k, its block scales at
// scales + r * (k / 32), its half sums (two per block, sum of the codes of each 16-value half) at
// half_sums + r * (k / 16).
struct QuantizedRows {
  const int8_t* codes = nullptr;
  const float* scales = nullptr;
  const int32_t* half_sums = nullptr;
  int64_t m = 0;
  int64_t k = 0;
};

struct IntKernelTable {
  const char* isa;  // "avx512-vnni" or "portable"
  // Quantizes rows [0, m) of x (row stride ldx, k a multiple of 32) into codes [m][k],
  // scales [m][k / 32] and half_sums [m][k / 16].
  void (*quantize_rows)(const float* x, int64_t ldx, int64_t m, int64_t k, int8_t* codes, float* scales,
                        int32_t* half_sums);
  // y[r, n] for every row r < x.m and every column n of panels [panel0, panel1) below w.n.
  void (*linear)(const QuantizedRows& x, const IntWeightView& w, int64_t panel0, int64_t panel1, float* y,
                 int64_t ldy);
};

// The AVX-512 VNNI table when the CPU has AVX512F, AVX512BW and AVX512-VNNI, else the portable one.
const IntKernelTable& best_int_kernels();
const IntKernelTable& portable_int_kernels();
// nullptr when the CPU lacks one of those extensions.
const IntKernelTable* vnni_int_kernels();

}  // namespace vericache::cpu
