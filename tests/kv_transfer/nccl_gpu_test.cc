// The real NCCL communicator (libtandem_nccl.so) under the transport. Without the library or a
// GPU, only the loader's error is checked and the rest skips; NCCL cannot put two ranks on one
// GPU, so the end-to-end transfer needs two (scripts/gpu_check.sh runs this file).
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "absl/synchronization/mutex.h"
#include "kv_transfer/nccl/nccl_kv.h"
#include "kv_transfer/nccl/nccl_loader.h"
#include "kv_transfer/nccl/nccl_transport.h"

namespace tandem {
namespace {

TEST(NcclLoaderTest, MissingLibraryOrGpuIsAClearError) {
  auto api = LoadNcclApi();
  auto factory = MakeNcclCommunicatorFactory(0);
  if (!api.ok()) {
    EXPECT_EQ(api.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(api.status().message().find("libtandem_nccl.so") != std::string::npos ||
                api.status().message().find("no CUDA device") != std::string::npos)
        << api.status();
    EXPECT_EQ(factory.status(), api.status());
    return;
  }
  EXPECT_TRUE(factory.ok()) << factory.status();
  EXPECT_EQ(MakeNcclCommunicatorFactory(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeNcclCommunicatorFactory((*api)->device_count()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// What a worker started with --kv-transport=nccl prints and exits with on such a machine.
TEST(NcclLoaderTest, TransportLoadErrorNamesTheFlag) {
  auto parts = LoadNcclTransport(0);
  if (parts.ok()) {
    EXPECT_NE(parts->factory, nullptr);
    EXPECT_FALSE(parts->staging->host_visible());
    EXPECT_FALSE(parts->options.checksum_payload);
    return;
  }
  EXPECT_EQ(parts.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(parts.status().message().find("--kv-transport=nccl"), std::string::npos)
      << parts.status();
}

class NcclGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto api = LoadNcclApi();
    if (!api.ok()) GTEST_SKIP() << api.status().message();
    api_ = *api;
  }
  const TandemNcclApi* api_ = nullptr;
};

// As far as one GPU allows: a rank whose peer never joins stays pending, and the watchdog's
// abort returns without waiting for it.
TEST_F(NcclGpuTest, LonelyRankPendsAndAbortDoesNotHang) {
  auto factory = MakeNcclCommunicatorFactory(0);
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto id = (*factory)->NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto comm = (*factory)->InitRank(*id, 2, kNcclDecodeRank);
  ASSERT_TRUE(comm.ok()) << comm.status();
  const absl::Time end = absl::Now() + absl::Milliseconds(300);
  while (absl::Now() < end) {
    auto p = (*comm)->Poll();
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, CommPoll::kPending);
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Time start = absl::Now();
  (*comm)->Abort();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_FALSE((*comm)->Poll().ok());
}

// Device memory owned by the test, on one device.
class DeviceSink : public NcclKvSink {
 public:
  DeviceSink(const TandemNcclApi* api, int device) : api_(api), device_(device) {}
  ~DeviceSink() override {
    for (auto& [k, b] : buffers_) api_->dev_free(device_, b.first);
  }
  absl::StatusOr<std::span<char>> Destination(const KvChunkHeader& h) override {
    absl::MutexLock lock(&mu_);
    const size_t n = 2ull * h.token_count * h.width * DTypeSize(h.dtype);
    void* d = nullptr;
    if (api_->dev_malloc(device_, &d, n) != 0) return absl::ResourceExhaustedError("cudaMalloc");
    buffers_[{h.request_id, h.layer}] = {d, n};
    return std::span<char>(static_cast<char*>(d), n);
  }
  void Deliver(const KvChunkHeader& h, std::span<const char> payload) override {
    absl::MutexLock lock(&mu_);
    std::string host(payload.size(), '\0');
    api_->d2h(device_, host.data(), payload.data(), payload.size());
    delivered_[{h.request_id, h.layer}] = std::move(host);
  }
  void Failed(const KvChunkHeader& h, std::span<char>, const absl::Status& s) override {
    absl::MutexLock lock(&mu_);
    failures_++;
  }
  std::map<std::pair<uint64_t, uint32_t>, std::string> delivered() {
    absl::MutexLock lock(&mu_);
    return delivered_;
  }

 private:
  const TandemNcclApi* const api_;
  const int device_;
  absl::Mutex mu_;
  std::map<std::pair<uint64_t, uint32_t>, std::pair<void*, size_t>> buffers_;
  std::map<std::pair<uint64_t, uint32_t>, std::string> delivered_;
  int failures_ = 0;
};

// Prefill on device 1, decode on device 0, one process: 8 layers of a 512-token request.
TEST_F(NcclGpuTest, TwoGpuTransferMatchesByteForByte) {
  if (api_->device_count() < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL: one rank per GPU)";
  auto decode_factory = MakeNcclCommunicatorFactory(0);
  auto prefill_factory = MakeNcclCommunicatorFactory(1);
  ASSERT_TRUE(decode_factory.ok() && prefill_factory.ok());
  NcclKvOptions options;
  options.checksum_payload = false;  // device memory
  DeviceSink sink(api_, 0);
  NcclKvReceiver receiver(decode_factory->get(), &sink, options);
  NcclKvSender sender(
      prefill_factory->get(),
      [&](const std::string&) { return receiver.Bootstrap("prefill-gpu1"); }, options);
  constexpr int kLayers = 8;
  std::vector<std::string> host(kLayers);
  std::vector<void*> dev(kLayers);
  std::vector<NcclKvLayer> layers;
  std::mt19937 rng(7);
  for (int l = 0; l < kLayers; ++l) {
    KvChunkHeader c;
    c.request_id = 1;
    c.lease_id = 1;
    c.generation = 1;
    c.layer = l;
    c.token_count = 512;
    c.width = 1024;
    c.dtype = DType::kF32;
    host[l].resize(2ull * c.token_count * c.width * 4);
    for (char& ch : host[l]) ch = static_cast<char>(rng());
    ASSERT_EQ(api_->dev_malloc(1, &dev[l], host[l].size()), 0) << api_->last_error();
    ASSERT_EQ(api_->h2d(1, dev[l], host[l].data(), host[l].size()), 0);
    layers.push_back({c, std::span<const char>(static_cast<const char*>(dev[l]), host[l].size())});
  }
  const absl::Time start = absl::Now();
  auto id = sender.Submit("decode-gpu0", layers, absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(sender.Wait(*id).ok());
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (receiver.chunks_delivered() < kLayers && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  auto got = sink.delivered();
  for (int l = 0; l < kLayers; ++l) EXPECT_EQ((got[{1, static_cast<uint32_t>(l)}]), host[l]) << l;
  std::printf("nccl kv transfer: %d layers, %.1f MB in %.3f s (first transfer, includes init)\n",
              kLayers, kLayers * host[0].size() / 1e6, secs);
  sender.Shutdown();
  receiver.Shutdown();
  for (int l = 0; l < kLayers; ++l) api_->dev_free(1, dev[l]);
}

// Device staging on one GPU: host -> pinned -> device for a send, device -> pinned -> sink for a
// receive; the pool reuses its buffers.
class HostSink : public KvSink {
 public:
  absl::Status CheckHeader(const KvChunkHeader&) override { return absl::OkStatus(); }
  absl::Status Accept(const KvChunkHeader& h, std::span<const char> payload) override {
    absl::MutexLock lock(&mu_);
    got_[{h.lease_id, h.layer}] = std::string(payload.data(), payload.size());
    return absl::OkStatus();
  }
  void Undeliverable(const KvChunkHeader& h, const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    undeliverable_++;
  }
  std::map<std::pair<uint64_t, uint32_t>, std::string> got() {
    absl::MutexLock lock(&mu_);
    return got_;
  }
  int undeliverable() {
    absl::MutexLock lock(&mu_);
    return undeliverable_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::pair<uint64_t, uint32_t>, std::string> got_;
  int undeliverable_ = 0;
};

TEST_F(NcclGpuTest, DeviceStagingRoundTripOnOneGpu) {
  if (api_->device_count() < 1) GTEST_SKIP() << "needs a GPU";
  auto staging = MakeDeviceKvStaging(api_, 0);
  EXPECT_FALSE(staging->host_visible());
  std::mt19937 rng(3);
  HostSink sink;
  for (int i = 0; i < 3; ++i) {
    KvChunkHeader h;
    h.lease_id = 1;
    h.layer = i;
    std::string host(3u << 20, '\0');
    for (char& c : host) c = static_cast<char>(rng());
    auto sent = staging->StageForSend(h, host);
    ASSERT_TRUE(sent.ok()) << sent.status();
    // The staged device bytes are the payload: copy them into a receive buffer and deliver.
    auto recv = staging->ReceiveBuffer(h, host.size());
    ASSERT_TRUE(recv.ok()) << recv.status();
    std::string back(host.size(), '\0');
    ASSERT_EQ(api_->d2h(0, back.data(), (*sent)->data().data(), back.size()), 0);
    ASSERT_EQ(api_->h2d(0, (*recv)->data().data(), back.data(), back.size()), 0);
    ASSERT_TRUE(staging->Deliver(h, **recv, &sink).ok());
    EXPECT_EQ((sink.got()[{1, static_cast<uint32_t>(i)}]), host) << i;
  }
  EXPECT_EQ(staging->buffers_in_use(), 0);
}

// The whole transport as the workers use it: KvSender on GPU 1 -> KvReceiver on GPU 0 through
// device staging, bootstrapped in process.
TEST_F(NcclGpuTest, TransportOnTwoGpusDeliversEveryChunk) {
  if (api_->device_count() < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL: one rank per GPU)";
  auto decode_parts = LoadNcclTransport(0);
  auto prefill_parts = LoadNcclTransport(1);
  ASSERT_TRUE(decode_parts.ok() && prefill_parts.ok());
  HostSink sink;
  auto receiver = MakeNcclKvReceiver(*decode_parts, &sink);
  receiver->SetBootstrapAddress("127.0.0.1:1");
  auto sender = MakeNcclKvSender(
      *prefill_parts, [&](const std::string&) { return receiver->Bootstrap("prefill-gpu1"); });
  ASSERT_TRUE(sender.ok()) << sender.status();
  const KvTarget target{receiver->endpoint(), 9, 1};
  std::map<std::pair<uint64_t, uint32_t>, std::string> sent;
  std::mt19937 rng(11);
  for (uint32_t l = 0; l < 8; ++l) {
    KvChunkHeader h;
    h.request_id = 9;
    h.layer = l;
    h.token_count = 256;
    h.width = 1024;
    h.dtype = DType::kF32;
    std::string p(2ull * 256 * 1024 * 4, '\0');
    for (char& c : p) c = static_cast<char>(rng());
    sent[{9, l}] = p;
    ASSERT_TRUE((*sender)->Send(target, h, std::move(p)).ok());
  }
  EXPECT_TRUE((*sender)->Wait(target, absl::Now() + absl::Seconds(60)).ok());
  (*sender)->Forget(target);
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (sink.got().size() < sent.size() && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(sink.got(), sent);
  EXPECT_EQ(sink.undeliverable(), 0);
  (*sender)->Shutdown();
  receiver->Shutdown();
  EXPECT_EQ((*sender)->staging_buffers_in_use(), 0);
  EXPECT_EQ(receiver->staging_buffers_in_use(), 0);
}

}  // namespace
}  // namespace tandem
