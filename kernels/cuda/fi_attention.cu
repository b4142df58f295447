// FiAttention (fi_attention.h): workspaces sized for the largest step, the per-step plan
// (FlashInfer's PrefillPlan: the work split over query tiles and KV chunks, shared by every
// layer), and the dispatch to the instantiation of the model's head_dim and KV dtype.
#include <algorithm>
#include <exception>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fi_attention.h"
#include "kernels/cuda/ops.h"

#ifdef TANDEM_FLASHINFER
#include <flashinfer/attention/scheduler.cuh>
#endif

namespace tandem::cuda {

bool FiSupported(int head_dim, int kv_dtype, const char** why) {
#ifdef TANDEM_FLASHINFER
  if (head_dim != 64 && head_dim != 128) {
    if (why) *why = "FlashInfer's kernels are built for head_dim 64 and 128 only";
    return false;
  }
  if (kv_dtype != kKvBf16 && kv_dtype != kKvFp8) {
    if (why) *why = "FlashInfer's kernels are built for bf16 and fp8 KV caches only";
    return false;
  }
  return true;
#else
  (void)head_dim;
  (void)kv_dtype;
  if (why) {
    *why =
        "this libtandem_cuda.so was built without FlashInfer (scripts/fetch_flashinfer.sh "
        "could not fetch it at configure time, or -DTANDEM_FLASHINFER=OFF)";
  }
  return false;
#endif
}

#ifdef TANDEM_FLASHINFER
namespace {

FiPlan FromInfo(const flashinfer::PrefillPlanInfo& i) {
  FiPlan p;
  p.padded_batch_size = i.padded_batch_size;
  p.total_num_rows = i.total_num_rows;
  p.total_num_rows_offset = i.total_num_rows_offset;
  p.cta_tile_q = i.cta_tile_q;
  p.request_indices_offset = i.request_indices_offset;
  p.qo_tile_indices_offset = i.qo_tile_indices_offset;
  p.kv_tile_indices_offset = i.kv_tile_indices_offset;
  p.merge_indptr_offset = i.merge_indptr_offset;
  p.o_indptr_offset = i.o_indptr_offset;
  p.kv_chunk_size_ptr_offset = i.kv_chunk_size_ptr_offset;
  p.v_offset = i.v_offset;
  p.s_offset = i.s_offset;
  p.block_valid_mask_offset = i.block_valid_mask_offset;
  p.enable_cuda_graph = i.enable_cuda_graph;
  p.split_kv = i.split_kv;
  return p;
}

// The planner's arguments for a step of `seqs` sequences.
struct PlanArgs {
  std::vector<int32_t> q, kv;  // host indptrs
  bool graph = false;
};

// The workspace bytes (float, int) a plan of `a` needs (FlashInfer's own sizing).
void Need(const FiShape& s, PlanArgs a, size_t* float_bytes, size_t* int_bytes) {
  size_t f = 0, i = 0;
  const uint32_t n = static_cast<uint32_t>(a.q.size() - 1);
  flashinfer::PrefillPlanWorkspaceSize<int32_t>(
      f, i, a.q.data(), a.kv.data(), static_cast<uint32_t>(a.q.back()), n, s.n_heads, s.n_kv_heads,
      s.head_dim, s.head_dim, s.block_size, a.graph, /*sizeof_dtype_o=*/2,
      s.sliding_window > 0 ? s.sliding_window - 1 : -1, /*fixed_split_size=*/-1,
      /*disable_split_kv=*/false, /*num_colocated_ctas=*/0, /*uniform_q_len=*/a.graph ? 1 : 0,
      /*fixed_uniform_q_len=*/a.graph, /*stream=*/nullptr,
      static_cast<uint32_t>(KvElementBytes(s.kv_dtype)));
  *float_bytes = std::max(*float_bytes, f);
  *int_bytes = std::max(*int_bytes, i);
}

// `n` sequences of `rows` query rows each over `pages` pages.
PlanArgs Uniform(int n, int rows, int pages, bool graph) {
  PlanArgs a;
  a.graph = graph;
  for (int s = 0; s <= n; ++s) {
    a.q.push_back(s * rows);
    a.kv.push_back(s * pages);
  }
  return a;
}

}  // namespace
#endif

FiAttention* FiAttention::Create(const FiShape& shape, int max_rows, int max_seqs) {
  const char* why = nullptr;
  if (!FiSupported(shape.head_dim, shape.kv_dtype, &why)) {
    BadArg("flashinfer attention", why);
    return nullptr;
  }
  if (shape.n_heads <= 0 || shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0 ||
      shape.block_size <= 0 || max_rows <= 0 || max_seqs <= 0) {
    BadArg("flashinfer attention",
           "heads (a multiple of the KV heads), block size and capacities > 0");
    return nullptr;
  }
#ifdef TANDEM_FLASHINFER
  auto* fi = new FiAttention();
  fi->shape_ = shape;
  fi->max_rows_ = max_rows;
  fi->max_seqs_ = max_seqs;
  // The largest plans a step within the capacities can make: long contexts (which split the
  // KV) for decode batches of every size, eager and graphed, and prefill shapes.
  const int long_pages = 1 << 16;
  size_t f = 0, i = 0;
  try {
    for (int n = 1; n <= max_seqs; n = n < max_seqs ? std::min(2 * n, max_seqs) : n + 1) {
      Need(shape, Uniform(n, 1, long_pages, true), &f, &i);
      Need(shape, Uniform(n, 1, long_pages, false), &f, &i);
      Need(shape, Uniform(n, std::max(1, max_rows / n), long_pages, false), &f, &i);
    }
    Need(shape, Uniform(1, max_rows, long_pages, false), &f, &i);
  } catch (const std::exception& e) {
    BadArg("flashinfer attention: sizing the workspace", e.what());
    delete fi;
    return nullptr;
  }
  // A plan that splits the KV keeps a partial output row per (query tile row, KV chunk): at most
  // padded_batch_size x cta_tile_q / group of them. It splits only while its work tiles are
  // fewer than twice the SMs per KV head (max_bs), with tiles of up to 128 packed rows; a decode
  // graph pads to max(max_bs, its sequences) tiles of 16. The sampled shapes above need not
  // reach that bound, so it is taken analytically too.
  int sms = 0, dev = 0;
  if (Check(cudaGetDevice(&dev), "flashinfer attention") ||
      Check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
            "flashinfer attention")) {
    delete fi;
    return nullptr;
  }
  const size_t group = static_cast<size_t>(shape.n_heads / shape.n_kv_heads);
  const size_t max_bs = std::max(1, 2 * sms / shape.n_kv_heads);
  const size_t rows = std::max((max_bs * 128 + group - 1) / group,
                               (std::max<size_t>(max_bs, max_seqs) * 16 + group - 1) / group);
  const size_t bound = static_cast<size_t>(shape.n_heads) * rows *
                           (static_cast<size_t>(shape.head_dim) + 1) * sizeof(float) +
                       4096;
  fi->float_bytes_ = std::max<size_t>({f, bound, 1 << 20});
  fi->int_bytes_ = std::max<size_t>(i, 1 << 16);
  if (Check(cudaMalloc(&fi->float_ws_, fi->float_bytes_), "flashinfer attention workspace") ||
      Check(cudaMalloc(&fi->int_ws_, fi->int_bytes_), "flashinfer attention workspace") ||
      Check(cudaMallocHost(&fi->int_host_, fi->int_bytes_), "flashinfer attention staging")) {
    delete fi;
    return nullptr;
  }
  return fi;
#else
  return nullptr;
#endif
}

FiAttention::~FiAttention() {
  if (float_ws_ != nullptr) cudaFree(float_ws_);
  if (int_ws_ != nullptr) cudaFree(int_ws_);
  if (int_host_ != nullptr) cudaFreeHost(int_host_);
}

int FiAttention::Plan(const int* q_indptr_h, const int* kv_indptr_h, int num_seqs, bool graph,
                      cudaStream_t stream) {
  if (num_seqs <= 0 || num_seqs > max_seqs_ || q_indptr_h[num_seqs] > max_rows_) {
    return BadArg("flashinfer attention plan", "1..max_seqs sequences of at most max_rows rows");
  }
#ifdef TANDEM_FLASHINFER
  std::vector<int32_t> q(q_indptr_h, q_indptr_h + num_seqs + 1);
  std::vector<int32_t> kv(kv_indptr_h, kv_indptr_h + num_seqs + 1);
  flashinfer::PrefillPlanInfo info;
  auto plan = [&](bool disable_split_kv) {
    return flashinfer::PrefillPlan<int32_t>(
        float_ws_, float_bytes_, int_ws_, int_host_, int_bytes_, info, q.data(), kv.data(),
        static_cast<uint32_t>(q.back()), static_cast<uint32_t>(num_seqs), shape_.n_heads,
        shape_.n_kv_heads, shape_.head_dim, shape_.head_dim, shape_.block_size, graph,
        /*sizeof_dtype_o=*/2, shape_.sliding_window > 0 ? shape_.sliding_window - 1 : -1,
        /*fixed_split_size=*/-1, disable_split_kv, /*num_colocated_ctas=*/0,
        /*uniform_q_len=*/graph ? 1 : 0, /*fixed_uniform_q_len=*/graph, stream,
        static_cast<uint32_t>(KvElementBytes(shape_.kv_dtype)));
  };
  try {
    cudaError_t e;
    try {
      e = plan(/*disable_split_kv=*/false);
    } catch (const std::exception&) {
      // The workspace is sized for the largest split (Create); should a plan still want more,
      // an eager step runs unsplit rather than fail (a graph's shape must not change).
      if (graph) throw;
      e = plan(/*disable_split_kv=*/true);
    }
    if (int rc = Check(e, "flashinfer attention plan")) return rc;
  } catch (const std::exception& ex) {
    return BadArg("flashinfer attention plan", ex.what());
  }
  plan_ = FromInfo(info);
  num_seqs_ = num_seqs;
  return 0;
#else
  (void)kv_indptr_h;
  (void)graph;
  (void)stream;
  return BadArg("flashinfer attention plan", "built without FlashInfer");
#endif
}

int FiAttention::Run(const void* q, const void* k_cache, const void* v_cache, const float* scales,
                     const FiSequences& seqs, void* o, cudaStream_t stream) const {
  if (num_seqs_ == 0) return BadArg("flashinfer attention", "run before a plan");
  if (shape_.kv_dtype == kKvFp8 && scales == nullptr) {
    return BadArg("flashinfer attention", "an fp8 cache needs its scales");
  }
  FiLaunch l;
  l.shape = shape_;
  l.plan = plan_;
  l.num_seqs = num_seqs_;
  l.q = q;
  l.k_cache = k_cache;
  l.v_cache = v_cache;
  l.scales = scales;
  l.seqs = seqs;
  l.o = o;
  l.float_workspace = float_ws_;
  l.int_workspace = int_ws_;
  l.stream = stream;
#ifdef TANDEM_FLASHINFER
  const bool fp8 = shape_.kv_dtype == kKvFp8;
  if (shape_.head_dim == 64) return fp8 ? FiRunHd64Fp8(l) : FiRunHd64Bf16(l);
  return fp8 ? FiRunHd128Fp8(l) : FiRunHd128Bf16(l);
#else
  return BadArg("flashinfer attention", "built without FlashInfer");
#endif
}

}  // namespace tandem::cuda
