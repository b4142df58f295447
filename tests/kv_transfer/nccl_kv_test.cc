// The NCCL KV transport's logic (framing, pool, bootstrap, watchdog) against the in-process fake
// communicator of nccl_fake.h. Every test ends with the leak check: no transfer left in the
// sender, no communicator left alive once both sides shut down.
#include "kv_transfer/nccl/nccl_kv.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "kv_transfer/nccl/comm_pool.h"
#include "kv_transfer/nccl/framing.h"
#include "tests/kv_transfer/nccl_fake.h"

namespace tandem {
namespace {

using ::tandem::testing::FakeNccl;

KvChunkHeader Chunk(uint64_t request, uint32_t layer, uint32_t tokens = 5, uint32_t width = 8) {
  KvChunkHeader h;
  h.request_id = request;
  h.lease_id = 1000 + request;
  h.generation = 1;
  h.layer = layer;
  h.token_start = 0;
  h.token_count = tokens;
  h.width = width;
  h.dtype = DType::kF32;
  return h;
}

size_t PayloadBytes(const KvChunkHeader& h) { return 2ull * h.token_count * h.width * 4; }

// ---- framing -------------------------------------------------------------------------------

TEST(NcclFramingTest, HeaderRoundTrip) {
  const KvChunkHeader c = Chunk(7, 3);
  const std::string payload = testing::RandomBytes(PayloadBytes(c), 1);
  auto bytes = EncodeNcclLayerHeader(42, c, payload, true, kDefaultMaxFrameBytes);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto h = DecodeNcclLayerHeader(*bytes, 42, kDefaultMaxFrameBytes);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->seq, 42u);
  EXPECT_EQ(h->chunk.request_id, 7u);
  EXPECT_EQ(h->chunk.lease_id, 1007u);
  EXPECT_EQ(h->chunk.layer, 3u);
  EXPECT_EQ(h->chunk.token_count, 5u);
  EXPECT_EQ(h->chunk.width, 8u);
  EXPECT_EQ(h->payload_length, payload.size());
  EXPECT_TRUE(VerifyNcclPayload(*h, payload, true).ok());
  std::string bad = payload;
  bad[17] ^= 1;
  EXPECT_EQ(VerifyNcclPayload(*h, bad, true).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(VerifyNcclPayload(*h, std::string_view(payload).substr(1), true).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclFramingTest, RejectsOutOfStepCorruptAndMalformed) {
  const KvChunkHeader c = Chunk(1, 0);
  const std::string payload = testing::RandomBytes(PayloadBytes(c), 2);
  auto bytes = EncodeNcclLayerHeader(5, c, payload, true, kDefaultMaxFrameBytes);
  ASSERT_TRUE(bytes.ok());
  auto wrong_seq = DecodeNcclLayerHeader(*bytes, 6, kDefaultMaxFrameBytes);
  EXPECT_EQ(wrong_seq.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_seq.status().message().find("out of step"), std::string::npos);
  NcclHeaderBytes flipped = *bytes;
  flipped[40] ^= 0x10;  // token_start: the header CRC no longer matches
  EXPECT_EQ(DecodeNcclLayerHeader(flipped, 5, kDefaultMaxFrameBytes).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(
      DecodeNcclLayerHeader(std::span<const char>(bytes->data(), 71), 5, kDefaultMaxFrameBytes)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  // An ACK frame is never part of the NCCL stream.
  const std::string ack = EncodeKvAckFrame(5, c, absl::OkStatus());
  EXPECT_EQ(DecodeNcclLayerHeader(std::span<const char>(ack.data(), kKvFrameHeaderBytes), 5,
                                  kDefaultMaxFrameBytes)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The payload must be what the header describes.
  auto short_payload =
      EncodeNcclLayerHeader(0, c, std::string_view(payload).substr(4), true, kDefaultMaxFrameBytes);
  EXPECT_EQ(short_payload.status().code(), absl::StatusCode::kInvalidArgument);
  KvChunkHeader zero = c;
  zero.width = 0;
  EXPECT_EQ(EncodeNcclLayerHeader(0, zero, {}, true, kDefaultMaxFrameBytes).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeNcclLayerHeader(0, c, payload, true, 100).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(NcclFramingTest, ChecksumOffSkipsOnlyThePayloadCrc) {
  const KvChunkHeader c = Chunk(1, 0);
  std::string payload = testing::RandomBytes(PayloadBytes(c), 3);
  auto bytes = EncodeNcclLayerHeader(0, c, payload, false, kDefaultMaxFrameBytes);
  ASSERT_TRUE(bytes.ok());
  auto h = DecodeNcclLayerHeader(*bytes, 0, kDefaultMaxFrameBytes);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->payload_crc, 0u);
  payload[0] ^= 1;
  EXPECT_TRUE(VerifyNcclPayload(*h, payload, false).ok());
}

// ---- pool ----------------------------------------------------------------------------------

class NcclPoolTest : public ::testing::Test {
 protected:
  std::unique_ptr<Communicator> NewComm() {
    auto id = net_.NewUniqueId();
    auto c = net_.InitRank(*id, 2, kNcclPrefillRank);
    EXPECT_TRUE(c.ok());
    return std::move(*c);
  }
  FakeNccl net_;
};

TEST_F(NcclPoolTest, ReusesIdleThenGrowsToPerPeerBoundThenShares) {
  const absl::Time t0 = absl::Now();
  {
    NcclCommPool pool({.max_comms_per_peer = 2, .max_comms = 8, .idle_timeout = absl::Seconds(10)});
    auto pick = pool.Pick("d1");
    ASSERT_TRUE(pick.ok());
    EXPECT_EQ(*pick, nullptr);  // nothing yet: bootstrap
    auto* a = pool.Add("d1", NewComm(), t0);
    EXPECT_EQ(*pool.Pick("d1"), a);  // idle: reused
    a->active = 1;
    EXPECT_EQ(*pool.Pick("d1"), nullptr);  // busy, room for a second
    auto* b = pool.Add("d1", NewComm(), t0);
    b->active = 2;
    EXPECT_EQ(*pool.Pick("d1"), a);        // at the bound: the least loaded
    EXPECT_EQ(*pool.Pick("d2"), nullptr);  // other peers have their own
    EXPECT_EQ(pool.size("d1"), 2u);
    const uint64_t a_id = a->id;
    pool.Invalidate(a_id);
    EXPECT_EQ(pool.Find(a_id), nullptr);
    EXPECT_EQ(net_.aborts(), 1);
    EXPECT_EQ(pool.size(), 1u);
    EXPECT_EQ(*pool.Pick("d1"), nullptr);  // room again after invalidation
  }
  EXPECT_EQ(net_.live_comms(), 0);
}

TEST_F(NcclPoolTest, EvictsIdleAndLeastRecentlyUsed) {
  const absl::Time t0 = absl::Now();
  NcclCommPool pool({.max_comms_per_peer = 1, .max_comms = 2, .idle_timeout = absl::Seconds(10)});
  const uint64_t a = pool.Add("d1", NewComm(), t0)->id;
  auto* b = pool.Add("d2", NewComm(), t0 + absl::Seconds(1));
  b->active = 1;
  EXPECT_EQ(pool.EvictIdle(t0 + absl::Seconds(5)), 0);
  EXPECT_EQ(pool.EvictIdle(t0 + absl::Seconds(10)), 1);  // a, idle for 10 s
  EXPECT_EQ(pool.Find(a), nullptr);
  EXPECT_NE(pool.Find(b->id), nullptr);  // busy ones stay whatever their age
  const uint64_t c = pool.Add("d3", NewComm(), t0 + absl::Seconds(2))->id;
  // Full (2) with d2 busy and d3 idle: a new peer evicts d3, the idle one.
  EXPECT_EQ(*pool.Pick("d4"), nullptr);
  pool.Add("d4", NewComm(), t0 + absl::Seconds(3));
  EXPECT_EQ(pool.Find(c), nullptr);
  EXPECT_EQ(pool.size(), 2u);
  // Full of busy communicators of other peers: refused with a clear error.
  for (auto* e : pool.entries()) e->active = 1;
  auto full = pool.Pick("d5");
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  pool.AbortAll();
  EXPECT_EQ(pool.size(), 0u);
  EXPECT_EQ(net_.live_comms(), 0);
}

// ---- transport -----------------------------------------------------------------------------

// Collects what the decode side received.
class TestSink : public NcclKvSink {
 public:
  absl::StatusOr<std::span<char>> Destination(const KvChunkHeader& h) override {
    absl::MutexLock lock(&mu_);
    if (refuse_layer_ >= 0 && h.layer == static_cast<uint32_t>(refuse_layer_)) {
      return absl::FailedPreconditionError("lease is gone");
    }
    auto& buf = buffers_[{h.request_id, h.layer}];
    buf.assign(2ull * h.token_count * h.width * DTypeSize(h.dtype), '\0');
    return std::span<char>(buf);
  }
  void Deliver(const KvChunkHeader& h, std::span<const char> payload) override {
    absl::MutexLock lock(&mu_);
    delivered_[{h.request_id, h.layer}] = std::string(payload.data(), payload.size());
    if (on_deliver_) on_deliver_();
  }
  void Failed(const KvChunkHeader& h, std::span<char>, const absl::Status& s) override {
    absl::MutexLock lock(&mu_);
    failed_[{h.request_id, h.layer}] = s;
  }
  std::map<std::pair<uint64_t, uint32_t>, std::string> delivered() {
    absl::MutexLock lock(&mu_);
    return delivered_;
  }
  std::map<std::pair<uint64_t, uint32_t>, absl::Status> failed() {
    absl::MutexLock lock(&mu_);
    return failed_;
  }
  void set_refuse_layer(int layer) {
    absl::MutexLock lock(&mu_);
    refuse_layer_ = layer;
  }
  void set_on_deliver(std::function<void()> f) {
    absl::MutexLock lock(&mu_);
    on_deliver_ = std::move(f);
  }

 private:
  absl::Mutex mu_;
  int refuse_layer_ = -1;
  std::function<void()> on_deliver_;
  std::map<std::pair<uint64_t, uint32_t>, std::string> buffers_;
  std::map<std::pair<uint64_t, uint32_t>, std::string> delivered_;
  std::map<std::pair<uint64_t, uint32_t>, absl::Status> failed_;
};

// One request's KV: `layers` payloads that outlive the transfer.
struct Request {
  uint64_t id;
  std::vector<std::string> payloads;
  std::vector<NcclKvLayer> layers;
  Request(uint64_t request_id, int n_layers, uint32_t tokens = 5) : id(request_id) {
    for (int l = 0; l < n_layers; ++l) {
      const KvChunkHeader c = Chunk(request_id, l, tokens);
      payloads.push_back(
          testing::RandomBytes(PayloadBytes(c), static_cast<uint32_t>(request_id * 131 + l)));
    }
    for (int l = 0; l < n_layers; ++l)
      layers.push_back({Chunk(request_id, l, tokens), payloads[l]});
  }
};

using testing::WaitFor;

class NcclKvTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(); }
  void Start() {
    options_.pool.idle_timeout = absl::Minutes(1);
    receiver_ = std::make_unique<NcclKvReceiver>(&net_, &sink_, options_);
    sender_ = std::make_unique<NcclKvSender>(
        &net_,
        [this](const std::string& peer) -> absl::StatusOr<NcclUniqueId> {
          if (peer != "decode-0") return absl::NotFoundError("no such decode worker " + peer);
          return receiver_->Bootstrap("prefill-0");
        },
        options_);
  }
  void TearDown() override {
    // The leak check.
    EXPECT_EQ(sender_->num_transfers(), 0u);
    sender_->Shutdown();
    receiver_->Shutdown();
    EXPECT_EQ(sender_->num_comms(), 0u);
    EXPECT_EQ(receiver_->num_comms(), 0u);
    sender_.reset();
    receiver_.reset();
    EXPECT_EQ(net_.live_comms(), 0);
  }
  void ExpectDelivered(const Request& r) {
    auto got = sink_.delivered();
    for (size_t l = 0; l < r.payloads.size(); ++l) {
      auto it = got.find({r.id, static_cast<uint32_t>(l)});
      ASSERT_NE(it, got.end()) << "request " << r.id << " layer " << l;
      EXPECT_EQ(it->second, r.payloads[l]) << "request " << r.id << " layer " << l;
    }
  }

  NcclKvOptions options_;
  FakeNccl net_;
  TestSink sink_;
  std::unique_ptr<NcclKvReceiver> receiver_;
  std::unique_ptr<NcclKvSender> sender_;
};

TEST_F(NcclKvTest, TransfersLayersInOrderAndReusesTheCommunicator) {
  Request a(1, 4), b(2, 3);
  auto ta = sender_->Submit("decode-0", a.layers, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(ta.ok()) << ta.status();
  ASSERT_TRUE(sender_->Wait(*ta).ok());
  auto tb = sender_->Submit("decode-0", b.layers, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(tb.ok());
  EXPECT_TRUE(sender_->Wait(*tb).ok());
  ASSERT_TRUE(WaitFor([&] { return receiver_->chunks_delivered() == 7; }));
  ExpectDelivered(a);
  ExpectDelivered(b);
  EXPECT_EQ(sender_->bootstraps(), 1u);  // the second transfer reused the communicator
  EXPECT_EQ(sender_->num_comms(), 1u);
  EXPECT_EQ(net_.inits(), 2);                                         // one per rank
  EXPECT_EQ(sender_->Wait(*tb).code(), absl::StatusCode::kNotFound);  // forgotten once returned
}

TEST_F(NcclKvTest, RejectsBadSubmissionsNamingTheField) {
  Request r(1, 2);
  EXPECT_EQ(sender_->Submit("", r.layers, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sender_->Submit("decode-0", {}, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto bad = r.layers;
  bad[1].payload = bad[1].payload.subspan(1);
  auto s = sender_->Submit("decode-0", bad, absl::InfiniteFuture());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("layers[1]"), std::string::npos) << s.status();
  auto unknown = sender_->Submit("decode-9", r.layers, absl::InfiniteFuture());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("bootstrap with decode-9"), std::string::npos);
  EXPECT_EQ(sender_->num_comms(), 0u);
}

TEST_F(NcclKvTest, ConcurrentTransfersAllArriveIntact) {
  constexpr int kThreads = 8, kPerThread = 5, kLayers = 3;
  std::vector<std::unique_ptr<Request>> reqs;
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    reqs.push_back(std::make_unique<Request>(100 + i, kLayers, 1 + i % 7));
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        Request& r = *reqs[t * kPerThread + k];
        auto id = sender_->Submit("decode-0", r.layers, absl::Now() + absl::Seconds(30));
        if (!id.ok() || !sender_->Wait(*id).ok()) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(
      WaitFor([&] { return receiver_->chunks_delivered() == kThreads * kPerThread * kLayers; }));
  for (auto& r : reqs) ExpectDelivered(*r);
  EXPECT_TRUE(sink_.failed().empty());
  EXPECT_GE(sender_->bootstraps(), 1u);
  EXPECT_EQ(sender_->aborts(), 0u);
}

TEST_F(NcclKvTest, WatchdogAbortsAStuckPeerAndTheNextTransferBootstrapsAFreshOne) {
  Request warm(1, 1);
  auto t0 = sender_->Submit("decode-0", warm.layers, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(t0.ok());
  ASSERT_TRUE(sender_->Wait(*t0).ok());

  net_.Freeze(kNcclDecodeRank, true);  // the decode worker hangs: nothing completes, no error
  Request stuck(2, 4), behind(3, 2);
  const absl::Time start = absl::Now();
  auto ts = sender_->Submit("decode-0", stuck.layers, start + absl::Milliseconds(200));
  ASSERT_TRUE(ts.ok());
  auto tb = sender_->Submit("decode-0", behind.layers, start + absl::Seconds(30));
  ASSERT_TRUE(tb.ok());
  // `stuck` took the idle communicator; `behind` found it busy and got a second one (two per
  // peer by default), equally frozen.
  absl::Status s = sender_->Wait(*ts, start + absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("communicator aborted"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  net_.Freeze(kNcclDecodeRank, false);
  absl::Status sb = sender_->Wait(*tb, start + absl::Seconds(20));
  // `behind` was on the other communicator: it completes once the peer thaws.
  EXPECT_TRUE(sb.ok()) << sb;
  EXPECT_EQ(sender_->bootstraps(), 2u);
  EXPECT_EQ(sender_->aborts(), 1u);

  // The aborted communicator left the pool; the next transfer works.
  const uint64_t boots = sender_->bootstraps();
  Request after(4, 2);
  auto ta = sender_->Submit("decode-0", after.layers, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(ta.ok()) << ta.status();
  EXPECT_TRUE(sender_->Wait(*ta).ok());
  ASSERT_TRUE(WaitFor([&] { return sink_.delivered().count({4, 1}) == 1; }));
  ExpectDelivered(after);
  EXPECT_EQ(sender_->bootstraps(), boots);  // reused the healthy one
  EXPECT_EQ(sender_->num_comms(), 1u);
}

TEST_F(NcclKvTest, SharedCommunicatorAbortFailsEveryTransferOnIt) {
  sender_->Shutdown();
  receiver_->Shutdown();
  options_.pool.max_comms_per_peer = 1;  // force both transfers onto one communicator
  Start();
  net_.Freeze(kNcclDecodeRank, true);
  Request stuck(2, 2), behind(3, 2);
  const absl::Time start = absl::Now();
  auto ts = sender_->Submit("decode-0", stuck.layers, start + absl::Milliseconds(150));
  auto tb = sender_->Submit("decode-0", behind.layers, start + absl::Seconds(30));
  ASSERT_TRUE(ts.ok() && tb.ok());
  EXPECT_EQ(sender_->bootstraps(), 1u);
  absl::Status s = sender_->Wait(*ts, start + absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("of 2 layers posted"), std::string::npos) << s;
  absl::Status sb = sender_->Wait(*tb, start + absl::Seconds(10));
  EXPECT_EQ(sb.code(), absl::StatusCode::kUnavailable) << sb;
  EXPECT_NE(sb.message().find("aborted because transfer"), std::string::npos) << sb;
  EXPECT_EQ(sender_->num_comms(), 0u);
  net_.Freeze(kNcclDecodeRank, false);
  Request after(4, 1);
  auto ta = sender_->Submit("decode-0", after.layers, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(ta.ok());
  EXPECT_TRUE(sender_->Wait(*ta).ok());
  EXPECT_EQ(sender_->bootstraps(), 2u);  // a fresh communicator
  // The decode side saw its old communicator's peer abort and dropped it too.
  ASSERT_TRUE(WaitFor([&] { return receiver_->num_comms() == 1; }));
}

TEST_F(NcclKvTest, InitThatNeverCompletesIsAbortedAtTheDeadline) {
  // The decode worker answered the bootstrap RPC but its rank never joins.
  sender_->Shutdown();
  sender_ = std::make_unique<NcclKvSender>(
      &net_, [this](const std::string&) { return net_.NewUniqueId(); }, options_);
  Request r(1, 1);
  const absl::Time start = absl::Now();
  auto t = sender_->Submit("decode-0", r.layers, start + absl::Milliseconds(100));
  ASSERT_TRUE(t.ok());
  absl::Status s = sender_->Wait(*t, start + absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("still initialising"), std::string::npos) << s;
  EXPECT_EQ(sender_->num_comms(), 0u);
  EXPECT_EQ(net_.aborts(), 1);
}

TEST_F(NcclKvTest, PeerDeathMidTransferFailsItWithUnavailable) {
  Request r(1, 6);
  // The decode process dies after the second layer lands.
  std::atomic<int> delivered{0};
  sink_.set_on_deliver([&] {
    if (++delivered == 2) net_.FailAll(absl::UnavailableError("fake nccl: remote process died"));
  });
  auto t = sender_->Submit("decode-0", r.layers, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(t.ok());
  const absl::Time start = absl::Now();
  absl::Status s = sender_->Wait(*t, start + absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("remote process died"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // the error, not the deadline
  EXPECT_EQ(sender_->num_comms(), 0u);
  ASSERT_TRUE(WaitFor([&] { return receiver_->num_comms() == 0; }));
  EXPECT_EQ(receiver_->chunks_delivered(), 2u);
}

TEST_F(NcclKvTest, IdleCommunicatorOfADeadPeerLeavesThePool) {
  Request a(1, 2);
  auto ta = sender_->Submit("decode-0", a.layers, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(ta.ok());
  ASSERT_TRUE(sender_->Wait(*ta).ok());
  EXPECT_EQ(sender_->num_comms(), 1u);
  // The sender's Wait returns once its sends completed; let the decode side deliver too.
  ASSERT_TRUE(WaitFor([&] { return receiver_->chunks_delivered() == 2; }));
  net_.FailAll(absl::UnavailableError("fake nccl: remote process died"));
  EXPECT_TRUE(WaitFor([&] { return sender_->num_comms() == 0; }));
  EXPECT_TRUE(WaitFor([&] { return receiver_->num_comms() == 0; }));
  Request b(2, 2);
  auto tb = sender_->Submit("decode-0", b.layers, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(tb.ok());
  EXPECT_TRUE(sender_->Wait(*tb).ok());  // a fresh communicator, not the dead one
  EXPECT_EQ(sender_->bootstraps(), 2u);
  ASSERT_TRUE(WaitFor([&] { return receiver_->chunks_delivered() == 4; }));
  ExpectDelivered(b);
}

TEST_F(NcclKvTest, QueuedTransferPastItsDeadlineFailsAloneWithoutAnAbort) {
  sender_->Shutdown();
  receiver_->Shutdown();
  options_.pool.max_comms_per_peer = 1;
  Start();
  Request warm(1, 1);
  auto tw = sender_->Submit("decode-0", warm.layers, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(tw.ok());
  ASSERT_TRUE(sender_->Wait(*tw).ok());
  net_.Freeze(kNcclDecodeRank, true);
  Request first(2, 2), queued(3, 2);
  auto tf = sender_->Submit("decode-0", first.layers, absl::Now() + absl::Seconds(30));
  auto tq = sender_->Submit("decode-0", queued.layers, absl::Now() + absl::Milliseconds(50));
  ASSERT_TRUE(tf.ok() && tq.ok());
  absl::Status sq = sender_->Wait(*tq, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(sq.code(), absl::StatusCode::kDeadlineExceeded) << sq;
  EXPECT_NE(sq.message().find("while queued"), std::string::npos) << sq;
  net_.Freeze(kNcclDecodeRank, false);
  EXPECT_TRUE(sender_->Wait(*tf).ok());  // the communicator survived
  EXPECT_EQ(sender_->aborts(), 0u);
  EXPECT_EQ(sender_->bootstraps(), 1u);
  ASSERT_TRUE(WaitFor([&] { return receiver_->chunks_delivered() == 3; }));
  ExpectDelivered(first);
  EXPECT_EQ(sink_.delivered().count({3, 0}), 0u);
}

TEST_F(NcclKvTest, DecodeShutdownMidTransferIsSeenAsPeerAbort) {
  Request r(1, 3);
  net_.Freeze(kNcclPrefillRank, true);  // hold the layers back until the decode side is gone
  auto t = sender_->Submit("decode-0", r.layers, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(t.ok());
  receiver_->Shutdown();
  net_.Freeze(kNcclPrefillRank, false);
  absl::Status s = sender_->Wait(*t, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("remote rank aborted"), std::string::npos) << s;
}

TEST_F(NcclKvTest, SilentPeerAbortIsCaughtByTheDeadline) {
  net_.set_abort_visible_to_peer(false);  // NVLink-like: the survivor just stalls
  Request r(1, 3);
  net_.Freeze(kNcclPrefillRank, true);
  auto t = sender_->Submit("decode-0", r.layers, absl::Now() + absl::Milliseconds(300));
  ASSERT_TRUE(t.ok());
  receiver_->Shutdown();
  net_.Freeze(kNcclPrefillRank, false);
  absl::Status s = sender_->Wait(*t, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(sender_->num_comms(), 0u);
}

TEST_F(NcclKvTest, RefusedLayerIsDrainedAndTheStreamStaysInStep) {
  sink_.set_refuse_layer(1);
  Request a(1, 3);
  auto ta = sender_->Submit("decode-0", a.layers, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(ta.ok());
  EXPECT_TRUE(sender_->Wait(*ta).ok());  // NCCL completes; the refusal goes by the lease path
  ASSERT_TRUE(WaitFor([&] { return receiver_->chunks_failed() == 1; }));
  auto failed = sink_.failed();
  ASSERT_EQ(failed.count({1, 1}), 1u);
  EXPECT_EQ((failed[{1, 1}].code()), absl::StatusCode::kFailedPrecondition);
  sink_.set_refuse_layer(-1);
  Request b(2, 2);
  auto tb = sender_->Submit("decode-0", b.layers, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(tb.ok());
  EXPECT_TRUE(sender_->Wait(*tb).ok());
  ASSERT_TRUE(WaitFor([&] { return receiver_->chunks_delivered() == 4; }));
  ExpectDelivered(b);
  EXPECT_EQ(receiver_->aborts(), 0u);
}

TEST_F(NcclKvTest, CorruptedPayloadIsReportedAsDataLoss) {
  Request r(1, 2);
  net_.Freeze(kNcclDecodeRank, true);
  auto t = sender_->Submit("decode-0", r.layers, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(t.ok());
  r.payloads[0][3] ^= 0x40;  // after the CRC was taken, before the bytes moved
  net_.Freeze(kNcclDecodeRank, false);
  EXPECT_TRUE(sender_->Wait(*t).ok());
  ASSERT_TRUE(WaitFor([&] { return receiver_->chunks_failed() == 1; }));
  EXPECT_EQ((sink_.failed()[{1, 0}].code()), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(WaitFor([&] { return receiver_->chunks_delivered() == 1; }));
}

TEST_F(NcclKvTest, ReceiverAbortsAnIdleCommunicatorAndSenderEvictsIdleOnes) {
  sender_->Shutdown();
  receiver_->Shutdown();
  options_.receiver_idle_timeout = absl::Milliseconds(300);
  options_.receiver_init_timeout = absl::Milliseconds(300);
  Start();
  // Start() set the pool's idle timeout to a minute; shorten it for this test.
  sender_->Shutdown();
  NcclKvOptions sender_options = options_;
  sender_options.pool.idle_timeout = absl::Milliseconds(50);
  sender_ = std::make_unique<NcclKvSender>(
      &net_, [this](const std::string&) { return receiver_->Bootstrap("prefill-0"); },
      sender_options);
  Request r(1, 1);
  auto t = sender_->Submit("decode-0", r.layers, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(sender_->Wait(*t).ok());
  EXPECT_TRUE(WaitFor([&] { return sender_->num_comms() == 0; }));  // evicted when idle
  EXPECT_TRUE(WaitFor([&] { return receiver_->num_comms() == 0; }));
  // A decode worker whose prefill never joins drops the half-made communicator too.
  auto id = receiver_->Bootstrap("prefill-ghost");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(receiver_->num_comms(), 1u);
  EXPECT_TRUE(WaitFor([&] { return receiver_->num_comms() == 0; }));
}

TEST_F(NcclKvTest, BootstrapsBeyondTheReceiversLimitAreRefused) {
  receiver_->Shutdown();
  options_.max_receiver_comms = 2;
  receiver_ = std::make_unique<NcclKvReceiver>(&net_, &sink_, options_);
  ASSERT_TRUE(receiver_->Bootstrap("p1").ok());
  ASSERT_TRUE(receiver_->Bootstrap("p2").ok());
  const auto third = receiver_->Bootstrap("p3");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_NE(third.status().message().find("p3"), std::string::npos) << third.status();
  EXPECT_EQ(receiver_->num_comms(), 2u);
}

// The decode side alone, driven by a hand-made prefill rank: a header whose payload never
// comes, and a header out of step.
class NcclKvReceiverTest : public NcclKvTest {
 protected:
  // Rank 1 of a new communicator with the receiver, once initialised.
  std::unique_ptr<Communicator> Prefill() {
    auto id = receiver_->Bootstrap("prefill-raw");
    EXPECT_TRUE(id.ok());
    auto c = net_.InitRank(*id, 2, kNcclPrefillRank);
    EXPECT_TRUE(c.ok());
    EXPECT_TRUE(WaitFor([&] { return *(*c)->Poll() == CommPoll::kIdle; }));
    return std::move(*c);
  }
};

TEST_F(NcclKvReceiverTest, LatePayloadAbortsTheCommunicatorAndFailsTheChunk) {
  receiver_->Shutdown();
  options_.payload_timeout = absl::Milliseconds(100);
  receiver_ = std::make_unique<NcclKvReceiver>(&net_, &sink_, options_);
  auto prefill = Prefill();
  Request r(9, 1);
  auto header =
      EncodeNcclLayerHeader(0, r.layers[0].chunk, r.layers[0].payload, true, kDefaultMaxFrameBytes);
  ASSERT_TRUE(header.ok());
  ASSERT_TRUE(prefill->Send(*header, kNcclDecodeRank).ok());  // and no payload
  ASSERT_TRUE(WaitFor([&] { return receiver_->chunks_failed() == 1; }));
  const absl::Status s = sink_.failed()[{9, 0}];
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("did not arrive in time"), std::string::npos) << s;
  EXPECT_EQ(receiver_->num_comms(), 0u);
  EXPECT_EQ(receiver_->aborts(), 1u);
  EXPECT_FALSE(prefill->Poll().ok());  // the abort reached the prefill rank
}

TEST_F(NcclKvReceiverTest, HeaderOutOfStepAbortsTheCommunicator) {
  auto prefill = Prefill();
  Request r(9, 1);
  auto header = EncodeNcclLayerHeader(5, r.layers[0].chunk, r.layers[0].payload, true,
                                      kDefaultMaxFrameBytes);  // seq 5, expected 0
  ASSERT_TRUE(header.ok());
  ASSERT_TRUE(prefill->Send(*header, kNcclDecodeRank).ok());
  ASSERT_TRUE(WaitFor([&] { return receiver_->num_comms() == 0; }));
  EXPECT_EQ(receiver_->aborts(), 1u);
  EXPECT_EQ(receiver_->chunks_delivered(), 0u);
  prefill.reset();
}

TEST_F(NcclKvTest, ShutdownCancelsPendingTransfers) {
  net_.Freeze(kNcclDecodeRank, true);
  Request r(1, 2);
  auto t = sender_->Submit("decode-0", r.layers, absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(t.ok());
  sender_->Shutdown();
  EXPECT_EQ(sender_->Wait(*t).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sender_->Submit("decode-0", r.layers, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  net_.Freeze(kNcclDecodeRank, false);
}

}  // namespace
}  // namespace tandem
