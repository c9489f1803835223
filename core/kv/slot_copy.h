// copy_slots: moves the K/V of listed token slots between two page pools (or within one).
//
// A slot list names one (slot, KV head) per entry: the page id, the offset in that page and the head.
// copy_slots(src, from, dst, to) copies entry i of `from` (in `src`) to entry i of `to` (in `dst`);
// the lists must have equal lengths and both pools the same n_kv_heads and head_dim (page sizes may
// differ). Everything is read before anything is written, so moving slots within one pool is safe in
// any order.
//
// Two paths with the same result: when both pools are CPU tensors of one dtype, a plain loop copies
// bytes on the calling thread (it runs on every verify step, and ATen's indexing would wake its
// OpenMP team, whose spinning steals cores from the engine's own threads); otherwise ATen indexing
// (any devices, dtype conversion). Thread-safety: none; the caller owns both pools.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vericache {

class PagePool;

struct SlotList {
  std::vector<int64_t> page, offset, head;

  void add(int64_t page_id, int64_t page_offset, int64_t kv_head) {
    page.push_back(page_id);
    offset.push_back(page_offset);
    head.push_back(kv_head);
  }
  size_t size() const { return page.size(); }
};

void copy_slots(const PagePool& src, const SlotList& from, PagePool& dst, const SlotList& to);

// Test-only: forces the ATen path even where the CPU loop applies, so tests compare the two.
void set_copy_slots_force_aten_for_testing(bool force);

}  // namespace vericache
