// The kept set of top-k / top-p sampling as a boundary, without sorting; shared by the CUDA
// sampler (sampler.cu, reductions over a thread block) and a host test that checks it against
// engine/sampling/sampler.cc on the CPU (tests/kernels/sample_boundary_test.cc).
//
// Sorting tokens by probability (ties by lower id) and keeping a prefix is the same as keeping
// token i when p_i > v, or p_i == v and i < cut, for some boundary (v, cut). Probabilities are
// non-negative doubles, whose bit patterns order like their values, so v is found by binary
// search over the bits with two reductions: count(p >= v) and mass(p >= v).
#ifndef TANDEM_KERNELS_CUDA_SAMPLE_BOUNDARY_H_
#define TANDEM_KERNELS_CUDA_SAMPLE_BOUNDARY_H_

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define TANDEM_HD __host__ __device__
#else
#define TANDEM_HD
#endif

namespace tandem::sampling {

struct KeepBoundary {
  uint64_t v = 0;  // bit pattern of the boundary probability
  int cut = 0;     // tied tokens (p == v) with id < cut are kept
};

TANDEM_HD inline uint64_t ProbBits(double d) {
#ifdef __CUDA_ARCH__
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t b;
  std::memcpy(&b, &d, sizeof(b));
  return b;
#endif
}
TANDEM_HD inline double BitsProb(uint64_t b) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double(static_cast<long long>(b));
#else
  double d;
  std::memcpy(&d, &b, sizeof(d));
  return d;
#endif
}

TANDEM_HD inline bool Kept(const KeepBoundary& b, double p, int i) {
  const uint64_t x = ProbBits(p);
  return x > b.v || (x == b.v && i < b.cut);
}

// R provides, over the normalized probabilities of one row (each call a reduction):
//   long long CountGe(uint64_t bits)          #{i : bits(p_i) >= bits}
//   double MassGe(uint64_t bits)              sum of p_i with bits(p_i) >= bits
//   long long TiesBelow(uint64_t v, int x)    #{i < x : bits(p_i) == v}
// Returns the boundary of the shorter of the top-k and top-p prefixes; *limited = false when
// neither applies (everything kept, no renormalization), as engine/sampling/sampler.cc does.
template <typename R>
TANDEM_HD KeepBoundary FindKeepBoundary(R& r, int vocab, int top_k, float top_p, bool* limited) {
  const uint64_t one = ProbBits(1.0);
  KeepBoundary keep{0, vocab};
  *limited = false;
  // Smallest x with TiesBelow(v, x) >= m.
  auto tie_cut = [&](uint64_t v, long long m) {
    int lo = 1, hi = vocab;
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (r.TiesBelow(v, mid) >= m) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  };
  const int k = top_k > 0 && top_k < vocab ? top_k : vocab;
  if (k < vocab) {
    *limited = true;
    uint64_t lo = 0, hi = one;  // the largest v with count(p >= v) >= k
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo + 1) / 2;
      if (r.CountGe(mid) >= k) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    keep = {lo, tie_cut(lo, k - r.CountGe(lo + 1))};
  }
  if (top_p < 1.f) {
    *limited = true;
    const double target = top_p;
    // Rounding can leave the whole mass below top_p: the CPU then keeps every token.
    if (r.MassGe(0) >= target) {
      uint64_t lo = 0, hi = one;  // the largest v with mass(p >= v) >= top_p
      while (lo < hi) {
        const uint64_t mid = lo + (hi - lo + 1) / 2;
        if (r.MassGe(mid) >= target) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      // Every token above v is in; the CPU then adds the tied ones one by one until the mass
      // reaches top_p.
      const long long ties = r.CountGe(lo) - r.CountGe(lo + 1);
      const double v = BitsProb(lo);
      double cum = r.MassGe(lo + 1);
      long long m = 0;
      do {
        cum += v;
        ++m;
      } while (cum < target && m < ties);
      const KeepBoundary b{lo, tie_cut(lo, m)};
      if (b.v > keep.v || (b.v == keep.v && b.cut < keep.cut)) keep = b;
    }
  }
  return keep;
}

}  // namespace tandem::sampling

#endif  // TANDEM_KERNELS_CUDA_SAMPLE_BOUNDARY_H_
