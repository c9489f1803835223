#include "engine/compressed_kv_check.h"

#include <ATen/ATen.h>

namespace vericache {

Status check_compressed_kv(const std::string& compressor, const CompressedKV& compressed, const KvLayout& layout,
                           const std::vector<int64_t>& lengths) {
  auto fail = [&](int64_t layer, const std::string& what) {
    return Status::invalid_argument(compressor + ": layer " + std::to_string(layer) + ": " + what);
  };
  if (static_cast<int64_t>(compressed.kept.size()) != layout.n_layers) {
    return Status::invalid_argument(compressor + ": kept positions for " + std::to_string(compressed.kept.size()) +
                                    " layers, the model has " + std::to_string(layout.n_layers));
  }
  for (int64_t l = 0; l < layout.n_layers; ++l) {
    const at::Tensor& kept = compressed.kept[l];
    if (!kept.defined() || kept.dim() != 2 || kept.scalar_type() != at::kLong || kept.size(0) != layout.n_kv_heads) {
      return fail(l, "kept positions must be an int64 tensor [" + std::to_string(layout.n_kv_heads) + ", n_kept]");
    }
    const int64_t n = kept.size(1);
    if (n < 1 || n > lengths[l]) {
      return fail(l, "keeps " + std::to_string(n) + " of " + std::to_string(lengths[l]) + " tokens per head");
    }
    const at::Tensor k = kept.cpu().contiguous();
    const int64_t* p = k.data_ptr<int64_t>();
    for (int64_t h = 0; h < layout.n_kv_heads; ++h) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t v = p[h * n + j];
        if (v < 0 || v >= lengths[l]) return fail(l, "head " + std::to_string(h) + " keeps position " + std::to_string(v) + ", outside [0, " + std::to_string(lengths[l]) + ")");
        if (j > 0 && v <= p[h * n + j - 1]) return fail(l, "head " + std::to_string(h) + ": kept positions are not strictly increasing");
      }
    }
  }
  return Status();
}

}  // namespace vericache
