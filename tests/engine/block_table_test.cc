// Block tables over layer groups (engine/kv/block_table.h) and the grouping KvCacheSpec gives a
// model that mixes sliding-window and full-attention layers. Every test ends with the pool empty.
#include "engine/kv/block_table.h"

#include <gtest/gtest.h>

#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/model_config.h"

namespace tandem {
namespace {

TEST(BlockTableTest, OneGroupIsThePlainPagedTable) {
  const KvTableLayout one{4, {}};
  EXPECT_EQ(one.n_groups(), 1);
  EXPECT_FALSE(one.windowed());
  EXPECT_EQ(one.Entries(9), 3);
  EXPECT_EQ(one.BlocksAt(9), 3);
  EXPECT_EQ(one.TokensIn(10), 40);
  BlockPool pool(10);
  std::vector<int> table;
  ASSERT_TRUE(GrowTable(one, &pool, &table, 0, 9).ok());
  EXPECT_EQ(table, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(TrimTable(one, &pool, &table, 8), 0);  // nothing to let go
  ShrinkTable(one, &pool, &table, 4);
  EXPECT_EQ(table, (std::vector<int>{0}));
  EXPECT_EQ(pool.num_available(), 9);
  FreeTable(&pool, &table);
  EXPECT_TRUE(table.empty());
  EXPECT_TRUE(pool.NoneInUse());
}

// A full group and a sliding group of window 6, blocks of 4 tokens: entries interleave
// [full 0, sliding 0, full 1, sliding 1, ...].
TEST(BlockTableTest, ASlidingGroupTakesOnlyItsWindowAndLetsOlderBlocksGo) {
  const KvTableLayout hybrid{4, {0, 6}};
  EXPECT_TRUE(hybrid.windowed());
  // A query at 9 reads 4..9: logical blocks 1 and 2 of the sliding group.
  EXPECT_EQ(hybrid.KeepFrom(1, 9), 4);
  EXPECT_EQ(hybrid.KeepFrom(0, 9), 0);
  EXPECT_EQ(hybrid.BlocksHeld(9, 10), 3 + 2);
  BlockPool pool(20);
  std::vector<int> table;
  EXPECT_EQ(MissingBlocks(hybrid, table, 9, 10), 5);
  ASSERT_TRUE(GrowTable(hybrid, &pool, &table, 9, 10).ok());
  ASSERT_EQ(table.size(), 6u);
  EXPECT_EQ(table[1], kNoBlock);  // sliding block 0: never taken
  EXPECT_EQ(LiveBlocks(table), 5);
  EXPECT_EQ(GroupTable(hybrid, table, 0).size(), 3u);
  EXPECT_EQ(GroupTable(hybrid, table, 1)[0], kNoBlock);
  // Queries from 12 still read position 7 (block 1); from 14 they start at 9 (block 2).
  EXPECT_EQ(TrimTable(hybrid, &pool, &table, 12), 0);
  const int sliding1 = table[3];
  EXPECT_EQ(TrimTable(hybrid, &pool, &table, 14), 1);
  EXPECT_EQ(table[3], kNoBlock);
  EXPECT_EQ(pool.ref_count(sliding1), 0);
  // Growing to 16 positions from 14 on takes full block 3 and sliding block 3 only.
  EXPECT_EQ(MissingBlocks(hybrid, table, 14, 16), 2);
  ASSERT_TRUE(GrowTable(hybrid, &pool, &table, 14, 16).ok());
  EXPECT_EQ(LiveBlocks(table), 4 + 2);
  // A recompute from 0 (after preemption) takes the sliding blocks it reads again.
  EXPECT_EQ(MissingBlocks(hybrid, table, 0, 16), 2);
  FreeTable(&pool, &table);
  EXPECT_TRUE(pool.NoneInUse());
}

TEST(BlockTableTest, GrowingTakesNothingWhenThePoolIsShort) {
  const KvTableLayout hybrid{4, {0, 6}};
  BlockPool pool(4);
  std::vector<int> table;
  const absl::Status s = GrowTable(hybrid, &pool, &table, 9, 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(pool.num_available(), 4);
}

// TokensIn is the longest sequence that fits: every length up to it fits, the next does not.
TEST(BlockTableTest, TokensInIsTheLongestSequenceEveryStepOfWhichFits) {
  for (const KvTableLayout& layout :
       {KvTableLayout{4, {}}, KvTableLayout{4, {0, 6}}, KvTableLayout{16, {0, 512, 512}},
        KvTableLayout{16, {0, 0, 4, 4, 4}}}) {
    for (int blocks : {5, 10, 37, 200}) {
      const int64_t most = layout.TokensIn(blocks);
      for (int t = 1; t <= most; ++t) ASSERT_LE(layout.BlocksAt(t), blocks) << t;
      int64_t peak = 0;  // the most blocks at any length up to most + 1
      for (int t = 1; t <= most + 1; ++t) peak = std::max(peak, layout.BlocksAt(t));
      EXPECT_GT(peak, blocks) << most;
    }
  }
  // Only sliding groups: a sequence of any length fits once one window does.
  EXPECT_GT(KvTableLayout({4, {6}}).TokensIn(10), int64_t{1} << 30);
}

// PeakBlocks(t) is the most a sequence holds at any length up to t (what a reservation up to t
// sets aside): the running maximum of BlocksAt, by brute force.
TEST(BlockTableTest, PeakBlocksIsTheMostHeldAtAnyLengthUpToIt) {
  for (const KvTableLayout& layout :
       {KvTableLayout{4, {}}, KvTableLayout{4, {0, 6}}, KvTableLayout{16, {0, 512, 512}},
        KvTableLayout{16, {0, 0, 4, 4, 4}}, KvTableLayout{4, {5, 9}}, KvTableLayout{8, {1}}}) {
    int64_t most = 0;
    for (int t = 1; t <= 2000; ++t) {
      most = std::max(most, layout.BlocksAt(t));
      ASSERT_EQ(layout.PeakBlocks(t), most) << "t=" << t << " block_size " << layout.block_size;
    }
  }
}

TEST(BlockTableTest, ContiguousTablesAndGroupHashes) {
  const KvTableLayout hybrid{4, {0, 6, 6}};
  EXPECT_EQ(ContiguousTable(hybrid, 5), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(GroupBlockHash(1234, 0), 1234u);
  EXPECT_NE(GroupBlockHash(1234, 1), GroupBlockHash(1234, 2));
}

// Gemma 3 270M's layout: 18 layers, every sixth one global, window 512.
TEST(BlockTableTest, AMixedModelKeepsItsKvInGroupsOfEquallyManyLayers) {
  ModelConfig c;
  c.n_layers = 18;
  c.n_kv_heads = 1;
  c.head_dim = 256;
  c.sliding_window = 512;
  c.sliding_layers.assign(18, 0);
  for (int l = 0; l < 18; ++l) c.sliding_layers[l] = (l + 1) % 6 != 0;
  const KvCacheSpec spec = KvCacheSpec::For(c, 16, DType::kF32);
  EXPECT_EQ(spec.n_groups(), 6);
  EXPECT_EQ(spec.group_layers(), 3);
  EXPECT_EQ(spec.group_window, (std::vector<int>{0, 512, 512, 512, 512, 512}));
  EXPECT_EQ(spec.group_of(5), 0);  // the globals, in order: 5, 11, 17
  EXPECT_EQ(spec.slot_of(11), 1);
  EXPECT_EQ(spec.group_of(0), 1);  // the sliding layers fill groups 1..5 three at a time
  EXPECT_EQ(spec.group_of(3), 2);
  EXPECT_EQ(spec.slot_of(3), 0);
  EXPECT_EQ(spec.group_of(16), 5);
  EXPECT_EQ(spec.bytes_per_block(), int64_t{2} * 3 * 256 * 4 * 16);
  EXPECT_EQ(spec.KeepFrom(0, 8192), 8192 - 511);
  EXPECT_EQ(spec.KeepFrom(5, 8192), 0);
  // An 8k sequence holds its global group whole and a window in each sliding one: under a
  // quarter of the full cache's blocks.
  const KvTableLayout layout = spec.table_layout();
  EXPECT_EQ(layout.BlocksAt(8192), 512 + 5 * 32);  // the last query reads 7680..8191
  EXPECT_LT(layout.BlocksAt(8192) * 4, 6 * 512);
  // Without grouping (the CUDA runner), and for a model of one kind: one group.
  EXPECT_EQ(KvCacheSpec::For(c, 16, DType::kF32, /*grouped=*/false).n_groups(), 1);
  c.sliding_layers.clear();
  EXPECT_EQ(KvCacheSpec::For(c, 16, DType::kF32).n_groups(), 1);
}

}  // namespace
}  // namespace tandem
