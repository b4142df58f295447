// What the prefill and decode engines run a model on: the forward pass plus the paged KV cache
// it writes, exposed for KV transfer to pack. Two implementations:
//   - the CPU runner: Model::Forward over a host KvCache (the reference; unchanged behaviour);
//   - the CUDA runner: the device-resident model of libtandem_cuda.so (kernels/cuda/
//     cuda_api.h model_*), weights and KV cache on the GPU, loaded at run time.
#ifndef TANDEM_ENGINE_MODEL_RUNNER_H_
#define TANDEM_ENGINE_MODEL_RUNNER_H_

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kv/kv_cache.h"
#include "engine/model.h"
#include "engine/sampling/sampler.h"

namespace tandem {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual std::string_view device() const = 0;  // "cpu" or "cuda"
  virtual int num_blocks() const = 0;
  virtual int block_size() const = 0;

  // Model::Forward's contract (engine/model.h), with the runner's own cache. The CPU runner calls
  // on_layer_kv(layer) as each layer's KV is final; the CUDA runner calls it for every layer
  // once the whole step is done (per-layer events on the device are not wired yet), so a
  // prefill's KV shipping starts after its forward there.
  virtual absl::Status Forward(std::span<const SequenceChunk> batch, std::vector<float>* logits,
                               const std::function<void(int layer)>& on_layer_kv = nullptr) = 0;

  // Forward, then each logit row sampled where the logits are (engine/sampling/sampler.h Sample
  // with params[row] at positions[row]): only the tokens come back. For runners whose logits live
  // on a device (samples_on_device()); the others answer UNIMPLEMENTED.
  virtual bool samples_on_device() const { return false; }
  virtual absl::Status ForwardSample(std::span<const SequenceChunk> batch,
                                     std::span<const SamplingParams> params,
                                     std::span<const uint64_t> positions,
                                     std::vector<int>* tokens) {
    return absl::UnimplementedError("this runner samples on the host from the logits");
  }

  // The runner's KV cache, for KV transfer to pack and unpack (kv_transfer/runner_kv.h).
  // A cache in host memory is handed out as is; a device cache is reached by copies.
  virtual KvCache* host_kv_cache() { return nullptr; }
  // The cache's shape and dtype (what a block and a transferred chunk hold).
  virtual KvCacheSpec kv_spec() const = 0;
  int kv_width() const { return kv_spec().width(); }
  // Device caches: a chunk's payload as kv_transfer/kv_pack.h GatherKv lays it out (K rows then
  // V rows [2, token_count, width] of the cache dtype, then for fp8 the sequence's scales [2,
  // n_kv_heads] f32) for tokens [token_start, token_start + token_count) of `layer` through
  // `block_table`, copied out of (into) the cache. INVALID_ARGUMENT for a layer, range or block
  // outside the cache, before anything is copied.
  virtual absl::Status CopyKvOut(int layer, std::span<const int> block_table, int token_start,
                                 int token_count, char* out) {
    return absl::UnimplementedError("this runner's KV cache is in host memory");
  }
  virtual absl::Status CopyKvIn(int layer, std::span<const int> block_table, int token_start,
                                int token_count, const char* in) {
    return absl::UnimplementedError("this runner's KV cache is in host memory");
  }
};

// The CPU runner over `model` (which must outlive it) and `cache`. With `samples_rows` it also
// answers ForwardSample, drawing each row on the host as a device runner draws it on the device
// (the twin the engines' sample-on-device paths are tested with).
std::unique_ptr<ModelRunner> MakeCpuModelRunner(const Model* model, KvCache cache,
                                                bool samples_rows = false);

// What a model runner (CPU or device, MakeModelRunner) is sized for: its KV cache and the largest
// step it will be given.
struct ModelRunnerOptions {
  int num_blocks = 0;
  int block_size = 16;
  int max_batch_tokens = 2048;  // tokens per step (the prefill token budget; the decode batch)
  int max_seqs = 64;            // sequences per step
  int max_logit_rows = 0;       // logit rows per step (all_logits chunks); 0: max_seqs
  bool use_graphs = true;       // decode-only steps as CUDA graphs per batch bucket
  // The KV cache dtype (engine/kv/kv_cache.h): f32, bf16 or fp8 on the CUDA device model (bf16
  // and fp8 attention by FlashInfer, for head_dim 64 and 128; f16 runs on the CPU only).
  DType kv_dtype = DType::kF32;

  absl::Status Validate() const;
};

// The CUDA runner: uploads `model`'s weights (matrices must all be f32 or all bf16; the token
// embedding may be f32, f16 or bf16) to the device. UNAVAILABLE naming --device when there is
// no CUDA library or device.
absl::StatusOr<std::unique_ptr<ModelRunner>> MakeCudaModelRunner(const Model& model,
                                                                 const ModelRunnerOptions& options);

// OK when the CUDA runner computes `config`'s layout; else UNIMPLEMENTED naming what it lacks
// (`--device=auto` then runs such a model on the CPU).
absl::Status CudaSupportsModel(const ModelConfig& config);

// `--kv-dtype` for an engine on `device` ("cpu" or "cuda"): "auto" is bf16 on CUDA where the
// library's attention supports the model's head_dim in bf16 (FlashInfer), else f32; any other
// name as ParseKvDtype reads it.
absl::StatusOr<DType> ResolveKvDtype(std::string_view name, std::string_view device,
                                     const ModelConfig& config);

// The runner for an engine: "cpu" builds the CPU runner over a new KvCache of num_blocks x
// block_size, "cuda" the CUDA runner.
absl::StatusOr<std::unique_ptr<ModelRunner>> MakeModelRunner(const std::string& device,
                                                             const Model* model,
                                                             const ModelRunnerOptions& options);

}  // namespace tandem

#endif  // TANDEM_ENGINE_MODEL_RUNNER_H_
