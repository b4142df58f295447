// The router's coroutine runtime (router/async.h): a coroutine waits on callbacks without a
// thread and wakes on the pool, completions racing suspensions resume each coroutine once, an
// exception becomes the error result, the timer fires in order and can be cancelled, a signal
// reaches every subscriber once. No gRPC: also under the sanitizers (scripts/fuzz.sh).
#include "router/async.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

namespace tandem::async {
namespace {

// Completes `value` on the timer's thread after `ms`.
Callback<int> Later(Timer* timer, Executor* ex, int value, int ms) {
  return Callback<int>(ex, [timer, value, ms](std::function<void(int)> done) {
    timer->At(absl::Now() + absl::Milliseconds(ms), [done, value] { done(value); });
  });
}

Task<int> Sum(Timer* t, Executor* ex, std::vector<std::thread::id>* threads) {
  int total = 0;
  total += co_await Later(t, ex, 1, 5);
  threads->push_back(std::this_thread::get_id());
  // A completion before the coroutine suspends continues it inline.
  total += co_await Callback<int>(ex, [](std::function<void(int)> done) { done(10); });
  total += co_await Later(t, ex, 100, 1);
  threads->push_back(std::this_thread::get_id());
  co_return total;
}

Task<int> Nested(Timer* t, Executor* ex, std::vector<std::thread::id>* threads) {
  int a = co_await Sum(t, ex, threads);
  int b = co_await Sum(t, ex, threads);
  co_return a + b;
}

TEST(AsyncTest, ACoroutineWaitsWithoutAThreadAndResumesOnThePool) {
  Executor ex(2);
  Timer timer;  // destroyed first: it posts to the pool
  std::vector<std::thread::id> threads;
  std::promise<int> result;
  Spawn<int>(
      Nested(&timer, &ex, &threads), [&](int v) { result.set_value(v); },
      [](const std::exception&) { return -1; });
  EXPECT_EQ(result.get_future().get(), 222);
  ASSERT_EQ(threads.size(), 4u);
  for (std::thread::id t : threads) EXPECT_NE(t, std::this_thread::get_id());
}

Task<int> Throws(Timer* t, Executor* ex) {
  co_await Later(t, ex, 1, 1);
  throw std::runtime_error("boom");
}

TEST(AsyncTest, AnExceptionBecomesTheErrorResult) {
  Executor ex(1);
  Timer timer;
  std::promise<int> result;
  Spawn<int>(
      Throws(&timer, &ex), [&](int v) { result.set_value(v); },
      [](const std::exception& e) { return std::string(e.what()) == "boom" ? -7 : -1; });
  EXPECT_EQ(result.get_future().get(), -7);
}

// Many coroutines racing their completions against their suspensions, on several threads:
// each resumes exactly once (the sanitizer build checks the handoff).
TEST(AsyncTest, ThousandsOfRacingCompletionsEachResumeOnce) {
  Executor ex(2);
  Timer timer;
  constexpr int kTasks = 2000;
  std::atomic<int> done{0};
  std::promise<void> all;
  for (int i = 0; i < kTasks; ++i) {
    auto task = [](Timer* t, Executor* ex, int i) -> Task<int> {
      int v = co_await Later(t, ex, i, i % 3);
      co_return v;
    }(&timer, &ex, i);
    Spawn<int>(
        std::move(task),
        [&, i](int v) {
          EXPECT_EQ(v, i);
          if (++done == kTasks) all.set_value();
        },
        [](const std::exception&) { return -1; });
  }
  all.get_future().wait();
  EXPECT_EQ(done.load(), kTasks);
}

TEST(AsyncTest, TheTimerFiresInOrderAndCancelledCallbacksNever) {
  Timer timer;
  std::mutex mu;
  std::vector<int> order;
  std::promise<void> last;
  const absl::Time now = absl::Now();
  timer.At(now + absl::Milliseconds(60), [&] {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(3);
    last.set_value();
  });
  timer.At(now + absl::Milliseconds(20), [&] {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(1);
  });
  const uint64_t cancelled = timer.At(now + absl::Milliseconds(30), [&] {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(99);
  });
  timer.At(now - absl::Seconds(1), [&] {  // past: at once
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(0);
  });
  EXPECT_TRUE(timer.Cancel(cancelled));
  EXPECT_FALSE(timer.Cancel(cancelled));
  last.get_future().wait();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 3}));
}

TEST(AsyncTest, ASignalReachesEverySubscriberOnce) {
  Signal s;
  int a = 0, b = 0, late = 0;
  s.Subscribe([&] { ++a; });
  const uint64_t id = s.Subscribe([&] { ++b; });
  s.Unsubscribe(id);
  EXPECT_FALSE(s.fired());
  s.Fire();
  s.Fire();
  EXPECT_TRUE(s.fired());
  EXPECT_EQ(s.Subscribe([&] { ++late; }), 0u);
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 0);
  EXPECT_EQ(late, 1);
}

TEST(AsyncTest, FirstOfLetsOnlyTheFirstSourceThrough) {
  int calls = 0, value = 0;
  auto wake = FirstOf<int>([&](int v) {
    ++calls;
    value = v;
  });
  std::vector<std::thread> ts;
  for (int i = 1; i <= 8; ++i) ts.emplace_back([wake, i] { wake(i); });
  for (std::thread& t : ts) t.join();
  EXPECT_EQ(calls, 1);
  EXPECT_GE(value, 1);
}

}  // namespace
}  // namespace tandem::async
