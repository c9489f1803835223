// Checks a compressor's output against the contract (vericache/compressor.h) before the runtime
// uses it: a plugin's mistake becomes an error naming the compressor, never a crash later.
#pragma once

#include <vector>

#include <vericache/compressor.h>
#include <vericache/kv_view.h>

namespace vericache {

// Token dropping: one int64 [n_kv_heads, n_kept] tensor per layer, 1 <= n_kept <= length, every row
// strictly increasing within [0, length). InvalidArgument (prefixed with `compressor`) otherwise.
Status check_compressed_kv(const std::string& compressor, const CompressedKV& compressed, const KvLayout& layout,
                           const std::vector<int64_t>& lengths);

}  // namespace vericache
