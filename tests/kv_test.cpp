// PagePool and SequenceKv: allocation, all-or-nothing reservation, rollback.
#include <gtest/gtest.h>

#include "kv/page_pool.h"
#include "kv/sequence_kv.h"

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

}  // namespace
}  // namespace vericache
