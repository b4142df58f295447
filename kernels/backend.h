// The compute backend interface: the handful of operations the Llama forward pass needs. The
// model (engine/model.cc) is written once against it. The CPU backend (kernels/cpu/) is the
// reference; the CUDA backend (kernels/cuda/) implements the same operations on the device and
// is tested against the CPU twins.
//
// All activations are float32. Weights may be f32, f16 or bf16 (WeightRef), the KV cache f32,
// bf16, f16 or fp8 (KvLayerRef); compute and accumulation are float32.
#ifndef TANDEM_KERNELS_BACKEND_H_
#define TANDEM_KERNELS_BACKEND_H_

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kernels/dtype.h"

namespace tandem {

// A row-major matrix [rows, cols] of `dtype` elements, not owned.
struct WeightRef {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

enum class RopeStyle : uint8_t {
  kInterleaved,  // rotate pairs (2i, 2i+1): llama2.c / Meta checkpoints
  kHalf,         // rotate (i, i + head_dim/2): Hugging Face checkpoints
};

// Metadata for attention of a flat batch of tokens (from several sequences) over a paged KV
// cache laid out per layer as [num_blocks, block_size, n_kv_heads, head_dim].
struct PagedAttentionArgs {
  int num_tokens = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int max_blocks_per_seq = 0;
  const int* token_seq = nullptr;     // [num_tokens] sequence index of each token
  const int* token_pos = nullptr;     // [num_tokens] position; attends to positions [0, pos]
  const int* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq] block ids
  int sliding_window = 0;             // > 0: attend to positions (pos - window, pos] only
  float scale = 0.0f;                 // scores are q·k times this; 0 = 1 / sqrt(head_dim)

  float ScoreScale() const {
    return scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
};

// One layer of a paged KV cache, not owned: K and V as [num_blocks * block_size, n_kv_heads,
// head_dim] of `dtype` (f32, bf16, f16 or fp8); for fp8, `scales` [num_blocks, 2 (K, V),
// n_kv_heads]: an element's value is its stored value times its block's scale for its KV head.
struct KvLayerRef {
  DType dtype = DType::kF32;
  void* k = nullptr;
  void* v = nullptr;
  float* scales = nullptr;  // fp8 only
  int block_size = 0;
  int n_kv_heads = 0;
  int head_dim = 0;

  int64_t width() const { return static_cast<int64_t>(n_kv_heads) * head_dim; }
  // The scale of K (kv = 0) or V (kv = 1) of KV head `h` in `block`; 1 without scales.
  float scale(int block, int kv, int h) const {
    return scales == nullptr ? 1.0f
                             : scales[(static_cast<int64_t>(block) * 2 + kv) * n_kv_heads + h];
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // y[n, w.rows] = x[n, w.cols] · wᵀ, plus bias[w.rows] when bias != nullptr.
  virtual void Matmul(const float* x, const WeightRef& w, const float* bias, float* y, int n) = 0;
  // y[n, dim] = x / sqrt(mean(x²) + eps) * weight[dim]. y may alias x.
  virtual void RmsNorm(const float* x, const float* weight, float* y, int n, int dim,
                       float eps) = 0;
  // Rotates x[n, n_heads, head_dim] in place by positions[n] with inv_freq[head_dim / 2].
  virtual void Rope(float* x, int n, int n_heads, int head_dim, const int* positions,
                    const float* inv_freq, RopeStyle style) = 0;
  // Scatters k[n, width] and v[n, width] into the cache at slots[n] (slot = block *
  // block_size + offset), converted to its dtype (fp8: divided by the slot's block scale, which
  // must be set, and saturated at ±448).
  virtual void WriteKv(const float* k, const float* v, const int* slots, int n,
                       const KvLayerRef& cache) = 0;
  // out[num_tokens, n_heads, head_dim] = causal softmax(q·Kᵀ · args.ScoreScale()) · V, with q
  // [num_tokens, n_heads, head_dim]; query head h reads KV head h / (n_heads / n_kv_heads). The
  // cache is read in its dtype; compute is float32.
  virtual void PagedAttention(const float* q, const KvLayerRef& cache,
                              const PagedAttentionArgs& args, float* out) = 0;
  // out[i] = silu(gate[i]) * up[i] for i < n.
  virtual void SiluMul(const float* gate, const float* up, float* out, int64_t n) = 0;
  // out[i] = gelu_tanh(gate[i]) * up[i] for i < n, PyTorch's gelu(approximate="tanh").
  virtual void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n) = 0;
  // x[i] *= s for i < n.
  virtual void Scale(float* x, float s, int64_t n) = 0;
  // out[n, table.cols] = rows ids[n] of table.
  virtual void Embedding(const int* ids, const WeightRef& table, float* out, int n) = 0;
  // x[i] += y[i] for i < n.
  virtual void Add(float* x, const float* y, int64_t n) = 0;
};

// The CPU backend (always available), with its own pool of `num_threads` threads (<= 0: the
// TANDEM_NUM_THREADS environment variable, else one per hardware thread).
std::unique_ptr<Backend> MakeCpuBackend(int num_threads = 0);

}  // namespace tandem

#endif  // TANDEM_KERNELS_BACKEND_H_
