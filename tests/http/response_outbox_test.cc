// The response outbox as a data structure: bytes in order, the per-connection and total bounds,
// the grace and minimum-rate rule that fails a client who does not read, and failure waking a
// waiting producer.
#include "http/response_outbox.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

namespace tandem {
namespace {

// Takes everything the outbox holds now.
std::string Drain(ResponseOutbox& out) {
  std::string got;
  for (std::string_view next = out.Front(); !next.empty(); next = out.Front()) {
    got.append(next);
    out.Consumed(next.size(), absl::Now());
  }
  return got;
}

OutboxLimits Small() {
  OutboxLimits l;
  l.max_bytes = 10;
  l.max_total = 1 << 20;
  l.grace = absl::Milliseconds(100);
  l.min_bytes_per_second = 1000;
  l.stall_timeout = absl::Seconds(30);
  return l;
}

TEST(ResponseOutboxTest, BytesComeOutInOrderAndTheTotalFollows) {
  std::atomic<size_t> total{0};
  int notices = 0;
  {
    ResponseOutbox out(Small(), &total, [&] { ++notices; });
    EXPECT_TRUE(out.Push("ab", "cd", true));
    EXPECT_TRUE(out.Push("ef", "", true));
    EXPECT_EQ(notices, 1);  // only the push into an empty outbox is announced
    EXPECT_EQ(total.load(), 6u);
    std::string_view front = out.Front();
    ASSERT_EQ(front, "abcd");
    out.Consumed(3, absl::Now());  // a partial write
    EXPECT_EQ(out.Front(), "d");
    EXPECT_EQ(Drain(out), "def");
    EXPECT_EQ(total.load(), 0u);
    EXPECT_TRUE(out.Push("gh", "", true));
    EXPECT_EQ(notices, 2);
  }
  EXPECT_EQ(total.load(), 0u);  // unwritten bytes are given back with the outbox
}

TEST(ResponseOutboxTest, AStreamedPieceWaitsForRoomAndAWholeResponseNever) {
  std::atomic<size_t> total{0};
  ResponseOutbox out(Small(), &total, nullptr);
  ASSERT_TRUE(out.Push("0123456789", "", true));
  EXPECT_TRUE(out.Push(std::string(1000, 'w'), "", false));  // whole: taken at once
  std::atomic<bool> pushed{false};
  std::thread producer([&] { pushed = out.Push("next", "", true); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(pushed.load());
  const std::string got = Drain(out);  // the client reads: room
  producer.join();
  EXPECT_TRUE(pushed.load());
  EXPECT_EQ(got.size() + Drain(out).size(), 1014u);
  EXPECT_FALSE(out.failed());
}

TEST(ResponseOutboxTest, AClientThatDoesNotReadFailsAfterTheGrace) {
  std::atomic<size_t> total{0};
  ResponseOutbox out(Small(), &total, nullptr);
  ASSERT_TRUE(out.Push("0123456789", "", true));
  const absl::Time t0 = absl::Now();
  EXPECT_FALSE(out.Push("more", "", true));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(100));
  EXPECT_NE(out.failure().find("slower than 1000 bytes/s"), std::string::npos) << out.failure();
  EXPECT_FALSE(out.Push("x", "", false));  // failed for good
}

TEST(ResponseOutboxTest, WithoutARateOnlyAStallFails) {
  std::atomic<size_t> total{0};
  OutboxLimits l = Small();
  l.min_bytes_per_second = 0;
  l.stall_timeout = absl::Milliseconds(150);
  ResponseOutbox out(l, &total, nullptr);
  ASSERT_TRUE(out.Push("0123456789", "", true));
  EXPECT_FALSE(out.Push("more", "", true));
  EXPECT_NE(out.failure().find("took no byte"), std::string::npos) << out.failure();
}

TEST(ResponseOutboxTest, TheTotalBoundHoldsEveryStream) {
  std::atomic<size_t> total{0};
  OutboxLimits l = Small();
  l.max_bytes = 100;
  l.max_total = 15;
  ResponseOutbox a(l, &total, nullptr), b(l, &total, nullptr);
  ASSERT_TRUE(a.Push("0123456789abcdef", "", true));  // an empty outbox always takes a piece
  ASSERT_TRUE(b.Push("x", "", true));
  std::atomic<bool> pushed{false};
  std::thread producer([&] { pushed = b.Push("y", "", true); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(pushed.load());  // past the total: b's next piece waits
  Drain(a);
  producer.join();
  EXPECT_TRUE(pushed.load());
}

TEST(ResponseOutboxTest, FailureWakesAWaitingProducer) {
  std::atomic<size_t> total{0};
  OutboxLimits l = Small();
  l.grace = absl::Seconds(30);
  ResponseOutbox out(l, &total, nullptr);
  ASSERT_TRUE(out.Push("0123456789", "", true));
  std::atomic<bool> done{false};
  std::thread producer([&] {
    EXPECT_FALSE(out.Push("more", "", true));
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  out.Fail("the connection closed");
  producer.join();
  EXPECT_TRUE(done.load());
  EXPECT_EQ(out.failure(), "the connection closed");
}

// A producer without a thread: its piece is taken at once, and it hears when the next may come
// (room freed by the consumer), or that the client failed the rate rule (judged by the consumer)
// or left; the fail hook runs once.
TEST(ResponseOutboxTest, PushThenHearsOfRoomOrFailureWithoutWaiting) {
  std::atomic<size_t> total{0};
  ResponseOutbox out(Small(), &total, nullptr);
  std::vector<int> heard;  // 1: room, 0: failed
  auto room = [&](bool ok) { heard.push_back(ok ? 1 : 0); };
  EXPECT_TRUE(out.PushThen("01234", "", room));
  EXPECT_EQ(heard, (std::vector<int>{1})) << "room left: told at once";
  EXPECT_TRUE(out.PushThen("5678901234", "", room));  // taken past the bound, then waits
  EXPECT_EQ(heard.size(), 1u);
  EXPECT_EQ(out.unwritten(), 15u);
  out.Judge(absl::Now());  // within the grace
  EXPECT_EQ(heard.size(), 1u);
  out.Consumed(10, absl::Now());
  EXPECT_EQ(heard, (std::vector<int>{1, 1})) << "room freed by the consumer";

  int hooks = 0;
  out.OnFail([&] { ++hooks; });
  EXPECT_TRUE(out.PushThen("0123456789", "", room));
  EXPECT_EQ(heard.size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // past the grace, nothing read
  out.Judge(absl::Now());
  EXPECT_EQ(heard, (std::vector<int>{1, 1, 0}));
  EXPECT_TRUE(out.failed());
  EXPECT_EQ(hooks, 1);
  EXPECT_FALSE(out.PushThen("x", "", room));
  out.Fail("again");
  EXPECT_EQ(hooks, 1);
  int late = 0;
  out.OnFail([&] { ++late; });  // set after the failure: runs at once
  EXPECT_EQ(late, 1);
}

// A client that closes its side: the hook runs (its request is cancelled), yet what is pushed
// afterwards is still taken, for a client that only half-closed and reads its response.
TEST(ResponseOutboxTest, AClientLeavingRunsTheHookButKeepsTheOutbox) {
  std::atomic<size_t> total{0};
  ResponseOutbox out(Small(), &total, nullptr);
  int hooks = 0;
  out.OnFail([&] { ++hooks; });
  out.ClientLeft();
  EXPECT_EQ(hooks, 1);
  EXPECT_FALSE(out.failed());
  EXPECT_TRUE(out.Push("HTTP/1.1 200 OK\r\n", "", false));
  EXPECT_EQ(Drain(out), "HTTP/1.1 200 OK\r\n");
  int late = 0;
  out.OnFail([&] { ++late; });  // set after the client left: runs at once
  EXPECT_EQ(late, 1);
  out.Fail("closed");
  EXPECT_EQ(hooks, 1);
}

}  // namespace
}  // namespace tandem
