// The NCCL transport behind KvSender / KvReceiver (nccl_transport.h) and its staging
// (staging.h), on the CPU: the fake communicator of nccl_fake.h and host staging memory. Every
// test ends with the leak check: no target, no staged buffer, no communicator left.
#include "kv_transfer/nccl/nccl_transport.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "kv_transfer/transport_common.h"
#include "tests/kv_transfer/nccl_fake.h"

namespace tandem {
namespace {

using ::tandem::testing::FakeNccl;

// ---- StagingPool ---------------------------------------------------------------------------

class CountingAllocator {
 public:
  StagingPool::Allocator allocator() {
    return {[this](size_t n) -> absl::StatusOr<char*> {
              absl::MutexLock lock(&mu_);
              if (fail_) return absl::ResourceExhaustedError("out of device memory");
              live_bytes_ += n;
              return new char[n];
            },
            [this](char* p, size_t n) {
              absl::MutexLock lock(&mu_);
              live_bytes_ -= n;
              delete[] p;
            }};
  }
  void set_fail(bool f) {
    absl::MutexLock lock(&mu_);
    fail_ = f;
  }
  uint64_t live_bytes() {
    absl::MutexLock lock(&mu_);
    return live_bytes_;
  }

 private:
  absl::Mutex mu_;
  bool fail_ = false;
  uint64_t live_bytes_ = 0;
};

TEST(StagingPoolTest, ReusesBuffersBySizeClassAndBoundsTheCache) {
  CountingAllocator a;
  {
    StagingPool pool(a.allocator(), /*max_cached_bytes=*/16384, "test pool");
    auto x = pool.Take(5000);  // class 8192
    ASSERT_TRUE(x.ok()) << x.status();
    EXPECT_EQ(x->capacity, 8192u);
    auto small = pool.Take(1);  // the smallest class is 4096
    ASSERT_TRUE(small.ok());
    EXPECT_EQ(small->capacity, 4096u);
    EXPECT_EQ(pool.in_use(), 2);
    pool.Return(*x);
    auto y = pool.Take(8000);  // same class: the same buffer again, no allocation
    ASSERT_TRUE(y.ok());
    EXPECT_EQ(y->data, x->data);
    EXPECT_EQ(pool.allocations(), 2);
    auto big = pool.Take(20000);  // class 32768: above the cache bound once returned
    ASSERT_TRUE(big.ok());
    pool.Return(*big);
    EXPECT_EQ(pool.cached_bytes(), 0u);  // freed, not cached
    pool.Return(*y);
    pool.Return(*small);
    EXPECT_EQ(pool.in_use(), 0);
    EXPECT_EQ(pool.cached_bytes(), 8192u + 4096u);
    EXPECT_EQ(pool.Take(0).status().code(), absl::StatusCode::kInvalidArgument);
    a.set_fail(true);
    auto fails = pool.Take(100000);
    EXPECT_EQ(fails.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(fails.status().message().find("test pool"), std::string::npos) << fails.status();
    EXPECT_EQ(pool.in_use(), 0);
  }
  EXPECT_EQ(a.live_bytes(), 0u);  // the destructor freed the cache
}

TEST(HostKvStagingTest, CopiesAndCountsBuffers) {
  auto staging = MakeHostKvStaging();
  EXPECT_TRUE(staging->host_visible());
  KvChunkHeader h;
  const std::string payload = "0123456789abcdef";
  {
    auto sent = staging->StageForSend(h, payload);
    ASSERT_TRUE(sent.ok()) << sent.status();
    EXPECT_EQ(std::string((*sent)->data().data(), (*sent)->data().size()), payload);
    EXPECT_EQ(staging->buffers_in_use(), 1);
  }
  EXPECT_EQ(staging->buffers_in_use(), 0);
}

// ---- the transport over the fake communicator ----------------------------------------------

KvChunkHeader Chunk(uint64_t request, uint32_t layer, uint32_t tokens = 6, uint32_t width = 8) {
  KvChunkHeader h;
  h.request_id = request;
  h.layer = layer;
  h.token_start = 0;
  h.token_count = tokens;
  h.width = width;
  h.dtype = DType::kF32;
  return h;
}

class RecordingSink : public KvSink {
 public:
  absl::Status CheckHeader(const KvChunkHeader&) override { return absl::OkStatus(); }
  absl::Status Accept(const KvChunkHeader& h, std::span<const char> payload) override {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(h.layer) == refuse_layer_) {
      return absl::NotFoundError("lease released");
    }
    got_[{h.lease_id, h.layer}] = std::string(payload.data(), payload.size());
    return absl::OkStatus();
  }
  void Undeliverable(const KvChunkHeader& h, const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    undeliverable_[{h.lease_id, h.layer}] = why;
  }
  void set_refuse_layer(int l) {
    absl::MutexLock lock(&mu_);
    refuse_layer_ = l;
  }
  std::map<std::pair<uint64_t, uint32_t>, std::string> got() {
    absl::MutexLock lock(&mu_);
    return got_;
  }
  std::map<std::pair<uint64_t, uint32_t>, absl::Status> undeliverable() {
    absl::MutexLock lock(&mu_);
    return undeliverable_;
  }

 private:
  absl::Mutex mu_;
  int refuse_layer_ = -1;
  std::map<std::pair<uint64_t, uint32_t>, std::string> got_;
  std::map<std::pair<uint64_t, uint32_t>, absl::Status> undeliverable_;
};

using testing::WaitFor;

class NcclTransportTest : public ::testing::Test {
 protected:
  NcclTransportParts Parts() {
    NcclTransportParts p;
    p.factory = std::shared_ptr<CommunicatorFactory>(&net_, [](CommunicatorFactory*) {});
    p.staging = MakeHostKvStaging();
    return p;
  }
  void SetUp() override {
    receiver_ = MakeNcclKvReceiver(Parts(), &sink_);
    receiver_->SetBootstrapAddress("127.0.0.1:5000");
    MakeSender(KvSenderOptions());
  }
  void MakeSender(KvSenderOptions so) {
    so.io_timeout = absl::Milliseconds(300);
    auto s = MakeNcclKvSender(
        Parts(),
        [this](const std::string& peer) -> absl::StatusOr<NcclUniqueId> {
          if (peer != "127.0.0.1:5000") return absl::UnavailableError("no decode worker " + peer);
          return receiver_->Bootstrap("prefill-test");
        },
        so);
    ASSERT_TRUE(s.ok()) << s.status();
    sender_ = std::move(*s);
  }
  void TearDown() override {
    EXPECT_EQ(sender_->num_targets(), 0u);
    sender_->Shutdown();
    receiver_->Shutdown();
    EXPECT_EQ(sender_->staging_buffers_in_use(), 0);
    EXPECT_EQ(receiver_->staging_buffers_in_use(), 0);
    EXPECT_EQ(receiver_->num_comms(), 0u);
    sender_.reset();
    receiver_.reset();
    EXPECT_EQ(net_.live_comms(), 0);
  }
  KvTarget Target(uint64_t lease) { return KvTarget{receiver_->endpoint(), lease, 1}; }

  FakeNccl net_;
  RecordingSink sink_;
  std::unique_ptr<NcclKvTransportReceiver> receiver_;
  std::unique_ptr<NcclKvTransportSender> sender_;
};

TEST_F(NcclTransportTest, ChunksArriveThroughStagingAndTheBootstrapIsReused) {
  EXPECT_EQ(receiver_->endpoint(), "nccl://127.0.0.1:5000");
  std::map<std::pair<uint64_t, uint32_t>, std::string> sent;
  for (uint64_t lease : {7, 8}) {
    const KvTarget t = Target(lease);
    for (uint32_t l = 0; l < 4; ++l) {
      const KvChunkHeader h = Chunk(lease, l);
      std::string p = testing::RandomBytes(2 * 6 * 8 * 4, static_cast<uint32_t>(lease * 10 + l));
      sent[{lease, l}] = p;
      ASSERT_TRUE(sender_->Send(t, h, std::move(p)).ok());
    }
    EXPECT_TRUE(sender_->Wait(t, absl::Now() + absl::Seconds(10)).ok());
    sender_->Forget(t);
  }
  ASSERT_TRUE(WaitFor([&] { return sink_.got().size() == sent.size(); }));
  EXPECT_EQ(sink_.got(), sent);
  EXPECT_TRUE(sink_.undeliverable().empty());
  EXPECT_LE(sender_->bootstraps(), 2u);  // at most max_comms_per_peer, reused across requests
  EXPECT_EQ(receiver_->chunks_delivered(), 8u);
}

TEST_F(NcclTransportTest, RefusesOtherKindsAndCorruptionFaults) {
  const KvTarget tcp{"tcp://127.0.0.1:1", 1, 1};
  absl::Status s = sender_->Send(tcp, Chunk(1, 0), testing::RandomBytes(2 * 6 * 8 * 4, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--kv-transport=tcp"), std::string::npos) << s;
  KvSenderOptions corrupt;
  corrupt.corrupt_every = 3;
  auto bad = MakeNcclKvSender(
      Parts(), [](const std::string&) { return NcclUniqueId{}; }, corrupt);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  const KvTarget nowhere{"nccl://127.0.0.1:6000", 1, 1};
  s = sender_->Send(nowhere, Chunk(1, 0), testing::RandomBytes(2 * 6 * 8 * 4, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;  // the bootstrap's error
  EXPECT_EQ(sender_->Wait(nowhere, absl::Now()).code(), absl::StatusCode::kUnavailable);
  sender_->Forget(nowhere);
}

TEST_F(NcclTransportTest, ASinkRefusalIsReportedOnTheDecodeSide) {
  sink_.set_refuse_layer(1);
  const KvTarget t = Target(3);
  for (uint32_t l = 0; l < 3; ++l) {
    ASSERT_TRUE(sender_->Send(t, Chunk(3, l), testing::RandomBytes(2 * 6 * 8 * 4, l)).ok());
  }
  // No ACK over NCCL: the prefill's send completes; the decode learns of the refusal.
  EXPECT_TRUE(sender_->Wait(t, absl::Now() + absl::Seconds(10)).ok());
  sender_->Forget(t);
  ASSERT_TRUE(WaitFor([&] { return sink_.undeliverable().size() == 1; }));
  EXPECT_EQ(sink_.undeliverable().begin()->first, (std::pair<uint64_t, uint32_t>{3, 1}));
  EXPECT_EQ(sink_.undeliverable().begin()->second.code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(WaitFor([&] { return sink_.got().size() == 2; }));
}

TEST_F(NcclTransportTest, AHungDecodeFailsTheTargetAndFreesEveryBuffer) {
  const KvTarget warm = Target(1);
  ASSERT_TRUE(sender_->Send(warm, Chunk(1, 0), testing::RandomBytes(2 * 6 * 8 * 4, 1)).ok());
  ASSERT_TRUE(sender_->Wait(warm, absl::Now() + absl::Seconds(10)).ok());
  sender_->Forget(warm);
  net_.Freeze(kNcclDecodeRank, true);
  const KvTarget t = Target(2);
  for (uint32_t l = 0; l < 3; ++l) {
    ASSERT_TRUE(sender_->Send(t, Chunk(2, l), testing::RandomBytes(2 * 6 * 8 * 4, l)).ok());
  }
  absl::Status s = sender_->Wait(t, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  // The chunk in flight fails with its communicator aborted, those queued behind it alone.
  EXPECT_NE(s.message().find("deadline passed"), std::string::npos) << s;
  sender_->Forget(t);
  EXPECT_GE(sender_->aborts(), 1u);  // the watchdog fired
  // The abort reached the decode side: its communicator is dropped, its buffer returned.
  ASSERT_TRUE(WaitFor([&] { return receiver_->staging_buffers_in_use() == 0; }));
  net_.Freeze(kNcclDecodeRank, false);
  // The next transfer bootstraps a fresh communicator and goes through.
  const KvTarget after = Target(3);
  ASSERT_TRUE(sender_->Send(after, Chunk(3, 0), testing::RandomBytes(2 * 6 * 8 * 4, 3)).ok());
  EXPECT_TRUE(sender_->Wait(after, absl::Now() + absl::Seconds(10)).ok());
  sender_->Forget(after);
  EXPECT_EQ(sender_->staging_buffers_in_use(), 0);
}

TEST_F(NcclTransportTest, QueuedChunksOfAForgottenTargetAreNotSent) {
  const KvTarget warm = Target(1);
  ASSERT_TRUE(sender_->Send(warm, Chunk(1, 0), testing::RandomBytes(2 * 6 * 8 * 4, 1)).ok());
  ASSERT_TRUE(sender_->Wait(warm, absl::Now() + absl::Seconds(10)).ok());
  sender_->Forget(warm);
  // Two chunks on the wire (one per pooled communicator), a third queued behind one of them.
  net_.Freeze(kNcclDecodeRank, true);
  const KvTarget t = Target(2);
  for (uint32_t l = 0; l < 3; ++l) {
    ASSERT_TRUE(sender_->Send(t, Chunk(2, l), testing::RandomBytes(2 * 6 * 8 * 4, l)).ok());
  }
  absl::SleepFor(absl::Milliseconds(50));  // the progress thread posts the heads
  sender_->Forget(t);                      // the prefill gave up on this lease
  net_.Freeze(kNcclDecodeRank, false);
  ASSERT_TRUE(WaitFor([&] { return sender_->staging_buffers_in_use() == 0; }));
  absl::SleepFor(absl::Milliseconds(50));  // anything sent would have arrived by now
  const auto got = sink_.got();
  EXPECT_EQ(got.count({2, 2}), 0u) << "the queued chunk was sent";
  EXPECT_LE(got.size(), 3u);
}

}  // namespace
}  // namespace tandem
