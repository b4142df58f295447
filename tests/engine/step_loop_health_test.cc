// A step loop's health: a step that advances (its parallel loops, the slow_step_ms fault) keeps
// SinceProgress small however long it takes; a step that never returns (wedge_after_steps)
// makes it grow. Notes reach only the loop whose scope is open on the noting thread.
#include "engine/step_loop_health.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "kernels/cpu/thread_pool.h"
#include "kernels/step_progress.h"

namespace tandem {
namespace {

TEST(StepProgressTest, NotesReachTheOpenScopeOnlyAndScopesNest) {
  StepProgress outer, inner;
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  StepProgress::NoteHere();  // no scope: nobody noted
  EXPECT_GE(outer.Since(), std::chrono::milliseconds(30));
  {
    StepProgress::Scope a(&outer);
    {
      StepProgress::Scope b(&inner);
      StepProgress::NoteHere();
    }
    EXPECT_LT(inner.Since(), std::chrono::milliseconds(20));
    EXPECT_GE(outer.Since(), std::chrono::milliseconds(30));
    std::thread other([] { StepProgress::NoteHere(); });  // another thread: not this step's
    other.join();
    EXPECT_GE(outer.Since(), std::chrono::milliseconds(30));
    StepProgress::NoteHere();
    EXPECT_LT(outer.Since(), std::chrono::milliseconds(20));
  }
}

// Each parallel loop of the CPU pool called from inside a step is a note.
TEST(StepProgressTest, ThePoolNotesEachLoop) {
  ThreadPool pool(2);
  StepLoopHealth health;
  const auto scope = health.StepScope();
  for (int i = 0; i < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    EXPECT_GE(health.SinceProgress(), absl::Milliseconds(60));
    std::atomic<int> ran{0};
    pool.ParallelFor(8, 1, [&](int64_t b, int64_t e) { ran += static_cast<int>(e - b); });
    EXPECT_EQ(ran, 8);
    EXPECT_LT(health.SinceProgress(), absl::Milliseconds(40));
  }
}

// A 600 ms slow step never lets SinceProgress pass a few ms, though the loop does not come
// around (SinceBeat grows).
TEST(StepLoopHealthTest, ASlowStepThatAdvancesIsNotWedged) {
  auto spec = FaultSpec::Parse("slow_step_ms=600");
  ASSERT_TRUE(spec.ok()) << spec.status();
  StepLoopHealth health(*spec);
  health.Beat();
  std::atomic<bool> done{false};
  std::thread step([&] {
    const auto scope = health.StepScope();
    EXPECT_TRUE(health.BeforeStep().ok());
    done = true;
  });
  absl::Duration worst = absl::ZeroDuration();
  const absl::Time t0 = absl::Now();
  while (!done) {
    worst = std::max(worst, health.SinceProgress());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  step.join();
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(550));
  EXPECT_GE(health.SinceBeat(), absl::Milliseconds(550));
  // A note every millisecond; 100 ms leaves room for a descheduled thread on a loaded machine.
  EXPECT_LT(worst, absl::Milliseconds(100));
}

TEST(StepLoopHealthTest, AWedgedStepIsSeenAsNoProgress) {
  auto spec = FaultSpec::Parse("wedge_after_steps=0");
  ASSERT_TRUE(spec.ok()) << spec.status();
  StepLoopHealth health(*spec);
  health.Beat();
  std::thread step([&] {
    const auto scope = health.StepScope();
    health.BeforeStep().IgnoreError();  // returns once Stop() is called
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_GE(health.SinceProgress(), absl::Milliseconds(300));
  health.Stop();
  step.join();
}

TEST(FaultSpecTest, SlowStepIsParsedAndBadValuesAreNamed) {
  auto spec = FaultSpec::Parse("slow_step_ms=25, step_delay_ms=3");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->slow_step_ms, 25);
  EXPECT_EQ(spec->step_delay_ms, 3);
  EXPECT_TRUE(spec->any());
  auto bad = FaultSpec::Parse("slow_step_ms=soon");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("slow_step_ms"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace tandem
