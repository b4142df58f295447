// The AVX-512 kernel source (kernels/cpu/avx512_kernels.inc) compiled for the baseline ISA:
// SIMDe emulates every AVX-512 intrinsic, so the kernels' logic (tiles, tails, block decoding,
// the VNNI arithmetic) is checked against the scalar twins on CPUs without AVX-512. Only the
// few lines under SIMDE_X86_AVX512F_NATIVE (direct 512-bit conversions, a gather) need a native
// run; where the CPU has AVX-512, both builds run.
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/tile_prefetch.h"
#include "kernels/dtype.h"
#include "kernels/quant.h"
#include "tests/kernels/isa_paths.h"

namespace tandem::testing_isa {
namespace {

#include "kernels/cpu/avx512_kernels.inc"

}  // namespace

const cpu::Avx512Kernels& EmulatedAvx512Kernels() {
  static const cpu::Avx512Kernels kernels{"avx512-emulated", &MatmulRows, &QuantRows,
                                          &QuantGemmRows};
  return kernels;
}

std::vector<IsaPath> TestablePaths() {
  std::vector<IsaPath> out = {{cpu::Isa::kScalar, false}};
  if (!cpu::CpuHasAvx2()) return out;
  out.push_back({cpu::Isa::kAvx2, false});
  // The emulation also where the CPU has AVX-512: the same source must give the same results
  // compiled either way (it is what machines without AVX-512 test).
  if (cpu::CpuHasAvx512()) out.push_back({cpu::Isa::kAvx512, false});
  out.push_back({cpu::Isa::kAvx512, true});
  // AMX tiles (the batched quantized matmuls) have no emulation: natively, where the CPU has them.
  if (cpu::CpuHasAmx()) out.push_back({cpu::Isa::kAmx, false});
  return out;
}

std::string PathName(const IsaPath& path) {
  return std::string(path.isa == cpu::Isa::kScalar   ? "Scalar"
                     : path.isa == cpu::Isa::kAvx2   ? "Avx2"
                     : path.isa == cpu::Isa::kAvx512 ? "Avx512"
                                                     : "Amx") +
         (path.emulated ? "Emulated" : "");
}

ScopedIsa::ScopedIsa(const IsaPath& path) : saved_(cpu::ActiveIsa()) {
  cpu::SetAvx512KernelsForTesting(path.emulated ? &EmulatedAvx512Kernels() : nullptr);
  ok_ = cpu::SetIsa(path.isa) == path.isa;
}

ScopedIsa::~ScopedIsa() {
  cpu::SetAvx512KernelsForTesting(nullptr);
  cpu::SetIsa(saved_);
}

}  // namespace tandem::testing_isa
