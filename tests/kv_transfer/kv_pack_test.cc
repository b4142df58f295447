#include "kv_transfer/kv_pack.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "engine/kv/block_table.h"
#include "tests/kv_transfer/kv_test_util.h"

namespace tandem {
namespace {

using testing::FillPrompt;
using testing::HoldsPrompt;
using testing::KvShape;
using testing::KvValue;
using testing::MakeCache;

constexpr int kLayers = 3;
constexpr int kTokens = 37;  // not a multiple of either block size

class KvPackTest : public ::testing::Test {
 protected:
  KvPackTest()
      : config_(KvShape(kLayers, 2, 8)),
        src_(MakeCache(config_, 8, 16)),
        dst_(MakeCache(config_, 40, 4)) {
    src_table_ = {5, 2, 7};  // 3 blocks of 16 cover 37 tokens
    dst_table_.resize(40);
    std::iota(dst_table_.begin(), dst_table_.end(), 0);
    std::shuffle(dst_table_.begin(), dst_table_.end(), std::mt19937(3));
    dst_table_.resize(10);  // 10 blocks of 4 cover 37 tokens
    FillPrompt(&src_, src_table_, kTokens, /*seed=*/1);
  }

  ModelConfig config_;
  KvCache src_, dst_;
  std::vector<int> src_table_, dst_table_;
};

TEST_F(KvPackTest, PayloadIsKRowsThenVRows) {
  absl::StatusOr<std::string> p = GatherKv(src_, 1, src_table_, 14, 5);
  ASSERT_TRUE(p.ok()) << p.status();
  const int w = src_.width();
  ASSERT_EQ(p->size(), 2u * 5 * w * sizeof(float));
  std::vector<float> f(p->size() / sizeof(float));
  std::memcpy(f.data(), p->data(), p->size());
  for (int t = 0; t < 5; ++t) {
    for (int col = 0; col < w; ++col) {
      EXPECT_EQ(f[t * w + col], KvValue(1, 1, 0, 14 + t, col));
      EXPECT_EQ(f[(5 + t) * w + col], KvValue(1, 1, 1, 14 + t, col));
    }
  }
}

TEST_F(KvPackTest, DifferentBlockSizesRoundTrip) {
  for (int chunk : {1, 3, 16, 37}) {
    dst_ = MakeCache(config_, 40, 4);
    for (int l = 0; l < kLayers; ++l) {
      for (int start = 0; start < kTokens; start += chunk) {
        const int n = std::min(chunk, kTokens - start);
        absl::StatusOr<std::string> p = GatherKv(src_, l, src_table_, start, n);
        ASSERT_TRUE(p.ok()) << p.status();
        KvChunkHeader h = MakeKvChunkHeader(src_, 9, l, start, n);
        ASSERT_TRUE(ScatterKv(*p, h, dst_table_, &dst_).ok());
      }
    }
    EXPECT_TRUE(HoldsPrompt(dst_, dst_table_, kTokens, 1)) << "chunk " << chunk;
  }
}

// A model with sliding-window layers between full ones: each layer's rows go to its group's
// blocks, and a decode-side table that holds only the sliding layers' window takes exactly
// those rows (KvCacheSpec::KeepFrom) and refuses rows behind it.
TEST(KvPackGroupsTest, SlidingLayersMoveOnlyTheirWindow) {
  ModelConfig c = KvShape(3, 2, 8);
  c.sliding_window = 4;
  c.sliding_layers = {1, 0, 1};
  KvCache src = MakeCache(c, 12, 16);
  KvCache dst = MakeCache(c, 40, 4);
  ASSERT_EQ(src.spec().n_groups(), 3);
  const std::vector<int> src_table = ContiguousTable(src.spec().table_layout(), kTokens);
  const int w = src.width();
  auto rows = [&](int layer, int start, int n) {  // KvValue rows as a payload
    std::string p(2 * n * w * sizeof(float), '\0');
    std::vector<float> f(p.size() / sizeof(float));
    for (int kv = 0; kv < 2; ++kv) {
      for (int t = 0; t < n; ++t) {
        for (int col = 0; col < w; ++col) {
          f[(kv * n + t) * w + col] = KvValue(2, layer, kv, start + t, col);
        }
      }
    }
    std::memcpy(p.data(), f.data(), p.size());
    return p;
  };
  for (int l = 0; l < 3; ++l) {
    ASSERT_TRUE(
        ScatterKv(rows(l, 0, kTokens), MakeKvChunkHeader(src, 1, l, 0, kTokens), src_table, &src)
            .ok());
  }
  BlockPool pool(40);
  std::vector<int> dst_table;
  const KvTableLayout layout = dst.spec().table_layout();
  ASSERT_TRUE(GrowTable(layout, &pool, &dst_table, kTokens, kTokens + 1).ok());
  for (int l = 0; l < 3; ++l) {
    const int from = src.spec().KeepFrom(l, kTokens);
    EXPECT_EQ(from, l == 1 ? 0 : kTokens - 3);
    absl::StatusOr<std::string> p = GatherKv(src, l, src_table, from, kTokens - from);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, rows(l, from, kTokens - from)) << l;
    ASSERT_TRUE(
        ScatterKv(*p, MakeKvChunkHeader(src, 1, l, from, kTokens - from), dst_table, &dst).ok());
    absl::StatusOr<std::string> back = GatherKv(dst, l, dst_table, from, kTokens - from);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, *p) << l;
  }
  // Sliding layer 0's rows 0..31 have no block on the decode side.
  const absl::Status behind =
      ScatterKv(rows(0, 0, 4), MakeKvChunkHeader(src, 1, 0, 0, 4), dst_table, &dst);
  EXPECT_EQ(behind.code(), absl::StatusCode::kInvalidArgument) << behind;
  FreeTable(&pool, &dst_table);
  EXPECT_TRUE(pool.NoneInUse());
}

TEST_F(KvPackTest, GatherRejectsBadRanges) {
  using Code = absl::StatusCode;
  EXPECT_EQ(GatherKv(src_, -1, src_table_, 0, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(GatherKv(src_, kLayers, src_table_, 0, 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(GatherKv(src_, 0, src_table_, 0, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(GatherKv(src_, 0, src_table_, -1, 2).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(GatherKv(src_, 0, src_table_, 40, 9).status().code(), Code::kInvalidArgument);
  const std::vector<int> bad_block = {5, 99};
  EXPECT_EQ(GatherKv(src_, 0, bad_block, 0, 20).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(GatherKv(src_, 0, bad_block, 0, 16).ok());  // block 99 not touched
}

TEST_F(KvPackTest, ScatterRejectsBadChunksWithoutWriting) {
  using Code = absl::StatusCode;
  const std::string p = *GatherKv(src_, 0, src_table_, 0, 8);
  const KvChunkHeader good = MakeKvChunkHeader(src_, 9, 0, 0, 8);
  auto scatter = [&](KvChunkHeader h, std::span<const char> payload) {
    return ScatterKv(payload, h, dst_table_, &dst_).code();
  };
  KvChunkHeader h = good;
  h.dtype = DType::kF16;  // the cache stores f32: another dtype is refused
  EXPECT_EQ(scatter(h, p), Code::kFailedPrecondition);
  h = good;
  h.width = 8;
  EXPECT_EQ(scatter(h, p), Code::kInvalidArgument);
  h = good;
  h.layer = kLayers;
  EXPECT_EQ(scatter(h, p), Code::kInvalidArgument);
  h = good;
  h.token_start = 38;  // past the 10 blocks of 4
  EXPECT_EQ(scatter(h, p), Code::kInvalidArgument);
  EXPECT_EQ(scatter(good, std::span<const char>(p).first(p.size() - 4)), Code::kInvalidArgument);
  const std::vector<int> bad_block = {-3};
  h = good;
  h.token_count = 2;
  EXPECT_EQ(ScatterKv(std::span<const char>(p).first(2 * 2 * 16 * 4), h, bad_block, &dst_).code(),
            Code::kInvalidArgument);
  // Nothing was written: the destination is still all zeros.
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(std::all_of(dst_.k(l), dst_.k(l) + 40 * 4 * 16, [](float x) { return x == 0; }));
    EXPECT_TRUE(std::all_of(dst_.v(l), dst_.v(l) + 40 * 4 * 16, [](float x) { return x == 0; }));
  }
}

}  // namespace
}  // namespace tandem
