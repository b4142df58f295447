// The fixture every CUDA twin test shares: loads libtandem_cuda.so and skips the test when it
// is not there or no device is usable; device buffers allocated through it are freed after
// the test.
#ifndef TANDEM_TESTS_KERNELS_CUDA_DEVICE_TEST_H_
#define TANDEM_TESTS_KERNELS_CUDA_DEVICE_TEST_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/backend_loader.h"
#include "kernels/cuda/cuda_api.h"

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
  // max |a - b| / max |b|: the normalized error.
  static double NormErr(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < a.size(); ++i) {
      num = std::max(num, static_cast<double>(std::abs(a[i] - b[i])));
      den = std::max(den, static_cast<double>(std::abs(b[i])));
    }
    return num / den;
  }
  const TandemCudaApi* api_ = nullptr;
  std::vector<void*> allocs_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_KERNELS_CUDA_DEVICE_TEST_H_
