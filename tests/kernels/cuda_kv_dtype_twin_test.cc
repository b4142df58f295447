// The ABI-5 kernels of bf16 and fp8 KV caches against their CPU twins: writing rows
// (cpu::WriteKv over a KvLayerRef), fp8 scales (SetFp8Scales), packing and unpacking a chunk
// (GatherKv / ScatterKv, kv_transfer/kv_pack.h), and FlashInfer's attention over such caches
// (cpu::PagedAttention over the same cache). Skipped where no GPU (or no CUDA library) is
// present; scripts/gpu_check.sh runs them on a machine with one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/model_config.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dtype.h"
#include "kv_transfer/kv_pack.h"
#include "tests/kernels/cuda_device_test.h"

namespace tandem {
namespace {

class CudaKvDtypeTwinTest : public testing::CudaDeviceTest {
 protected:
  static ModelConfig Config(int n_heads, int n_kv_heads, int head_dim) {
    ModelConfig c;
    c.n_layers = 1;
    c.dim = n_heads * head_dim;
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv_heads;
    c.head_dim = head_dim;
    c.max_seq_len = 1 << 16;
    return c;
  }
  static int Code(DType d) { return d == DType::kBF16 ? TANDEM_KV_BF16 : TANDEM_KV_FP8; }
  // A one-layer cache with every byte and scale zero (KvCache leaves its memory untouched).
  static KvCache Zeroed(const ModelConfig& cfg, int blocks, int bs, DType dt) {
    KvCache c = *KvCache::Create(cfg, blocks, bs, 0, dt);
    const size_t bytes = static_cast<size_t>(blocks) * bs * c.width() * DTypeSize(dt);
    std::memset(c.k_bytes(0), 0, bytes);
    std::memset(c.v_bytes(0), 0, bytes);
    if (c.scales(0) != nullptr) std::fill_n(c.scales(0), blocks * 2 * c.spec().n_kv_heads, 1.0f);
    return c;
  }
  // The cache's bytes and scales on the device, as a KvLayerRef of device pointers.
  KvLayerRef UploadCache(const KvCache& c) {
    KvLayerRef d;
    d.dtype = c.dtype();
    const size_t bytes =
        static_cast<size_t>(c.num_blocks()) * c.block_size() * c.width() * DTypeSize(c.dtype());
    d.k = Upload(std::vector<char>(c.k_bytes(0), c.k_bytes(0) + bytes));
    d.v = Upload(std::vector<char>(c.v_bytes(0), c.v_bytes(0) + bytes));
    if (c.scales(0) != nullptr) {
      d.scales =
          Upload(std::vector<float>(c.scales(0), c.scales(0) + static_cast<size_t>(c.num_blocks()) *
                                                                   2 * c.spec().n_kv_heads));
    }
    d.block_size = c.block_size();
    d.n_kv_heads = c.spec().n_kv_heads;
    d.head_dim = c.spec().head_dim;
    return d;
  }
};

// A step of chunks (start_pos, count) over shuffled blocks: the CPU and the device set fp8
// scales and write the rows; every byte of K, V and the scales agrees.
TEST_F(CudaKvDtypeTwinTest, WriteRowsAndFp8ScalesAreBitExact) {
  for (DType dt : {DType::kBF16, DType::kFp8E4M3}) {
    const int heads = 4, kv_heads = 2, hd = 64, bs = 16, blocks = 64;
    const ModelConfig cfg = Config(heads, kv_heads, hd);
    KvCache c = Zeroed(cfg, blocks, bs, dt);
    // Chunk 1 continues a sequence whose first chunk came in an earlier step.
    const std::vector<std::pair<int, int>> chunks = {{0, 37}, {40, 9}, {0, 1}};
    const int stride = 8;
    std::vector<int> ids(blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(3));
    std::vector<int> tables(ids.begin(), ids.begin() + 3 * stride);
    if (dt == DType::kFp8E4M3) {  // the earlier step's scales of sequence 1
      std::vector<float> earlier = Random(2 * kv_heads, 5, 0.1f);
      for (float& x : earlier) x = std::fabs(x) + 1e-3f;
      std::copy(earlier.begin(), earlier.end(),
                c.scales(0) + int64_t{tables[stride]} * 2 * kv_heads);
    }
    const KvLayerRef dev = UploadCache(c);
    std::vector<int> q_indptr = {0}, pos, slots;
    std::vector<KvChunkRows> rows;
    for (size_t s = 0; s < chunks.size(); ++s) {
      auto [start, n] = chunks[s];
      rows.push_back({start, n, std::span<const int>(tables).subspan(s * stride, stride)});
      for (int i = 0; i < n; ++i) {
        pos.push_back(start + i);
        slots.push_back(tables[s * stride + (start + i) / bs] * bs + (start + i) % bs);
      }
      q_indptr.push_back(q_indptr.back() + n);
    }
    const int T = q_indptr.back();
    const auto k = Random(static_cast<size_t>(T) * kv_heads * hd, 11, 3.f);
    const auto v = Random(k.size(), 12, 0.5f);
    SetFp8Scales(&c, 0, rows, k.data(), v.data());
    KvLayerRef host{dt, c.k_bytes(0), c.v_bytes(0), c.scales(0), bs, kv_heads, hd};
    cpu::WriteKv(k.data(), v.data(), slots.data(), T, host);

    const float* dk = Upload(k);
    const float* dv = Upload(v);
    if (dt == DType::kFp8E4M3) {
      ASSERT_EQ(api_->set_fp8_scales(dk, dv, Upload(q_indptr), Upload(pos), 3, Upload(tables),
                                     stride, kv_heads, hd, bs, dev.scales),
                0)
          << api_->last_error();
    }
    ASSERT_EQ(api_->write_kv_typed(dk, dv, Upload(slots), T, kv_heads, hd, bs, Code(dt), dev.scales,
                                   dev.k, dev.v),
              0)
        << api_->last_error();
    const size_t bytes = static_cast<size_t>(blocks) * bs * kv_heads * hd * DTypeSize(dt);
    const auto got_k = Download(static_cast<const char*>(dev.k), bytes);
    const auto got_v = Download(static_cast<const char*>(dev.v), bytes);
    EXPECT_EQ(std::memcmp(got_k.data(), c.k_bytes(0), bytes), 0) << DTypeName(dt);
    EXPECT_EQ(std::memcmp(got_v.data(), c.v_bytes(0), bytes), 0) << DTypeName(dt);
    if (dt == DType::kFp8E4M3) {
      const size_t n = static_cast<size_t>(blocks) * 2 * kv_heads;
      const auto got = Download(dev.scales, n);
      EXPECT_EQ(std::memcmp(got.data(), c.scales(0), n * 4), 0) << "fp8 scales";
    }
  }
}

// A chunk packed on the device equals GatherKv's payload of the same cache, and unpacking that
// payload into other blocks gives ScatterKv's bytes and scales.
TEST_F(CudaKvDtypeTwinTest, PackAndUnpackMatchGatherAndScatter) {
  for (DType dt : {DType::kBF16, DType::kFp8E4M3}) {
    const int kv_heads = 2, hd = 64, bs = 16, blocks = 16;
    const ModelConfig cfg = Config(4, kv_heads, hd);
    KvCache src_cache = Zeroed(cfg, blocks, bs, dt), dst_cache = Zeroed(cfg, blocks, bs, dt);
    KvCache* src = &src_cache;
    KvCache* dst = &dst_cache;
    std::mt19937 rng(9);
    const size_t bytes = static_cast<size_t>(blocks) * bs * kv_heads * hd * DTypeSize(dt);
    for (size_t i = 0; i < bytes; ++i) {
      // fp8: no NaN patterns (0x7f / 0xff) in what is compared byte for byte anyway.
      src->k_bytes(0)[i] = static_cast<char>(rng() % 0x7e);
      src->v_bytes(0)[i] = static_cast<char>(rng() % 0x7e);
    }
    if (src->scales(0) != nullptr) {
      for (int i = 0; i < blocks * 2 * kv_heads; ++i) src->scales(0)[i] = 0.01f * (i + 1);
    }
    const std::vector<int> table = {5, 2, 11, 7}, other = {1, 9, 3, 14};
    const int start = 7, count = 40;
    auto want = GatherKv(*src, 0, table, start, count);
    ASSERT_TRUE(want.ok()) << want.status();
    const KvLayerRef dev = UploadCache(*src);
    void* wire = Alloc(want->size());
    ASSERT_EQ(api_->pack_kv_typed(dev.k, dev.v, dev.scales, Upload(table), bs, kv_heads, hd,
                                  Code(dt), start, count, wire),
              0)
        << api_->last_error();
    const auto got = Download(static_cast<const char*>(wire), want->size());
    EXPECT_EQ(std::string(got.begin(), got.end()), *want) << DTypeName(dt);

    const KvChunkHeader h = MakeKvChunkHeader(*dst, 1, 0, start, count);
    ASSERT_TRUE(ScatterKv(*want, h, other, dst).ok());
    const KvLayerRef back = UploadCache(Zeroed(cfg, blocks, bs, dt));
    ASSERT_EQ(api_->unpack_kv_typed(wire, Upload(other), bs, kv_heads, hd, Code(dt), start, count,
                                    back.k, back.v, back.scales),
              0)
        << api_->last_error();
    const auto bk = Download(static_cast<const char*>(back.k), bytes);
    const auto bv = Download(static_cast<const char*>(back.v), bytes);
    EXPECT_EQ(std::memcmp(bk.data(), dst->k_bytes(0), bytes), 0) << DTypeName(dt);
    EXPECT_EQ(std::memcmp(bv.data(), dst->v_bytes(0), bytes), 0) << DTypeName(dt);
    if (back.scales != nullptr) {
      const auto bs_ = Download(back.scales, static_cast<size_t>(blocks) * 2 * kv_heads);
      EXPECT_EQ(std::memcmp(bs_.data(), dst->scales(0), bs_.size() * 4), 0) << "scales";
    }
  }
}

struct FiCase {
  int block_size, n_heads, n_kv_heads, head_dim, window;
  std::vector<std::pair<int, int>> chunks;  // (start_pos, count)
};

// FlashInfer's attention over bf16 and fp8 caches against cpu::PagedAttention over the same
// cache: prefill chunks, chunks after a prefix, decode rows, all in one step; GQA groups of 1, 3
// and 4 (SmolLM2, Llama 3); block sizes 16 and 64; a sliding window; head dims 64 and 128.
TEST_F(CudaKvDtypeTwinTest, FlashInferAttentionMatchesCpu) {
  for (DType dt : {DType::kBF16, DType::kFp8E4M3}) {
    for (int hd : {64, 128}) {
      const char* why = "";
      if (api_->fi_attention_supported(hd, Code(dt), &why) == 0) {
        GTEST_SKIP() << "this libtandem_cuda.so has no FlashInfer attention: " << why;
      }
    }
  }
  const std::vector<FiCase> cases = {
      {16, 9, 3, 64, 0, {{0, 37}}},
      {16, 32, 8, 128, 0, {{0, 100}, {45, 20}, {7, 1}, {300, 1}}},
      {64, 8, 8, 64, 50, {{0, 130}, {200, 65}}},
      {16, 32, 8, 128, 0, {{3000, 96}, {100, 1}, {2047, 1}}},
      {16, 32, 8, 128, 4096, {{30000, 33}}},
      // Few query tiles over a long context: the planner splits the KV with 128-row tiles, the
      // largest partial outputs the workspace must hold.
      {16, 32, 8, 128, 0, {{0, 200}}},
      {16, 32, 8, 128, 0, {{1800, 130}}},
  };
  for (DType dt : {DType::kBF16, DType::kFp8E4M3}) {
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const FiCase& c = cases[ci];
      const int S = static_cast<int>(c.chunks.size());
      int max_end = 0, T = 0;
      for (auto [s, n] : c.chunks) {
        max_end = std::max(max_end, s + n);
        T += n;
      }
      const int mb = (max_end + c.block_size - 1) / c.block_size;
      std::optional<KvCache> cache =
          Zeroed(Config(c.n_heads, c.n_kv_heads, c.head_dim), S * mb, c.block_size, dt);
      std::vector<int> ids(S * mb);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), std::mt19937(7 + ci));
      // Every position of every sequence written through the CPU (scales set by a first chunk
      // of the whole context): the cache a step finds.
      std::vector<int> token_seq, token_pos;
      std::vector<TandemStepChunk> steps;
      for (int s = 0; s < S; ++s) {
        const auto [start, n] = c.chunks[s];
        const std::span<const int> table(ids.data() + s * mb, mb);
        const int len = start + n;
        const auto k = Random(static_cast<size_t>(len) * c.n_kv_heads * c.head_dim, 50 + s);
        const auto v = Random(k.size(), 60 + s);
        const KvChunkRows all{0, len, table};
        SetFp8Scales(&*cache, 0, std::span<const KvChunkRows>(&all, 1), k.data(), v.data());
        std::vector<int> slots(len);
        for (int p = 0; p < len; ++p) {
          slots[p] = table[p / c.block_size] * c.block_size + p % c.block_size;
        }
        KvLayerRef host{dt,           cache->k_bytes(0), cache->v_bytes(0), cache->scales(0),
                        c.block_size, c.n_kv_heads,      c.head_dim};
        cpu::WriteKv(k.data(), v.data(), slots.data(), len, host);
        for (int i = 0; i < n; ++i) {
          token_seq.push_back(s);
          token_pos.push_back(start + i);
        }
        steps.push_back({n, start, mb, 0});
      }
      const auto q = Random(static_cast<size_t>(T) * c.n_heads * c.head_dim, 30 + ci);
      const PagedAttentionArgs a = HostArgs(c.n_heads, c.n_kv_heads, c.head_dim, c.block_size, mb,
                                            c.window, token_seq, token_pos, ids);
      // The CPU on the queries rounded to bf16, as FlashInfer takes them.
      std::vector<float> q16(q);
      for (float& x : q16) x = Bf16ToF32(F32ToBf16(x));
      KvLayerRef host{dt,           cache->k_bytes(0), cache->v_bytes(0), cache->scales(0),
                      c.block_size, c.n_kv_heads,      c.head_dim};
      std::vector<float> want(q.size());
      cpu::PagedAttention(q16.data(), host, a, want.data());

      const KvLayerRef dev = UploadCache(*cache);
      float* d_out = static_cast<float*>(Alloc(q.size() * 4));
      ASSERT_EQ(api_->paged_attention_fi(Upload(q), Code(dt), dev.k, dev.v, dev.scales, c.n_heads,
                                         c.n_kv_heads, c.head_dim, c.block_size, c.window,
                                         steps.data(), S, ids.data(), d_out),
                0)
          << api_->last_error();
      // K enters exact (bf16 and scaled fp8 are exact in bf16 and f32); what differs from the
      // CPU is the bf16 rounding of the softmax weights (relative 2^-9 each, random in sign:
      // ~1e-3 of the largest output), of each V scale (once per block and head: a bias of up to
      // 2^-9), of the output (2^-9), and the f32 sums' order. 1e-2 catches a wrong key, block,
      // head, scale or mask.
      const double err = NormErr(Download(d_out, q.size()), want);
      std::printf("%s case %zu: FlashInfer attention error %.2e\n", DTypeName(dt).data(), ci, err);
      EXPECT_LT(err, 1e-2) << DTypeName(dt) << " case " << ci;
    }
  }
}

// Bad arguments are refused with a reason, before anything runs.
TEST_F(CudaKvDtypeTwinTest, RefusesWhatItCannotRun) {
  const char* why = "";
  EXPECT_EQ(api_->fi_attention_supported(96, TANDEM_KV_BF16, &why), 0);
  EXPECT_NE(std::string(why), "");
  EXPECT_EQ(api_->fi_attention_supported(64, TANDEM_KV_F32, &why), 0);
  float* buf = static_cast<float*>(Alloc(1024));
  std::vector<int> slot = {0};
  EXPECT_NE(
      api_->write_kv_typed(buf, buf, Upload(slot), 1, 1, 8, 16, TANDEM_KV_FP8, nullptr, buf, buf),
      0);
  EXPECT_NE(std::string(api_->last_error()).find("scales"), std::string::npos);
  EXPECT_NE(api_->pack_kv_typed(buf, buf, nullptr, Upload(slot), 16, 1, 8, 7, 0, 1, buf), 0);
}

}  // namespace
}  // namespace tandem
