// The AVX-512 kernels compiled for the CPU. The code is avx512_kernels.inc; this file enables
// AVX-512 F, BW, VL, DQ and VNNI (with AVX2, FMA and F16C) for it alone, by a target pragma
// rather than a file-wide -mavx512f, so that no inline function this file shares with the rest
// of the library (from the standard library or our headers, all included before the pragma) is
// ever emitted with AVX-512 instructions. SIMDe cannot see a pragma's target, so the native
// macros below tell it which instructions it may use. Clang gets the same through its
// attribute pragma.
#include "kernels/cpu/avx512.h"

#include <immintrin.h>

// Everything SIMDe includes, before the pragma (see above).
#include <fenv.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <x86intrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/tile_prefetch.h"
#include "kernels/dtype.h"
#include "kernels/quant.h"

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's own avx512fintrin.h builds its _mm512_undefined_* values from uninitialized
// variables; its warnings about them say nothing about this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#define TANDEM_AVX512_PRAGMA 1
#elif defined(__clang__)
#pragma clang attribute push(                                                               \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))), \
    apply_to = function)
#define TANDEM_AVX512_PRAGMA 2
#endif
#if defined(TANDEM_AVX512_PRAGMA)
#define SIMDE_X86_AVX512F_NATIVE
#define SIMDE_X86_AVX512BW_NATIVE
#define SIMDE_X86_AVX512VL_NATIVE
#define SIMDE_X86_AVX512DQ_NATIVE
#define SIMDE_X86_AVX512VNNI_NATIVE
#define SIMDE_X86_F16C_NATIVE
#define SIMDE_X86_FMA_NATIVE
#endif

#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>

namespace tandem::cpu {
namespace {

#include "kernels/cpu/avx512_kernels.inc"
#if defined(TANDEM_AVX512_PRAGMA) && defined(__x86_64__)
#define TANDEM_HAS_AMX_KERNELS 1
#include "kernels/cpu/amx_panels.inc"
#endif

}  // namespace

#if TANDEM_AVX512_PRAGMA == 1
#pragma GCC pop_options
#elif TANDEM_AVX512_PRAGMA == 2
#pragma clang attribute pop
#endif

const Avx512Kernels& NativeAvx512Kernels() {
  static const Avx512Kernels kernels{"avx512", &MatmulRows, &QuantRows, &QuantGemmRows};
  return kernels;
}

const Avx512Kernels* NativeAmxKernels() {
#if defined(TANDEM_HAS_AMX_KERNELS)
  static const Avx512Kernels kernels{"amx", &MatmulRows, &QuantRows, &amx_detail::AmxQuantGemmRows};
  return &kernels;
#else
  return nullptr;
#endif
}

}  // namespace tandem::cpu
