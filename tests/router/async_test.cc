// The router's event-driven runtime (router/async.h) and its cancellation of worker calls
// (router/call_watch.h): a coroutine waits on callbacks without a thread and wakes on the pool,
// the timer fires in order and can be cancelled, a signal reaches every subscriber once, a client
// that goes away cancels every worker call of its request, and a worker that turns unhealthy
// abandons only its own call. The calls are real gRPC calls, made wait-for-ready to an address
// where nothing listens: left alone they would wait for their deadline, so a prompt CANCELLED is
// the watch's doing.
#include "router/async.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "router/call_watch.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router_internal {
namespace {

using Clock = std::chrono::steady_clock;

// A loopback port nothing listens on (bound, read back and closed).
std::string DeadAddress() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

// A call on `ctx` that waits (for a connection that never comes) until its 30 s deadline or its
// cancellation, on a thread; Finish() returns its status and how long it took.
class PendingCall {
 public:
  PendingCall(const std::string& address, grpc::ClientContext* ctx) {
    ctx->set_wait_for_ready(true);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    thread_ = std::thread([this, address, ctx] {
      auto stub =
          v1::Registry::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
      v1::ListWorkersRequest req;
      v1::ListWorkersResponse resp;
      status_ = stub->ListWorkers(ctx, req, &resp);
    });
  }
  ~PendingCall() {
    if (thread_.joinable()) thread_.join();
  }
  grpc::StatusCode Finish(double* seconds) {
    const auto start = Clock::now();
    thread_.join();
    *seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return status_.error_code();
  }

 private:
  grpc::Status status_;
  std::thread thread_;
};

// ---- The runtime ----

// Completes `value` on another thread after `ms`.
async::Callback<int> Later(async::Executor* ex, int value, int ms) {
  return async::Callback<int>(ex, [value, ms](std::function<void(int)> done) {
    std::thread([=] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      done(value);
    }).detach();
  });
}

async::Task<int> Sum(async::Executor* ex, std::vector<std::thread::id>* threads) {
  int total = 0;
  total += co_await Later(ex, 1, 5);
  threads->push_back(std::this_thread::get_id());
  // A completion before the coroutine suspends continues it inline.
  total += co_await async::Callback<int>(ex, [](std::function<void(int)> done) { done(10); });
  total += co_await Later(ex, 100, 1);
  threads->push_back(std::this_thread::get_id());
  co_return total;
}

async::Task<int> Nested(async::Executor* ex, std::vector<std::thread::id>* threads) {
  int a = co_await Sum(ex, threads);
  int b = co_await Sum(ex, threads);
  co_return a + b;
}

TEST(AsyncTest, ACoroutineWaitsWithoutAThreadAndResumesOnThePool) {
  async::Executor ex(2);
  std::vector<std::thread::id> threads;
  std::promise<int> result;
  async::Spawn<int>(
      Nested(&ex, &threads), [&](int v) { result.set_value(v); },
      [](const std::exception&) { return -1; });
  EXPECT_EQ(result.get_future().get(), 222);
  ASSERT_EQ(threads.size(), 4u);
  for (std::thread::id t : threads) EXPECT_NE(t, std::this_thread::get_id());
}

async::Task<int> Throws(async::Executor* ex) {
  co_await Later(ex, 1, 1);
  throw std::runtime_error("boom");
}

TEST(AsyncTest, AnExceptionBecomesTheErrorResult) {
  async::Executor ex(1);
  std::promise<int> result;
  async::Spawn<int>(
      Throws(&ex), [&](int v) { result.set_value(v); },
      [](const std::exception& e) { return std::string(e.what()) == "boom" ? -7 : -1; });
  EXPECT_EQ(result.get_future().get(), -7);
}

// Many coroutines racing their completions against their suspensions, on several threads:
// each resumes exactly once (the sanitizer build checks the handoff).
TEST(AsyncTest, ThousandsOfRacingCompletionsEachResumeOnce) {
  async::Executor ex(2);
  constexpr int kTasks = 2000;
  std::atomic<int> done{0};
  std::promise<void> all;
  for (int i = 0; i < kTasks; ++i) {
    auto task = [](async::Executor* ex, int i) -> async::Task<int> {
      int v = co_await Later(ex, i, i % 3);
      co_return v;
    }(&ex, i);
    async::Spawn<int>(
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
  async::Timer timer;
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
  async::Signal s;
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
  auto wake = async::FirstOf<int>([&](int v) {
    ++calls;
    value = v;
  });
  std::vector<std::thread> ts;
  for (int i = 1; i <= 8; ++i) ts.emplace_back([wake, i] { wake(i); });
  for (std::thread& t : ts) t.join();
  EXPECT_EQ(calls, 1);
  EXPECT_GE(value, 1);
}

// ---- Cancelling worker calls ----

TEST(CallWatchTest, AClientThatGoesAwayCancelsEveryWatchedCall) {
  auto gone = std::make_shared<async::Signal>();
  CallWatch w(gone);
  const std::string dead = DeadAddress();
  grpc::ClientContext a, b;
  w.Watch(&a);
  w.Watch(&b);
  PendingCall call_a(dead, &a), call_b(dead, &b);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(w.cancelled());
  gone->Fire();
  double seconds = 0;
  EXPECT_EQ(call_a.Finish(&seconds), grpc::StatusCode::CANCELLED);
  EXPECT_LT(seconds, 10);
  EXPECT_EQ(call_b.Finish(&seconds), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(w.cancelled());
  EXPECT_FALSE(w.abandoned(&a)) << "cancelled for the client, not abandoned for a worker";
  // A call watched after the client left (a resumed attempt's) is cancelled as it is watched.
  grpc::ClientContext late;
  w.Watch(&late);
  PendingCall call_late(dead, &late);
  EXPECT_EQ(call_late.Finish(&seconds), grpc::StatusCode::CANCELLED);
  EXPECT_LT(seconds, 10);
  for (grpc::ClientContext* c : {&a, &b, &late}) w.Unwatch(c);
}

TEST(CallWatchTest, AnUnhealthyWorkerAbandonsOnlyItsOwnCall) {
  CallWatch w(nullptr);
  const std::string dead = DeadAddress();
  grpc::ClientContext sick, well;
  w.Watch(&sick);
  w.Watch(&well);
  w.WatchWorker(&sick, "sick");
  w.WatchWorker(&well, "well");
  PendingCall call_sick(dead, &sick);
  w.Sweep([](const std::string&) { return true; });
  EXPECT_FALSE(w.abandoned(&sick));
  w.Sweep([](const std::string& worker) { return worker != "sick"; });
  double seconds = 0;
  EXPECT_EQ(call_sick.Finish(&seconds), grpc::StatusCode::CANCELLED);
  EXPECT_LT(seconds, 10);
  EXPECT_TRUE(w.abandoned(&sick));
  EXPECT_FALSE(w.abandoned(&well));
  EXPECT_FALSE(w.cancelled());
  // The same context watched again is a new call (a later attempt's): not abandoned.
  w.Unwatch(&sick);
  w.Watch(&sick);
  EXPECT_FALSE(w.abandoned(&sick));
  w.Unwatch(&sick);
  w.Unwatch(&well);
}

// Watches come and go while their signal fires on other threads (a request each): a watch that
// is gone is never touched (the sanitizer build checks for use after free).
TEST(CallWatchTest, WatchesComeAndGoWhileSignalsFire) {
  for (int i = 0; i < 200; ++i) {
    auto gone = std::make_shared<async::Signal>();
    auto w = std::make_unique<CallWatch>(gone);
    grpc::ClientContext c;
    w->Watch(&c);
    std::thread fire([gone] { gone->Fire(); });
    w->Unwatch(&c);
    w.reset();
    fire.join();
  }
}

}  // namespace
}  // namespace tandem::router_internal
