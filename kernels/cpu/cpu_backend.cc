#include <cstdlib>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem {
namespace {

// The CPU backend: the cpu:: kernels on a thread pool that lives as long as the backend.
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads) : pool_(num_threads) {}

  std::string_view name() const override { return "cpu"; }
  void Matmul(const float* x, const WeightRef& w, const float* bias, float* y, int n) override {
    cpu::Matmul(x, w, bias, y, n, &pool_);
  }
  void RmsNorm(const float* x, const float* weight, float* y, int n, int dim, float eps) override {
    cpu::RmsNorm(x, weight, y, n, dim, eps, &pool_);
  }
  void Rope(float* x, int n, int n_heads, int head_dim, const int* positions, const float* inv_freq,
            RopeStyle style) override {
    cpu::Rope(x, n, n_heads, head_dim, positions, inv_freq, style, &pool_);
  }
  void WriteKv(const float* k, const float* v, const int* slots, int n,
               const KvLayerRef& cache) override {
    cpu::WriteKv(k, v, slots, n, cache);
  }
  void PagedAttention(const float* q, const KvLayerRef& cache, const PagedAttentionArgs& args,
                      float* out) override {
    cpu::PagedAttention(q, cache, args, out, &pool_);
  }
  void SiluMul(const float* gate, const float* up, float* out, int64_t n) override {
    cpu::SiluMul(gate, up, out, n, &pool_);
  }
  void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n) override {
    cpu::GeluTanhMul(gate, up, out, n, &pool_);
  }
  void Scale(float* x, float s, int64_t n) override { cpu::Scale(x, s, n); }
  void Embedding(const int* ids, const WeightRef& table, float* out, int n) override {
    cpu::Embedding(ids, table, out, n);
  }
  void Add(float* x, const float* y, int64_t n) override { cpu::Add(x, y, n, &pool_); }

 private:
  ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int num_threads) {
  if (num_threads <= 0) {
    if (const char* env = std::getenv("TANDEM_NUM_THREADS")) num_threads = std::atoi(env);
  }
  return std::make_unique<CpuBackend>(num_threads);
}

}  // namespace tandem
