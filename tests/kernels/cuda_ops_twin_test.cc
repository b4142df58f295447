// The ABI-2 CUDA kernels (kernels/cuda/{embedding,kv_cache,paged_attention,sampler}.cu) against
// their CPU twins. Skipped where no GPU (or no CUDA library) is present; scripts/gpu_check.sh
// runs them on a machine with one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "engine/kv/kv_cache.h"
#include "engine/model_config.h"
#include "engine/sampling/sampler.h"
#include "kernels/backend_loader.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dtype.h"
#include "kv_transfer/kv_pack.h"
#include "tests/kernels/cuda_device_test.h"

namespace tandem {
namespace {

class CudaOpsTwinTest : public testing::CudaDeviceTest {
 protected:
  // The decode kernel against cpu::PagedAttention for one head shape.
  void DecodeAttentionCases(int n_heads, int n_kv, int hd);
};

TEST_F(CudaOpsTwinTest, EmbeddingF32AndBf16ExactAndBadIdsFlagged) {
  const int rows = 1000, cols = 4096;
  std::vector<float> table = Random(static_cast<size_t>(rows) * cols, 1);
  std::vector<uint16_t> table_bf16(table.size());
  for (size_t i = 0; i < table.size(); ++i) table_bf16[i] = F32ToBf16(table[i]);
  std::vector<int> ids = {0, 999, 17, 17, 512};
  const int n = ids.size();
  int* d_ids = Upload(ids);
  int* d_bad = Upload(std::vector<int>{0});
  for (int dtype : {0, 2}) {
    const void* host = dtype == 0 ? static_cast<const void*>(table.data()) : table_bf16.data();
    const void* dev = dtype == 0 ? static_cast<const void*>(Upload(table)) : Upload(table_bf16);
    std::vector<float> ref(static_cast<size_t>(n) * cols);
    cpu::Embedding(ids.data(), WeightRef{static_cast<DType>(dtype), host, rows, cols}, ref.data(),
                   n);
    float* d_out = static_cast<float*>(Alloc(ref.size() * 4));
    ASSERT_EQ(api_->embedding(d_ids, dtype, dev, rows, cols, d_out, n, d_bad), 0)
        << api_->last_error();
    EXPECT_EQ(Download(d_out, ref.size()), ref);  // a copy / exact conversion: bit-equal
  }
  EXPECT_EQ(Download(d_bad, 1)[0], 0);
  int* d_bad_ids = Upload(std::vector<int>{3, 1000});
  float* d_out = static_cast<float*>(Alloc(2 * cols * 4));
  ASSERT_EQ(api_->embedding(d_bad_ids, 0, Upload(table), rows, cols, d_out, 2, d_bad), 0);
  EXPECT_EQ(Download(d_bad, 1)[0], 1);
  EXPECT_NE(api_->embedding(d_ids, 7, Upload(table), rows, cols, d_out, 1, d_bad), 0);
  EXPECT_NE(std::string(api_->last_error()).find("dtype"), std::string::npos);
}

TEST_F(CudaOpsTwinTest, WriteKvMatchesCpuBothPaths) {
  const int slots = 64 * 16;
  for (int width : {512, 130}) {  // float4 path and the scalar one (width % 4 != 0)
    const int n = 37;
    auto k = Random(static_cast<size_t>(n) * width, 2),
         v = Random(static_cast<size_t>(n) * width, 3);
    std::vector<int> slot(slots);
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), std::mt19937(4));
    slot.resize(n);
    std::vector<float> kc(static_cast<size_t>(slots) * width, 0.f), vc = kc;
    float* d_kc = Upload(kc);
    float* d_vc = Upload(vc);
    cpu::WriteKv(k.data(), v.data(), slot.data(), n, width, kc.data(), vc.data());
    ASSERT_EQ(api_->write_kv(Upload(k), Upload(v), Upload(slot), n, width, d_kc, d_vc), 0)
        << api_->last_error();
    EXPECT_EQ(Download(d_kc, kc.size()), kc);
    EXPECT_EQ(Download(d_vc, vc.size()), vc);
  }
}

TEST_F(CudaOpsTwinTest, PackUnpackMatchGatherAndScatterKv) {
  ModelConfig config;
  config.n_layers = 1;
  config.n_heads = 8;
  config.n_kv_heads = 2;
  config.head_dim = 64;
  const int num_blocks = 40, block_size = 16, width = config.kv_dim();
  auto cache = KvCache::Create(config, num_blocks, block_size);
  ASSERT_TRUE(cache.ok());
  const size_t floats = static_cast<size_t>(num_blocks) * block_size * width;
  auto kh = Random(floats, 5), vh = Random(floats, 6);
  std::copy(kh.begin(), kh.end(), cache->k(0));
  std::copy(vh.begin(), vh.end(), cache->v(0));
  std::vector<int> table = {7, 3, 39, 0, 12, 5};  // 96 tokens
  const int start = 10, count = 70;
  auto ref = GatherKv(*cache, 0, table, start, count);
  ASSERT_TRUE(ref.ok());
  float* d_wire = static_cast<float*>(Alloc(ref->size()));
  ASSERT_EQ(
      api_->pack_kv(Upload(kh), Upload(vh), Upload(table), block_size, width, start, count, d_wire),
      0)
      << api_->last_error();
  auto wire = Download(d_wire, ref->size() / 4);
  ASSERT_EQ(wire.size() * 4, ref->size());
  EXPECT_EQ(std::memcmp(wire.data(), ref->data(), ref->size()), 0);

  // Unpack into another cache with its own blocks; ScatterKv is the twin.
  auto dst = KvCache::Create(config, num_blocks, block_size);
  std::fill(dst->k(0), dst->k(0) + floats, 0.f);
  std::fill(dst->v(0), dst->v(0) + floats, 0.f);
  std::vector<int> table2 = {1, 2, 30, 31, 32, 33};
  const KvChunkHeader h = MakeKvChunkHeader(*cache, 1, 0, start, count);
  ASSERT_TRUE(ScatterKv(*ref, h, table2, &*dst).ok());
  float* d_k2 = Upload(std::vector<float>(floats, 0.f));
  float* d_v2 = Upload(std::vector<float>(floats, 0.f));
  ASSERT_EQ(api_->unpack_kv(d_wire, Upload(table2), block_size, width, start, count, d_k2, d_v2),
            0);
  EXPECT_EQ(Download(d_k2, floats), std::vector<float>(dst->k(0), dst->k(0) + floats));
  EXPECT_EQ(Download(d_v2, floats), std::vector<float>(dst->v(0), dst->v(0) + floats));
}

struct AttnCase {
  int block_size;
  std::vector<int> contexts;  // one decode token per sequence, at position context - 1
  int window = 0;
};

struct HeadShape {
  int n_heads, n_kv, hd;
};

// Groups of 4 (Llama 3), 12 (more than one thread block's 8: two head chunks) and 1 (MHA), head
// dims 128, 64 and 256.
TEST_F(CudaOpsTwinTest, PagedAttentionDecodeGqaSplitK) {
  for (const HeadShape& shape :
       {HeadShape{8, 2, 128}, HeadShape{12, 1, 64}, HeadShape{4, 4, 256}}) {
    SCOPED_TRACE(::testing::Message() << "n_heads " << shape.n_heads << " n_kv " << shape.n_kv);
    DecodeAttentionCases(shape.n_heads, shape.n_kv, shape.hd);
  }
}

void CudaOpsTwinTest::DecodeAttentionCases(int n_heads, int n_kv, int hd) {
  const int width = n_kv * hd;
  for (const AttnCase& c : {AttnCase{16, {1, 17, 300, 1000}}, AttnCase{64, {64, 2049, 32768}},
                            AttnCase{16, {5000, 700}, 512}}) {
    const int seqs = c.contexts.size();
    const int max_ctx = *std::max_element(c.contexts.begin(), c.contexts.end());
    const int max_blocks = (max_ctx + c.block_size - 1) / c.block_size;
    const int num_blocks = seqs * max_blocks;
    // Blocks handed out shuffled, as a block pool does after churn.
    std::vector<int> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(c.block_size));
    std::vector<int> tables(ids);
    const size_t cache_floats = static_cast<size_t>(num_blocks) * c.block_size * width;
    auto kc = Random(cache_floats, 7), vc = Random(cache_floats, 8);
    auto q = Random(static_cast<size_t>(seqs) * n_heads * hd, 9);
    std::vector<int> tok_pos(seqs);
    for (int s = 0; s < seqs; ++s) tok_pos[s] = c.contexts[s] - 1;
    const int span = c.window > 0 ? std::min(c.window, max_ctx) : max_ctx;
    const DecodeRun run = DecodeVsCpu(n_heads, n_kv, hd, c.block_size, max_blocks, span, c.window,
                                      tables, tok_pos, kc, vc, q);
    ASSERT_EQ(run.rc, 0) << api_->last_error();
    // Tolerance: fp32 dot products of 128 terms and up to 32k-term weighted sums accumulated in
    // another order (split-K, __expf); the normalized error stays near 1e-6, 1e-4 is ample
    // while still catching a wrong position, head or block (errors of order 1).
    EXPECT_LT(run.error, 1e-4) << "block_size " << c.block_size << " max context " << max_ctx;
    // A too-small workspace is refused with a clear error.
    EXPECT_NE(DecodeVsCpu(n_heads, n_kv, hd, c.block_size, max_blocks, span, c.window, tables,
                          tok_pos, kc, vc, q, /*shortfall=*/4)
                  .rc,
              0);
    EXPECT_NE(std::string(api_->last_error()).find("workspace"), std::string::npos);
  }
}

TEST_F(CudaOpsTwinTest, SamplerDrawsTheCpuToken) {
  const int vocab = 32000, rows = 64;
  std::vector<SamplingParams> cases = {{.temperature = 0.f},
                                       {.temperature = 1.f},
                                       {.temperature = 0.7f, .top_k = 40},
                                       {.temperature = 1.f, .top_p = 0.9f},
                                       {.temperature = 1.3f, .top_k = 50, .top_p = 0.8f},
                                       {.temperature = 0.5f, .top_k = 1}};
  int compared = 0, mismatched = 0;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    auto logits = Random(static_cast<size_t>(rows) * vocab, 100 + ci, 3.f);
    // Ties: some rows have duplicated maxima and blocks of equal logits.
    for (int i = 0; i < 50; ++i) logits[static_cast<size_t>(3) * vocab + i] = 9.f;
    std::vector<TandemSampleRowParams> params(rows);
    std::vector<int> want(rows);
    for (int r = 0; r < rows; ++r) {
      SamplingParams p = cases[ci];
      p.seed = 1000 * ci + r;
      const uint64_t position = 17 + r;
      params[r] = {p.temperature, p.top_k, p.top_p, p.seed, position};
      want[r] =
          Sample(std::span<const float>(logits.data() + static_cast<size_t>(r) * vocab, vocab), p,
                 position);
    }
    const size_t ws = api_->sample_workspace_bytes(rows, vocab);
    int* d_tokens = static_cast<int*>(Alloc(rows * 4));
    ASSERT_EQ(api_->sample(Upload(logits), rows, vocab, Upload(params), Alloc(ws), ws, d_tokens), 0)
        << api_->last_error();
    auto got = Download(d_tokens, rows);
    for (int r = 0; r < rows; ++r) {
      ++compared;
      if (got[r] != want[r]) {
        ++mismatched;
        ADD_FAILURE() << "case " << ci << " row " << r << ": gpu " << got[r] << " cpu " << want[r];
      }
    }
  }
  EXPECT_EQ(mismatched, 0) << "of " << compared;
}

}  // namespace
}  // namespace tandem
