// The instruction-set paths a kernel test runs on: scalar always, AVX2 where the CPU has it, and
// AVX-512 natively where the CPU has it, otherwise through SIMDe's emulation of the same kernel
// source (kernels/cpu/avx512.h) on any CPU with AVX2. So every path runs on every CI machine.
#ifndef TANDEM_TESTS_KERNELS_ISA_PATHS_H_
#define TANDEM_TESTS_KERNELS_ISA_PATHS_H_

#include <string>
#include <vector>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/cpu_ops.h"

namespace tandem::testing_isa {

struct IsaPath {
  cpu::Isa isa;
  bool emulated;  // kAvx512 through SIMDe's emulation
};

// The AVX-512 kernels compiled without AVX-512 (avx512_emulated.cc).
const cpu::Avx512Kernels& EmulatedAvx512Kernels();

std::vector<IsaPath> TestablePaths();
// "Scalar", "Avx2", "Avx512", "Avx512Emulated".
std::string PathName(const IsaPath& path);

// Selects a path for the life of the object and restores the previous ISA after.
class ScopedIsa {
 public:
  explicit ScopedIsa(const IsaPath& path);
  ~ScopedIsa();
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;
  // Whether the path is now active (false only if the CPU lost a feature under us).
  bool ok() const { return ok_; }

 private:
  cpu::Isa saved_;
  bool ok_;
};

}  // namespace tandem::testing_isa

#endif  // TANDEM_TESTS_KERNELS_ISA_PATHS_H_
