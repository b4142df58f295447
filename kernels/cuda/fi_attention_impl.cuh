// The launch of FlashInfer's batch attention for one (head_dim, KV dtype), included by the
// instantiation files fi_attention_hd*.cu only (each compiles its kernels once, in parallel with
// the others). See fi_attention.h.
#ifndef TANDEM_KERNELS_CUDA_FI_ATTENTION_IMPL_CUH_
#define TANDEM_KERNELS_CUDA_FI_ATTENTION_IMPL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <exception>
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>
#include <flashinfer/page.cuh>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fi_attention.h"

namespace tandem::cuda::fi {

using Bf16 = nv_bfloat16;
using Fp8 = __nv_fp8_e4m3;

// FlashInfer reads per-(page, token, head) KV scales only from a params struct that has these
// members (USE_TOKEN_HEAD_SF); Tandem's are per (block, K/V, head): a token stride of 0.
template <typename KV>
struct PagedParams : flashinfer::BatchPrefillPagedParams<Bf16, KV, Bf16, int32_t> {
  float* maybe_k_cache_sf = nullptr;
  float* maybe_v_cache_sf = nullptr;
};

// Causal, sliding window as data (window_left -1: none; exact for models without one), no
// custom mask, soft cap or ALiBi. RoPE is applied before the cache is written.
using Variant = flashinfer::DefaultAttention</*use_custom_mask=*/false, /*use_sliding_window=*/true,
                                             /*use_logits_soft_cap=*/false, /*use_alibi=*/false>;

template <typename T>
T* At(void* base, int64_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

template <int kHeadDim, typename KV>
int Run(const FiLaunch& l) {
  constexpr bool kScaled = std::is_same_v<KV, Fp8>;
  using Params = PagedParams<KV>;
  const FiShape& s = l.shape;
  Params p;
  p.q = static_cast<Bf16*>(const_cast<void*>(l.q));
  // [blocks, block_size, n_kv_heads, head_dim]: FlashInfer's NHD page layout.
  p.paged_kv = flashinfer::paged_kv_t<KV, int32_t>(
      s.n_kv_heads, s.block_size, kHeadDim, l.num_seqs, flashinfer::QKVLayout::kNHD,
      static_cast<KV*>(const_cast<void*>(l.k_cache)),
      static_cast<KV*>(const_cast<void*>(l.v_cache)), const_cast<int32_t*>(l.seqs.kv_indices),
      const_cast<int32_t*>(l.seqs.kv_indptr), const_cast<int32_t*>(l.seqs.kv_last_page_len));
  p.q_indptr = const_cast<int32_t*>(l.seqs.q_indptr);
  p.o = static_cast<Bf16*>(l.o);
  p.lse = nullptr;
  p.num_qo_heads = s.n_heads;
  p.group_size = flashinfer::uint_fastdiv(s.n_heads / s.n_kv_heads);
  p.q_stride_n = s.n_heads * kHeadDim;
  p.q_stride_h = kHeadDim;
  p.window_left = s.sliding_window > 0 ? s.sliding_window - 1 : -1;
  p.logits_soft_cap = 0.0f;
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  p.rope_rcp_scale = 1.0f;
  p.rope_rcp_theta = 1.0f;
  if constexpr (kScaled) {
    float* scales = const_cast<float*>(l.scales);
    p.maybe_k_cache_sf = scales;
    p.maybe_v_cache_sf = scales + s.n_kv_heads;
    p.k_sf_stride_page = p.v_sf_stride_page = 2 * s.n_kv_heads;
    p.k_sf_stride_n = p.v_sf_stride_n = 0;
    p.k_sf_stride_h = p.v_sf_stride_h = 1;
  }
  const FiPlan& plan = l.plan;
  p.request_indices = At<int32_t>(l.int_workspace, plan.request_indices_offset);
  p.qo_tile_indices = At<int32_t>(l.int_workspace, plan.qo_tile_indices_offset);
  p.kv_tile_indices = At<int32_t>(l.int_workspace, plan.kv_tile_indices_offset);
  p.o_indptr = At<int32_t>(l.int_workspace, plan.o_indptr_offset);
  p.kv_chunk_size_ptr = At<int32_t>(l.int_workspace, plan.kv_chunk_size_ptr_offset);
  Bf16* tmp_v = nullptr;
  float* tmp_s = nullptr;
  if (plan.split_kv) {
    p.merge_indptr = At<int32_t>(l.int_workspace, plan.merge_indptr_offset);
    tmp_v = At<Bf16>(l.float_workspace, plan.v_offset);
    tmp_s = At<float>(l.float_workspace, plan.s_offset);
  }
  p.padded_batch_size = static_cast<uint32_t>(plan.padded_batch_size);
  p.max_total_num_rows = static_cast<uint32_t>(plan.total_num_rows);
  if (plan.enable_cuda_graph) {
    p.block_valid_mask = At<bool>(l.int_workspace, plan.block_valid_mask_offset);
    p.total_num_rows = At<uint32_t>(l.int_workspace, plan.total_num_rows_offset);
  }
  cudaError_t e = cudaErrorInvalidValue;
  try {
    auto launch = [&](auto tile) {
      constexpr uint32_t kTile = decltype(tile)::value;
      return flashinfer::BatchPrefillWithPagedKVCacheDispatched<
          /*SAME_KV_STRIDES=*/true, kTile, kHeadDim, kHeadDim, flashinfer::PosEncodingMode::kNone,
          /*USE_FP16_QK_REDUCTION=*/false, flashinfer::MaskMode::kCausal, kScaled, Variant, Params>(
          p, tmp_v, tmp_s, /*enable_pdl=*/false, l.stream);
    };
    switch (plan.cta_tile_q) {
      case 16:
        e = launch(std::integral_constant<uint32_t, 16>());
        break;
      case 64:
        e = launch(std::integral_constant<uint32_t, 64>());
        break;
      case 128:
        e = launch(std::integral_constant<uint32_t, 128>());
        break;
      default:
        return BadArg("flashinfer attention", "the plan chose a query tile other than 16/64/128");
    }
  } catch (const std::exception& ex) {
    return BadArg("flashinfer attention", ex.what());
  }
  return Check(e, "flashinfer attention");
}

}  // namespace tandem::cuda::fi

#endif  // TANDEM_KERNELS_CUDA_FI_ATTENTION_IMPL_CUH_
