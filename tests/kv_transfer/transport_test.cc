// End-to-end tests of the tcp and local transports: a prefill-side cache (block size 16) ships
// prompts through a KvSender into a CacheSink (block size 4, shuffled block ids). Every test
// ends with the leak check: no lease, no block in use, no sender bookkeeping.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "kv_transfer/kv_auth.h"
#include "kv_transfer/kv_pack.h"
#include "kv_transfer/kv_transfer.h"
#include "kv_transfer/wire.h"
#include "tests/kv_transfer/kv_relay.h"
#include "tests/kv_transfer/kv_test_util.h"

namespace tandem {
namespace {

using Code = absl::StatusCode;
using testing::BlocksFor;
using testing::CacheSink;
using testing::FillPrompt;
using testing::KvShape;
using testing::MakeCache;

constexpr int kLayers = 4;
constexpr int kTokens = 50;
constexpr int kChunkTokens = 16;  // the prefill's chunk: 4 chunks per layer, the last of 2
constexpr int kChunksPerPrompt = kLayers * 4;
constexpr int kSrcBlock = 16;
constexpr int kDstBlock = 4;

int CountOpenFds() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

absl::Time Soon(absl::Duration d = absl::Seconds(20)) { return absl::Now() + d; }

// The cluster secret both ends of a tcp transport prove.
const ClusterSecret& TestSecret() {
  static const ClusterSecret* secret = new ClusterSecret(ClusterSecret::Generate());
  return *secret;
}
KvReceiverOptions ReceiverOptions() {
  KvReceiverOptions o;
  o.auth.secret = TestSecret();
  return o;
}
KvSenderOptions SenderOptions() {
  KvSenderOptions o;
  o.auth.secret = TestSecret();
  return o;
}

// One prefill worker: a cache holding prompts for several requests, each in its own blocks.
class PrefillSide {
 public:
  explicit PrefillSide(int max_requests, DType dtype = DType::kF32)
      : cache_(MakeCache(KvShape(kLayers, 2, 16), max_requests * BlocksFor(kTokens, kSrcBlock),
                         kSrcBlock, dtype)) {}

  // Fills the prompt of `slot` with values seeded by `seed`.
  void Prefill(int slot, int seed) { FillPrompt(&cache_, Table(slot), kTokens, seed); }

  // Sends every layer of `slot`'s prompt in chunks of kChunkTokens, layer by layer as a
  // prefill would.
  absl::Status Ship(KvSender* sender, const KvTarget& target, int slot, uint64_t request_id) {
    const std::vector<int> table = Table(slot);
    for (int l = 0; l < kLayers; ++l) {
      for (int start = 0; start < kTokens; start += kChunkTokens) {
        const int n = std::min(kChunkTokens, kTokens - start);
        absl::StatusOr<std::string> payload = GatherKv(cache_, l, table, start, n);
        if (!payload.ok()) return payload.status();
        const KvChunkHeader h = MakeKvChunkHeader(cache_, request_id, l, start, n);
        if (absl::Status s = sender->Send(target, h, *std::move(payload)); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

 private:
  std::vector<int> Table(int slot) const {
    const int n = BlocksFor(kTokens, kSrcBlock);
    std::vector<int> t(n);
    // Reversed ids, so sender blocks are not in order either.
    for (int i = 0; i < n; ++i) t[i] = slot * n + (n - 1 - i);
    return t;
  }

  KvCache cache_;
};

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    fds_before_ = CountOpenFds();
    sink_ = std::make_unique<CacheSink>(KvShape(kLayers, 2, 16), 200, kDstBlock);
    receiver_ = MakeReceiver(sink_.get());
    ASSERT_NE(receiver_, nullptr);
  }

  void TearDown() override {
    if (sender_ != nullptr) {
      EXPECT_EQ(sender_->num_targets(), 0u) << "sender bookkeeping leaked";
    }
    sender_.reset();
    receiver_.reset();
    EXPECT_TRUE(sink_->Clean()) << "lease or block leaked";
    EXPECT_EQ(CountOpenFds(), fds_before_) << "file descriptors leaked";
  }

  std::unique_ptr<KvReceiver> MakeReceiver(KvSink* sink, std::string address = "") {
    if (address.empty()) {
      address = GetParam() == "tcp" ? "127.0.0.1:0"
                                    : "recv-" + std::to_string(reinterpret_cast<uintptr_t>(sink));
    }
    absl::StatusOr<std::unique_ptr<KvReceiver>> r =
        MakeKvReceiver(GetParam(), address, sink, ReceiverOptions());
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }

  KvSender* MakeSender(const KvSenderOptions& options = SenderOptions()) {
    absl::StatusOr<std::unique_ptr<KvSender>> s = MakeKvSender(GetParam(), options);
    EXPECT_TRUE(s.ok()) << s.status();
    sender_ = *std::move(s);
    return sender_.get();
  }

  // Admit, ship, wait: the whole transfer of one prompt.
  absl::Status Transfer(KvSender* sender, PrefillSide& p, int slot, uint64_t request_id,
                        KvTarget* target_out = nullptr) {
    const KvTarget target = sink_->Admit(receiver_->endpoint(), request_id, kTokens, Soon());
    if (target_out != nullptr) *target_out = target;
    absl::Status s = p.Ship(sender, target, slot, request_id);
    if (s.ok()) s = sender->Wait(target, Soon());
    return s;
  }

  int fds_before_ = 0;
  std::unique_ptr<CacheSink> sink_;
  std::unique_ptr<KvReceiver> receiver_;
  std::unique_ptr<KvSender> sender_;
};

TEST_P(TransportTest, ShipsSeveralPromptsConcurrently) {
  KvSender* sender = MakeSender();
  constexpr int kRequests = 6;
  PrefillSide prefill(kRequests);
  std::vector<KvTarget> targets(kRequests);
  std::vector<absl::Status> results(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    prefill.Prefill(i, /*seed=*/10 + i);
    targets[i] = sink_->Admit(receiver_->endpoint(), 100 + i, kTokens, Soon());
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      results[i] = prefill.Ship(sender, targets[i], i, 100 + i);
      if (results[i].ok()) results[i] = sender->Wait(targets[i], Soon());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_TRUE(results[i].ok()) << results[i];
    EXPECT_TRUE(sink_->IsComplete(targets[i].lease_id));
    EXPECT_TRUE(sink_->Holds(100 + i, kTokens, 10 + i)) << "request " << i;
    sender->Forget(targets[i]);
    EXPECT_TRUE(sink_->Release(targets[i].lease_id).ok());
  }
  EXPECT_EQ(sink_->accepted_calls(), kRequests * kChunksPerPrompt);
}

TEST_P(TransportTest, CorruptedChunkIsDataLossAndTheNextLeaseStillWorks) {
  KvSenderOptions options = SenderOptions();
  options.corrupt_chunk_index = 5;
  KvSender* sender = MakeSender(options);
  PrefillSide prefill(2);
  prefill.Prefill(0, 1);
  prefill.Prefill(1, 2);

  KvTarget bad;
  absl::Status s = Transfer(sender, prefill, 0, 1, &bad);
  EXPECT_EQ(s.code(), Code::kDataLoss) << s;
  EXPECT_FALSE(sink_->IsComplete(bad.lease_id));

  KvTarget good;
  s = Transfer(sender, prefill, 1, 2, &good);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(sink_->Holds(2, kTokens, 2));

  sender->Forget(bad);
  sender->Forget(good);
  EXPECT_TRUE(sink_->Release(bad.lease_id).ok());
  EXPECT_TRUE(sink_->Release(good.lease_id).ok());
}

TEST_P(TransportTest, SinkRefusalComesBackThroughWait) {
  KvSender* sender = MakeSender();
  PrefillSide prefill(1);
  prefill.Prefill(0, 3);
  // The decode admitted request 9, gave up on it, and admitted it again (a resume): the
  // prefill still holding the first target is a late writer.
  const KvTarget stale = sink_->Admit(receiver_->endpoint(), 9, kTokens, Soon());
  ASSERT_TRUE(sink_->Release(stale.lease_id).ok());
  const KvTarget fresh = sink_->Admit(receiver_->endpoint(), 9, kTokens, Soon());
  EXPECT_NE(fresh.lease_id, stale.lease_id);
  EXPECT_NE(fresh.capability, stale.capability);

  ASSERT_TRUE(sender
                  ->Send(stale,
                         MakeKvChunkHeader(MakeCache(KvShape(kLayers, 2, 16), 1, 4), 9, 0, 0, 1),
                         std::string(2 * 32 * 4, '\0'))
                  .ok());
  absl::Status s = sender->Wait(stale, Soon());
  EXPECT_EQ(s.code(), Code::kAborted) << s;
  EXPECT_NE(s.message().find("no live lease"), std::string::npos) << s;
  // The prefill stops sending to a lease the decode refused.
  EXPECT_EQ(prefill.Ship(sender, stale, 0, 9).code(), Code::kAborted);

  EXPECT_TRUE(prefill.Ship(sender, fresh, 0, 9).ok());
  EXPECT_TRUE(sender->Wait(fresh, Soon()).ok());
  EXPECT_TRUE(sink_->Holds(9, kTokens, 3));

  // An unknown lease, and the live lease with a wrong capability, get the stale writer's
  // answer: nothing tells them apart.
  KvTarget unknown = fresh;
  unknown.lease_id = fresh.lease_id + 1;
  KvTarget forged = fresh;
  forged.capability[0] ^= 1;
  for (const KvTarget& t : {unknown, forged}) {
    absl::Status refused = prefill.Ship(sender, t, 0, 12345);
    if (refused.ok()) refused = sender->Wait(t, Soon());
    EXPECT_EQ(refused.code(), Code::kAborted) << refused;
    EXPECT_EQ(refused.message(), s.message());
  }

  for (const KvTarget& t : {stale, fresh, unknown, forged}) sender->Forget(t);
  EXPECT_TRUE(sink_->Release(fresh.lease_id).ok());
}

TEST_P(TransportTest, DroppedChunkMeansDeadlineOnBothSides) {
  KvSenderOptions options = SenderOptions();
  options.drop_chunk_index = 2;
  KvSender* sender = MakeSender(options);
  PrefillSide prefill(1);
  prefill.Prefill(0, 4);
  const absl::Time lease_deadline = absl::Now() + absl::Seconds(30);
  const KvTarget target = sink_->Admit(receiver_->endpoint(), 5, kTokens, lease_deadline);
  ASSERT_TRUE(prefill.Ship(sender, target, 0, 5).ok());
  absl::Status s = sender->Wait(target, absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(s.code(), Code::kDeadlineExceeded) << s;
  // Every chunk but the dropped one arrived; the lease never completes and expires.
  EXPECT_EQ(sink_->accepted_calls(), kChunksPerPrompt - 1);
  EXPECT_FALSE(sink_->IsComplete(target.lease_id));
  EXPECT_EQ(sink_->Expire(lease_deadline - absl::Seconds(1)), 0);
  EXPECT_EQ(sink_->Expire(lease_deadline), 1);
  sender->Forget(target);
}

TEST_P(TransportTest, SendRejectsMalformedChunks) {
  KvSender* sender = MakeSender();
  const KvTarget target{receiver_->endpoint(), 1, 1};
  KvChunkHeader h;
  h.token_count = 2;
  h.width = 4;
  EXPECT_EQ(sender->Send(target, h, std::string(63, '\0')).code(), Code::kInvalidArgument);
  h.width = 0;
  EXPECT_EQ(sender->Send(target, h, "").code(), Code::kInvalidArgument);
  h.width = 4;
  h.dtype = static_cast<DType>(9);
  EXPECT_EQ(sender->Send(target, h, std::string(64, '\0')).code(), Code::kInvalidArgument);
  const std::string other = GetParam() == "tcp" ? "local://x" : "tcp://127.0.0.1:1";
  h.dtype = DType::kF32;
  EXPECT_EQ(sender->Send({other, 1, 1}, h, std::string(64, '\0')).code(), Code::kInvalidArgument);
  EXPECT_EQ(sender->Send({"bogus", 1, 1}, h, std::string(64, '\0')).code(), Code::kInvalidArgument);
  EXPECT_EQ(sender->num_targets(), 0u);
  EXPECT_EQ(sender->Wait(target, Soon()).code(), Code::kNotFound);
}

TEST_P(TransportTest, ReceiverGoneIsUnavailableAndAReplacementIsReached) {
  KvSender* sender = MakeSender();
  PrefillSide prefill(3);
  prefill.Prefill(0, 1);
  prefill.Prefill(1, 2);
  prefill.Prefill(2, 3);
  KvTarget first;
  ASSERT_TRUE(Transfer(sender, prefill, 0, 1, &first).ok());
  const std::string endpoint = receiver_->endpoint();

  // The decode worker goes away with the connection open; Shutdown must not hang.
  receiver_->Shutdown();
  const KvTarget orphan = sink_->Admit(endpoint, 2, kTokens, Soon());
  // Send may already report the target's failure, else Wait does.
  absl::Status lost = prefill.Ship(sender, orphan, 1, 2);
  if (lost.ok()) lost = sender->Wait(orphan, Soon());
  EXPECT_EQ(lost.code(), Code::kUnavailable) << lost;

  // It comes back at the same address: the sender reconnects.
  receiver_ = MakeReceiver(sink_.get(), endpoint.substr(endpoint.find("://") + 3));
  ASSERT_NE(receiver_, nullptr);
  KvTarget again;
  absl::Status s = Transfer(sender, prefill, 2, 3, &again);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(sink_->Holds(3, kTokens, 3));

  for (const KvTarget& t : {first, orphan, again}) {
    sender->Forget(t);
    EXPECT_TRUE(sink_->Release(t.lease_id).ok());
  }
}

// Every KV dtype travels as stored: the decode side's blocks hold the prefill's bytes (and fp8
// scales) exactly.
TEST_P(TransportTest, EveryKvDtypeArrivesByteForByte) {
  KvSender* sender = MakeSender();
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kFp8E4M3}) {
    CacheSink sink(KvShape(kLayers, 2, 16), 64, kDstBlock, dtype);
    std::unique_ptr<KvReceiver> receiver = MakeReceiver(&sink);
    ASSERT_NE(receiver, nullptr);
    PrefillSide prefill(1, dtype);
    prefill.Prefill(0, 9);
    const KvTarget target = sink.Admit(receiver->endpoint(), 1, kTokens, Soon());
    absl::Status s = prefill.Ship(sender, target, 0, 1);
    if (s.ok()) s = sender->Wait(target, Soon());
    EXPECT_TRUE(s.ok()) << DTypeName(dtype) << ": " << s;
    EXPECT_TRUE(sink.Holds(1, kTokens, 9)) << DTypeName(dtype);
    sender->Forget(target);
    EXPECT_TRUE(sink.Release(target.lease_id).ok());
    receiver->Shutdown();
    EXPECT_TRUE(sink.Clean());
  }
}

// A KV dtype other than the receiver's is refused, naming both.
TEST_P(TransportTest, AnotherKvDtypeIsRefused) {
  KvSender* sender = MakeSender();
  PrefillSide prefill(1, DType::kBF16);
  prefill.Prefill(0, 4);
  const KvTarget target = sink_->Admit(receiver_->endpoint(), 1, kTokens, Soon());
  absl::Status s = prefill.Ship(sender, target, 0, 1);
  if (s.ok()) s = sender->Wait(target, Soon());
  EXPECT_EQ(s.code(), Code::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("bf16"), std::string::npos) << s;
  EXPECT_NE(s.message().find("f32"), std::string::npos) << s;
  sender->Forget(target);
  EXPECT_TRUE(sink_->Release(target.lease_id).ok());
}

// A sink that blocks until told to go on.
class BlockingSink : public KvSink {
 public:
  absl::Status CheckHeader(const KvChunkHeader&) override { return absl::OkStatus(); }
  absl::Status Accept(const KvChunkHeader&, std::span<const char>) override {
    if (!entered_.HasBeenNotified()) entered_.Notify();
    release_.WaitForNotification();
    return absl::OkStatus();
  }
  absl::Notification entered_, release_;
};

TEST_P(TransportTest, SinkThatNeverAnswersIsDeadlineAndShutdownDoesNotHang) {
  BlockingSink blocking;
  std::unique_ptr<KvReceiver> slow = MakeReceiver(&blocking);
  ASSERT_NE(slow, nullptr);
  KvSender* sender = MakeSender();
  PrefillSide prefill(1);
  prefill.Prefill(0, 1);
  const KvTarget target{slow->endpoint(), 77, 1};
  ASSERT_TRUE(prefill.Ship(sender, target, 0, 77).ok());
  blocking.entered_.WaitForNotification();
  EXPECT_EQ(sender->Wait(target, absl::Now() + absl::Milliseconds(200)).code(),
            Code::kDeadlineExceeded);
  // The sender shuts down while its chunks sit in the sink, the socket or the queue: what is
  // pending fails with CANCELLED at once.
  std::thread shutdown([sender] { sender->Shutdown(); });
  EXPECT_EQ(sender->Wait(target, Soon()).code(), Code::kCancelled);
  EXPECT_EQ(
      sender
          ->Send(target, MakeKvChunkHeader(MakeCache(KvShape(kLayers, 2, 16), 1, 4), 77, 0, 0, 1),
                 std::string(2 * 32 * 4, '\0'))
          .code(),
      Code::kCancelled);
  if (GetParam() == "tcp") {
    shutdown.join();  // does not wait for the stuck receiver
    blocking.release_.Notify();
  } else {
    blocking.release_.Notify();  // local: the sink call runs on the sender's thread
    shutdown.join();
  }
  sender->Forget(target);
  slow->Shutdown();
}

INSTANTIATE_TEST_SUITE_P(Kinds, TransportTest, ::testing::Values("tcp", "local"),
                         [](const auto& info) { return info.param; });

// ---- tcp only -------------------------------------------------------------------------------

TEST(TcpTransportTest, PeerThatNeverAnswersIsDeadlineExceeded) {
  const int fds_before = CountOpenFds();
  // A socket that listens but never accepts or reads: connect succeeds, no ACK ever comes.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const KvTarget target{"tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), 1, 1};
  {
    std::unique_ptr<KvSender> sender = *MakeKvSender("tcp", SenderOptions());
    PrefillSide prefill(1);
    prefill.Prefill(0, 1);
    // The writer is stuck in the handshake (nobody ever says hello).
    for (int i = 0; i < 40; ++i) ASSERT_TRUE(prefill.Ship(sender.get(), target, 0, 1).ok());
    EXPECT_EQ(sender->Wait(target, absl::Now() + absl::Milliseconds(300)).code(),
              Code::kDeadlineExceeded);
    sender->Forget(target);
    EXPECT_EQ(sender->num_targets(), 0u);
  }  // destructor: Shutdown with a write in progress
  close(fd);
  EXPECT_EQ(CountOpenFds(), fds_before);
}

TEST(TcpTransportTest, NobodyListeningIsUnavailable) {
  // Bind then close to get a port nobody listens on.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  std::unique_ptr<KvSender> sender = *MakeKvSender("tcp", SenderOptions());
  const KvTarget target{"tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), 1, 1};
  PrefillSide prefill(1);
  // The writer thread connects on the first chunk; once it has found nobody listening, the
  // target's later chunks are refused at once with that error, so Ship may already see it.
  const absl::Status shipped = prefill.Ship(sender.get(), target, 0, 1);
  EXPECT_TRUE(shipped.ok() || shipped.code() == Code::kUnavailable) << shipped;
  EXPECT_EQ(sender->Wait(target, Soon()).code(), Code::kUnavailable);
  sender->Forget(target);
  EXPECT_EQ(sender->num_targets(), 0u);
}

// Writes raw frames to a receiver and returns what comes back until it closes. With
// `authenticate`, the connection first proves the test secret (a hostile member of the
// cluster, or a prefill worker with a bug), each frame is sealed, and the answers come back
// with their seals checked and removed ("SEAL MISMATCH" where one fails).
std::string RawExchange(const std::string& endpoint, const std::vector<std::string>& frames,
                        bool authenticate = true) {
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "connect failed";
  }
  std::unique_ptr<KvSession> session = std::make_unique<KvSession>();
  if (authenticate) {
    SecureSocket sock(dup(fd), nullptr, /*server=*/false);
    std::atomic<bool> stop{false};
    KvAuth auth;
    auth.secret = TestSecret();
    absl::StatusOr<std::unique_ptr<KvSession>> s =
        AuthenticateKvConnection(sock, auth, /*receiver=*/false, stop, Soon());
    if (!s.ok()) {
      close(fd);
      return "handshake failed";
    }
    session = *std::move(s);
    // SecureSocket made the descriptor non-blocking; the reads below block.
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  }
  std::string bytes;
  for (const std::string& f : frames) bytes += SealKvFrame(*session, f);
  send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) got.append(buf, n);
  close(fd);
  if (!session->sealed()) return got;
  // header | tag | payload | tag, each record's seal checked.
  std::string opened;
  const std::string_view in(got);
  constexpr size_t kHead = kKvFrameHeaderBytes, kTag = kKvFrameTagBytes;
  for (size_t at = 0; at < in.size();) {
    if (at + kHead + kTag > in.size()) return opened + "TRUNCATED";
    if (!session->Open(in.substr(at, kHead), in.substr(at + kHead, kTag))) {
      return opened + "SEAL MISMATCH";
    }
    absl::StatusOr<KvFrameHeader> a = DecodeKvFrameHeader(in.substr(at, kHead));
    if (!a.ok()) return opened + "UNPARSEABLE";
    const size_t len = a->payload_length;
    if (at + kHead + kTag + len + kTag > in.size()) return opened + "TRUNCATED";
    if (!session->Open(in.substr(at + kHead + kTag, len),
                       in.substr(at + kHead + kTag + len, kTag))) {
      return opened + "SEAL MISMATCH";
    }
    opened.append(in.substr(at, kHead));
    opened.append(in.substr(at + kHead + kTag, len));
    at += kHead + kTag + len + kTag;
  }
  return opened;
}

TEST(TcpTransportTest, ReceiverSurvivesGarbageAndAnswersOversizedFrames) {
  const int fds_before = CountOpenFds();
  CacheSink sink(KvShape(kLayers, 2, 16), 64, kDstBlock);
  KvReceiverOptions options = ReceiverOptions();
  options.max_frame_bytes = 4096;
  std::unique_ptr<KvReceiver> receiver = *MakeKvReceiver("tcp", "127.0.0.1:0", &sink, options);

  // Garbage instead of a handshake: the receiver's hello (40 bytes) is all that comes back.
  EXPECT_EQ(RawExchange(receiver->endpoint(), {std::string(500, 'z')}, false).size(), 40u);
  // Garbage after the handshake: the connection is dropped without an answer.
  EXPECT_EQ(RawExchange(receiver->endpoint(), {std::string(500, 'z')}), "");

  // A valid frame over the receiver's limit: RESOURCE_EXHAUSTED, then the connection ends.
  KvChunkHeader h;
  h.lease_id = 3;
  h.token_count = 64;
  h.width = 32;  // 16 KiB payload
  const std::string big = EncodeKvDataFrame(41, h, std::string(2 * 64 * 32 * 4, '\0'));
  const std::string answer = RawExchange(receiver->endpoint(), {big});
  absl::StatusOr<KvFrame> ack = DecodeKvFrame(answer);
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(ack->header.seq, 41u);
  EXPECT_EQ(KvAckStatus(ack->header, ack->payload).code(), Code::kResourceExhausted);

  // A chunk for no lease: refused before its payload is buffered (ABORTED), and the same
  // connection goes on. A corrupted payload for a live lease: DATA_LOSS, and the connection
  // answers the next frame, which lands.
  const KvTarget lease = sink.Admit(receiver->endpoint(), 7, 2, Soon());
  KvChunkHeader good = h;
  good.lease_id = lease.lease_id;
  good.generation = lease.generation;
  good.capability = lease.capability;
  good.token_count = 2;
  h.token_count = 2;
  // (The corrupted payload is sealed as it is: the sender's own bug, which the checksum finds.)
  std::vector<std::string> frames = {EncodeKvDataFrame(1, h, std::string(2 * 2 * 32 * 4, '\1')),
                                     EncodeKvDataFrame(2, good, std::string(2 * 2 * 32 * 4, '\1')),
                                     EncodeKvDataFrame(3, good, std::string(2 * 2 * 32 * 4, '\1'))};
  frames[1][frames[1].size() - 5] ^= 1;
  const std::string answers = RawExchange(receiver->endpoint(), frames);
  std::vector<KvFrame> acks;
  for (size_t at = 0; at < answers.size();) {
    absl::StatusOr<KvFrameHeader> a = DecodeKvFrameHeader(std::string_view(answers).substr(at));
    ASSERT_TRUE(a.ok()) << a.status();
    const size_t len = kKvFrameHeaderBytes + a->payload_length;
    acks.push_back(*DecodeKvFrame(std::string_view(answers).substr(at, len)));
    at += len;
  }
  ASSERT_EQ(acks.size(), 3u);
  EXPECT_EQ(acks[0].header.seq, 1u);
  EXPECT_EQ(acks[0].header.status, Code::kAborted);  // the sink knows no lease 3
  EXPECT_EQ(acks[1].header.seq, 2u);
  EXPECT_EQ(acks[1].header.status, Code::kDataLoss);
  EXPECT_EQ(acks[2].header.seq, 3u);
  EXPECT_EQ(acks[2].header.status, Code::kOk);
  EXPECT_EQ(sink.accepted_calls(), 1);  // only the good chunk reached Accept
  EXPECT_TRUE(sink.Release(lease.lease_id).ok());

  receiver->Shutdown();
  receiver.reset();
  EXPECT_TRUE(sink.Clean());
  EXPECT_EQ(CountOpenFds(), fds_before);
}

TEST(TcpTransportTest, NeverRunsOpenAndAWrongSecretIsRefusedAtTheHandshake) {
  const int fds_before = CountOpenFds();
  CacheSink sink(KvShape(kLayers, 2, 16), 64, kDstBlock);
  EXPECT_EQ(MakeKvReceiver("tcp", "127.0.0.1:0", &sink).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(MakeKvSender("tcp").status().code(), Code::kInvalidArgument);
  std::unique_ptr<KvReceiver> receiver =
      *MakeKvReceiver("tcp", "127.0.0.1:0", &sink, ReceiverOptions());
  KvSenderOptions wrong;
  wrong.auth.secret = ClusterSecret::Generate();
  std::unique_ptr<KvSender> sender = *MakeKvSender("tcp", wrong);
  const KvTarget target = sink.Admit(receiver->endpoint(), 1, kTokens, Soon());
  PrefillSide prefill(1);
  prefill.Prefill(0, 1);
  absl::Status s = prefill.Ship(sender.get(), target, 0, 1);
  if (s.ok()) s = sender->Wait(target, Soon());
  EXPECT_EQ(s.code(), Code::kUnavailable) << s;
  EXPECT_NE(s.message().find("handshake"), std::string::npos) << s;
  EXPECT_EQ(sink.checked_headers(), 0) << "not a frame was read from the impostor";
  sender->Forget(target);
  sender.reset();
  EXPECT_TRUE(sink.Release(target.lease_id).ok());
  receiver.reset();
  EXPECT_TRUE(sink.Clean());
  EXPECT_EQ(CountOpenFds(), fds_before);
}

// A relay between a prefill worker's sender and a decode worker's receiver passes the
// handshake through (both ends prove the secret to each other through it). What it does with
// the frames afterwards: answering them itself, altering them or replaying one must fail every
// time, with no chunk delivered that the sender did not send and no success the receiver did
// not give. Passing them on untouched is the control: it works.
TEST(TcpTransportTest, RelayInTheMiddleCannotAnswerAlterOrReplayFrames) {
  using Mode = testing::KvRelay::Mode;
  const int fds_before = CountOpenFds();
  for (Mode mode :
       {Mode::kPass, Mode::kAnswerItself, Mode::kTamperPayload, Mode::kReplayFirstFrame}) {
    SCOPED_TRACE(static_cast<int>(mode));
    CacheSink sink(KvShape(kLayers, 2, 16), 64, kDstBlock);
    std::unique_ptr<KvReceiver> receiver =
        *MakeKvReceiver("tcp", "127.0.0.1:0", &sink, ReceiverOptions());
    {
      testing::KvRelay relay(receiver->endpoint(), mode);
      std::unique_ptr<KvSender> sender = *MakeKvSender("tcp", SenderOptions());
      const KvTarget lease = sink.Admit(receiver->endpoint(), 1, kTokens, Soon());
      KvTarget via_relay = lease;
      via_relay.endpoint = relay.endpoint();
      PrefillSide prefill(1);
      prefill.Prefill(0, 7);
      absl::Status s = prefill.Ship(sender.get(), via_relay, 0, 1);
      if (s.ok()) s = sender->Wait(via_relay, Soon());
      EXPECT_GE(relay.handshakes(), 1);
      switch (mode) {
        case Mode::kPass:
          EXPECT_TRUE(s.ok()) << s;
          EXPECT_TRUE(sink.IsComplete(lease.lease_id));
          EXPECT_TRUE(sink.Holds(1, kTokens, 7));
          break;
        case Mode::kAnswerItself:
          // Its ACKs carry no valid seal: the sender believes none of them.
          EXPECT_EQ(s.code(), Code::kUnavailable) << s;
          EXPECT_NE(s.message().find("seal"), std::string::npos) << s;
          EXPECT_GE(relay.forged_acks(), 1);
          EXPECT_EQ(sink.checked_headers(), 0);
          break;
        case Mode::kTamperPayload:
          // The altered frame fails its seal at the receiver, which hangs up unanswered.
          EXPECT_FALSE(s.ok());
          EXPECT_EQ(sink.accepted_calls(), 0);
          EXPECT_FALSE(sink.IsComplete(lease.lease_id));
          break;
        case Mode::kReplayFirstFrame:
          // The first frame lands once; its copy ends the connection.
          EXPECT_FALSE(s.ok());
          EXPECT_LE(sink.accepted_calls(), 1);
          EXPECT_FALSE(sink.IsComplete(lease.lease_id));
          break;
      }
      sender->Forget(via_relay);
      sender.reset();
      EXPECT_TRUE(sink.Release(lease.lease_id).ok());
    }
    receiver.reset();
    EXPECT_TRUE(sink.Clean());
  }
  EXPECT_EQ(CountOpenFds(), fds_before);
}

TEST(LocalTransportTest, NamesAreUniqueWhileRegistered) {
  CacheSink sink(KvShape(1, 1, 4), 4, 4);
  std::unique_ptr<KvReceiver> a = *MakeKvReceiver("local", "decode-0", &sink);
  EXPECT_EQ(a->endpoint(), "local://decode-0");
  EXPECT_EQ(MakeKvReceiver("local", "decode-0", &sink).status().code(), Code::kAlreadyExists);
  a->Shutdown();
  EXPECT_TRUE(MakeKvReceiver("local", "decode-0", &sink).ok());
  EXPECT_EQ(MakeKvSender("nccl").status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
