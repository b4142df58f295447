// The ABI-3 kernels against their CPU twins: the cuBLAS GEMM (kernels/cuda/gemm.cu) against
// cpu::Matmul and the tiled prefill attention (kernels/cuda/prefill_attention.cu) against
// cpu::PagedAttention. Skipped where no GPU (or no CUDA library) is present; scripts/gpu_check.sh
// runs them on a machine with one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

#include "engine/cuda/step_plan.h"
#include "kernels/backend_loader.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dtype.h"
#include "tests/kernels/cuda_device_test.h"

namespace tandem {
namespace {

class CudaGemmAttentionTwinTest : public testing::CudaDeviceTest {};

// Shapes: decode-like n = 1 and 2 (bf16: our GEMV) and 8, odd sizes that are no multiple of any
// tile (cuBLAS), a Llama-ish block (cuBLAS).
TEST_F(CudaGemmAttentionTwinTest, GemmF32AndBf16WithAndWithoutBias) {
  struct Shape {
    int n, rows, cols;
  };
  for (Shape sh : {Shape{1, 512, 256}, Shape{2, 2048, 1024}, Shape{8, 1000, 4096},
                   Shape{7, 333, 129}, Shape{64, 1024, 4096}}) {
    const auto x = Random(static_cast<size_t>(sh.n) * sh.cols, 1);
    const auto w = Random(static_cast<size_t>(sh.rows) * sh.cols, 2, 0.05f);
    const auto bias = Random(sh.rows, 3);
    std::vector<uint16_t> w16(w.size());
    for (size_t i = 0; i < w.size(); ++i) w16[i] = F32ToBf16(w[i]);
    float* d_x = Upload(x);
    float* d_bias = Upload(bias);
    float* d_y = static_cast<float*>(Alloc(static_cast<size_t>(sh.n) * sh.rows * 4));
    for (int dtype : {0, 2}) {
      for (bool with_bias : {false, true}) {
        WeightRef ref{dtype == 0 ? DType::kF32 : DType::kBF16,
                      dtype == 0 ? static_cast<const void*>(w.data()) : w16.data(), sh.rows,
                      sh.cols};
        std::vector<float> want(static_cast<size_t>(sh.n) * sh.rows);
        cpu::Matmul(x.data(), ref, with_bias ? bias.data() : nullptr, want.data(), sh.n);
        const void* d_w = dtype == 0 ? static_cast<const void*>(Upload(w)) : Upload(w16);
        const size_t ws_bytes = api_->gemm_workspace_bytes(sh.n, sh.cols, dtype);
        void* ws = ws_bytes > 0 ? Alloc(ws_bytes) : nullptr;
        ASSERT_EQ(api_->gemm(d_x, dtype, d_w, with_bias ? d_bias : nullptr, d_y, sh.n, sh.rows,
                             sh.cols, ws, ws_bytes),
                  0)
            << api_->last_error();
        const double err = NormErr(Download(d_y, want.size()), want);
        // f32, and bf16 through the GEMV (n <= 2, cols % 8 == 0: x stays f32 as on the CPU):
        // full-precision products, only the summation order differs: ~1e-6 relative.
        // bf16 through cuBLAS: the GPU rounds x to bf16 (8 significant bits, relative error
        // <= 2^-9 per element) before the product, the CPU does not; over random signs the
        // errors partly cancel, leaving well under 1% of the largest output.
        const bool gemv = dtype == 2 && sh.n <= 2 && sh.cols % 8 == 0;
        const double tol = dtype == 0 || gemv ? 1e-4 : 1e-2;
        EXPECT_LT(err, tol) << "dtype " << dtype << " n " << sh.n << " rows " << sh.rows << " cols "
                            << sh.cols << " bias " << with_bias;
      }
    }
  }
}

TEST_F(CudaGemmAttentionTwinTest, GemmRejectsBadArguments) {
  float* d = static_cast<float*>(Alloc(64));
  EXPECT_NE(api_->gemm(d, 1, d, nullptr, d, 1, 4, 4, nullptr, 0), 0);
  EXPECT_NE(std::string(api_->last_error()).find("w_dtype"), std::string::npos);
  EXPECT_NE(api_->gemm(d, 2, d, nullptr, d, 1, 4, 4, nullptr, 0), 0);  // no bf16 workspace
  EXPECT_NE(api_->gemm(d, 0, d, nullptr, d, 1, 0, 4, nullptr, 0), 0);
}

struct AttnCase {
  int block_size;
  int n_heads, n_kv_heads, head_dim;
  int window;
  std::vector<std::pair<int, int>> chunks;  // (start_pos, new tokens)
};

// Chunks after a cached prefix (start_pos > 0), tiles not full, GQA, a sliding window, block
// sizes 16 and 64, head_dim 64 / 128 / 256 (the last above the default shared memory).
TEST_F(CudaGemmAttentionTwinTest, PrefillAttentionMatchesCpu) {
  const std::vector<AttnCase> cases = {
      {16, 4, 4, 64, 0, {{0, 37}}},
      {16, 8, 2, 128, 0, {{0, 100}, {45, 20}, {7, 1}}},
      {64, 8, 2, 128, 50, {{0, 130}, {200, 65}}},
      {16, 4, 1, 256, 0, {{10, 40}}},
      {64, 32, 8, 128, 0, {{3000, 96}}},
      // Long contexts: a chunk at the end of a 32k context, block sizes 16 and 64, and a
      // sliding window there.
      {16, 8, 2, 128, 0, {{32000, 40}}},
      {64, 8, 2, 128, 0, {{32700, 68}}},
      {16, 8, 2, 128, 4096, {{30000, 33}}},
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const AttnCase& c = cases[ci];
    const int width = c.n_kv_heads * c.head_dim;
    int max_end = 0, T = 0;
    for (auto [s, n] : c.chunks) {
      max_end = std::max(max_end, s + n);
      T += n;
    }
    const int mb = (max_end + c.block_size - 1) / c.block_size;
    const int S = static_cast<int>(c.chunks.size());
    const int num_blocks = S * mb;
    // Each sequence gets its blocks in a shuffled order.
    std::vector<int> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
    std::vector<int> tables(ids);  // [S, mb]
    std::vector<int> token_seq, token_pos;
    for (int s = 0; s < S; ++s) {
      for (int i = 0; i < c.chunks[s].second; ++i) {
        token_seq.push_back(s);
        token_pos.push_back(c.chunks[s].first + i);
      }
    }
    const auto kc = Random(static_cast<size_t>(num_blocks) * c.block_size * width, 10 + ci);
    const auto vc = Random(kc.size(), 20 + ci);
    const auto q = Random(static_cast<size_t>(T) * c.n_heads * c.head_dim, 30 + ci);
    const PagedAttentionArgs a = HostArgs(c.n_heads, c.n_kv_heads, c.head_dim, c.block_size, mb,
                                          c.window, token_seq, token_pos, tables);
    std::vector<float> want(q.size());
    cpu::PagedAttention(q.data(), kc.data(), vc.data(), a, want.data());

    std::vector<int32_t> tiles;
    cuda::BuildAttentionTiles(token_seq, &tiles);
    TandemPagedAttentionArgs d{
        T,  c.n_heads,         c.n_kv_heads,      c.head_dim,     c.block_size,
        mb, Upload(token_seq), Upload(token_pos), Upload(tables), c.window};
    float* d_out = static_cast<float*>(Alloc(q.size() * 4));
    ASSERT_EQ(api_->prefill_attention(Upload(q), Upload(kc), Upload(vc), &d, Upload(tiles),
                                      static_cast<int>(tiles.size() / 2), d_out),
              0)
        << api_->last_error();
    // Both sum exponentials in f32 in different orders (online softmax rescaling, __expf):
    // relative error ~1e-6 per term; 1e-4 of the largest output leaves room for the long
    // contexts here while catching any masking or indexing mistake (errors of order 1).
    EXPECT_LT(NormErr(Download(d_out, q.size()), want), 1e-4) << "case " << ci;

    // The tensor-core variant (bf16 models) against the CPU on the same inputs rounded to bf16
    // (as the kernel rounds them): what remains is the bf16 rounding of the softmax weights
    // (relative 2^-9 each, random in sign, so the output's error stays near 1e-3 of its
    // largest value) and the f32 sums' order; 1e-2 catches a wrong key, block or head.
    auto round = [](std::vector<float> x) {
      for (float& f : x) f = Bf16ToF32(F32ToBf16(f));
      return x;
    };
    const auto q16 = round(q), k16 = round(kc), v16 = round(vc);
    std::vector<float> want16(q.size());
    cpu::PagedAttention(q16.data(), k16.data(), v16.data(), a, want16.data());
    ASSERT_EQ(api_->prefill_attention_bf16(Upload(q), Upload(kc), Upload(vc), &d, Upload(tiles),
                                           static_cast<int>(tiles.size() / 2), d_out),
              0)
        << api_->last_error();
    const double err16 = NormErr(Download(d_out, q.size()), want16);
    std::printf("case %zu: bf16 tensor-core prefill attention error %.2e\n", ci, err16);
    EXPECT_LT(err16, 1e-2) << "case " << ci;
  }
  // head_dim must be a multiple of 16 for the tensor cores.
  std::vector<int32_t> tiles = {0, 1};
  std::vector<int> zero = {0};
  TandemPagedAttentionArgs d{1, 1, 1, 8, 16, 1, Upload(zero), Upload(zero), Upload(zero), 0};
  float* buf = static_cast<float*>(Alloc(16 * 8 * 4));
  EXPECT_NE(api_->prefill_attention_bf16(buf, buf, buf, &d, Upload(tiles), 1, buf), 0);
  EXPECT_NE(std::string(api_->last_error()).find("head_dim"), std::string::npos);
}

// Many decode rows (512 sequences x 8 heads, contexts near 2k): too many partials for the fine
// partitions the small batches get, so the kernel takes its largest (256 positions). The
// sequences share one block table (as a common prefix would), keeping the cache small.
TEST_F(CudaGemmAttentionTwinTest, DecodeAttentionManyRowsLargePartitions) {
  const int S = 512, n_heads = 8, n_kv = 2, hd = 128, bs = 16, width = n_kv * hd;
  const int max_ctx = 2099, mb = (max_ctx + bs - 1) / bs;
  std::vector<int> blocks(mb);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(3));
  std::vector<int> tables, token_pos(S);
  for (int s = 0; s < S; ++s) {
    tables.insert(tables.end(), blocks.begin(), blocks.end());
    token_pos[s] = max_ctx - 1 - (s * 37) % 300;
  }
  const auto kc = Random(static_cast<size_t>(mb) * bs * width, 4);
  const auto vc = Random(kc.size(), 5);
  const auto q = Random(static_cast<size_t>(S) * n_heads * hd, 6);
  // As for prefill: f32 sums in another order, 1e-4 of the largest output.
  const DecodeRun run =
      DecodeVsCpu(n_heads, n_kv, hd, bs, mb, max_ctx, 0, tables, token_pos, kc, vc, q);
  ASSERT_EQ(run.rc, 0) << api_->last_error();
  EXPECT_LT(run.error, 1e-4);
}

// The split-K decode kernel at contexts up to 32k, block sizes 16 and 64, sequences of
// different lengths in one batch (the model's decode-only path).
TEST_F(CudaGemmAttentionTwinTest, DecodeAttentionLongContexts) {
  for (int bs : {16, 64}) {
    const int n_heads = 8, n_kv = 2, hd = 128, width = n_kv * hd;
    const std::vector<int> ctx = {32768, 1, 5000, 16 * 1024 + 3};
    const int S = static_cast<int>(ctx.size());
    const int mb = 32768 / bs;
    const int num_blocks = S * mb;
    std::vector<int> tables(num_blocks);
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), std::mt19937(bs));
    std::vector<int> token_pos(S);
    for (int s = 0; s < S; ++s) token_pos[s] = ctx[s] - 1;
    const auto kc = Random(static_cast<size_t>(num_blocks) * bs * width, 1);
    const auto vc = Random(kc.size(), 2);
    const auto q = Random(static_cast<size_t>(S) * n_heads * hd, 3);
    // As for prefill: f32 sums in another order, 1e-4 of the largest output.
    const DecodeRun run =
        DecodeVsCpu(n_heads, n_kv, hd, bs, mb, 32768, 0, tables, token_pos, kc, vc, q);
    ASSERT_EQ(run.rc, 0) << api_->last_error();
    EXPECT_LT(run.error, 1e-4) << "block size " << bs;
  }
}

}  // namespace
}  // namespace tandem
