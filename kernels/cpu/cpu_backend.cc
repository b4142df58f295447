#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"

namespace tandem {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  void Matmul(const float* x, const WeightRef& w, const float* bias, float* y, int n) override {
    cpu::Matmul(x, w, bias, y, n);
  }
  void RmsNorm(const float* x, const float* weight, float* y, int n, int dim, float eps) override {
    cpu::RmsNorm(x, weight, y, n, dim, eps);
  }
  void Rope(float* x, int n, int n_heads, int head_dim, const int* positions, const float* inv_freq,
            RopeStyle style) override {
    cpu::Rope(x, n, n_heads, head_dim, positions, inv_freq, style);
  }
  void WriteKv(const float* k, const float* v, const int* slots, int n, int width, float* k_cache,
               float* v_cache) override {
    cpu::WriteKv(k, v, slots, n, width, k_cache, v_cache);
  }
  void PagedAttention(const float* q, const float* k_cache, const float* v_cache,
                      const PagedAttentionArgs& args, float* out) override {
    cpu::PagedAttention(q, k_cache, v_cache, args, out);
  }
  void SiluMul(const float* gate, const float* up, float* out, int64_t n) override {
    cpu::SiluMul(gate, up, out, n);
  }
  void Embedding(const int* ids, const WeightRef& table, float* out, int n) override {
    cpu::Embedding(ids, table, out, n);
  }
  void Add(float* x, const float* y, int64_t n) override { cpu::Add(x, y, n); }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace tandem
