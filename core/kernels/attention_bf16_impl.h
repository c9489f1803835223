// Attention's two products over bfloat16 pages, in bfloat16 pairs (kernels/simd_bf16.h): part of
// cpu_kernels_impl.h, included once per kernel build.
//
// Over bfloat16 pages a score is q . k with q rounded to bfloat16 and the channels taken in pairs
// (0,1), (2,3), ... in order, each pair one dot_bf16 step; an output channel is sum_j e_j v_j with
// the numerators e_j rounded to bfloat16 and the slots taken in pairs (j0, j0+1), (j0+2, j0+3), ...
// in order from each block's first slot (a multiple of 16), a row's last odd slot paired with a
// zero. Only the row's own inputs and length enter, so one row gives the same bits whatever rows
// share its call, as with float pages. Float prefix pages and packed slots keep float32 products.
#pragma once

#ifndef VC_KERNEL_NAMESPACE
#error "include attention_bf16_impl.h through cpu_kernels_impl.h"
#endif

#include <cstdint>
#include <cstring>

#include "kernels/simd.h"
#include "kernels/simd_bf16.h"

namespace vericache::cpu::VC_KERNEL_NAMESPACE {

// T query vectors of HD channels rounded to bfloat16: pair[t][i] holds channels 2i (low half) and
// 2i + 1 (high half).
template <int HD, int T>
struct QueryPairs {
  alignas(64) uint32_t pair[T][HD / 2];

  explicit QueryPairs(const float* const* q) {
    for (int t = 0; t < T; ++t) {
      uint16_t* halves = reinterpret_cast<uint16_t*>(pair[t]);
      for (int c = 0; c < HD; c += simd::kLanes) simd::store_bf16(halves + c, simd::load(q[t] + c));
    }
  }
};

// Scores of T query vectors for the 16 slots from s0 whose bfloat16 keys are channel-major at
// keys + c * stride: one chain of dot_bf16 steps over the channel pairs in order per slot.
template <int HD, int T>
inline void block_scores(const uint16_t* keys, int64_t stride, const QueryPairs<HD, T>& q, simd::Vec16 vscale,
                         int64_t s0, float* const* scores) {
  simd::Vec16 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = simd::zero();
  for (int d = 0; d < HD; d += 2) {
    const simd::Pairs16 kv = simd::interleave_bf16(keys + d * stride, keys + (d + 1) * stride);
    for (int t = 0; t < T; ++t) acc[t] = simd::dot_bf16(acc[t], simd::set1_pair(q.pair[t][d / 2]), kv);
  }
  for (int t = 0; t < T; ++t) simd::store(scores[t] + s0, simd::mul(acc[t], vscale));
}

// acc[t] += e_t[j0 + j] * v_j for the n slots (n <= 16) whose bfloat16 value rows are at
// rows + j * HD, channels [c0, c0 + 16 * kVecs): slot pairs in order, one dot_bf16 per channel
// vector; an odd n pairs the last slot with zeros (its neighbour's row is never read).
template <int HD, int NQ, int kVecs>
inline void accumulate_values(const uint16_t* rows, int64_t n, const float* const* e, int64_t j0, int64_t c0,
                              simd::Vec16 (&acc)[NQ][kVecs]) {
  alignas(64) uint16_t weights[NQ][simd::kLanes];
  for (int t = 0; t < NQ; ++t) simd::store_bf16(weights[t], simd::load_partial(e[t] + j0, static_cast<int>(n)));
  for (int64_t j = 0; j < n; j += 2) {
    simd::Pairs16 vv[kVecs];
    const uint16_t* row = rows + j * HD + c0;
    if (j + 1 < n) {
      int v = 0;
      for (; v + 2 <= kVecs; v += 2) {
        simd::interleave_bf16_32(row + v * simd::kLanes, row + HD + v * simd::kLanes, &vv[v], &vv[v + 1]);
      }
      if (v < kVecs) vv[v] = simd::interleave_bf16(row + v * simd::kLanes, row + HD + v * simd::kLanes);
    } else {
      for (int v = 0; v < kVecs; ++v) vv[v] = simd::widen_bf16(row + v * simd::kLanes);
    }
    for (int t = 0; t < NQ; ++t) {
      uint32_t pair;
      std::memcpy(&pair, &weights[t][j], sizeof pair);
      const simd::Pairs16 w = simd::set1_pair(pair);
      for (int v = 0; v < kVecs; ++v) acc[t][v] = simd::dot_bf16(acc[t][v], w, vv[v]);
    }
  }
}

}  // namespace vericache::cpu::VC_KERNEL_NAMESPACE
