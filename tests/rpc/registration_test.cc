// The worker side of service discovery: resolving --router, registering with every router the
// name resolves to, heartbeats, registering again after a router forgot the worker, and the
// serving=false goodbye on shutdown. The routers here are fake Registry services in process.
#include "rpc/registration.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

namespace tandem {
namespace {

TEST(ResolveHostPort, LiteralsAndNames) {
  auto v4 = ResolveHostPort("10.77.0.1:7000");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(*v4, (std::vector<std::string>{"10.77.0.1:7000"}));
  auto v6 = ResolveHostPort("[::1]:80");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(*v6, (std::vector<std::string>{"[::1]:80"}));
  auto local = ResolveHostPort("localhost:9");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_NE(std::find(local->begin(), local->end(), "127.0.0.1:9"), local->end());
}

TEST(ResolveHostPort, BadTargetsNameTheFlag) {
  for (const char* bad : {"", "router", "router:", ":7000", "router:0", "router:70000", "router:x",
                          "a:b:c", "[::1]", "[::1]x80"}) {
    auto r = ResolveHostPort(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--router"), std::string::npos) << r.status();
  }
  // RFC 2606: .invalid never resolves.
  auto r = ResolveHostPort("no-such-router.invalid:7000");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
}

TEST(JoinHostPort, BracketsIpv6) {
  EXPECT_EQ(JoinHostPort("10.0.0.1", 5), "10.0.0.1:5");
  EXPECT_EQ(JoinHostPort("fd00::1", 5), "[fd00::1]:5");
}

// Records what a worker sends; `forget()` makes it answer the next heartbeat with known=false.
class FakeRegistry final : public v1::Registry::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++registers_;
    known_ = true;
    last_id_ = req->worker_id();
    resp->set_heartbeat_interval_ms(50);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++heartbeats_;
    last_serving_ = req->serving();
    resp->set_known(known_);
    return grpc::Status::OK;
  }
  void forget() {
    std::lock_guard<std::mutex> lock(mu_);
    known_ = false;
  }
  int registers() {
    std::lock_guard<std::mutex> lock(mu_);
    return registers_;
  }
  int heartbeats() {
    std::lock_guard<std::mutex> lock(mu_);
    return heartbeats_;
  }
  bool last_serving() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_serving_;
  }
  std::string last_id() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_id_;
  }

 private:
  std::mutex mu_;
  int registers_ = 0;
  int heartbeats_ = 0;
  bool known_ = false;
  bool last_serving_ = true;
  std::string last_id_;
};

template <typename F>
bool WaitFor(F cond, int timeout_ms = 10000) {
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

TEST(RegistrationClient, RegistersHeartbeatsReregistersAndSaysGoodbye) {
  FakeRegistry fake;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&fake);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  const std::string router = "127.0.0.1:" + std::to_string(port);

  v1::RegisterRequest base;
  base.set_worker_id("w1");
  base.set_role(v1::WORKER_ROLE_DECODE);
  base.set_address("10.0.0.9:1234");
  {
    RegistrationClient client(
        router, base, [] { return WorkerLoadSnapshot{}; }, [] { return true; });
    ASSERT_TRUE(WaitFor([&] { return client.registered(); }));
    EXPECT_EQ(client.registered_with(), (std::vector<std::string>{router}));
    EXPECT_EQ(fake.last_id(), "w1");
    ASSERT_TRUE(WaitFor([&] { return fake.heartbeats() >= 3; }));
    EXPECT_TRUE(fake.last_serving());
    EXPECT_EQ(fake.registers(), 1);
    // The router forgets the worker: the next heartbeat says so and the worker registers again.
    fake.forget();
    ASSERT_TRUE(WaitFor([&] { return fake.registers() == 2; }));
    ASSERT_TRUE(WaitFor([&] { return client.registered(); }));
  }
  // Destroying the client (worker shutdown) sent a last heartbeat with serving=false.
  EXPECT_FALSE(fake.last_serving());
  server->Shutdown();
}

TEST(RegistrationClient, UnresolvableNameKeepsRetryingWithoutRegistering) {
  v1::RegisterRequest base;
  base.set_worker_id("w1");
  RegistrationOptions options;
  options.retry_interval = absl::Milliseconds(10);
  RegistrationClient client(
      "no-such-router.invalid:7000", base, [] { return WorkerLoadSnapshot{}; }, [] { return true; },
      /*draining=*/nullptr, options);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(client.registered());
  EXPECT_TRUE(client.registered_with().empty());
}

}  // namespace
}  // namespace tandem
