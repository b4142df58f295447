#include "engine/fault_injection.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/step_progress.h"

namespace tandem {

bool FaultSpec::Compiled() {
#ifdef TANDEM_FAULT_INJECTION
  return true;
#else
  return false;
#endif
}

absl::StatusOr<FaultSpec> FaultSpec::Parse(absl::string_view spec) {
  FaultSpec f;
  spec = absl::StripAsciiWhitespace(spec);
  if (spec.empty()) return f;
  if (!Compiled()) {
    return absl::FailedPreconditionError(
        "--fault: this build has no fault injection (configure with -DTANDEM_FAULT_INJECTION=ON)");
  }
  const std::vector<std::pair<absl::string_view, int64_t*>> fields = {
      {"kv_corrupt_chunk", &f.kv_corrupt_chunk},   {"kv_drop_chunk", &f.kv_drop_chunk},
      {"kv_corrupt_every", &f.kv_corrupt_every},   {"kv_drop_every", &f.kv_drop_every},
      {"step_delay_ms", &f.step_delay_ms},         {"slow_step_ms", &f.slow_step_ms},
      {"wedge_after_steps", &f.wedge_after_steps}, {"fail_step_every", &f.fail_step_every}};
  for (absl::string_view entry : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--fault: \"%s\" is not NAME=VALUE", entry));
    }
    const absl::string_view name = absl::StripAsciiWhitespace(entry.substr(0, eq));
    const absl::string_view value = absl::StripAsciiWhitespace(entry.substr(eq + 1));
    int64_t* target = nullptr;
    for (const auto& [n, p] : fields) {
      if (n == name) target = p;
    }
    if (target == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("--fault: unknown fault \"%s\"", name));
    }
    int64_t v = 0;
    if (!absl::SimpleAtoi(value, &v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--fault: %s must be a non-negative integer, got \"%s\"", name, value));
    }
    *target = v;
  }
  return f;
}

bool FaultSpec::any() const {
  return kv_corrupt_chunk >= 0 || kv_drop_chunk >= 0 || kv_corrupt_every > 0 || kv_drop_every > 0 ||
         step_delay_ms > 0 || slow_step_ms > 0 || wedge_after_steps >= 0 || fail_step_every > 0;
}

absl::Status StepFaults::BeforeStep(const std::atomic<bool>& stopping) {
  const int64_t step = steps_.fetch_add(1);  // 0-based index of this step
  if (spec_.step_delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(spec_.step_delay_ms));
  }
  if (spec_.slow_step_ms > 0) {
    // Busy for slow_step_ms, a millisecond at a time, each one noted as progress.
    using Clock = std::chrono::steady_clock;
    const Clock::time_point end = Clock::now() + std::chrono::milliseconds(spec_.slow_step_ms);
    volatile uint64_t sink = 0;
    for (Clock::time_point t = Clock::now(); t < end && !stopping.load(); t = Clock::now()) {
      const Clock::time_point piece = std::min(end, t + std::chrono::milliseconds(1));
      while (Clock::now() < piece) sink = sink + 1;
      StepProgress::NoteHere();
    }
  }
  if (spec_.wedge_after_steps >= 0 && step >= spec_.wedge_after_steps) {
    while (!stopping.load()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (spec_.fail_step_every > 0 && (step + 1) % spec_.fail_step_every == 0) {
    return absl::ResourceExhaustedError("out of device memory (injected fault)");
  }
  return absl::OkStatus();
}

}  // namespace tandem
