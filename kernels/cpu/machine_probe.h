// The machine's limits as the CPU backend sees them: streaming read bandwidth and float32 FMA
// peak, measured over a number of threads. Used by engine_bench's roofline and by
// `tandem plan calibrate` as the reference its efficiency factors are fractions of.
#ifndef TANDEM_KERNELS_CPU_MACHINE_PROBE_H_
#define TANDEM_KERNELS_CPU_MACHINE_PROBE_H_

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace tandem::cpu {

// Read bandwidth in bytes/s: `threads` threads each stream a contiguous part of a buffer far
// larger than the last-level cache (default 1 GiB). The bandwidth a shared machine gives varies
// from second to second, so callers measure it when they need it rather than once.
class BandwidthMeter {
 public:
  explicit BandwidthMeter(int threads, int64_t bytes = int64_t{1} << 30);
  ~BandwidthMeter();
  BandwidthMeter(const BandwidthMeter&) = delete;
  BandwidthMeter& operator=(const BandwidthMeter&) = delete;

  double Measure();  // best of 5 passes

 private:
  int threads_;
  int64_t floats_;
  float* buf_;
  ThreadPool pool_;
};

// Float32 FMA peak in FLOP/s over `threads` threads: independent 8-lane FMA chains on
// registers (0 without AVX2: not measured).
double MeasureFmaPeak(int threads);

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_MACHINE_PROBE_H_
