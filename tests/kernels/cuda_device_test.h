// The fixture every CUDA twin test shares: loads libtandem_cuda.so and skips the test when it
// is not there or no device is usable; device buffers allocated through it are freed after
// the test.
#ifndef TANDEM_TESTS_KERNELS_CUDA_DEVICE_TEST_H_
#define TANDEM_TESTS_KERNELS_CUDA_DEVICE_TEST_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/backend_loader.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_api.h"
#include "tests/kernels/attention_args.h"

namespace tandem::testing {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto api = LoadCudaApi();
    if (!api.ok()) GTEST_SKIP() << api.status().message();
    api_ = *api;
  }
  void TearDown() override {
    for (void* p : allocs_) api_->free(p);
  }
  void* Alloc(size_t bytes) {
    void* d = nullptr;
    EXPECT_EQ(api_->malloc(&d, std::max<size_t>(bytes, 16)), 0) << api_->last_error();
    allocs_.push_back(d);
    return d;
  }
  template <typename T>
  T* Upload(const std::vector<T>& h) {
    void* d = Alloc(h.size() * sizeof(T));
    EXPECT_EQ(api_->memcpy_h2d(d, h.data(), h.size() * sizeof(T)), 0) << api_->last_error();
    return static_cast<T*>(d);
  }
  template <typename T>
  std::vector<T> Download(const T* d, size_t n) {
    std::vector<T> h(n);
    EXPECT_EQ(api_->memcpy_d2h(h.data(), d, n * sizeof(T)), 0) << api_->last_error();
    return h;
  }
  static std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
  }
  // The CPU twin's arguments (tests/kernels/attention_args.h).
  static PagedAttentionArgs HostArgs(int n_heads, int n_kv_heads, int head_dim, int block_size,
                                     int mb, int window, const std::vector<int>& token_seq,
                                     const std::vector<int>& token_pos,
                                     const std::vector<int>& tables) {
    return testing::AttentionArgs(n_heads, n_kv_heads, head_dim, block_size, mb, window, token_seq,
                                  token_pos, tables);
  }
  // max |a - b| / max |b|: the normalized error.
  static double NormErr(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < a.size(); ++i) {
      num = std::max(num, static_cast<double>(std::abs(a[i] - b[i])));
      den = std::max(den, static_cast<double>(std::abs(b[i])));
    }
    return num / den;
  }
  // The decode attention kernel against cpu::PagedAttention: one token per sequence s at
  // token_pos[s], its block table the s-th row of `tables` (mb ids), a sliding window (0:
  // none), the workspace paged_attention_workspace_bytes asks for less `shortfall` bytes.
  // rc: the launch's return; error: the normalized error when it ran.
  struct DecodeRun {
    int rc = 0;
    double error = 0;
  };
  DecodeRun DecodeVsCpu(int n_heads, int n_kv, int hd, int bs, int mb, int max_context, int window,
                        const std::vector<int>& tables, const std::vector<int>& token_pos,
                        const std::vector<float>& kc, const std::vector<float>& vc,
                        const std::vector<float>& q, size_t shortfall = 0) {
    const int S = static_cast<int>(token_pos.size());
    std::vector<int> token_seq(S);
    std::iota(token_seq.begin(), token_seq.end(), 0);
    const PagedAttentionArgs a =
        testing::AttentionArgs(n_heads, n_kv, hd, bs, mb, window, token_seq, token_pos, tables);
    std::vector<float> want(q.size());
    cpu::PagedAttention(q.data(), kc.data(), vc.data(), a, want.data());
    TandemPagedAttentionArgs d{
        S, n_heads, n_kv, hd, bs, mb, Upload(token_seq), Upload(token_pos), Upload(tables), window};
    const size_t ws_bytes =
        api_->paged_attention_workspace_bytes(S, n_heads, hd, max_context) - shortfall;
    void* ws = Alloc(ws_bytes);
    float* d_out = static_cast<float*>(Alloc(q.size() * 4));
    DecodeRun run;
    run.rc = api_->paged_attention_decode(Upload(q), Upload(kc), Upload(vc), &d, max_context, ws,
                                          ws_bytes, d_out);
    if (run.rc == 0) run.error = NormErr(Download(d_out, q.size()), want);
    return run;
  }

  const TandemCudaApi* api_ = nullptr;
  std::vector<void*> allocs_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_KERNELS_CUDA_DEVICE_TEST_H_
