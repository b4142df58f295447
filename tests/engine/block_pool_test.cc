#include "engine/kv/block_pool.h"

#include <gtest/gtest.h>

#include <set>

namespace tandem {
namespace {

TEST(BlockPoolTest, AllocateAndFree) {
  BlockPool pool(8);
  EXPECT_EQ(pool.num_available(), 8);
  auto a = pool.Allocate(3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->size(), 3u);
  EXPECT_EQ(pool.num_in_use(), 3);
  for (int b : *a) EXPECT_EQ(pool.ref_count(b), 1);
  auto b = pool.Allocate(5);
  ASSERT_TRUE(b.ok());
  std::set<int> all(a->begin(), a->end());
  all.insert(b->begin(), b->end());
  EXPECT_EQ(all.size(), 8u);  // distinct
  EXPECT_EQ(pool.Allocate(1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.num_in_use(), 8);  // a failed allocation takes nothing
  ASSERT_TRUE(pool.Free(*a).ok());
  ASSERT_TRUE(pool.Free(*b).ok());
  EXPECT_TRUE(pool.NoneInUse());
}

TEST(BlockPoolTest, LowIdsFirstAndTheLastFreedBeforeUntouchedOnes) {
  // A pool of a billion blocks costs nothing until used (the planner builds one per simulation).
  BlockPool pool(1 << 30);
  EXPECT_EQ(pool.num_available(), 1 << 30);
  EXPECT_EQ(pool.ref_count(12345), 0);  // untouched: free
  EXPECT_EQ(pool.generation(12345), 0u);
  auto a = pool.Allocate(3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<int>{0, 1, 2}));
  const std::vector<int> first = {0}, third = {2};
  ASSERT_TRUE(pool.Free(third).ok());
  ASSERT_TRUE(pool.Free(first).ok());
  auto b = pool.Allocate(3);  // the last freed first, then the next untouched block
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(pool.generation(0), 2u);
  EXPECT_EQ(pool.generation(3), 1u);
  EXPECT_EQ(pool.num_in_use(), 4);
  // An untouched block is not in use: freeing or referencing it is an error.
  EXPECT_FALSE(pool.Free(std::vector<int>{4}).ok());
  EXPECT_FALSE(pool.AddRef(4).ok());
  ASSERT_TRUE(pool.Free(*b).ok());
  ASSERT_TRUE(pool.Free(std::vector<int>{1}).ok());
  EXPECT_TRUE(pool.NoneInUse());
  EXPECT_EQ(pool.num_available(), 1 << 30);
}

TEST(BlockPoolTest, DoubleFreeIsAnError) {
  BlockPool pool(2);
  auto a = pool.Allocate(1);
  ASSERT_TRUE(pool.Free(*a).ok());
  EXPECT_FALSE(pool.Free(*a).ok());
  std::vector<int> bad = {7};
  EXPECT_FALSE(pool.Free(bad).ok());
  EXPECT_TRUE(pool.NoneInUse());
}

TEST(BlockPoolTest, GenerationChangesOnReuse) {
  BlockPool pool(1);
  auto a = pool.Allocate(1);
  const uint32_t g1 = pool.generation((*a)[0]);
  ASSERT_TRUE(pool.Free(*a).ok());
  auto b = pool.Allocate(1);
  EXPECT_EQ((*a)[0], (*b)[0]);
  EXPECT_NE(pool.generation((*b)[0]), g1);
  ASSERT_TRUE(pool.Free(*b).ok());
}

TEST(BlockPoolTest, RefCounts) {
  BlockPool pool(2);
  auto a = pool.Allocate(1);
  ASSERT_TRUE(pool.AddRef((*a)[0]).ok());
  EXPECT_EQ(pool.ref_count((*a)[0]), 2);
  ASSERT_TRUE(pool.Free(*a).ok());
  EXPECT_EQ(pool.num_in_use(), 1);
  ASSERT_TRUE(pool.Free(*a).ok());
  EXPECT_TRUE(pool.NoneInUse());
}

TEST(BlockPoolTest, PrefixCacheHitAndLruEviction) {
  BlockPool pool(3);
  const std::vector<int> t1 = {1, 2, 3, 4}, t2 = {5, 6, 7, 8};
  const uint64_t h1 = HashBlockTokens(0, t1);
  const uint64_t h2 = HashBlockTokens(h1, t2);
  EXPECT_NE(HashBlockTokens(0, t2), h2);  // chained: same tokens, different prefix
  auto a = pool.Allocate(2);
  pool.Register((*a)[0], h1);
  pool.Register((*a)[1], h2);
  ASSERT_TRUE(pool.Free(*a).ok());
  EXPECT_EQ(pool.num_cached(), 2);
  EXPECT_EQ(pool.num_available(), 3);
  EXPECT_TRUE(pool.NoneInUse());
  // A hit revives the block.
  auto hit = pool.Lookup(h1);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, (*a)[0]);
  EXPECT_EQ(pool.ref_count(*hit), 1);
  EXPECT_EQ(pool.num_cached(), 1);
  // Fresh allocations take the free block, then evict the cached one (h2).
  auto b = pool.Allocate(2);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(pool.Lookup(h2).has_value());
  std::vector<int> h = {*hit};
  ASSERT_TRUE(pool.Free(h).ok());
  ASSERT_TRUE(pool.Free(*b).ok());
  EXPECT_TRUE(pool.NoneInUse());
}

}  // namespace
}  // namespace tandem
