// PagePool and SequenceKv: allocation, all-or-nothing reservation, rollback, compaction and drops.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "kv/packed_page_pool.h"
#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "kv/slot_copy.h"

namespace vericache {
namespace {

KvPageSpec spec() { return KvPageSpec{3, 2, 64, 16}; }

TEST(PagePool, RejectsBadGeometry) {
  KvPageSpec bad = spec();
  bad.page_size = 24;
  EXPECT_EQ(PagePool::create(bad, 4, at::kFloat, at::kCPU).status().message(),
            "KV page size must be a positive multiple of 16, got 24");
  EXPECT_EQ(PagePool::create(spec(), 0, at::kFloat, at::kCPU).status().message(),
            "KV page count must be between 1 and 2^31-1, got 0");
}

TEST(PagePool, AllocatesAllOrNothing) {
  auto pool = PagePool::create(spec(), 5, at::kFloat, at::kCPU);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->page_bytes(), 2 * 2 * 64 * 16 * 4);
  EXPECT_EQ(pool->k_pages().sizes(), (at::IntArrayRef{5, 2, 64, 16}));
  EXPECT_EQ(pool->v_pages().sizes(), (at::IntArrayRef{5, 2, 16, 64}));
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool->allocate(3, &pages).ok());
  Status s = pool->allocate(3, &pages);
  EXPECT_EQ(s.code(), StatusCode::kOutOfPages);
  EXPECT_EQ(s.message(), "KV page pool exhausted: 3 pages needed, 2 of 5 free");
  EXPECT_EQ(pages.size(), 3u);
  pool->release(pages);
  EXPECT_EQ(pool->num_free(), 5);
}

TEST(SequenceKv, ReserveAdvanceTruncate) {
  auto pool = PagePool::create(spec(), 20, at::kFloat, at::kCPU);
  ASSERT_TRUE(pool.ok());
  SequenceKv kv(3);
  ASSERT_TRUE(kv.reserve(*pool, 20).ok());  // 2 pages per layer
  EXPECT_EQ(kv.pages_held(), 6);
  EXPECT_EQ(kv.length(0), 0);
  kv.advance(20);
  EXPECT_EQ(kv.length(2), 20);
  ASSERT_TRUE(kv.reserve(*pool, 12).ok());  // 32 slots: still 2 pages
  EXPECT_EQ(kv.pages_held(), 6);
  kv.advance(12);
  // 50 more slots would need 82 slots = 6 pages per layer: 12 more pages, 14 free: fits.
  EXPECT_EQ(kv.pages_needed(pool->spec(), 50), 12);
  // 100 more need 21 more pages: refused, nothing changes.
  Status s = kv.reserve(*pool, 100);
  EXPECT_EQ(s.message(), "KV page pool exhausted: 21 pages needed, 14 of 20 free");
  EXPECT_EQ(kv.pages_held(), 6);
  kv.truncate(*pool, 17);  // rollback to 17 slots: 2 pages per layer stay
  EXPECT_EQ(kv.length(1), 17);
  EXPECT_EQ(kv.pages_held(), 6);
  kv.truncate(*pool, 16);
  EXPECT_EQ(kv.pages_held(), 3);
  EXPECT_EQ(pool->num_free(), 17);
  kv.release(*pool);
  EXPECT_EQ(pool->num_free(), 20);
  EXPECT_EQ(kv.length(0), 0);
}


// Writes a recognisable value into every slot of every layer: K[e] = 1000 * layer + slot + e / 100,
// V[e] = -(1000 * layer + slot) - e / 100, the same for both KV heads except a +0.5 on head 1.
void fill_slots(PagePool& pool, const SequenceKv& kv) {
  const int64_t ps = pool.spec().page_size, hd = pool.spec().head_dim;
  auto k = pool.k_pages().accessor<float, 4>();
  auto v = pool.v_pages().accessor<float, 4>();
  for (int64_t l = 0; l < kv.n_layers(); ++l) {
    for (int64_t s = 0; s < kv.length(l); ++s) {
      const int64_t page = kv.block_table(l)[s / ps], off = s % ps;
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t e = 0; e < hd; ++e) {
          k[page][h][e][off] = 1000.0f * l + s + e / 100.0f + 0.5f * h;
          v[page][h][off][e] = -(1000.0f * l + s) - e / 100.0f - 0.5f * h;
        }
      }
    }
  }
}

float key_at(PagePool& pool, const SequenceKv& kv, int64_t layer, int64_t head, int64_t slot, int64_t e) {
  const int64_t ps = pool.spec().page_size;
  return pool.k_pages()[kv.block_table(layer)[slot / ps]][head][e][slot % ps].item<float>();
}
float value_at(PagePool& pool, const SequenceKv& kv, int64_t layer, int64_t head, int64_t slot, int64_t e) {
  const int64_t ps = pool.spec().page_size;
  return pool.v_pages()[kv.block_table(layer)[slot / ps]][head][slot % ps][e].item<float>();
}

TEST(SequenceKv, CompactMovesKeptSlotsAndFreesPages) {
  auto pool = PagePool::create(spec(), 40, at::kFloat, at::kCPU);
  ASSERT_TRUE(pool.ok());
  SequenceKv kv(3);
  ASSERT_TRUE(kv.reserve(*pool, 50).ok());  // 4 pages per layer
  kv.advance(50);
  fill_slots(*pool, kv);
  // Layer 0 keeps 3 per head, layer 1 keeps 20 (crossing a page), layer 2 keeps all 50.
  std::vector<at::Tensor> kept{at::tensor({0, 17, 49, 1, 2, 33}, at::kLong).view({2, 3}),
                               at::cat({at::arange(0, 40, 2, at::kLong), at::arange(30, 50, at::kLong)}).view({2, 20}),
                               at::arange(50, at::kLong).repeat({2, 1})};
  kv.compact(*pool, kept);
  EXPECT_TRUE(kv.compressed());
  EXPECT_EQ(kv.length(0), 3);
  EXPECT_EQ(kv.length(1), 20);
  EXPECT_EQ(kv.length(2), 50);
  EXPECT_EQ(kv.pages_held(), 1 + 2 + 4);
  EXPECT_EQ(pool->num_free(), 40 - 7);
  for (int64_t l = 0; l < 3; ++l) {
    for (int64_t h = 0; h < 2; ++h) {
      const std::vector<int64_t>& positions = kv.slot_positions(l, h);
      ASSERT_EQ(static_cast<int64_t>(positions.size()), kv.length(l));
      for (int64_t s = 0; s < kv.length(l); ++s) {
        const int64_t p = kept[l][h][s].item<int64_t>();
        EXPECT_EQ(positions[s], p);
        EXPECT_FLOAT_EQ(key_at(*pool, kv, l, h, s, 3), 1000.0f * l + p + 0.03f + 0.5f * h) << l << " " << h << " " << s;
        EXPECT_FLOAT_EQ(value_at(*pool, kv, l, h, s, 5), -(1000.0f * l + p) - 0.05f - 0.5f * h);
      }
    }
  }
  // New tokens append after the kept slots with the positions they ran at.
  ASSERT_TRUE(kv.reserve(*pool, 2).ok());
  const std::vector<int32_t> next{50, 51};
  kv.advance(next);
  EXPECT_EQ(kv.length(0), 5);
  EXPECT_EQ(kv.slot_positions(0, 1), (std::vector<int64_t>{1, 2, 33, 50, 51}));
  EXPECT_EQ(kv.view(*pool).positions[0][1][4].item<int64_t>(), 51);
  // Rolling back per layer (what ModelAccess::run_without_keeping does) restores each layer's length.
  kv.truncate(*pool, std::vector<int64_t>{3, 20, 50});
  EXPECT_EQ(kv.slot_positions(0, 1), (std::vector<int64_t>{1, 2, 33}));
  EXPECT_EQ(kv.length(1), 20);
  EXPECT_EQ(kv.pages_held(), 1 + 2 + 4);
  kv.release(*pool);
  EXPECT_EQ(pool->num_free(), 40);
}

TEST(SequenceKv, DropRemovesPositionsPerHead) {
  auto pool = PagePool::create(spec(), 40, at::kFloat, at::kCPU);
  ASSERT_TRUE(pool.ok());
  SequenceKv kv(3);
  ASSERT_TRUE(kv.reserve(*pool, 20).ok());
  kv.advance(20);
  fill_slots(*pool, kv);
  // Head 0 drops 0..3 (given out of order), head 1 drops 16..19: 16 slots each, one page.
  ASSERT_TRUE(kv.drop(*pool, 1, at::tensor({3, 1, 0, 2, 19, 16, 17, 18}, at::kLong).view({2, 4})).ok());
  EXPECT_EQ(kv.length(1), 16);
  EXPECT_EQ(kv.length(0), 20);
  EXPECT_EQ(kv.pages_held(), 2 + 1 + 2);
  EXPECT_EQ(kv.slot_positions(1, 0).front(), 4);
  EXPECT_EQ(kv.slot_positions(1, 1).back(), 15);
  EXPECT_FLOAT_EQ(key_at(*pool, kv, 1, 0, 0, 0), 1004.0f);
  EXPECT_FLOAT_EQ(key_at(*pool, kv, 1, 1, 15, 0), 1015.5f);
  EXPECT_EQ(kv.drop(*pool, 1, at::tensor({5, 17}, at::kLong).view({2, 1})).message(),
            "layer 1, KV head 1: cannot drop position 17, which is not kept (or is dropped twice)");
  EXPECT_EQ(kv.length(1), 16);  // a refused drop changes nothing
  EXPECT_EQ(kv.drop(*pool, 1, at::tensor({5, 6}, at::kLong)).message(),
            "layer 1: dropped positions must be an int64 tensor [2, n]");
  kv.release(*pool);
}

TEST(PagePool, ResidentAndTransientPagesHaveSeparateBudgets) {
  auto pool = PagePool::create(spec(), PagePoolOptions{4, 3, at::kFloat, at::kCPU, false});
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->num_pages(), 7);
  EXPECT_EQ(pool->num_pages(PageKind::kResident), 4);
  EXPECT_EQ(pool->num_pages(PageKind::kTransient), 3);
  std::vector<int32_t> transient, resident;
  ASSERT_TRUE(pool->allocate(3, &transient, PageKind::kTransient).ok());
  for (int32_t p : transient) EXPECT_EQ(pool->kind_of(p), PageKind::kTransient);
  // Transient pages running out leaves the resident budget untouched, and the other way round.
  EXPECT_EQ(pool->allocate(1, &transient, PageKind::kTransient).message(),
            "KV page pool (transient pages) exhausted: 1 pages needed, 0 of 3 free");
  ASSERT_TRUE(pool->allocate(4, &resident).ok());
  EXPECT_EQ(pool->allocate(1, &resident).message(), "KV page pool (resident pages) exhausted: 1 pages needed, 0 of 4 free");
  pool->release(transient);
  EXPECT_EQ(pool->num_free(PageKind::kTransient), 3);
  EXPECT_EQ(pool->num_free(PageKind::kResident), 0);
  pool->release(resident);
  EXPECT_EQ(pool->num_free(PageKind::kResident), 4);

  // A cache of transient pages takes only transient pages.
  SequenceKv staged(3, PageKind::kTransient);
  EXPECT_EQ(staged.reserve(*pool, 20).message(), "KV page pool (transient pages) exhausted: 6 pages needed, 3 of 3 free");
  ASSERT_TRUE(staged.reserve(*pool, 16).ok());
  EXPECT_EQ(pool->num_free(PageKind::kTransient), 0);
  EXPECT_EQ(pool->num_free(PageKind::kResident), 4);
  staged.release(*pool);
}

// Builds a compressed cache from a full one in another pool (another page size), then carries
// more full-cache slots over and rolls back by position: the path of one verify window.
TEST(SequenceKv, AssignKeptAppendRangeAndPositionRollbackAcrossPools) {
  auto host = PagePool::create(spec(), 40, at::kFloat, at::kCPU);
  KvPageSpec small = spec();
  small.page_size = 32;
  auto device = PagePool::create(small, 20, at::kFloat, at::kCPU);
  ASSERT_TRUE(host.ok() && device.ok());
  SequenceKv full(3);
  ASSERT_TRUE(full.reserve(*host, 40).ok());
  full.advance(40);
  fill_slots(*host, full);
  std::vector<at::Tensor> kept{at::tensor({0, 5, 30, 2, 5, 39}, at::kLong).view({2, 3}),
                               at::arange(0, 40, 4, at::kLong).repeat({2, 1}),
                               at::arange(40, at::kLong).repeat({2, 1})};
  SequenceKv comp(3);
  ASSERT_TRUE(comp.assign_kept(*device, full, *host, kept).ok());
  EXPECT_TRUE(comp.compressed());
  EXPECT_EQ(comp.lengths(), (std::vector<int64_t>{3, 10, 40}));
  EXPECT_EQ(comp.pages_held(), 1 + 1 + 2);
  for (int64_t l = 0; l < 3; ++l) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t s = 0; s < comp.length(l); ++s) {
        const int64_t p = kept[l][h][s].item<int64_t>();
        EXPECT_EQ(comp.position(l, h, s), p);
        EXPECT_FLOAT_EQ(key_at(*device, comp, l, h, s, 7), 1000.0f * l + p + 0.07f + 0.5f * h);
        EXPECT_FLOAT_EQ(value_at(*device, comp, l, h, s, 1), -(1000.0f * l + p) - 0.01f - 0.5f * h);
      }
    }
  }
  // Two drafted tokens (positions 40, 41) appended to both caches, then a verify keeps 40 only.
  ASSERT_TRUE(full.reserve(*host, 2).ok());
  full.advance(2);
  fill_slots(*host, full);
  ASSERT_TRUE(comp.append_range(*device, full, *host, 40, 2).ok());
  EXPECT_EQ(comp.slot_positions(0, 1), (std::vector<int64_t>{2, 5, 39, 40, 41}));
  EXPECT_FLOAT_EQ(key_at(*device, comp, 1, 1, 11, 0), 1041.5f);
  comp.truncate_positions(*device, 41);
  full.truncate_positions(*host, 41);
  EXPECT_EQ(comp.lengths(), (std::vector<int64_t>{4, 11, 41}));
  EXPECT_EQ(full.lengths(), (std::vector<int64_t>{41, 41, 41}));
  EXPECT_EQ(comp.slot_positions(2, 0).back(), 40);
  comp.truncate_positions(*device, 40);  // back to the kept set (heads differ below it)
  EXPECT_EQ(comp.slot_positions(0, 0), (std::vector<int64_t>{0, 5, 30}));
  EXPECT_EQ(comp.length(2), 40);
  // A full cache continues only where it ends.
  SequenceKv copy(3);
  ASSERT_TRUE(copy.append_range(*device, full, *host, 0, 41).ok());
  EXPECT_FALSE(copy.compressed());
  EXPECT_FLOAT_EQ(value_at(*device, copy, 2, 0, 40, 0), -2040.0f);
  // Out of pages: nothing changes.
  std::vector<int32_t> hog;  // leave 5 pages: one short of another 41-slot copy
  ASSERT_TRUE(device->allocate(device->num_free() - 5, &hog).ok());
  SequenceKv big(3);
  EXPECT_EQ(big.append_range(*device, full, *host, 0, 41).code(), StatusCode::kOutOfPages);
  EXPECT_EQ(big.pages_held(), 0);
  EXPECT_EQ(device->num_free(), 5);
  device->release(hog);
  comp.release(*device);
  copy.release(*device);
  full.release(*host);
  EXPECT_EQ(device->num_free(), 20);
  EXPECT_EQ(host->num_free(), 40);
}

// The CPU loop (used whenever both pools are CPU tensors of one dtype) must match ATen indexing
// exactly: across pools of different page sizes, and for moves within one pool whose targets
// overwrite other entries' sources (everything is read before anything is written).
TEST(CopySlots, CpuLoopMatchesAtenIndexing) {
  KvPageSpec wide = spec();
  wide.page_size = 32;
  auto run = [&](bool force_aten) {
    at::manual_seed(7);
    auto a = PagePool::create(spec(), 6, at::kFloat, at::kCPU);
    auto b = PagePool::create(wide, 4, at::kFloat, at::kCPU);
    EXPECT_TRUE(a.ok() && b.ok());
    a->k_pages().copy_(at::randn_like(a->k_pages()));
    a->v_pages().copy_(at::randn_like(a->v_pages()));
    b->k_pages().zero_();
    b->v_pages().zero_();
    SlotList from, to, back;
    for (int64_t i = 0; i < 40; ++i) {
      from.add((i * 5) % 6, (i * 7) % 16, i % 2);
      to.add(i / 10, (i * 3) % 32, i % 2);  // 40 distinct targets
    }
    for (int64_t i = 0; i < 20; ++i) back.add(i % 3, (i + 1) % 16, 1 - i % 2);  // overlaps `from`'s sources
    set_copy_slots_force_aten_for_testing(force_aten);
    copy_slots(*a, from, *b, to);
    SlotList head(from);
    head.page.resize(20), head.offset.resize(20), head.head.resize(20);
    copy_slots(*a, head, *a, back);
    set_copy_slots_force_aten_for_testing(false);
    return std::vector<at::Tensor>{a->k_pages().clone(), a->v_pages().clone(), b->k_pages().clone(), b->v_pages().clone()};
  };
  const std::vector<at::Tensor> loop = run(false), aten = run(true);
  for (size_t i = 0; i < loop.size(); ++i) EXPECT_TRUE(at::equal(loop[i], aten[i])) << "tensor " << i;
  EXPECT_GT(loop[2].abs().sum().item<float>(), 0.0f);  // something was copied
}

TEST(PackedPagePool, AllocatesAllOrNothingAndRejectsBadSizes) {
  EXPECT_EQ(PackedPagePool::create(4, 0).status().message(), "packed KV pages need at least one byte, got 0");
  EXPECT_EQ(PackedPagePool::create(0, 64).status().message(),
            "packed KV page count must be between 1 and 2^31-1, got 0");
  auto pool = PackedPagePool::create(4, 100);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->storage().sizes(), (at::IntArrayRef{4, 100}));
  std::vector<int32_t> pages;
  ASSERT_TRUE(pool->allocate(3, &pages).ok());
  EXPECT_EQ(pool->allocate(2, &pages).message(), "packed KV page pool exhausted: 2 pages needed, 1 of 4 free");
  EXPECT_EQ(pages.size(), 3u);
  pool->release(pages);
  EXPECT_EQ(pool->num_free(), 4);
  EXPECT_EQ(pool->peak_in_use(), 3);
}

// A quantizer's cache: whole leading float pages move to packed pages (positions with them),
// attention lengths count both parts, rollback stays in the float part, release returns both.
TEST(SequenceKv, MoveFrontToPackedKeepsPositionsAndFreesFloatPages) {
  auto host = PagePool::create(spec(), 40, at::kFloat, at::kCPU);
  auto device = PagePool::create(spec(), 40, at::kFloat, at::kCPU);
  auto packed = PackedPagePool::create(10, 8);
  ASSERT_TRUE(host.ok() && device.ok() && packed.ok());
  SequenceKv full(3);
  ASSERT_TRUE(full.reserve(*host, 50).ok());
  full.advance(50);
  fill_slots(*host, full);
  SequenceKv comp(3);
  const at::Tensor all = at::arange(50, at::kLong).repeat({2, 1});
  ASSERT_TRUE(comp.assign_kept(*device, full, *host, {all, all, all}).ok());
  EXPECT_EQ(comp.pages_held(), 3 * 4);
  std::vector<int32_t> pages;
  ASSERT_TRUE(packed->allocate(2, &pages).ok());
  comp.move_front_to_packed(*device, 1, pages);  // layer 1: slots 0-31 packed
  EXPECT_EQ(comp.packed_length(1), 32);
  EXPECT_EQ(comp.packed_length(0), 0);
  EXPECT_EQ(comp.length(1), 18);
  EXPECT_EQ(comp.total_length(1), 50);
  EXPECT_EQ(comp.packed_table(1), pages);
  EXPECT_EQ(comp.pages_held(), 3 * 4 - 2);
  EXPECT_EQ(comp.packed_pages_held(), 2);
  EXPECT_TRUE(at::equal(comp.packed_positions(1), at::arange(32, at::kLong).repeat({2, 1})));
  EXPECT_EQ(comp.position(1, 1, 0), 32);  // float slot 0 now holds position 32, with its K/V
  EXPECT_FLOAT_EQ(key_at(*device, comp, 1, 1, 0, 7), 1000.0f + 32 + 0.07f + 0.5f);
  comp.truncate_positions(*device, 40);  // a rollback stays in the float part
  EXPECT_EQ(comp.length(1), 8);
  EXPECT_EQ(comp.total_length(1), 40);
  comp.release_packed(*packed);
  EXPECT_EQ(packed->num_free(), 10);
  EXPECT_EQ(comp.packed_length(1), 0);
  comp.release(*device);
  full.release(*host);
  EXPECT_EQ(device->num_free(), 40);
}

}  // namespace
}  // namespace vericache
