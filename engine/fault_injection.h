// Fault injection for tests: the faults docs/reliability.md asks Tandem to survive, injected on
// purpose by a flag the binaries accept (`--fault SPEC`) in builds with TANDEM_FAULT_INJECTION
// (the default; a production image may turn it off, and then any SPEC is refused).
//
// SPEC is a comma-separated list of NAME=VALUE:
//   kv_corrupt_chunk=I   flip a payload byte of the I-th KV chunk this worker sends (0-based)
//   kv_drop_chunk=I      never send the I-th KV chunk (its lease never completes)
//   kv_corrupt_every=N   corrupt every N-th KV chunk sent
//   kv_drop_every=N      drop every N-th KV chunk sent
//   step_delay_ms=MS     every forward step of the engine sleeps MS first
//   wedge_after_steps=N  after N forward steps, the step loop blocks (a wedged worker)
//   fail_step_every=N    every N-th forward step fails as out of device memory
#ifndef TANDEM_ENGINE_FAULT_INJECTION_H_
#define TANDEM_ENGINE_FAULT_INJECTION_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tandem {

struct FaultSpec {
  int64_t kv_corrupt_chunk = -1;
  int64_t kv_drop_chunk = -1;
  int64_t kv_corrupt_every = 0;
  int64_t kv_drop_every = 0;
  int64_t step_delay_ms = 0;
  int64_t slow_step_ms = 0;
  int64_t wedge_after_steps = -1;
  int64_t fail_step_every = 0;

  // INVALID_ARGUMENT naming the entry for an unknown name or a bad value; FAILED_PRECONDITION
  // for a non-empty SPEC in a build without fault injection.
  static absl::StatusOr<FaultSpec> Parse(absl::string_view spec);
  static bool Compiled();
  bool any() const;
};

// The step-loop faults of one engine. Thread-safe.
class StepFaults {
 public:
  explicit StepFaults(const FaultSpec& spec = {}) : spec_(spec) {}
  // Called by the step loop before each forward step, without locks held. Sleeps for
  // step_delay_ms; computes for slow_step_ms (noting progress, kernels/step_progress.h); blocks
  // while the loop is wedged and `stopping` is false; returns the injected failure of this step (OK
  // for none).
  absl::Status BeforeStep(const std::atomic<bool>& stopping);

 private:
  FaultSpec spec_;
  std::atomic<int64_t> steps_{0};
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_FAULT_INJECTION_H_
