#include "kv_transfer/lease_table.h"

#include <gtest/gtest.h>

#include "engine/block_pool.h"

namespace tandem {
namespace {

using Code = absl::StatusCode;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(LeaseTableTest, CompleteWhenEveryLayerAndTokenCovered) {
  LeaseTable t;
  Lease l = *t.Create(7, {3, 1}, /*num_tokens=*/10, /*n_layers=*/2, kT0);
  EXPECT_EQ(l.id, 7u);
  EXPECT_TRUE(t.OnChunk(7, l.generation, 0, 0, 4).ok());
  EXPECT_TRUE(t.OnChunk(7, l.generation, 0, 4, 6).ok());
  EXPECT_FALSE(t.IsComplete(7));
  // Out of order, overlapping and duplicate chunks are merged.
  EXPECT_TRUE(t.OnChunk(7, l.generation, 1, 6, 4).ok());
  EXPECT_TRUE(t.OnChunk(7, l.generation, 1, 2, 5).ok());
  EXPECT_TRUE(t.OnChunk(7, l.generation, 1, 2, 5).ok());
  EXPECT_FALSE(t.IsComplete(7));
  EXPECT_TRUE(t.OnChunk(7, l.generation, 1, 0, 1).ok());
  EXPECT_FALSE(t.IsComplete(7));  // token 1 of layer 1 missing
  EXPECT_TRUE(t.OnChunk(7, l.generation, 1, 1, 1).ok());
  EXPECT_TRUE(t.IsComplete(7));
  // Once complete the decode may read the blocks: no more writes.
  EXPECT_EQ(t.OnChunk(7, l.generation, 0, 0, 4).code(), Code::kFailedPrecondition);
  absl::StatusOr<std::vector<int>> blocks = t.Release(7);
  ASSERT_TRUE(blocks.ok());
  EXPECT_EQ(*blocks, (std::vector<int>{3, 1}));
  EXPECT_EQ(t.size(), 0u);
}

TEST(LeaseTableTest, RejectsChunksOutsideThePrompt) {
  LeaseTable t;
  Lease l = *t.Create(7, {0}, 10, 2, kT0);
  EXPECT_EQ(t.OnChunk(7, l.generation, 2, 0, 1).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.OnChunk(7, l.generation, 0, 8, 3).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.OnChunk(7, l.generation, 0, 0, 0).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.OnChunk(7, l.generation, 0, 0xFFFFFFFFu, 2).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.OnChunk(8, l.generation, 0, 0, 1).code(), Code::kNotFound);
  absl::StatusOr<std::span<const int>> blocks = t.CheckChunk(7, l.generation, 1, 0, 10);
  ASSERT_TRUE(blocks.ok());
  EXPECT_EQ(blocks->size(), 1u);
  EXPECT_FALSE(t.IsComplete(7));  // CheckChunk records nothing
  EXPECT_TRUE(t.Release(7).ok());
  EXPECT_EQ(t.size(), 0u);
}

TEST(LeaseTableTest, CreateValidatesAndRefusesDuplicates) {
  LeaseTable t;
  EXPECT_EQ(t.Create(1, {}, 0, 2, kT0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(t.Create(1, {}, 4, 0, kT0).status().code(), Code::kInvalidArgument);
  ASSERT_TRUE(t.Create(1, {0}, 4, 2, kT0).ok());
  EXPECT_EQ(t.Create(1, {1}, 4, 2, kT0).status().code(), Code::kAlreadyExists);
  EXPECT_TRUE(t.Release(1).ok());
  EXPECT_EQ(t.size(), 0u);
}

TEST(LeaseTableTest, StaleGenerationRefusedAfterReleaseAndReuse) {
  LeaseTable t;
  Lease first = *t.Create(7, {1, 2}, 8, 1, kT0);
  ASSERT_TRUE(t.OnChunk(7, first.generation, 0, 0, 4).ok());
  ASSERT_TRUE(t.Release(7).ok());
  // Released: the late writer finds nothing.
  EXPECT_EQ(t.OnChunk(7, first.generation, 0, 4, 4).code(), Code::kNotFound);
  // The request is resumed here: same id, a new generation.
  Lease second = *t.Create(7, {2, 5}, 8, 1, kT0);
  EXPECT_EQ(second.id, first.id);
  EXPECT_GT(second.generation, first.generation);
  absl::Status late = t.OnChunk(7, first.generation, 0, 4, 4);
  EXPECT_EQ(late.code(), Code::kAborted);
  EXPECT_NE(late.message().find("stale generation"), std::string::npos) << late;
  EXPECT_TRUE(t.OnChunk(7, second.generation, 0, 0, 8).ok());
  EXPECT_TRUE(t.IsComplete(7));
  EXPECT_TRUE(t.Release(7).ok());
  EXPECT_EQ(t.size(), 0u);
}

TEST(LeaseTableTest, ReleaseExactlyOnce) {
  LeaseTable t;
  ASSERT_TRUE(t.Create(3, {4, 5, 6}, 40, 2, kT0).ok());
  EXPECT_EQ(t.Release(3)->size(), 3u);
  EXPECT_EQ(t.Release(3).status().code(), Code::kNotFound);
  EXPECT_EQ(t.Release(99).status().code(), Code::kNotFound);
  EXPECT_EQ(t.size(), 0u);
}

TEST(LeaseTableTest, ExpireFreesExactlyTheIncompleteLeasesPastDeadline) {
  BlockPool pool(16);
  LeaseTable t;
  auto create = [&](uint64_t id, absl::Duration deadline) {
    return *t.Create(id, *pool.Allocate(2), 8, 2, kT0 + deadline);
  };
  create(1, absl::Seconds(1));                  // incomplete, past deadline: expires
  Lease done = create(2, absl::Seconds(1));     // complete, past deadline: kept
  Lease partial = create(3, absl::Seconds(1));  // half done, past deadline: expires
  create(4, absl::Seconds(5));                  // incomplete, deadline ahead: kept
  for (uint32_t layer = 0; layer < 2; ++layer)
    ASSERT_TRUE(t.OnChunk(2, done.generation, layer, 0, 8).ok());
  ASSERT_TRUE(t.OnChunk(3, partial.generation, 0, 0, 8).ok());
  EXPECT_EQ(pool.num_in_use(), 8);

  EXPECT_TRUE(t.Expire(kT0).empty());
  std::vector<ExpiredLease> expired = t.Expire(kT0 + absl::Seconds(2));
  ASSERT_EQ(expired.size(), 2u);
  EXPECT_EQ(expired[0].lease.id, 1u);
  EXPECT_EQ(expired[1].lease.id, 3u);
  EXPECT_EQ(expired[1].lease.generation, partial.generation);
  for (const ExpiredLease& e : expired) {
    EXPECT_EQ(e.blocks.size(), 2u);
    ASSERT_TRUE(pool.Free(e.blocks).ok());
  }
  EXPECT_EQ(t.size(), 2u);
  // An expired lease is gone: its writer and a second Release both find nothing.
  EXPECT_EQ(t.OnChunk(3, partial.generation, 1, 0, 8).code(), Code::kNotFound);
  EXPECT_EQ(t.Release(1).status().code(), Code::kNotFound);

  ASSERT_TRUE(pool.Free(*t.Release(2)).ok());
  expired = t.Expire(kT0 + absl::Seconds(5));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].lease.id, 4u);
  ASSERT_TRUE(pool.Free(expired[0].blocks).ok());
  EXPECT_EQ(t.size(), 0u);
  EXPECT_TRUE(pool.NoneInUse());
}

}  // namespace
}  // namespace tandem
