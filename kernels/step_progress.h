// Progress from inside a forward step, so that a worker's health can tell a step that is slow (a
// loaded machine, a long prompt, a process at nice 19 beside a CPU hog) from one that never
// returns (a wedged kernel, a lost device).
//
// A step loop owns a StepProgress and opens a Scope on its thread around each step; the kernels
// call StepProgress::NoteHere() where a piece of the step has finished (the CPU pool after each
// parallel loop, the engines after each layer). Outside a Scope, NoteHere() does nothing.
#ifndef TANDEM_KERNELS_STEP_PROGRESS_H_
#define TANDEM_KERNELS_STEP_PROGRESS_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace tandem {

class StepProgress {
 public:
  using Clock = std::chrono::steady_clock;

  StepProgress() { Note(); }

  void Note() { ns_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed); }
  // Time since the last note (or since construction).
  Clock::duration Since() const {
    return Clock::now().time_since_epoch() - Clock::duration(ns_.load(std::memory_order_relaxed));
  }

  // Notes on this thread go to `progress` while the scope lives (scopes nest).
  class Scope {
   public:
    explicit Scope(StepProgress* progress) : outer_(current_) { current_ = progress; }
    ~Scope() { current_ = outer_; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepProgress* outer_;
  };

  // A note to the step running on this thread, if any.
  static void NoteHere() {
    if (current_ != nullptr) current_->Note();
  }

 private:
  static inline thread_local StepProgress* current_ = nullptr;
  std::atomic<Clock::rep> ns_{0};
};

}  // namespace tandem

#endif  // TANDEM_KERNELS_STEP_PROGRESS_H_
