// Float32 CPU kernels whose results do not depend on how many rows a call computes.
//
// Row-count invariance is what makes VeriCache's verify forward (x+1 rows per request) agree
// bitwise with one-token decoding: every output value here is a function of its own row's inputs
// only, computed with a reduction order that depends on the reduced length alone — never on the
// number of rows, the batch composition, the tile a value falls in, or the thread count. Kernels
// split work across threads by output column or by (request, KV head, row tile) only, never
// along a reduction.
//
// Each kernel exists in three builds that perform the same IEEE-754 operations lane by lane
// (kernels/simd.h, kernels/simd_bf16.h), so all give identical bits: AVX-512 with AVX512_BF16,
// AVX-512, and portable; the fastest the CPU runs is used. Pointers are raw float32 arrays owned
// by the caller (bfloat16 pages excepted).
// Thread-safety: every function may be called concurrently on disjoint outputs.
#pragma once

#include <cstdint>
#include <vector>

#include <vericache/packed_layout.h>

namespace vericache::cpu {

// How a weight matrix [n][k] is stored. Quantized rows are blocks of 32 values: ggml's own
// (Q8_0, Q4_0, Q4_1, Q5_0; model/ggml_dequant.h), or K-quants repacked at load with float32
// scales (model/weight_repack.h):
//   kNibbleF32  24 B: f32 d | f32 m | u8 qs[16]       value i = d*nib(i) + m (nibbles as Q4_1)
//   kInt8F32    40 B: f32 s0 | f32 s1 | int8 q[32]     value i = s_{i/16} * q[i]
// The kernels dequantize them on the fly into exactly the floats ggml_dequant produces, so a
// linear over quantized weights gives the same bits as over their float32 dequantization.
enum class WeightFormat { kF32, kQ8_0, kQ4_0, kQ4_1, kQ5_0, kNibbleF32, kInt8F32 };

struct WeightView {
  WeightFormat format = WeightFormat::kF32;
  const void* data = nullptr;  // row r at data + r * row_bytes
  int64_t n = 0;               // rows (output features)
  int64_t k = 0;               // columns (input features); a multiple of 32 for quantized formats
  int64_t row_bytes = 0;
};

// How a cache's K/V pages hold their values: float32, or bfloat16 (uint16_t bit patterns, half the
// bytes). Attention over bfloat16 pages computes in bfloat16 products accumulated in float32 (the
// arithmetic of vdpbf16ps, kernels/simd_bf16.h): the query and the softmax numerators are rounded
// to bfloat16 too, and the sums run over pairs (cpu_kernels_impl.h, attention_bf16_impl.h). Its
// results differ from float32 pages' by that rounding; the invariance above holds for each.
enum class KvElement { kFloat32, kBFloat16 };

// Paged attention over one request's cache for one layer (see kv/page_pool.h for the layout; page
// elements are kv_element, prefix pages float32):
//   K pages: [num_pages][n_kv_heads][head_dim][page_size]  (keys transposed within a page)
//   V pages: [num_pages][n_kv_heads][page_size][head_dim]
// The request's new rows are already written at slots cached_len, cached_len + 1, ...;
// row i attends to slots [0, cached_len + i] (causal within the new rows).
// A quantized cache's packed slots come first: slots [0, prefix_len) are the packed ones, slot
// prefix_len + s is in the paged cache at block_table[s / page_size]; prefix_len is a multiple of
// page_size and counts in cached_len. The packed slots are read either from float prefix pages
// (unpack()ed: slot s in prefix page s / page_size, pages in order, no table), or in place from
// packed pages in the min-max-groups layout (vericache/packed_layout.h), dequantized in registers
// into exactly the floats unpack() gives, so both give the same bits.
struct PagedAttentionArgs {
  const float* q = nullptr;      // [rows][n_heads][head_dim], row stride q_row_stride
  int64_t q_row_stride = 0;
  float* out = nullptr;          // [rows][n_heads][head_dim], row stride out_row_stride
  int64_t out_row_stride = 0;
  const void* k_pages = nullptr;  // elements of kv_element
  const void* v_pages = nullptr;
  KvElement kv_element = KvElement::kFloat32;
  const int32_t* block_table = nullptr;  // logical page -> physical page
  int64_t page_size = 0;                 // a multiple of 16
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;                  // 64 or 128
  int64_t cached_len = 0;
  float scale = 0;
  int64_t prefix_len = 0;
  const float* prefix_k_pages = nullptr;  // [prefix_len / page_size][n_kv_heads][head_dim][page_size]
  const float* prefix_v_pages = nullptr;  // [prefix_len / page_size][n_kv_heads][page_size][head_dim]
  // Or, when packed_layout is set: the layer's packed pages in slot order, in `packed_storage`
  // (page p at packed_storage + p * packed_layout->bytes()).
  const MinMaxGroupsLayout* packed_layout = nullptr;
  const uint8_t* packed_storage = nullptr;
  const int32_t* packed_pages = nullptr;
};

// Query vectors (rows x the query heads of one KV head) that share one pass over the keys in
// KernelTable::attention: a call of more rows runs them in tiles of attention_rows_per_tile.
constexpr int64_t kAttentionQueryTile = 16;
inline int64_t attention_rows_per_tile(int64_t n_heads, int64_t n_kv_heads) {
  const int64_t group = n_heads / n_kv_heads;
  return group >= kAttentionQueryTile ? 1 : kAttentionQueryTile / group;
}

struct KernelTable {
  const char* isa;  // "avx512" or "portable"
  // y[m, n] = sum_k x[m, k] * w[n, k] for m < M and n in [n0, n1); k is w.k.
  void (*linear)(const float* x, int64_t ldx, int64_t m, const WeightView& w, int64_t n0, int64_t n1, float* y,
                 int64_t ldy);
  // out[0, k) = row r of w, dequantized (an embedding lookup).
  void (*weight_row)(const WeightView& w, int64_t r, float* out);
  // y = x / sqrt(mean(x^2) + eps) * weight, one row of length d.
  void (*rms_norm)(const float* x, int64_t d, const float* weight, float eps, float* y);
  // out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g).
  void (*silu_mul)(const float* gate, const float* up, int64_t n, float* out);
  // Rows [row0, row1) of one request for the query heads that share KV head `kv_head`.
  void (*attention)(const PagedAttentionArgs& args, int64_t kv_head, int64_t row0, int64_t row1);

  // `attention` in three phases, so that one (request, KV head) can spread over threads with the
  // same bits (the forward uses them when there are fewer (request, KV head) jobs than threads
  // could share). A tile is rows [row0, row1), at most attention_rows_per_tile of them; its query
  // vector t is row row0 + t / group, query head kv_head * group + t % group (group = n_heads /
  // n_kv_heads), and its scores row t is at scores + t * stride.
  // 1. Scores of the tile's query vectors for slots [slot0, slot1) (multiples of 16, within the
  //    longest row's slots rounded up to 16).
  void (*attention_scores)(const PagedAttentionArgs& args, int64_t kv_head, int64_t row0, int64_t row1,
                           int64_t slot0, int64_t slot1, float* scores, int64_t stride);
  // 2. One query vector's scores [0, len) in place -> exp(s - max); returns their ordered sum.
  //    len is its row's own length, cached_len + row + 1.
  float (*softmax_numerators)(float* scores, int64_t len);
  // 3. The output channels [c0, c1) (multiples of 16) of the tile's query vectors, from step 2's
  //    numerators (`e`, the scores rows) and sums (sums[t]).
  void (*attention_values)(const PagedAttentionArgs& args, int64_t kv_head, int64_t row0, int64_t row1,
                           const float* e, int64_t stride, const float* sums, int64_t c0, int64_t c1);

  // One lane of the bfloat16 pair product attention uses over bfloat16 pages (kernels/simd_bf16.h):
  // acc + a_odd * b_odd, then + a_even * b_even, where a and b hold two bfloat16 values each
  // (element 0 in the low half). For tests of each build's arithmetic on chosen values.
  float (*dot_bf16)(float acc, uint32_t a, uint32_t b);
};

// The fastest table this CPU runs: AVX-512 with AVX512_BF16, else AVX-512, else portable. All
// give identical bits.
const KernelTable& best_kernels();
const KernelTable& portable_kernels();
// nullptr when the CPU lacks AVX-512F.
const KernelTable* avx512_kernels();
// nullptr when the CPU lacks AVX-512F, AVX-512BW or AVX512_BF16.
const KernelTable* avx512_bf16_kernels();
// Every table this CPU runs, portable first and best last (what tests compare).
std::vector<const KernelTable*> supported_kernels();

}  // namespace vericache::cpu
