#include "kv/slot_copy.h"

#include <atomic>
#include <cstring>

#include <ATen/ATen.h>
#include <ATen/TensorIndexing.h>

#include "kv/page_pool.h"
#include "util/check.h"

namespace vericache {
namespace {

std::atomic<bool> force_aten{false};

void copy_with_aten(const PagePool& src, const SlotList& from, PagePool& dst, const SlotList& to) {
  namespace idx = at::indexing;
  auto t = [](const std::vector<int64_t>& v, at::Device device) { return at::tensor(v, at::kLong).to(device); };
  const at::Device sd = src.k_pages().device(), dd = dst.k_pages().device();
  const at::Tensor sp = t(from.page, sd), so = t(from.offset, sd), sh = t(from.head, sd);
  const at::Tensor dp = t(to.page, dd), dof = t(to.offset, dd), dh = t(to.head, dd);
  const at::Tensor k = src.k_pages().index({sp, sh, idx::Slice(), so}).to(dd, dst.k_pages().scalar_type());
  const at::Tensor v = src.v_pages().index({sp, sh, so, idx::Slice()}).to(dd, dst.v_pages().scalar_type());
  dst.k_pages().index_put_({dp, dh, idx::Slice(), dof}, k);
  dst.v_pages().index_put_({dp, dh, dof, idx::Slice()}, v);
}

bool cpu_loop_applies(const PagePool& src, const PagePool& dst) {
  const at::Tensor* all[] = {&src.k_pages(), &src.v_pages(), &dst.k_pages(), &dst.v_pages()};
  for (const at::Tensor* t : all) {
    if (!t->device().is_cpu() || !t->is_contiguous() || t->scalar_type() != src.k_pages().scalar_type()) return false;
  }
  return true;
}

// Byte offsets of one slot's key channel 0 (channels `page_size` elements apart) and of its value
// row (head_dim contiguous elements), in a pool laid out as page_pool.h describes.
struct SlotAddress {
  int64_t key, value;
};

SlotAddress address(const KvPageSpec& spec, int64_t elem, int64_t page, int64_t offset, int64_t head) {
  const int64_t head_block = (page * spec.n_kv_heads + head) * spec.head_dim * spec.page_size;
  return {(head_block + offset) * elem, (head_block + offset * spec.head_dim) * elem};
}

void copy_with_cpu_loop(const PagePool& src, const SlotList& from, PagePool& dst, const SlotList& to) {
  const KvPageSpec &ss = src.spec(), &ds = dst.spec();
  const int64_t hd = ss.head_dim, elem = static_cast<int64_t>(src.k_pages().element_size());
  const int64_t n = static_cast<int64_t>(from.size());
  const auto* sk = static_cast<const char*>(src.k_pages().data_ptr());
  const auto* sv = static_cast<const char*>(src.v_pages().data_ptr());
  auto* dk = static_cast<char*>(dst.k_pages().data_ptr());
  auto* dv = static_cast<char*>(dst.v_pages().data_ptr());
  auto read = [&](int64_t i, char* k, int64_t k_stride, char* v) {
    const SlotAddress a = address(ss, elem, from.page[i], from.offset[i], from.head[i]);
    for (int64_t d = 0; d < hd; ++d) std::memcpy(k + d * k_stride, sk + a.key + d * ss.page_size * elem, elem);
    std::memcpy(v, sv + a.value, hd * elem);
  };
  if (&src != &dst) {  // separate pools: straight from source slot to target slot
    for (int64_t i = 0; i < n; ++i) {
      const SlotAddress a = address(ds, elem, to.page[i], to.offset[i], to.head[i]);
      read(i, dk + a.key, ds.page_size * elem, dv + a.value);
    }
    return;
  }
  // One pool: gather first, since a target may be another entry's source.
  std::vector<char> staged(static_cast<size_t>(n * 2 * hd * elem));
  for (int64_t i = 0; i < n; ++i) {
    char* k = staged.data() + i * 2 * hd * elem;
    read(i, k, elem, k + hd * elem);
  }
  for (int64_t i = 0; i < n; ++i) {
    const SlotAddress a = address(ds, elem, to.page[i], to.offset[i], to.head[i]);
    const char* k = staged.data() + i * 2 * hd * elem;
    for (int64_t d = 0; d < hd; ++d) std::memcpy(dk + a.key + d * ds.page_size * elem, k + d * elem, elem);
    std::memcpy(dv + a.value, k + hd * elem, hd * elem);
  }
}

}  // namespace

void copy_slots(const PagePool& src, const SlotList& from, PagePool& dst, const SlotList& to) {
  VC_CHECK(from.size() == to.size(), "copy_slots: slot lists differ in length");
  VC_CHECK(src.spec().n_kv_heads == dst.spec().n_kv_heads && src.spec().head_dim == dst.spec().head_dim,
           "copy_slots: pools differ in KV heads or head size");
  if (from.size() == 0) return;
  if (!force_aten.load(std::memory_order_relaxed) && cpu_loop_applies(src, dst)) {
    copy_with_cpu_loop(src, from, dst, to);
  } else {
    copy_with_aten(src, from, dst, to);
  }
}

void set_copy_slots_force_aten_for_testing(bool force) { force_aten.store(force, std::memory_order_relaxed); }

}  // namespace vericache
