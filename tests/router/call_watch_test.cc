// Cancelling a request's worker calls by events (router/call_watch.h): a client that goes away
// cancels every worker call of its request, and a worker that turns unhealthy abandons only its
// own call. The calls are real gRPC calls, made wait-for-ready to an address where nothing
// listens: left alone they would wait for their deadline, so a prompt CANCELLED is the watch's
// doing.
#include "router/call_watch.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

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
