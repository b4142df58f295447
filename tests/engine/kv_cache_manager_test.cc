#include "engine/kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace tandem {
namespace {

std::vector<int> Iota(int n, int from) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

// A prompt's full blocks, published once computed, are the next prompt's prefix in every layer
// group; a prompt that differs from some block on reuses the blocks before it only.
TEST(KvCacheManagerTest, PublishedPrefixesAreMatchedBlockByBlockInEveryGroup) {
  KvCacheManager cache(64, KvTableLayout{4, {0, 8}});  // a full and a sliding group
  const std::vector<int> prompt = Iota(14, 1);         // 3 full blocks and 2 tokens
  KvCacheManager::Prefix none = cache.MatchPrefix(prompt, 3);
  EXPECT_TRUE(none.blocks.empty());
  EXPECT_EQ(none.tokens, 0);
  auto table = cache.Allocate(cache.layout().Entries(14));
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->size(), 8u);  // 4 logical blocks x 2 groups
  cache.Publish(prompt, *table);
  ASSERT_TRUE(cache.Free(*table).ok());
  EXPECT_TRUE(cache.NoneInUse());

  KvCacheManager::Prefix hit = cache.MatchPrefix(prompt, 3);
  EXPECT_EQ(hit.tokens, 12);
  EXPECT_EQ(hit.blocks, std::vector<int>(table->begin(), table->begin() + 6));
  ASSERT_TRUE(cache.Free(hit.blocks).ok());

  std::vector<int> other = prompt;
  other[9] = 500;  // in the third block
  KvCacheManager::Prefix two = cache.MatchPrefix(other, 3);
  EXPECT_EQ(two.tokens, 8);
  EXPECT_EQ(two.blocks.size(), 4u);
  ASSERT_TRUE(cache.Free(two.blocks).ok());
  EXPECT_EQ(cache.MatchPrefix(prompt, 1).tokens, 4) << "at most max_blocks";
  ASSERT_TRUE(cache.Free(cache.MatchPrefix(prompt, 0).blocks).ok());
  EXPECT_EQ(cache.pool().ref_count((*table)[0]), 1);  // the max_blocks = 1 match's reference
  ASSERT_TRUE(cache.Free(std::vector<int>{(*table)[0], (*table)[1]}).ok());
  EXPECT_TRUE(cache.NoneInUse());
}

// With a hash under which every block collides, a different prompt still finds nothing: a hit
// is confirmed against the block's tokens, never taken on the hash.
TEST(KvCacheManagerTest, ACollidingHashPlantsNothing) {
  SetBlockHashForTesting([](uint64_t, std::span<const int>) -> uint64_t { return 42; });
  KvCacheManager cache(16, KvTableLayout{4, {}});
  const std::vector<int> planted = Iota(8, 1), victim = Iota(8, 100);
  auto table = cache.Allocate(2);
  ASSERT_TRUE(table.ok());
  cache.Publish(planted, *table);
  ASSERT_TRUE(cache.Free(*table).ok());
  const KvCacheManager::Prefix p = cache.MatchPrefix(victim, 2);
  EXPECT_EQ(p.tokens, 0);
  EXPECT_TRUE(p.blocks.empty());
  EXPECT_GT(cache.pool().hash_mismatches(), 0u);
  SetBlockHashForTesting(nullptr);
  EXPECT_TRUE(cache.NoneInUse());
}

}  // namespace
}  // namespace tandem
