# FlashInfer's attention templates for libtandem_cuda.so's bf16 and fp8 KV caches
# (kernels/cuda/fi_attention.h). The headers come from the flashinfer-python wheel on PyPI,
# fetched at configure time by scripts/fetch_flashinfer.sh (pinned version and sha256, cached
# in ~/.cache/tandem, never committed). Sets TANDEM_HAVE_FLASHINFER and, when on,
# TANDEM_FLASHINFER_DIR; adds the instantiations to `target` with their include paths (FlashInfer's
# CCCL ahead of the toolkit's, for these sources only) and flags.
function(tandem_add_flashinfer target)
  set(TANDEM_HAVE_FLASHINFER OFF PARENT_SCOPE)
  if(TANDEM_FLASHINFER STREQUAL "OFF")
    message(STATUS "FlashInfer attention: off (-DTANDEM_FLASHINFER=OFF)")
    return()
  endif()
  execute_process(
    COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/fetch_flashinfer.sh
    OUTPUT_VARIABLE dir ERROR_VARIABLE err RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0 OR NOT EXISTS "${dir}/include/flashinfer/attention/prefill.cuh")
    if(TANDEM_FLASHINFER STREQUAL "ON")
      message(FATAL_ERROR "TANDEM_FLASHINFER=ON but its headers could not be fetched: ${err}")
    endif()
    message(WARNING "FlashInfer attention: not built (${err}); bf16/fp8 KV caches will be "
                    "refused on CUDA")
    return()
  endif()
  set(k ${CMAKE_SOURCE_DIR}/kernels/cuda)
  set(sources ${k}/fi_attention_hd64_bf16.cu ${k}/fi_attention_hd64_fp8.cu
              ${k}/fi_attention_hd128_bf16.cu ${k}/fi_attention_hd128_fp8.cu)
  target_sources(${target} PRIVATE ${sources})
  set_source_files_properties(${sources} ${k}/fi_attention.cu PROPERTIES
    INCLUDE_DIRECTORIES "${dir}/cccl/libcudacxx/include;${dir}/include"
    COMPILE_DEFINITIONS "TANDEM_FLASHINFER=1"
    COMPILE_OPTIONS "--expt-relaxed-constexpr;-DNDEBUG")
  set(TANDEM_HAVE_FLASHINFER ON PARENT_SCOPE)
  set(TANDEM_FLASHINFER_DIR ${dir} PARENT_SCOPE)
  message(STATUS "FlashInfer attention: ${dir}")
endfunction()
