// Full-precision copies of chosen slots (a quantizer's sink tokens), per request and layer, kept by
// the plugin beside the packed pages and written over the dequantized slots at read.
// Slots are addressed in the contract's float page layout: k [pages][H][d][P], v [pages][H][P][d].
// Header-only (compiled into each plugin). Not part of the installed contract. Not thread-safe
// (a compressor is used by one thread at a time).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

namespace vericache::plugin {

class ExactSlots {
 public:
  ExactSlots(int64_t heads, int64_t dim, int64_t page_slots) : heads_(heads), dim_(dim), slots_(page_slots) {}

  // Keeps slot `slot` of `k`, `v` (every head) as `position` of the request's layer.
  void keep(int64_t request, int64_t layer, int64_t position, const float* k, const float* v, int64_t slot) {
    std::vector<float>& exact = exact_[request][layer][position];
    exact.resize(2 * heads_ * dim_);
    const int64_t j = slot / slots_, t = slot % slots_;
    for (int64_t h = 0; h < heads_; ++h) {
      for (int64_t c = 0; c < dim_; ++c) {
        exact[h * dim_ + c] = k[((j * heads_ + h) * dim_ + c) * slots_ + t];
        exact[(heads_ + h) * dim_ + c] = v[((j * heads_ + h) * slots_ + t) * dim_ + c];
      }
    }
  }

  // Writes the kept copy over every one of `n_slots` slots whose position (`positions[slot]`, the
  // slot's first head; strictly increasing, as packed slots are) has one. Looks up the few kept
  // positions, not every slot: this runs on every read of the packed pages.
  void restore(int64_t request, int64_t layer, const int64_t* positions, int64_t n_slots, float* k, float* v) const {
    const auto r = exact_.find(request);
    if (r == exact_.end()) return;
    const auto l = r->second.find(layer);
    if (l == r->second.end()) return;
    for (const auto& e : l->second) {
      const int64_t* at = std::lower_bound(positions, positions + n_slots, e.first);
      if (at == positions + n_slots || *at != e.first) continue;
      const int64_t slot = at - positions;
      const int64_t j = slot / slots_, t = slot % slots_;
      for (int64_t h = 0; h < heads_; ++h) {
        for (int64_t c = 0; c < dim_; ++c) {
          k[((j * heads_ + h) * dim_ + c) * slots_ + t] = e.second[h * dim_ + c];
          v[((j * heads_ + h) * slots_ + t) * dim_ + c] = e.second[(heads_ + h) * dim_ + c];
        }
      }
    }
  }

  void forget(int64_t request) { exact_.erase(request); }

 private:
  int64_t heads_, dim_, slots_;
  // request -> layer -> position -> [H * d] keys (after RoPE), then [H * d] values.
  std::map<int64_t, std::map<int64_t, std::map<int64_t, std::vector<float>>>> exact_;
};

}  // namespace vericache::plugin
