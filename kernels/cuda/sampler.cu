// Token sampling on the device, one thread block per row of logits, matching
// engine/sampling/sampler.cc (the CPU twin): greedy (first maximum) at temperature 0; otherwise
// softmax(logits / T) in double, top-k and top-p as prefixes of the tokens sorted by probability
// (ties by lower id), the shorter prefix kept and renormalized, and the counter-based draw u =
// CounterUniform(seed, position) taken against the cumulative distribution in id order.
//
// No sort: a prefix of the sorted order is a boundary (value v, cut id x): token i is kept when
// p_i > v, or p_i == v and i < x. The top-k boundary is found by binary search over the bit
// patterns of the (non-negative) probabilities, the top-p one likewise over the mass
// sum(p >= v); ties at the boundary are then taken in id order as the CPU's stable sort does.
// Sums are double, but in a different association than the CPU's sequential loops, so a draw
// can differ only when u lies within a few ulps of a cumulative boundary.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/sample_boundary.h"

namespace tandem::cuda {
namespace {

using sampling::FindKeepBoundary;
using sampling::KeepBoundary;
using sampling::Kept;
using sampling::ProbBits;

constexpr int kThreads = 1024;

__device__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ double CounterUniform(uint64_t seed, uint64_t counter) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ counter);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// Block-wide reductions over kThreads threads through shared memory.
template <typename T, typename Op>
__device__ T BlockReduce(T v, Op op, T* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  const T out = shared[0];
  __syncthreads();
  return out;
}

__global__ void SampleKernel(const float* __restrict__ logits,  // [rows, vocab]
                             int vocab, const SampleRowParams* __restrict__ params,  // [rows]
                             double* __restrict__ workspace,  // [rows, vocab]
                             int* __restrict__ tokens) {      // [rows]
  __shared__ double sd[kThreads];
  __shared__ long long si[kThreads];
  const float* lg = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  double* p = workspace + static_cast<int64_t>(blockIdx.x) * vocab;
  const SampleRowParams prm = params[blockIdx.x];
  const int tid = threadIdx.x, nt = blockDim.x;
  auto sum = [](double a, double b) { return a + b; };
  auto lmax = [](long long a, long long b) { return a > b ? a : b; };
  auto lmin = [](long long a, long long b) { return a < b ? a : b; };

  if (prm.temperature == 0.f) {
    // First maximum: reduce (value, -id) lexicographically via a two-pass max.
    float best = -INFINITY;
    for (int i = tid; i < vocab; i += nt) best = fmaxf(best, lg[i]);
    const double m = BlockReduce<double>(
        best, [](double a, double b) { return a > b ? a : b; }, sd);
    long long first = vocab;
    for (int i = tid; i < vocab; i += nt) {
      if (static_cast<double>(lg[i]) == m) {
        first = i;
        break;
      }
    }
    first = BlockReduce<long long>(first, lmin, si);
    if (tid == 0) tokens[blockIdx.x] = first < vocab ? static_cast<int>(first) : 0;
    return;
  }
  const double temp = prm.temperature;
  double mx = -INFINITY;
  for (int i = tid; i < vocab; i += nt) mx = fmax(mx, static_cast<double>(lg[i]) / temp);
  mx = BlockReduce<double>(
      mx, [](double a, double b) { return a > b ? a : b; }, sd);
  double local = 0.0;
  for (int i = tid; i < vocab; i += nt) {
    p[i] = exp(static_cast<double>(lg[i]) / temp - mx);
    local += p[i];
  }
  const double total = BlockReduce<double>(local, sum, sd);
  for (int i = tid; i < vocab; i += nt) p[i] /= total;
  __syncthreads();

  // The reductions FindKeepBoundary needs, over this block.
  struct BlockRows {
    const double* p;
    int vocab, tid, nt;
    double* sd;
    long long* si;
    __device__ long long CountGe(uint64_t b) {
      long long c = 0;
      for (int i = tid; i < vocab; i += nt) c += ProbBits(p[i]) >= b;
      return BlockReduce<long long>(
          c, [](long long a, long long x) { return a + x; }, si);
    }
    __device__ double MassGe(uint64_t b) {
      double m = 0.0;
      for (int i = tid; i < vocab; i += nt) m += ProbBits(p[i]) >= b ? p[i] : 0.0;
      return BlockReduce<double>(
          m, [](double a, double x) { return a + x; }, sd);
    }
    __device__ long long TiesBelow(uint64_t v, int x) {
      long long c = 0;
      for (int i = tid; i < x; i += nt) c += ProbBits(p[i]) == v;
      return BlockReduce<long long>(
          c, [](long long a, long long y) { return a + y; }, si);
    }
  } rows{p, vocab, tid, nt, sd, si};
  bool limited = false;
  const KeepBoundary keep = FindKeepBoundary(rows, vocab, prm.top_k, prm.top_p, &limited);
  auto kept = [&](int i) { return Kept(keep, p[i], i); };
  double kept_sum = 1.0;
  if (limited) {
    double s = 0.0;
    for (int i = tid; i < vocab; i += nt) s += kept(i) ? p[i] : 0.0;
    kept_sum = BlockReduce<double>(s, sum, sd);
  }
  auto dist = [&](int i) { return !limited ? p[i] : (kept(i) ? p[i] / kept_sum : 0.0); };
  // The draw: contiguous chunks per thread, prefix over the chunks, then the crossing.
  const int chunk = (vocab + nt - 1) / nt;
  const int b0 = min(vocab, tid * chunk), b1 = min(vocab, b0 + chunk);
  double mine = 0.0;
  long long last = -1;
  for (int i = b0; i < b1; ++i) {
    const double d = dist(i);
    if (d == 0.0) continue;
    mine += d;
    last = i;
  }
  sd[tid] = mine;
  __syncthreads();
  if (tid == 0) {
    double run = 0.0;
    for (int t = 0; t < nt; ++t) {
      const double c = sd[t];
      sd[t] = run;
      run += c;
    }
  }
  __syncthreads();
  const double u = CounterUniform(prm.seed, prm.position);
  double cum = sd[tid];
  __syncthreads();
  long long hit = vocab;
  for (int i = b0; i < b1; ++i) {
    const double d = dist(i);
    if (d == 0.0) continue;
    cum += d;
    if (u < cum) {
      hit = i;
      break;
    }
  }
  hit = BlockReduce<long long>(hit, lmin, si);
  last = BlockReduce<long long>(last, lmax, si);
  if (tid == 0) tokens[blockIdx.x] = static_cast<int>(hit < vocab ? hit : last);
}

}  // namespace

size_t SampleWorkspaceBytes(int rows, int vocab) {
  return static_cast<size_t>(rows) * vocab * sizeof(double);
}

int Sample(const float* d_logits, int rows, int vocab, const SampleRowParams* d_params,
           void* d_workspace, size_t workspace_bytes, int* d_tokens, cudaStream_t stream) {
  if (rows < 0 || vocab <= 0) return BadArg("sample", "rows >= 0 and vocab > 0");
  if (workspace_bytes < SampleWorkspaceBytes(rows, vocab)) {
    return BadArg("sample", "workspace too small (sample_workspace_bytes)");
  }
  if (!Aligned(d_workspace, 8)) return BadArg("sample", "workspace not 8-byte aligned");
  if (rows == 0) return 0;
  SampleKernel<<<rows, kThreads, 0, stream>>>(d_logits, vocab, d_params,
                                              static_cast<double*>(d_workspace), d_tokens);
  return LaunchCheck("sample");
}

}  // namespace tandem::cuda
