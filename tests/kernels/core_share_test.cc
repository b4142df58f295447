// CoreShare: a colocated decode step never has a prefill loop inside it, a prefill gets its
// windows between decode steps, and with sharing off or one side idle nothing waits. Real threads
// on the real ThreadPool, as the two engines of `--role=all` run.
#include "kernels/cpu/core_share.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "kernels/cpu/thread_pool.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

// About `micros` of work, split over the pool.
void Work(ThreadPool& pool, int micros, const std::function<void()>& inside = nullptr) {
  pool.ParallelFor(4, 1, [&](int64_t, int64_t) {
    if (inside) inside();
    const auto end = Clock::now() + std::chrono::microseconds(micros / 2);
    while (Clock::now() < end) {
    }
  });
}

struct Restore {
  ~Restore() { CoreShare::Process().Enable(0); }
};

TEST(CoreShare, OffNothingWaitsAndLoopsAreNotGated) {
  CoreShare& share = CoreShare::Process();
  share.Enable(0);
  EXPECT_FALSE(share.enabled());
  CoreShare::PrefillStep prefill(share);
  EXPECT_FALSE(share.EnterLoop());
  { CoreShare::DecodeStep decode(share); }
  EXPECT_EQ(share.counters().decode_steps, 0);
}

TEST(CoreShare, ADecodeStepNeverHasAPrefillLoopInsideAndBothProgress) {
  Restore restore;
  CoreShare& share = CoreShare::Process();
  share.Enable(0.5);
  const CoreShare::Counters before = share.counters();
  ThreadPool pool(2);
  std::atomic<bool> in_decode{false}, stop{false};
  std::atomic<int> overlaps{0}, prefill_loops{0};
  std::thread prefill([&] {
    while (!stop.load()) {
      CoreShare::PrefillStep step(share);
      for (int i = 0; i < 20 && !stop.load(); ++i) {
        Work(pool, 300, [&] {
          if (in_decode.load()) overlaps.fetch_add(1);
        });
        prefill_loops.fetch_add(1);
      }
    }
  });
  int decode_steps = 0;
  for (; decode_steps < 150; ++decode_steps) {
    CoreShare::DecodeStep step(share);
    in_decode.store(true);
    for (int loop = 0; loop < 4; ++loop) Work(pool, 100);
    in_decode.store(false);
  }
  stop.store(true);
  prefill.join();
  EXPECT_EQ(overlaps.load(), 0) << "a prefill loop ran inside a decode step";
  EXPECT_GT(prefill_loops.load(), 20) << "the prefill was starved";
  const CoreShare::Counters after = share.counters();
  EXPECT_EQ(after.decode_steps - before.decode_steps, decode_steps);
  EXPECT_GT(after.decode_waits - before.decode_waits, 0) << "no prefill window was given";
  EXPECT_GT(after.prefill_waits - before.prefill_waits, 0) << "no prefill loop waited";
}

TEST(CoreShare, WithoutAPrefillDecodeStepsNeverWait) {
  Restore restore;
  CoreShare& share = CoreShare::Process();
  share.Enable(1);
  const CoreShare::Counters before = share.counters();
  ThreadPool pool(2);
  for (int i = 0; i < 50; ++i) {
    CoreShare::DecodeStep step(share);
    Work(pool, 100);
  }
  EXPECT_EQ(share.counters().decode_waits, before.decode_waits);
  // Nor does a prefill without decode steps (its loops are gated, never held).
  CoreShare::PrefillStep prefill(share);
  for (int i = 0; i < 50; ++i) Work(pool, 100);
  EXPECT_EQ(share.counters().prefill_waits, before.prefill_waits);
  EXPECT_EQ(share.counters().prefill_loops - before.prefill_loops, 50);
}

TEST(CoreShare, APrefillThatEndsClosesItsWindow) {
  // A window of 16 decode steps would hold the next decode step 64 ms; the prefill
  // ends at once, so the decode step starts at once.
  Restore restore;
  CoreShare& share = CoreShare::Process();
  share.Enable(16);
  ThreadPool pool(2);
  std::atomic<bool> prefill_started{false}, decode_done{false};
  std::thread prefill([&] {
    CoreShare::PrefillStep step(share);
    prefill_started.store(true);
    while (!decode_done.load()) Work(pool, 50);
  });
  while (!prefill_started.load()) std::this_thread::yield();
  {
    CoreShare::DecodeStep step(share);
    Work(pool, 4000);  // the window: 64 ms
  }
  decode_done.store(true);
  prefill.join();  // the prefill step ends
  const auto t0 = Clock::now();
  { CoreShare::DecodeStep step(share); }
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(30));
}

}  // namespace
}  // namespace tandem
