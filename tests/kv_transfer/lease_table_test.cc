#include "kv_transfer/lease_table.h"

#include <gtest/gtest.h>

#include <set>

#include "engine/kv/block_pool.h"

namespace tandem {
namespace {

using Code = absl::StatusCode;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

// A chunk of layer `layer`, tokens [start, start + count), for `lease`.
KvChunkHeader Chunk(const Lease& lease, uint32_t layer, uint32_t start, uint32_t count) {
  KvChunkHeader h;
  h.lease_id = lease.id;
  h.generation = lease.generation;
  h.capability = lease.capability;
  h.layer = layer;
  h.token_start = start;
  h.token_count = count;
  return h;
}

TEST(LeaseTableTest, CompleteWhenEveryLayerAndTokenCovered) {
  LeaseTable t;
  Lease l = *t.Create({3, 1}, /*num_tokens=*/10, /*n_layers=*/2, kT0);
  EXPECT_NE(l.id, 0u);
  EXPECT_EQ(l.capability.size(), kKvCapabilityBytes);
  EXPECT_TRUE(t.OnChunk(Chunk(l, 0, 0, 4)).ok());
  EXPECT_TRUE(t.OnChunk(Chunk(l, 0, 4, 6)).ok());
  EXPECT_FALSE(t.IsComplete(l.id));
  // Out of order, overlapping and duplicate chunks are merged.
  EXPECT_TRUE(t.OnChunk(Chunk(l, 1, 6, 4)).ok());
  EXPECT_TRUE(t.OnChunk(Chunk(l, 1, 2, 5)).ok());
  EXPECT_TRUE(t.OnChunk(Chunk(l, 1, 2, 5)).ok());
  EXPECT_FALSE(t.IsComplete(l.id));
  EXPECT_TRUE(t.OnChunk(Chunk(l, 1, 0, 1)).ok());
  EXPECT_FALSE(t.IsComplete(l.id));  // token 1 of layer 1 missing
  EXPECT_TRUE(t.OnChunk(Chunk(l, 1, 1, 1)).ok());
  EXPECT_TRUE(t.IsComplete(l.id));
  // Once complete the decode may read the blocks: no more writes.
  EXPECT_EQ(t.OnChunk(Chunk(l, 0, 0, 4)).code(), Code::kFailedPrecondition);
  absl::StatusOr<std::vector<int>> blocks = t.Release(l.id);
  ASSERT_TRUE(blocks.ok());
  EXPECT_EQ(*blocks, (std::vector<int>{3, 1}));
  EXPECT_EQ(t.size(), 0u);
}

TEST(LeaseTableTest, RejectsChunksOutsideThePrompt) {
  LeaseTable t;
  Lease l = *t.Create({0}, 10, 2, kT0);
  EXPECT_EQ(t.OnChunk(Chunk(l, 2, 0, 1)).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.OnChunk(Chunk(l, 0, 8, 3)).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.OnChunk(Chunk(l, 0, 0, 0)).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.OnChunk(Chunk(l, 0, 0xFFFFFFFFu, 2)).code(), Code::kInvalidArgument);
  absl::StatusOr<std::span<const int>> blocks = t.CheckChunk(Chunk(l, 1, 0, 10));
  ASSERT_TRUE(blocks.ok());
  EXPECT_EQ(blocks->size(), 1u);
  EXPECT_FALSE(t.IsComplete(l.id));  // CheckChunk records nothing
  EXPECT_TRUE(t.Release(l.id).ok());
  EXPECT_EQ(t.size(), 0u);
}

// A sliding-window layer's KV is expected from its window on (KvCacheSpec::KeepFrom).
TEST(LeaseTableTest, ALayerMayStartAtItsWindow) {
  LeaseTable t;
  auto l = t.Create({0, 1, 2}, 10, std::vector<int>{0, 6}, absl::InfiniteFuture());
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(t.OnChunk(Chunk(*l, 0, 0, 10)).ok());
  const absl::Status early = t.OnChunk(Chunk(*l, 1, 5, 5));
  EXPECT_EQ(early.code(), Code::kInvalidArgument);
  EXPECT_NE(early.message().find("layer 1 outside [6, 10)"), std::string::npos) << early;
  EXPECT_FALSE(t.IsComplete(l->id));
  EXPECT_TRUE(t.OnChunk(Chunk(*l, 1, 6, 4)).ok());
  EXPECT_TRUE(t.IsComplete(l->id));
  EXPECT_EQ(t.Create({0}, 10, std::vector<int>{0, 10}, absl::InfiniteFuture()).status().code(),
            Code::kInvalidArgument);
}

TEST(LeaseTableTest, CreateValidatesAndDrawsUnguessableNames) {
  LeaseTable t;
  EXPECT_EQ(t.Create({}, 0, 2, kT0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(t.Create({}, 4, 0, kT0).status().code(), Code::kInvalidArgument);
  // Ids and capabilities are random: no two alike, ids not in sequence, generations increasing.
  std::set<uint64_t> ids;
  std::set<std::string> capabilities;
  uint32_t last_generation = 0;
  std::vector<Lease> leases;
  for (int i = 0; i < 200; ++i) {
    Lease l = *t.Create({i}, 4, 1, kT0);
    ids.insert(l.id);
    capabilities.insert(l.capability);
    EXPECT_GT(l.generation, last_generation);
    last_generation = l.generation;
    leases.push_back(l);
  }
  EXPECT_EQ(ids.size(), 200u);
  EXPECT_EQ(capabilities.size(), 200u);
  int consecutive = 0;
  for (size_t i = 1; i < leases.size(); ++i) consecutive += leases[i].id == leases[i - 1].id + 1;
  EXPECT_EQ(consecutive, 0);
  for (const Lease& l : leases) EXPECT_TRUE(t.Release(l.id).ok());
  EXPECT_EQ(t.size(), 0u);
}

// A chunk without the lease's capability, for an unknown lease or an earlier lease of a resumed
// request: one refusal, the same words, so a writer learns nothing about which leases exist.
TEST(LeaseTableTest, WrongCapabilityUnknownLeaseAndStaleWriterGetOneAnswer) {
  LeaseTable t;
  Lease first = *t.Create({1, 2}, 8, 1, kT0);
  ASSERT_TRUE(t.OnChunk(Chunk(first, 0, 0, 4)).ok());
  ASSERT_TRUE(t.Release(first.id).ok());
  // The request is resumed here: a new lease.
  Lease second = *t.Create({2, 5}, 8, 1, kT0);
  EXPECT_NE(second.id, first.id);
  EXPECT_NE(second.capability, first.capability);

  const absl::Status stale = t.OnChunk(Chunk(first, 0, 4, 4));
  KvChunkHeader forged = Chunk(second, 0, 0, 8);
  forged.capability[5] ^= 0x10;
  KvChunkHeader no_capability = Chunk(second, 0, 0, 8);
  no_capability.capability.clear();
  KvChunkHeader old_generation = Chunk(second, 0, 0, 8);
  old_generation.generation = first.generation;
  KvChunkHeader unknown = Chunk(second, 0, 0, 8);
  unknown.lease_id ^= 1;
  EXPECT_EQ(stale.code(), Code::kAborted) << stale;
  for (const KvChunkHeader& h : {forged, no_capability, old_generation, unknown}) {
    const absl::Status s = t.OnChunk(h);
    EXPECT_EQ(s, stale);
    EXPECT_EQ(t.CheckChunk(h).status(), stale);
  }
  EXPECT_FALSE(t.IsComplete(second.id));  // nothing forged was recorded
  EXPECT_TRUE(t.OnChunk(Chunk(second, 0, 0, 8)).ok());
  EXPECT_TRUE(t.IsComplete(second.id));
  EXPECT_TRUE(t.Release(second.id).ok());
  EXPECT_EQ(t.size(), 0u);
}

TEST(LeaseTableTest, ReleaseExactlyOnce) {
  LeaseTable t;
  Lease l = *t.Create({4, 5, 6}, 40, 2, kT0);
  EXPECT_EQ(t.Release(l.id)->size(), 3u);
  EXPECT_EQ(t.Release(l.id).status().code(), Code::kNotFound);
  EXPECT_EQ(t.Release(l.id + 1).status().code(), Code::kNotFound);
  EXPECT_EQ(t.size(), 0u);
}

TEST(LeaseTableTest, ExpireFreesExactlyTheIncompleteLeasesPastDeadline) {
  BlockPool pool(16);
  LeaseTable t;
  auto create = [&](absl::Duration deadline) {
    return *t.Create(*pool.Allocate(2), 8, 2, kT0 + deadline);
  };
  Lease l1 = create(absl::Seconds(1));       // incomplete, past deadline: expires
  Lease done = create(absl::Seconds(1));     // complete, past deadline: kept
  Lease partial = create(absl::Seconds(1));  // half done, past deadline: expires
  Lease l4 = create(absl::Seconds(5));       // incomplete, deadline ahead: kept
  for (uint32_t layer = 0; layer < 2; ++layer)
    ASSERT_TRUE(t.OnChunk(Chunk(done, layer, 0, 8)).ok());
  ASSERT_TRUE(t.OnChunk(Chunk(partial, 0, 0, 8)).ok());
  EXPECT_EQ(pool.num_in_use(), 8);

  EXPECT_TRUE(t.Expire(kT0).empty());
  std::vector<ExpiredLease> expired = t.Expire(kT0 + absl::Seconds(2));
  ASSERT_EQ(expired.size(), 2u);
  const std::set<uint64_t> got = {expired[0].lease.id, expired[1].lease.id};
  EXPECT_EQ(got, (std::set<uint64_t>{l1.id, partial.id}));
  EXPECT_LT(expired[0].lease.id, expired[1].lease.id);  // in id order
  for (const ExpiredLease& e : expired) {
    EXPECT_EQ(e.blocks.size(), 2u);
    ASSERT_TRUE(pool.Free(e.blocks).ok());
  }
  EXPECT_EQ(t.size(), 2u);
  // An expired lease is gone: its writer is refused and a second Release finds nothing.
  EXPECT_EQ(t.OnChunk(Chunk(partial, 1, 0, 8)).code(), Code::kAborted);
  EXPECT_EQ(t.Release(l1.id).status().code(), Code::kNotFound);

  ASSERT_TRUE(pool.Free(*t.Release(done.id)).ok());
  expired = t.Expire(kT0 + absl::Seconds(5));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].lease.id, l4.id);
  ASSERT_TRUE(pool.Free(expired[0].blocks).ok());
  EXPECT_EQ(t.size(), 0u);
  EXPECT_TRUE(pool.NoneInUse());
}

}  // namespace
}  // namespace tandem
