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

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/step_progress.h"

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

// A worker engine's step loop as its health sees it, shared by the prefill and decode engines:
// when the loop last came around, when a forward step last failed, whether it is draining, and
// the step faults injected before each forward step. Thread-safe (atomics).
class StepLoopHealth {
 public:
  explicit StepLoopHealth(const FaultSpec& faults = {}) : faults_(faults) {}
  // The loop came around (it does at least every 50 ms when idle).
  void Beat() { beat_ns_ = absl::GetCurrentTimeNanos(); }
  // Before a forward step, without locks held: the injected delay, wedge or failure.
  absl::Status BeforeStep() { return faults_.BeforeStep(stopping_); }
  void StepDone(const absl::Status& step) {
    if (!step.ok()) failed_ns_ = absl::GetCurrentTimeNanos();
  }
  // The engine is going away: a wedged loop returns.
  void Stop() { stopping_ = true; }
  // The step's progress notes go to this loop while the returned scope lives on this thread:
  // open it around each forward step.
  StepProgress::Scope StepScope() { return StepProgress::Scope(&progress_); }
  // Graceful drain: the engine refuses new work from now on.
  void BeginDrain() { draining_ = true; }
  bool draining() const { return draining_.load(); }

  // A step that never returns makes this grow.
  absl::Duration SinceBeat() const {
    return absl::Nanoseconds(absl::GetCurrentTimeNanos() - beat_ns_.load());
  }
  // Since the loop came around or its step last noted progress, whichever is later: a step that
  // advances, however slowly, keeps this small; one that never returns makes it grow.
  absl::Duration SinceProgress() const {
    return std::min(SinceBeat(), absl::FromChrono(progress_.Since()));
  }
  // absl::InfinitePast() if no step failed.
  absl::Time last_failed_step() const {
    const int64_t ns = failed_ns_.load();
    return ns == kNever ? absl::InfinitePast() : absl::FromUnixNanos(ns);
  }

 private:
  static constexpr int64_t kNever = INT64_MIN;
  StepFaults faults_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> beat_ns_{absl::GetCurrentTimeNanos()};
  std::atomic<int64_t> failed_ns_{kNever};
  StepProgress progress_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_FAULT_INJECTION_H_
