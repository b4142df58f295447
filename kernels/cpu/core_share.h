// How the two engines of one process (`--role=all`) share the CPU pool so that running streams
// keep their pace while prompts are prefilled.
//
// Both engines call the same ThreadPool, one parallel loop at a time. Left alone, a prefill's
// loops (a 512-token chunk's matrix products, milliseconds each) land between a decode step's
// forty-odd small loops, and the step takes many times its idle length. With sharing on:
//   - a decode step runs whole: no prefill loop starts while it is open, and it waits at most for
//     the one prefill loop already running;
//   - between two decode steps, a prefill that has work gets a window of `prefill_share` times the
//     last decode step's length before the next decode step may start;
//   - with only one of the two busy, nothing waits.
// So a stream's inter-token time is at most about (1 + prefill_share) decode steps plus one
// prefill loop, and prefill keeps prefill_share / (1 + prefill_share) of the cores while streams
// run (all of them otherwise).
//
// Off by default (every call returns at once): a process enables it where both engines share the
// CPU (the colocated server on the CPU device). On a GPU the two engines' kernels overlap on the
// device, and this gate would only delay them.
#ifndef TANDEM_KERNELS_CPU_CORE_SHARE_H_
#define TANDEM_KERNELS_CPU_CORE_SHARE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace tandem {

class CoreShare {
 public:
  using Clock = std::chrono::steady_clock;

  // The process's one (the pool the engines share is the process's CPU backend's).
  static CoreShare& Process();

  // `prefill_share` > 0: turns sharing on; 0: off.
  void Enable(double prefill_share);
  bool enabled() const;

  // A decode step: waits for its turn (above), then holds the pool's loops for the step.
  class DecodeStep {
   public:
    explicit DecodeStep(CoreShare& share);
    ~DecodeStep();
    DecodeStep(const DecodeStep&) = delete;
    DecodeStep& operator=(const DecodeStep&) = delete;

   private:
    CoreShare* share_;  // null when sharing is off
    Clock::time_point start_;
  };

  // A prefill step on this thread: its parallel loops (ThreadPool::ParallelFor) go through
  // EnterLoop/ExitLoop. Never waits itself.
  class PrefillStep {
   public:
    explicit PrefillStep(CoreShare& share);
    ~PrefillStep();
    PrefillStep(const PrefillStep&) = delete;
    PrefillStep& operator=(const PrefillStep&) = delete;

   private:
    CoreShare* share_;  // null when sharing is off
  };

  // For ThreadPool: on a thread inside a PrefillStep, waits until a prefill loop may run and
  // returns true (the caller then calls ExitLoop after the loop); elsewhere returns false at once.
  bool EnterLoop();
  void ExitLoop();

  // What the gate did (for tests and the logs).
  struct Counters {
    int64_t decode_steps = 0;
    int64_t decode_waits = 0;  // decode steps that waited for a prefill window or loop
    int64_t prefill_loops = 0;
    int64_t prefill_waits = 0;  // prefill loops that waited for a decode step
  };
  Counters counters() const;

 private:
  bool PrefillMayRunLocked(Clock::time_point now) const;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  double prefill_share_ = 0;  // 0: off
  bool decode_open_ = false;
  int decode_waiting_ = 0;
  int prefill_steps_ = 0;  // prefill steps in progress
  bool prefill_loop_running_ = false;
  Clock::time_point window_end_{};  // the current prefill window's end
  Counters counters_;
};

}  // namespace tandem

#endif  // TANDEM_KERNELS_CPU_CORE_SHARE_H_
