// Causal attention over a paged KV cache of bf16 or fp8 (E4M3 with per-block, per-head scales),
// by FlashInfer's batch attention: the FA2 templates of flashinfer/attention/prefill.cuh, from
// the flashinfer-python wheel (Apache-2.0; scripts/fetch_flashinfer.sh), compiled ahead of time
// for the head dims and KV dtypes below. One launch per layer covers every chunk of a step,
// prefill (chunked, after a prefix hit: a chunk's queries are the last of its KV) and decode
// alike, with GQA and sliding windows. Queries and output are bf16; K is used exact (fp8 and
// bf16 are exact in bf16) and scaled after Q·K, the softmax weights and V are rounded to bf16,
// sums are f32. Internal to libtandem_cuda.so; no FlashInfer type crosses this header.
#ifndef TANDEM_KERNELS_CUDA_FI_ATTENTION_H_
#define TANDEM_KERNELS_CUDA_FI_ATTENTION_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tandem::cuda {

// A step's sequences in FlashInfer's page-list form, on the device (engine/cuda/step_plan.h
// builds them beside Tandem's block tables).
struct FiSequences {
  // [n + 1]: sequence s has query rows [q_indptr[s], q_indptr[s + 1]).
  const int* q_indptr = nullptr;
  // [n + 1]: its pages are kv_indices[kv_indptr[s] .. kv_indptr[s + 1]).
  const int* kv_indptr = nullptr;
  const int* kv_indices = nullptr;        // block ids, in position order
  const int* kv_last_page_len = nullptr;  // [n]: positions in its last page, in [1, block_size]
};

struct FiShape {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int kv_dtype = 0;        // kKvBf16 or kKvFp8 (kernels/cuda/ops.h)
  int sliding_window = 0;  // > 0: a query attends to at most this many positions
};

// Whether this build carries FlashInfer's kernels for `head_dim` and `kv_dtype` (64 and 128;
// bf16 and fp8), and why not when it does not (for errors naming --kv-dtype).
bool FiSupported(int head_dim, int kv_dtype, const char** why = nullptr);

// The planner's output every layer's launch of one step follows (flashinfer::PrefillPlanInfo's
// fields: the work tiles' layout in the workspaces, the split over the KV, the padded grid).
struct FiPlan {
  int64_t padded_batch_size = 0, total_num_rows = 0, total_num_rows_offset = 0, cta_tile_q = 0;
  int64_t request_indices_offset = 0, qo_tile_indices_offset = 0, kv_tile_indices_offset = 0;
  int64_t merge_indptr_offset = 0, o_indptr_offset = 0, kv_chunk_size_ptr_offset = 0;
  int64_t v_offset = 0, s_offset = 0, block_valid_mask_offset = 0;
  bool enable_cuda_graph = false, split_kv = false;
};

// One layer's launch, for the instantiations (fi_attention_hd*.cu).
struct FiLaunch {
  FiShape shape;
  FiPlan plan;
  int num_seqs = 0;
  const void* q = nullptr;        // [rows, n_heads, head_dim] bf16
  const void* k_cache = nullptr;  // [blocks, block_size, n_kv_heads, head_dim] of kv_dtype
  const void* v_cache = nullptr;
  const float* scales = nullptr;  // fp8: [blocks, 2 (K, V), n_kv_heads]
  FiSequences seqs;
  void* o = nullptr;  // [rows, n_heads, head_dim] bf16
  void* float_workspace = nullptr;
  void* int_workspace = nullptr;
  cudaStream_t stream = nullptr;
};
int FiRunHd64Bf16(const FiLaunch& l);
int FiRunHd64Fp8(const FiLaunch& l);
int FiRunHd128Bf16(const FiLaunch& l);
int FiRunHd128Fp8(const FiLaunch& l);

class FiAttention {
 public:
  // Workspaces for steps of at most max_rows query rows over max_seqs sequences: the planner's
  // float and int buffers on the device, its pinned host staging. nullptr with last_error() set
  // when the shape is not supported or memory is short.
  static FiAttention* Create(const FiShape& shape, int max_rows, int max_seqs);
  ~FiAttention();
  FiAttention(const FiAttention&) = delete;
  FiAttention& operator=(const FiAttention&) = delete;

  // Plans a step from host copies of its indptrs ([num_seqs + 1] each): how every layer's
  // launch splits the work. `graph`: a decode step (one row per sequence) to be replayed from a
  // CUDA graph; the launch shape is then the same at every num_seqs, and Plan must run before
  // each replay (outside the capture). Issues one host-to-device copy on `stream`, from pinned
  // staging the previous step no longer reads (the device model synchronizes between steps).
  int Plan(const int* q_indptr_h, const int* kv_indptr_h, int num_seqs, bool graph,
           cudaStream_t stream);
  // One layer under the last Plan: o = attention of q over the caches (see FiLaunch).
  int Run(const void* q, const void* k_cache, const void* v_cache, const float* scales,
          const FiSequences& seqs, void* o, cudaStream_t stream) const;

  size_t workspace_bytes() const { return float_bytes_ + int_bytes_; }

 private:
  FiAttention() = default;
  FiShape shape_;
  int max_rows_ = 0, max_seqs_ = 0;
  void* float_ws_ = nullptr;  // device
  void* int_ws_ = nullptr;    // device
  void* int_host_ = nullptr;  // pinned
  size_t float_bytes_ = 0, int_bytes_ = 0;
  FiPlan plan_;
  int num_seqs_ = 0;
};

}  // namespace tandem::cuda

#endif  // TANDEM_KERNELS_CUDA_FI_ATTENTION_H_
