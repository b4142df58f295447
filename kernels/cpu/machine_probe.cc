#include "kernels/cpu/machine_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"

namespace tandem::cpu {
namespace {

using Clock = std::chrono::steady_clock;

TANDEM_AVX2 float SumAvx2(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  return simd::HorizontalSum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

float SumScalar(const float* p, int64_t n) {
  float a[8] = {};
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];
  }
  return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

// 12 independent FMA chains of 8 lanes: 192 FLOPs per iteration.
TANDEM_AVX2 float FmaLoopAvx2(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  return simd::HorizontalSum(s);
}

}  // namespace

BandwidthMeter::BandwidthMeter(int threads, int64_t bytes)
    : threads_(threads),
      floats_(std::max<int64_t>(bytes / int64_t{sizeof(float)} / 32 / threads * 32 * threads,
                                32 * threads)),
      buf_(static_cast<float*>(std::aligned_alloc(64, floats_ * sizeof(float)))),
      pool_(threads) {
  pool_.ParallelFor(floats_, floats_ / threads_, [&](int64_t b, int64_t e) {
    std::fill(buf_ + b, buf_ + e, 1.0f);  // fault the pages in on the thread that reads them
  });
}

BandwidthMeter::~BandwidthMeter() { std::free(buf_); }

double BandwidthMeter::Measure() {
  const bool avx = ActiveIsa() != Isa::kScalar;
  std::atomic<float> sink{0};
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    pool_.ParallelFor(floats_, floats_ / threads_, [&](int64_t b, int64_t e) {
      sink = sink + (avx ? SumAvx2(buf_ + b, e - b) : SumScalar(buf_ + b, e - b));
    });
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return floats_ * sizeof(float) / best;
}

// Float32 FMA peak in FLOP/s over `threads` threads (0 without AVX2: not measured).
double MeasureFmaPeak(int threads) {
  if (ActiveIsa() == Isa::kScalar) return 0;
  const int64_t iters = 20'000'000;
  ThreadPool pool(threads);
  std::atomic<float> sink{0};
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    pool.ParallelFor(threads, 1, [&](int64_t, int64_t) { sink = sink + FmaLoopAvx2(iters); });
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 192.0 * iters * threads / best;
}

}  // namespace tandem::cpu
