// The real NCCL communicator (libtandem_nccl.so) under the transport. Without the library or a
// GPU, only the loader's error is checked and the rest skips; NCCL cannot put two ranks on one
// GPU, so the end-to-end transfer needs two (scripts/gpu_check.sh runs this file).
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "absl/synchronization/mutex.h"
#include "kv_transfer/nccl/nccl_kv.h"
#include "kv_transfer/nccl/nccl_loader.h"

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

}  // namespace
}  // namespace tandem
