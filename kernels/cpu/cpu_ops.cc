// The elementwise and normalization operations, and the run-time ISA choice. Matmul is in
// matmul.cc, PagedAttention in attention.cc.
#include "kernels/cpu/cpu_ops.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/simd.h"
#include "kernels/quant.h"

namespace tandem::cpu {
namespace {

// Elementwise loops run in chunks of this many floats (64 KB) when a pool is given.
constexpr int64_t kElementGrain = 16384;

const Avx512Kernels* g_test_avx512 = nullptr;  // SetAvx512KernelsForTesting

// The best ISA up to `isa` that can run here.
Isa Supported(Isa isa) {
  if (isa == Isa::kAmx && (!CpuHasAmx() || g_test_avx512 != nullptr)) isa = Isa::kAvx512;
  if (isa == Isa::kAvx512 && !CpuHasAvx512() && g_test_avx512 == nullptr) isa = Isa::kAvx2;
  if (isa >= Isa::kAvx2 && !CpuHasAvx2()) isa = Isa::kScalar;
  return isa;
}

Isa DefaultIsa() {
  Isa isa;
  return ParseIsa(std::getenv("TANDEM_CPU_ISA"), &isa) ? Supported(isa) : BestIsa();
}

std::atomic<Isa>& IsaSetting() {
  static std::atomic<Isa> isa{DefaultIsa()};
  return isa;
}

// Rows a token-parallel loop gives each chunk so that a chunk holds ~kElementGrain floats.
int64_t RowGrain(int64_t row_len) { return std::max<int64_t>(1, kElementGrain / row_len); }

TANDEM_AVX2 void RmsNormRowAvx2(const float* x, const float* weight, float* y, int dim, float eps) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= dim; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = simd::HorizontalSum(acc);
  for (; i < dim; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / dim + eps);
  const __m256 sv = _mm256_set1_ps(scale);
  i = 0;
  for (; i + 8 <= dim; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(weight + i),
                                          _mm256_mul_ps(sv, _mm256_loadu_ps(x + i))));
  }
  for (; i < dim; ++i) y[i] = weight[i] * (scale * x[i]);
}

void RmsNormRowScalar(const float* x, const float* weight, float* y, int dim, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < dim; ++i) ss += x[i] * x[i];
  ss /= dim;
  ss += eps;
  ss = 1.0f / std::sqrt(ss);
  for (int i = 0; i < dim; ++i) y[i] = weight[i] * (ss * x[i]);
}

TANDEM_AVX2 void SiluMulAvx2(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 sig =
        _mm256_div_ps(one, _mm256_add_ps(one, simd::Exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] * (1.0f / (1.0f + std::exp(-gate[i]))) * up[i];
}

void SiluMulScalar(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g * (1.0f / (1.0f + std::exp(-g))) * up[i];
  }
}

// gelu_tanh(x) = 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), which is x
// sigmoid(2u): the vector path computes that form (one exp, no cancellation for negative x).
constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

TANDEM_AVX2 void GeluTanhMulAvx2(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 minus_two_c = _mm256_set1_ps(-2.0f * kGeluSqrt2OverPi);
  const __m256 cubic = _mm256_set1_ps(kGeluCubic);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(cubic, g), _mm256_mul_ps(g, g), g);
    const __m256 e = simd::Exp8(_mm256_mul_ps(minus_two_c, inner));
    const __m256 gelu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-2.0f * kGeluSqrt2OverPi * (g + kGeluCubic * g * g * g))) * up[i];
  }
}

void GeluTanhMulScalar(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float inner = kGeluSqrt2OverPi * (g + kGeluCubic * g * g * g);
    out[i] = 0.5f * g * (1.0f + std::tanh(inner)) * up[i];
  }
}

TANDEM_AVX2 void AddAvx2(float* x, const float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) x[i] += y[i];
}

}  // namespace

bool CpuHasAvx2() {
  // F16C through cpuid: clang 14's __builtin_cpu_supports does not know "f16c".
  auto f16c = [] {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
  };
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c();
  return has;
}

bool CpuHasAvx512() {
  static const bool has = [] {
    unsigned a, b, c, d;
    // XCR0 must enable the opmask and upper-ZMM state (bits 5-7) besides SSE and AVX (1-2).
    if (__get_cpuid(1, &a, &b, &c, &d) == 0 || (c & bit_OSXSAVE) == 0) return false;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xE6) != 0xE6) return false;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    const bool f = b & bit_AVX512F, dq = b & bit_AVX512DQ, bw = b & bit_AVX512BW,
               vl = b & bit_AVX512VL, vnni = c & bit_AVX512VNNI;
    return CpuHasAvx2() && f && dq && bw && vl && vnni;
  }();
  return has;
}

bool CpuHasAmx() {
  static const bool has = [] {
#if defined(__x86_64__) && defined(__linux__) && defined(SYS_arch_prctl)
    if (NativeAmxKernels() == nullptr || !CpuHasAvx512()) return false;
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    constexpr unsigned kAmxTile = 1u << 24, kAmxInt8 = 1u << 25;
    if ((d & kAmxTile) == 0 || (d & kAmxInt8) == 0) return false;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    constexpr unsigned kTileState = 3u << 17;  // XTILECFG and XTILEDATA
    if ((lo & kTileState) != kTileState) return false;
    // Linux hands out the 8 KB of tile state only to processes that ask (ARCH_REQ_XCOMP_PERM
    // for XFEATURE_XTILEDATA); the grant covers every thread of the process.
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
    return false;
#endif
  }();
  return has;
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAmx:
      return "amx";
  }
  return "?";
}

bool ParseIsa(const char* name, Isa* isa) {
  if (name == nullptr) return false;
  for (Isa candidate : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    if (std::strcmp(name, IsaName(candidate)) == 0) {
      *isa = candidate;
      return true;
    }
  }
  return false;
}

Isa BestIsa() { return Supported(Isa::kAmx); }

Isa ActiveIsa() { return IsaSetting().load(std::memory_order_relaxed); }

Isa SetIsa(Isa isa) {
  isa = Supported(isa);
  IsaSetting().store(isa);
  return isa;
}

const Avx512Kernels& ActiveAvx512Kernels() {
  if (g_test_avx512 != nullptr) return *g_test_avx512;
  return ActiveIsa() == Isa::kAmx ? *NativeAmxKernels() : NativeAvx512Kernels();
}

void SetAvx512KernelsForTesting(const Avx512Kernels* kernels) {
  g_test_avx512 = kernels;
  if (kernels == nullptr) SetIsa(ActiveIsa());
}

void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)>& fn) {
  if (pool == nullptr) {
    if (n > 0) fn(0, n);
    return;
  }
  pool->ParallelFor(n, grain, fn);
}

void RmsNorm(const float* x, const float* weight, float* y, int n, int dim, float eps,
             ThreadPool* pool) {
  const bool avx = ActiveIsa() != Isa::kScalar;
  ParallelFor(pool, n, RowGrain(dim), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* xr = x + t * dim;
      float* yr = y + t * dim;
      if (avx) {
        RmsNormRowAvx2(xr, weight, yr, dim, eps);
      } else {
        RmsNormRowScalar(xr, weight, yr, dim, eps);
      }
    }
  });
}

void Rope(float* x, int n, int n_heads, int head_dim, const int* positions, const float* inv_freq,
          RopeStyle style, ThreadPool* pool) {
  const int half = head_dim / 2;
  ParallelFor(pool, n, RowGrain(int64_t{n_heads} * head_dim), [&](int64_t t0, int64_t t1) {
    // cos/sin depend on the position only: computed once per token for all its heads.
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t t = t0; t < t1; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (int i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        cos_v[i] = std::cos(angle);
        sin_v[i] = std::sin(angle);
      }
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + (t * n_heads + h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const int a = style == RopeStyle::kInterleaved ? 2 * i : i;
          const int b = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
          const float v0 = v[a], v1 = v[b];
          v[a] = v0 * cos_v[i] - v1 * sin_v[i];
          v[b] = v0 * sin_v[i] + v1 * cos_v[i];
        }
      }
    }
  });
}

KvLayerRef F32Cache(float* k_cache, float* v_cache, int block_size, int n_kv_heads, int head_dim) {
  KvLayerRef r;
  r.dtype = DType::kF32;
  r.k = k_cache;
  r.v = v_cache;
  r.block_size = block_size;
  r.n_kv_heads = n_kv_heads;
  r.head_dim = head_dim;
  return r;
}

void WriteKv(const float* k, const float* v, const int* slots, int n, int width, float* k_cache,
             float* v_cache) {
  WriteKv(k, v, slots, n, F32Cache(k_cache, v_cache, 1, 1, width));
}

namespace {

// One row of `width` floats into the cache row `dst` of `dtype`; fp8 divides each KV head's
// elements by its scale.
void StoreRow(const float* src, void* dst, const KvLayerRef& c, int block, int kv) {
  const int64_t width = c.width();
  switch (c.dtype) {
    case DType::kF32:
      std::copy(src, src + width, static_cast<float*>(dst));
      return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < width; ++i) d[i] = F32ToBf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < width; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    case DType::kFp8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (int h = 0; h < c.n_kv_heads; ++h) {
        const float inv = 1.0f / c.scale(block, kv, h);
        const int64_t o = static_cast<int64_t>(h) * c.head_dim;
        for (int i = 0; i < c.head_dim; ++i) d[o + i] = F32ToFp8E4M3(src[o + i] * inv);
      }
      return;
    }
    default:  // block-quantized types are weights only (KvCache::Create refuses them)
      return;
  }
}

}  // namespace

void WriteKv(const float* k, const float* v, const int* slots, int n, const KvLayerRef& c) {
  const int64_t width = c.width();
  const int64_t row_bytes = width * static_cast<int64_t>(DTypeSize(c.dtype));
  for (int t = 0; t < n; ++t) {
    const int block = slots[t] / c.block_size;
    const int64_t dst = static_cast<int64_t>(slots[t]) * row_bytes;
    StoreRow(k + t * width, static_cast<char*>(c.k) + dst, c, block, 0);
    StoreRow(v + t * width, static_cast<char*>(c.v) + dst, c, block, 1);
  }
}

void SiluMul(const float* gate, const float* up, float* out, int64_t n, ThreadPool* pool) {
  const bool avx = ActiveIsa() != Isa::kScalar;
  ParallelFor(pool, n, kElementGrain, [&](int64_t i0, int64_t i1) {
    if (avx) {
      SiluMulAvx2(gate + i0, up + i0, out + i0, i1 - i0);
    } else {
      SiluMulScalar(gate + i0, up + i0, out + i0, i1 - i0);
    }
  });
}

void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n, ThreadPool* pool) {
  const bool avx = ActiveIsa() != Isa::kScalar;
  ParallelFor(pool, n, kElementGrain, [&](int64_t i0, int64_t i1) {
    if (avx) {
      GeluTanhMulAvx2(gate + i0, up + i0, out + i0, i1 - i0);
    } else {
      GeluTanhMulScalar(gate + i0, up + i0, out + i0, i1 - i0);
    }
  });
}

void Scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void Embedding(const int* ids, const WeightRef& table, float* out, int n) {
  const int64_t row_bytes = RowBytes(table.dtype, table.cols);
  for (int t = 0; t < n; ++t) {
    const void* row = static_cast<const char*>(table.data) + ids[t] * row_bytes;
    DequantizeRow(table.dtype, row, out + static_cast<int64_t>(t) * table.cols, table.cols);
  }
}

void Add(float* x, const float* y, int64_t n, ThreadPool* pool) {
  const bool avx = ActiveIsa() != Isa::kScalar;
  ParallelFor(pool, n, kElementGrain, [&](int64_t i0, int64_t i1) {
    if (avx) {
      AddAvx2(x + i0, y + i0, i1 - i0);
    } else {
      for (int64_t i = i0; i < i1; ++i) x[i] += y[i];
    }
  });
}

}  // namespace tandem::cpu
