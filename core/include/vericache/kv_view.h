// KvCacheView: pass-through access to one request's paged KV cache, as the runtime lays it out.
//
// There is no virtualization layer: a plugin receives the physical pages and the block tables and
// reads (or, for its own compressed cache, writes) pages itself.
//   k_pages [num_pages, n_kv_heads, head_dim, page_size]   keys after RoPE, transposed within a page
//   v_pages [num_pages, n_kv_heads, page_size, head_dim]
// The pages' element type is the runtime's KV cache type: float32 or bfloat16 on the CPU (the
// `--kv-cache` choice), the model dtype on a GPU; token_scorer.h's layer_keys()/layer_values() read
// them as float32 whatever it is.
// Slot s of layer l lives in page block_tables[l][s / page_size] at offset s % page_size. In a
// full cache slot s holds the token at position s. In a compressed cache slot s of KV head h holds
// the token at positions[l][h][s] (its original RoPE position).
//
// Ownership: a view borrows the page tensors (and copies the small tables); it is valid only
// during the call it is passed to.
// Thread-safety: the runtime does not change viewed slots during that call (forwards a plugin runs
// through ModelAccess write only past each layer's length).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace vericache {

struct KvLayout {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t page_size = 0;
};

struct KvCacheView {
  KvLayout layout;
  at::Tensor k_pages;  // [num_pages, n_kv_heads, head_dim, page_size]
  at::Tensor v_pages;  // [num_pages, n_kv_heads, page_size, head_dim]
  // [n_layers] logical page -> physical page; a copy, so it stays valid while the plugin runs
  // forwards through ModelAccess (those append pages to the live tables).
  std::vector<std::vector<int32_t>> block_tables;
  std::vector<int64_t> lengths;                        // [n_layers] slots in use
  // Compressed caches only: [n_layers] int64 [n_kv_heads, lengths[l]], the original position of
  // each slot; empty for a full cache (slot == position).
  std::vector<at::Tensor> positions;
};

}  // namespace vericache
