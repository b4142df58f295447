// The health of a worker engine's step loop (engine/fault_injection.h injects its faults).
#ifndef TANDEM_ENGINE_STEP_LOOP_HEALTH_H_
#define TANDEM_ENGINE_STEP_LOOP_HEALTH_H_

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/fault_injection.h"
#include "kernels/step_progress.h"

namespace tandem {

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

#endif  // TANDEM_ENGINE_STEP_LOOP_HEALTH_H_
