// The host side of a device forward step (engine/cuda/step_plan.h), on the CPU: buckets,
// padding, the packed metadata, attention tiles, validation messages, workspace sizing.
#include "engine/cuda/step_plan.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace tandem::cuda {
namespace {

StepLimits Limits() {
  StepLimits l;
  l.vocab_size = 100;
  l.max_seq_len = 64;
  l.num_blocks = 10;
  l.block_size = 4;
  l.max_batch_tokens = 300;
  l.max_seqs = 256;
  l.max_logit_rows = 300;
  return l;
}

TEST(StepPlanTest, DecodeBuckets) {
  EXPECT_EQ(DecodeBucket(0), -1);
  EXPECT_EQ(DecodeBucket(1), 1);
  EXPECT_EQ(DecodeBucket(2), 2);
  EXPECT_EQ(DecodeBucket(3), 4);
  EXPECT_EQ(DecodeBucket(8), 8);
  EXPECT_EQ(DecodeBucket(9), 16);
  EXPECT_EQ(DecodeBucket(65), 128);
  EXPECT_EQ(DecodeBucket(256), 256);
  EXPECT_EQ(DecodeBucket(257), -1);
}

TEST(StepPlanTest, ContextBuckets) {
  StepLimits l = Limits();
  l.block_size = 16;
  l.max_seq_len = 131072;
  EXPECT_EQ(ContextBucket(1, l), 512);
  EXPECT_EQ(ContextBucket(512, l), 512);
  EXPECT_EQ(ContextBucket(513, l), 1024);
  EXPECT_EQ(ContextBucket(100000, l), 131072);
  EXPECT_EQ(ContextBucket(131072, l), 131072);
  l.max_seq_len = 8200;  // capacity 513 blocks = 8208 positions
  EXPECT_EQ(ContextBucket(5000, l), 8192);
  EXPECT_EQ(ContextBucket(8200, l), 8208);
  l.block_size = 48;  // buckets are whole blocks
  l.max_seq_len = 4096;
  EXPECT_EQ(ContextBucket(600, l), 1056);
}

TEST(StepPlanTest, TilesSplitChunksAtTileSizeAndSequenceBoundaries) {
  std::vector<int> seq;
  for (int i = 0; i < 70; ++i) seq.push_back(0);  // 32 + 32 + 6
  for (int i = 0; i < 3; ++i) seq.push_back(1);
  seq.push_back(2);
  std::vector<int32_t> tiles;
  BuildAttentionTiles(seq, &tiles);
  EXPECT_EQ(tiles, (std::vector<int32_t>{0, 32, 32, 32, 64, 6, 70, 3, 73, 1}));
}

TEST(StepPlanTest, MixedBatchPacksEveryArray) {
  // Chunk 0: prefill of 5 tokens from position 2 (a prefix hit), all logits; chunk 1: decode.
  const std::vector<int> t0 = {11, 12, 13, 14, 15}, b0 = {7, 3};
  const std::vector<int> t1 = {42}, b1 = {5, 6, 9};
  std::vector<StepChunk> batch(2);
  batch[0] = {t0, 2, b0, true};
  batch[1] = {t1, 9, b1, false};
  StepPlan p;
  ASSERT_EQ(PlanStep(batch, Limits(), /*pad_decode=*/true, &p), "");
  EXPECT_FALSE(p.decode_only);
  EXPECT_EQ(p.num_tokens, 6);
  EXPECT_EQ(p.num_real_tokens, 6);
  EXPECT_EQ(p.num_seqs, 2);
  EXPECT_EQ(p.num_rows, 6);
  EXPECT_EQ(p.num_real_rows, 6);
  EXPECT_EQ(p.max_context, 10);
  ASSERT_EQ(p.num_tiles, 2);
  const StepLayout& L = p.layout;
  const int32_t* m = p.meta.data();
  ASSERT_EQ(static_cast<int>(p.meta.size()), L.total);
  EXPECT_EQ(std::vector<int>(m + L.ids, m + L.ids + 6), (std::vector<int>{11, 12, 13, 14, 15, 42}));
  EXPECT_EQ(std::vector<int>(m + L.token_seq, m + L.token_seq + 6),
            (std::vector<int>{0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(std::vector<int>(m + L.token_pos, m + L.token_pos + 6),
            (std::vector<int>{2, 3, 4, 5, 6, 9}));
  // Positions 2, 3 in block 7 (slots 30, 31), 4..6 in block 3 (12..14); 9 in block 9 (37).
  EXPECT_EQ(std::vector<int>(m + L.slots, m + L.slots + 6),
            (std::vector<int>{30, 31, 12, 13, 14, 37}));
  EXPECT_EQ(std::vector<int>(m + L.logit_rows, m + L.logit_rows + 6),
            (std::vector<int>{0, 1, 2, 3, 4, 5}));
  // Not a graph step: the tables are as wide as the longest chunk needs (positions < 10).
  EXPECT_EQ(p.context_bucket, 0);
  const int stride = p.table_stride;
  EXPECT_EQ(stride, 3);
  EXPECT_EQ(m[L.block_tables + 0], 7);
  EXPECT_EQ(m[L.block_tables + 1], 3);
  EXPECT_EQ(m[L.block_tables + 2], 10);  // beyond the chunk: the pad block
  EXPECT_EQ(m[L.block_tables + stride + 2], 9);
  EXPECT_EQ(std::vector<int>(m + L.tiles, m + L.tiles + 4), (std::vector<int>{0, 5, 5, 1}));
  // FlashInfer's page lists: rows [0, 5) and [5, 6); positions 0..6 in pages 7, 3 (the last
  // holding 3), positions 0..9 in pages 5, 6, 9 (the last holding 2).
  auto ints = [m](int at, int n) { return std::vector<int>(m + at, m + at + n); };
  EXPECT_EQ(ints(L.fi_q_indptr, 3), (std::vector<int>{0, 5, 6}));
  EXPECT_EQ(ints(L.fi_kv_indptr, 3), (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(ints(L.fi_last_page_len, 2), (std::vector<int>{3, 2}));
  EXPECT_EQ(ints(L.fi_kv_indices, 5), (std::vector<int>{7, 3, 5, 6, 9}));
}

// The page lists alone: a context ending exactly at a block's end keeps that block as its last
// page (full), one position into a block starts a page; rows follow the chunks' token counts.
TEST(StepPlanTest, FlashInferPageListsFollowEachContext) {
  const std::vector<int32_t> tables = {4, 1, 8, 0,  //
                                       2, 9, 0, 0,  //
                                       6, 0, 0, 0};
  FiPageLists f;
  BuildFiPageLists(std::vector<int>{8, 1, 1}, std::vector<int>{0, 4, 0}, tables.data(), 4, 4, &f);
  EXPECT_EQ(f.q_indptr, (std::vector<int32_t>{0, 8, 9, 10}));
  EXPECT_EQ(f.kv_indptr, (std::vector<int32_t>{0, 2, 4, 5}));
  EXPECT_EQ(f.kv_last_page_len, (std::vector<int32_t>{4, 1, 1}));
  EXPECT_EQ(f.kv_indices, (std::vector<int32_t>{4, 1, 2, 9, 6}));
}

TEST(StepPlanTest, DecodeStepIsPaddedToItsBucketWithPadBlockTokens) {
  const std::vector<int> tok = {1, 2, 3}, table = {4, 5};
  std::vector<StepChunk> batch(3);
  for (int s = 0; s < 3; ++s) {
    batch[s] = {std::span<const int>(&tok[s], 1), 4 + s, table, false};
  }
  StepPlan p;
  ASSERT_EQ(PlanStep(batch, Limits(), true, &p), "");
  EXPECT_TRUE(p.decode_only);
  EXPECT_EQ(p.num_tokens, 4);
  EXPECT_EQ(p.num_real_tokens, 3);
  EXPECT_EQ(p.num_seqs, 4);
  EXPECT_EQ(p.num_rows, 4);
  EXPECT_EQ(p.num_real_rows, 3);
  EXPECT_EQ(p.num_tiles, 0);
  // A graph step: context bucket 512 capped at the capacity of 64 positions, 16 blocks a row.
  EXPECT_EQ(p.context_bucket, 64);
  EXPECT_EQ(p.table_stride, 16);
  // The layout is that of the buckets alone, the same at every step of these buckets.
  const StepLayout want = MakeStepLayout(4, 4, 4, 0, Limits().max_blocks_per_seq());
  EXPECT_EQ(p.layout.total, want.total);
  EXPECT_EQ(p.layout.block_tables, want.block_tables);
  const int32_t* m = p.meta.data();
  const StepLayout& L = p.layout;
  EXPECT_EQ(m[L.ids + 3], 0);
  EXPECT_EQ(m[L.token_pos + 3], 0);
  EXPECT_EQ(m[L.token_seq + 3], 3);
  EXPECT_EQ(m[L.slots + 3], 10 * 4);  // slot 0 of the pad block
  EXPECT_EQ(m[L.block_tables + 3 * Limits().max_blocks_per_seq()], 10);
  EXPECT_EQ(m[L.logit_rows + 3], 3);
  EXPECT_EQ(m[L.slots + 2], 5 * 4 + 2);  // position 6 -> block table[1] = 5, row 2
  // The padding row's page list: the pad block, one position; the real rows' two pages each.
  EXPECT_EQ(m[L.fi_kv_indptr + 4], 2 + 2 + 2 + 1);
  EXPECT_EQ(m[L.fi_last_page_len + 3], 1);
  EXPECT_EQ(m[L.fi_kv_indices + 6], 10);
  EXPECT_EQ(m[L.fi_q_indptr + 4], 4);

  // Without padding (graphs off) the step keeps its size.
  ASSERT_EQ(PlanStep(batch, Limits(), false, &p), "");
  EXPECT_EQ(p.num_tokens, 3);
  EXPECT_EQ(p.num_rows, 3);
  EXPECT_EQ(p.context_bucket, 0);
  EXPECT_EQ(p.table_stride, 2);  // positions up to 6
}

TEST(StepPlanTest, AboveTheLargestBucketIsNotPadded) {
  StepLimits lim = Limits();
  lim.max_batch_tokens = 400;
  lim.max_seqs = 400;
  lim.max_logit_rows = 400;
  lim.num_blocks = 400;
  std::vector<int> tok(300, 1), table(300);
  std::iota(table.begin(), table.end(), 0);
  std::vector<StepChunk> batch(300);
  for (int s = 0; s < 300; ++s) batch[s] = {std::span<const int>(&tok[s], 1), 0, {&table[s], 1}};
  StepPlan p;
  ASSERT_EQ(PlanStep(batch, lim, true, &p), "");
  EXPECT_TRUE(p.decode_only);
  EXPECT_EQ(p.num_tokens, 300);
}

TEST(StepPlanTest, BadChunksAreRejectedNamingTheField) {
  const std::vector<int> ok = {1, 2}, table = {0};
  StepPlan p;
  std::vector<StepChunk> batch(1);
  EXPECT_EQ(PlanStep({}, Limits(), true, &p), "forward: empty batch");
  batch[0] = {{}, 0, table};
  EXPECT_NE(PlanStep(batch, Limits(), true, &p).find("has no tokens"), std::string::npos);
  const std::vector<int> bad_tok = {1, 100};
  batch[0] = {bad_tok, 0, table};
  EXPECT_NE(PlanStep(batch, Limits(), true, &p).find("token id 100 outside"), std::string::npos);
  batch[0] = {ok, 63, {}};
  EXPECT_NE(PlanStep(batch, Limits(), true, &p).find("exceed the context length 64"),
            std::string::npos);
  batch[0] = {ok, 3, table};  // positions 3, 4 need two blocks
  EXPECT_NE(PlanStep(batch, Limits(), true, &p).find("blocks cover fewer than 5"),
            std::string::npos);
  const std::vector<int> bad_table = {0, 10};
  batch[0] = {ok, 3, bad_table};
  EXPECT_NE(PlanStep(batch, Limits(), true, &p).find("block id 10 out of range"),
            std::string::npos);
  StepLimits small = Limits();
  small.max_batch_tokens = 1;
  batch[0] = {ok, 0, table};
  EXPECT_NE(PlanStep(batch, small, true, &p).find("max_batch_tokens"), std::string::npos);
  // Three decode sequences would pad to 4, over max_seqs 3: they run unpadded instead.
  small = Limits();
  small.max_seqs = 3;
  std::vector<StepChunk> three(3, StepChunk{{&ok[0], 1}, 0, table});
  EXPECT_EQ(PlanStep(three, small, true, &p), "");
  EXPECT_EQ(p.num_tokens, 3);
  small.max_seqs = 2;
  EXPECT_NE(PlanStep(three, small, true, &p).find("3 sequences"), std::string::npos);
}

TEST(StepPlanTest, ModelDescValidation) {
  const float inv[2] = {1.f, 0.5f};
  TandemModelDesc d{};
  d.dim = 8;
  d.hidden_dim = 16;
  d.n_layers = 1;
  d.n_heads = 2;
  d.n_kv_heads = 1;
  d.head_dim = 4;
  d.vocab_size = 10;
  d.max_seq_len = 32;
  d.norm_eps = 1e-5f;
  d.rope_inv_freq = inv;
  d.num_blocks = 4;
  d.block_size = 16;
  d.max_batch_tokens = 64;
  d.max_seqs = 8;
  d.max_logit_rows = 64;
  EXPECT_EQ(ValidateModelDesc(d), "");
  TandemModelDesc bad = d;
  bad.n_kv_heads = 0;
  EXPECT_NE(ValidateModelDesc(bad).find("n_kv_heads"), std::string::npos);
  bad = d;
  bad.n_kv_heads = 3;
  EXPECT_NE(ValidateModelDesc(bad).find("multiple of n_kv_heads"), std::string::npos);
  bad = d;
  bad.head_dim = 512;
  EXPECT_NE(ValidateModelDesc(bad).find("head_dim"), std::string::npos);
  bad = d;
  bad.weight_dtype = 1;
  EXPECT_NE(ValidateModelDesc(bad).find("weight_dtype"), std::string::npos);
  bad = d;
  bad.max_seqs = 65;
  EXPECT_NE(ValidateModelDesc(bad).find("max_seqs"), std::string::npos);
}

TEST(StepPlanTest, WorkspaceRegionsAreAlignedDisjointAndSized) {
  WorkspaceShape s;
  s.dim = 4096;
  s.hidden_dim = 14336;
  s.q_dim = 4096;
  s.kv_dim = 1024;
  s.n_heads = 32;
  s.head_dim = 128;
  s.vocab_size = 128256;
  s.bf16_weights = true;
  StepLimits l = Limits();
  l.max_seq_len = 8192;
  l.block_size = 16;
  l.max_batch_tokens = 512;
  l.max_logit_rows = 256;
  const WorkspaceLayout w = MakeWorkspaceLayout(s, l, 1000, 2000, 32);
  const std::vector<std::pair<size_t, size_t>> regions = {
      {w.x, 512 * 4096 * 4},    {w.xb, 512 * 4096 * 4},
      {w.q, 512 * 4096 * 4},    {w.k, 512 * 1024 * 4},
      {w.v, 512 * 1024 * 4},    {w.att, 512 * 4096 * 4},
      {w.hb, 512 * 14336 * 4},  {w.hb2, 512 * 14336 * 4},
      {w.rows, 256 * 4096 * 4}, {w.logits, 256ull * 128256 * 4},
      {w.x16, 512 * 14336 * 2}, {w.attn, 1000},
      {w.sample, 2000},         {w.tokens, 256 * 4},
      {w.meta, w.meta_bytes},   {w.bad, 4}};
  for (size_t i = 0; i < regions.size(); ++i) {
    EXPECT_EQ(regions[i].first % 256, 0u) << i;
    const size_t end = regions[i].first + regions[i].second;
    EXPECT_LE(end, i + 1 < regions.size() ? regions[i + 1].first : w.total) << i;
  }
  EXPECT_EQ(w.meta_ints, static_cast<size_t>(MaxMetaInts(l)));
  EXPECT_EQ(w.meta_bytes, SampleParamsOffset(w.meta_ints) + 256 * 32);
  EXPECT_EQ(SampleParamsOffset(5) % 16, 0u);
  EXPECT_GE(SampleParamsOffset(5), 20u);
  // f32 weights need no bf16 copy of the GEMM input.
  s.bf16_weights = false;
  EXPECT_EQ(MakeWorkspaceLayout(s, l, 1000, 2000, 32).x16 + 0,
            MakeWorkspaceLayout(s, l, 1000, 2000, 32).attn);
}

TEST(StepPlanTest, EveryPlanFitsTheLargestMetadata) {
  StepLimits l = Limits();
  l.max_batch_tokens = 70;
  l.max_seqs = 3;
  l.max_logit_rows = 70;
  std::vector<int> tok(70, 1);
  const std::vector<int> table(16, 0);
  // Worst case for tiles: chunks of 33 + 33 + 4 tokens, all logits.
  std::vector<StepChunk> batch = {{{tok.data(), 33}, 0, table, true},
                                  {{tok.data(), 33}, 0, table, true},
                                  {{tok.data(), 4}, 0, table, true}};
  StepPlan p;
  ASSERT_EQ(PlanStep(batch, l, true, &p), "");
  EXPECT_EQ(p.num_tiles, 5);
  EXPECT_LE(static_cast<int>(p.meta.size()), MaxMetaInts(l));
}

}  // namespace
}  // namespace tandem::cuda
