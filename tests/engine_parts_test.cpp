// The engine's parts that need no model (core/engine/): counting a verify window into the metrics
// and turning an online compressor's prefill drops into a kept set, with the refusals a broken
// plugin meets.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <vector>

#include "engine/compressor_feed.h"
#include "engine/engine_stats.h"

namespace vericache {
namespace {

TEST(EngineParts, AWindowCountsDraftsAcceptedAndPositions) {
  RequestMetrics m;
  m.add_window(4, 2);
  m.add_window(0, 0);  // the last token verified alone: a window, not a draft
  m.add_window(2, 2);
  EXPECT_EQ(m.verify_windows, 3);
  EXPECT_EQ(m.drafts, 2);
  EXPECT_EQ(m.draft_tokens, 6);
  EXPECT_EQ(m.accepted_tokens, 4);
  EXPECT_EQ(m.drafted_per_position, (std::vector<int64_t>{2, 2, 1, 1}));
  EXPECT_EQ(m.accepted_per_position, (std::vector<int64_t>{2, 2, 0, 0}));
  EXPECT_DOUBLE_EQ(m.mean_acceptance_length(), 3.0);
}

LayerDrops drops_of(int64_t request, std::vector<int64_t> per_head_positions, int64_t heads) {
  const auto n = static_cast<int64_t>(per_head_positions.size()) / heads;
  return LayerDrops{request, 0, at::tensor(per_head_positions, at::kLong).view({heads, n})};
}

TEST(EngineParts, PrefillDropsBecomeTheKeptSet) {
  DroppedPositions dropped;
  // 2 layers, 2 KV heads, a prompt of 6 tokens; layer 1 drops 1 and 4 in head 0, 0 and 5 in head 1.
  const std::vector<LayerDrops> drops = {drops_of(7, {1, 4, 0, 5}, 2)};
  ASSERT_TRUE(record_prefill_drops("p", drops, 7, 1, 6, 2, 2, &dropped).ok());
  auto kept = kept_after_drops("p", dropped, 6, 2, 2);
  ASSERT_TRUE(kept.ok()) << kept.status().message();
  EXPECT_TRUE(at::equal((*kept)[0], at::tensor({0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}, at::kLong).view({2, 6})));
  EXPECT_TRUE(at::equal((*kept)[1], at::tensor({0, 2, 3, 5, 1, 2, 3, 4}, at::kLong).view({2, 4})));
  // Nothing dropped at all: everything kept.
  auto all = kept_after_drops("p", DroppedPositions{}, 3, 1, 2);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*all)[0].size(1), 3);
}

TEST(EngineParts, BrokenDropsAreThePluginsError) {
  DroppedPositions dropped;
  const Status other = record_prefill_drops("p", std::vector{drops_of(8, {1, 1}, 2)}, 7, 0, 6, 1, 2, &dropped);
  EXPECT_EQ(other.code(), StatusCode::kPluginError);
  EXPECT_EQ(other.message(), "p: layer 0: drops must be an int64 tensor [2, n] for this request");
  const Status shape = record_prefill_drops("p", std::vector{drops_of(7, {1, 2, 3}, 1)}, 7, 0, 6, 1, 2, &dropped);
  EXPECT_EQ(shape.code(), StatusCode::kPluginError);
  const Status unheld = record_prefill_drops("p", std::vector{drops_of(7, {6, 0}, 2)}, 7, 0, 6, 1, 2, &dropped);
  EXPECT_EQ(unheld.message(), "p: layer 0: dropped position 6 is not held");
  DroppedPositions uneven;
  ASSERT_TRUE(record_prefill_drops("p", std::vector{drops_of(7, {1, 2}, 2)}, 7, 0, 6, 1, 2, &uneven).ok());
  uneven[0][1].clear();  // head 1 now drops nothing while head 0 drops position 1
  const auto kept = kept_after_drops("p", uneven, 6, 1, 2);
  ASSERT_FALSE(kept.ok());
  EXPECT_EQ(kept.status().message(), "p: layer 0: KV heads kept different counts");
}

}  // namespace
}  // namespace vericache
