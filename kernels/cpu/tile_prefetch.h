// The next weight tile of a prefill or batched-decode matmul, prefetched a share per token group
// while the current tile runs, so that its rows are in cache when it starts instead of arriving
// at the latency of a few short streams (batched decode reads every weight from memory once per
// step); and PrefetchL2, the one-token decode paths' next rows. Shared by the AVX2 (matmul.cc,
// quant_super_avx2.cc) and AVX-512 (avx512_kernels.inc) paths; plain C++.
#ifndef TANDEM_KERNELS_CPU_TILE_PREFETCH_H_
#define TANDEM_KERNELS_CPU_TILE_PREFETCH_H_

#include <cstdint>

namespace tandem::cpu {

// Brings the cache lines of [p, p + bytes) towards L2 (prefetcht1). The one-token decode paths
// call it for the next group of rows, a little per block while the current group computes: a
// 4-row group of 1536-column Q4_K rows is a 3.4 KB stream, too short for the hardware prefetcher
// to run ahead of the kernel. It took one thread from 6.4 to 9.3 GB/s of weights from memory
// (13.3 streamed by a plain loop); into L1 (prefetcht0), or as a burst at each group's start,
// measured slower.
inline void PrefetchL2(const void* p, int64_t bytes) {
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes);
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; a < end; a += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(a), 0, 2);
  }
}

template <int kRows>
struct NextTile {
  const char* rows[kRows];  // the next tile's rows at the depth block's start
  int64_t share = 0;        // bytes per row per token group, a multiple of 64 (0: nothing)

  // The tile after rows[] (kRows rows of row_bytes each) when one exists before r1, with
  // `depth_bytes` of each row split over `groups` token groups.
  void Set(const void* const* tile, int64_t r, int64_t r1, int64_t row_bytes, int64_t depth_bytes,
           int groups) {
    if (r + 2 * kRows > r1) return;
    for (int i = 0; i < kRows; ++i) {
      rows[i] = static_cast<const char*>(tile[i]) + kRows * row_bytes;
    }
    share = (depth_bytes / 64 + groups - 1) / groups * 64;
  }

  void Prefetch(int group) const {
    if (share == 0) return;
    for (int i = 0; i < kRows; ++i) {
      for (int64_t b = 0; b < share; b += 64) __builtin_prefetch(rows[i] + group * share + b);
    }
  }
};

}  // namespace tandem::cpu

#endif  // TANDEM_KERNELS_CPU_TILE_PREFETCH_H_
