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

// The block hash is SipHash-2-4: the reference vectors of its authors' implementation (key
// 00..0f; the empty message and 00..0e).
TEST(BlockHashTest, IsSipHash24) {
  const BlockHashKey key{0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
  EXPECT_EQ(SipHash24(key, {}), 0x726fdb47dd0e0e31ull);
  std::vector<uint8_t> message(15);
  for (int i = 0; i < 15; ++i) message[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(SipHash24(key, message), 0xa129ca6149be45e5ull);
  // A block's message: the parent hash, the count, the ids as 32-bit little-endian words.
  for (const std::vector<int>& tokens :
       {std::vector<int>{}, std::vector<int>{7}, std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9}}) {
    std::vector<uint8_t> bytes;
    auto put = [&bytes](uint64_t v, int n) {
      for (int i = 0; i < n; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
    };
    put(0x1234567890abcdefull, 8);
    put(tokens.size(), 8);
    for (int t : tokens) put(static_cast<uint32_t>(t), 4);
    EXPECT_EQ(HashBlockTokens(key, 0x1234567890abcdefull, tokens), SipHash24(key, bytes));
  }
}

// Keyed: another cluster (another process, another key) hashes the same blocks differently, and
// this process's key is its own.
TEST(BlockHashTest, HashesDifferBetweenKeys) {
  const std::vector<int> tokens = {1, 2, 3, 4};
  const BlockHashKey a{1, 2}, b{1, 3};
  EXPECT_EQ(HashBlockTokens(a, 0, tokens), HashBlockTokens(a, 0, tokens));
  EXPECT_NE(HashBlockTokens(a, 0, tokens), HashBlockTokens(b, 0, tokens));
  const BlockHashKey& mine = ProcessBlockHashKey();
  EXPECT_FALSE(mine.k0 == 0 && mine.k1 == 0);
  EXPECT_EQ(HashBlockTokens(0, tokens), HashBlockTokens(mine, 0, tokens));
  EXPECT_NE(HashBlockTokens(0, tokens), HashBlockTokens(a, 0, tokens));
}

TEST(BlockPoolTest, PrefixCacheHitAndLruEviction) {
  BlockPool pool(3);
  const std::vector<int> t1 = {1, 2, 3, 4}, t2 = {5, 6, 7, 8};
  const uint64_t h1 = HashBlockTokens(0, t1);
  const uint64_t h2 = HashBlockTokens(h1, t2);
  EXPECT_NE(HashBlockTokens(0, t2), h2);  // chained: same tokens, different prefix
  const std::vector<int> both = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(PrefixBlockHashes(both, 4, 8), (std::vector<uint64_t>{h1, h2}));
  EXPECT_EQ(PrefixBlockHashes(both, 4, 1), (std::vector<uint64_t>{h1}));
  auto a = pool.Allocate(2);
  pool.Register((*a)[0], h1, t1, {});
  pool.Register((*a)[1], h2, t2, pool.AsParent((*a)[0]));
  ASSERT_TRUE(pool.Free(*a).ok());
  EXPECT_EQ(pool.num_cached(), 2);
  EXPECT_EQ(pool.num_available(), 3);
  EXPECT_TRUE(pool.NoneInUse());
  // A hit revives the block.
  auto hit = pool.Lookup(h1, t1, {});
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, (*a)[0]);
  EXPECT_EQ(pool.ref_count(*hit), 1);
  EXPECT_EQ(pool.num_cached(), 1);
  // Fresh allocations take the free block, then evict the cached one (h2).
  auto b = pool.Allocate(2);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(pool.Lookup(h2, t2, pool.AsParent(*hit)).has_value());
  EXPECT_EQ(pool.hash_mismatches(), 0u);
  std::vector<int> h = {*hit};
  ASSERT_TRUE(pool.Free(h).ok());
  ASSERT_TRUE(pool.Free(*b).ok());
  EXPECT_TRUE(pool.NoneInUse());
}

// The hash only finds a candidate. A forger who registers other tokens under a victim's block
// hash, or a block computed after another prefix under the victim's chained hash, plants
// nothing: the victim's lookups miss (and are counted), and its own blocks hit.
TEST(BlockPoolTest, PrefixHitsNeedTheSameTokensAfterTheSameBlock) {
  BlockPool pool(4);
  const std::vector<int> victim0 = {1, 2, 3, 4}, forged0 = {9, 9, 9, 9}, shared1 = {5, 6, 7, 8};
  const uint64_t h0 = 1234, h1 = 5678;  // as if forged0 collided with victim0, block by block
  auto forged = pool.Allocate(2);
  pool.Register((*forged)[0], h0, forged0, {});
  pool.Register((*forged)[1], h1, shared1, pool.AsParent((*forged)[0]));
  ASSERT_TRUE(pool.Free(*forged).ok());

  // Same hash, other tokens: a miss.
  EXPECT_FALSE(pool.Lookup(h0, victim0, {}).has_value());
  EXPECT_EQ(pool.hash_mismatches(), 1u);

  // The forger's first block is evicted and the victim's own first block takes its hash (and
  // maybe its very slot, at a new generation); the forger's second block, computed after
  // forged0, still sits under the chained hash the victim looks up next: a miss too.
  auto fill = pool.Allocate(3);  // two free blocks, then the least recently used cached one
  ASSERT_TRUE(fill.ok());
  EXPECT_EQ(pool.num_cached(), 1);
  const int mine = (*fill)[2];
  EXPECT_EQ(mine, (*forged)[0]);
  pool.Register(mine, h0, victim0, {});
  EXPECT_FALSE(pool.Lookup(h1, shared1, pool.AsParent(mine)).has_value());
  EXPECT_EQ(pool.hash_mismatches(), 2u);

  // The victim's own chain hits.
  ASSERT_TRUE(pool.Free(*fill).ok());
  auto first = pool.Lookup(h0, victim0, {});
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, mine);
  std::vector<int> held = {*first};
  ASSERT_TRUE(pool.Free(held).ok());
  EXPECT_TRUE(pool.NoneInUse());
}

}  // namespace
}  // namespace tandem
