// The NCCL KV transport wired as the workers wire it (server/server_main.cc), in one process
// over the fake communicator (tests/kv_transfer/nccl_fake.h): the decode engine's receiver made
// through DecodeEngineOptions::make_receiver, the DecodeWorker service serving NcclBootstrap on
// 127.0.0.1, the prefill engine's sender bootstrapping through it over gRPC. Every test ends with
// the leak check: engines idle, no sender target, no staged buffer on either side.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <array>
#include <atomic>
#include <cstdio>

#include "decode_node/decode_engine.h"
#include "decode_node/decode_service.h"
#include "engine/generator.h"
#include "kv_transfer/nccl/nccl_loader.h"
#include "kv_transfer/nccl/nccl_transport.h"
#include "prefill_node/nccl_bootstrap_client.h"
#include "prefill_node/prefill_engine.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/cluster_auth.h"
#include "tests/kv_transfer/nccl_fake.h"
#include "tests/serving/engine_pair.h"
#include "tests/test_util.h"
#include "tools/server_process.h"

namespace tandem {
namespace {

using ::tandem::testing::FakeNccl;

// Between the receiver and the decode engine: after the N-th chunk, freezes the decode rank (a
// hung peer) or fails every communicator (a peer process that died); or refuses the N-th chunk
// (as a sink refusing a lease would).
class FaultySink : public KvSink {
 public:
  FaultySink(FakeNccl* net) : net_(net) {}
  void set_inner(KvSink* s) { inner_ = s; }
  void FreezeAfter(int n) { freeze_after_ = n; }
  void FailAfter(int n) { fail_after_ = n; }
  void RefuseChunk(int n) { refuse_ = n; }
  absl::Status CheckHeader(const KvChunkHeader& h) override { return inner_->CheckHeader(h); }
  absl::Status Accept(const KvChunkHeader& h, std::span<const char> payload) override {
    const int n = ++count_;
    if (n == refuse_) return absl::InternalError("test: chunk refused");
    absl::Status s = inner_->Accept(h, payload);
    if (n == freeze_after_) net_->Freeze(kNcclDecodeRank, true);
    if (n == fail_after_) net_->FailAll(absl::UnavailableError("fake nccl: remote process died"));
    return s;
  }
  void Undeliverable(const KvChunkHeader& h, const absl::Status& why) override {
    inner_->Undeliverable(h, why);
  }

 private:
  FakeNccl* const net_;
  KvSink* inner_ = nullptr;
  std::atomic<int> count_{0};
  std::atomic<int> freeze_after_{-1};
  std::atomic<int> fail_after_{-1};
  std::atomic<int> refuse_{-1};
};

class NcclWiringTest : public ::testing::Test {
 protected:
  NcclTransportParts Parts() {
    NcclTransportParts p;
    p.factory = std::shared_ptr<CommunicatorFactory>(&net_, [](CommunicatorFactory*) {});
    p.staging = MakeHostKvStaging();
    p.options.payload_timeout = absl::Seconds(1);
    return p;
  }

  void SetUp() override {
    backend_ = MakeCpuBackend();
    model_ = std::move(*Model::Load(testing::Stories260K(), backend_.get()));
    DecodeEngineOptions dopt;
    dopt.block_size = 4;  // differs from the prefill's: the wire carries token ranges
    dopt.num_blocks = 2048;
    dopt.transport = "nccl";
    dopt.kv_settle_timeout = absl::Seconds(5);
    dopt.make_receiver = [this](KvSink* engine) -> absl::StatusOr<std::unique_ptr<KvReceiver>> {
      sink_.set_inner(engine);
      std::unique_ptr<NcclKvTransportReceiver> r = MakeNcclKvReceiver(Parts(), &sink_);
      receiver_ = r.get();
      return r;
    };
    auto d = DecodeEngine::Create(model_.get(), dopt);
    ASSERT_TRUE(d.ok()) << d.status();
    decode_ = std::move(*d);
    EXPECT_EQ(decode_->kv_endpoint(), "");  // nothing to advertise before the server is bound
    GenerationRequest early;
    early.prompt = {1, 2};
    early.max_tokens = 1;
    EXPECT_EQ(decode_->Admit(early).status().code(), absl::StatusCode::kUnavailable);

    service_ =
        std::make_unique<DecodeService>(decode_.get(), testing::TestInternalAuth(), receiver_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    address_ = absl::StrFormat("127.0.0.1:%d", port);
    receiver_->SetBootstrapAddress(address_);
    decode_->SetKvEndpoint(receiver_->endpoint());

    KvSenderOptions so;
    so.io_timeout = absl::Milliseconds(500);  // the watchdog's deadline per chunk
    auto s =
        MakeNcclKvSender(Parts(),
                         MakeGrpcNcclBootstrap("prefill-test", grpc::InsecureChannelCredentials(),
                                               testing::TestInternalAuth()),
                         so);
    ASSERT_TRUE(s.ok()) << s.status();
    sender_ = std::move(*s);
    PrefillEngineOptions po;
    po.block_size = 16;
    po.num_blocks = 256;
    po.scheduler.chunk_size = 7;  // several chunks per prompt
    auto p = PrefillEngine::Create(model_.get(), sender_.get(), po);
    ASSERT_TRUE(p.ok()) << p.status();
    prefill_ = std::move(*p);
  }

  void TearDown() override {
    // The leak check. The decode frees a cancelled request's blocks between steps.
    for (int i = 0; i < 200 && !decode_->Idle(); ++i) absl::SleepFor(absl::Milliseconds(10));
    EXPECT_TRUE(prefill_->Idle());
    EXPECT_TRUE(decode_->Idle());
    EXPECT_EQ(sender_->num_targets(), 0u);
    EXPECT_EQ(sender_->staging_buffers_in_use(), 0);
    for (int i = 0; i < 300 && receiver_->staging_buffers_in_use() != 0; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(receiver_->staging_buffers_in_use(), 0);
    prefill_.reset();
    sender_.reset();
    server_->Shutdown();
    decode_.reset();  // shuts the receiver down
    EXPECT_EQ(net_.live_comms(), 0);
  }

  GenerationRequest Request(int max_tokens = 12) {
    GenerationRequest r;
    // 40 tokens: 6 prefill chunks of 7 tokens per layer.
    for (int i = 0; i < 40; ++i) r.prompt.push_back(1 + (i * 37) % 500);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    return r;
  }
  std::vector<int> Alone(const GenerationRequest& r) {
    Generator alone(model_.get(), nullptr, {});
    const std::vector<GenerationRequest> reqs = {r};
    auto want = alone.Generate(reqs);
    EXPECT_TRUE(want.ok()) << want.status();
    return want.ok() ? (*want)[0].tokens : std::vector<int>{};
  }

  FakeNccl net_;
  FaultySink sink_{&net_};
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  NcclKvTransportReceiver* receiver_ = nullptr;  // owned by decode_
  std::unique_ptr<DecodeEngine> decode_;
  std::unique_ptr<DecodeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<NcclKvTransportSender> sender_;
  std::unique_ptr<PrefillEngine> prefill_;
};

TEST_F(NcclWiringTest, BootstrapsOverGrpcAndGivesTheEngineAlonesTokens) {
  EXPECT_EQ(decode_->kv_endpoint(), "nccl://" + address_);
  const GenerationRequest r = Request();
  auto got = testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, Alone(r));
  const uint64_t bootstraps = sender_->bootstraps();
  EXPECT_GE(bootstraps, 1u);
  EXPECT_GT(receiver_->chunks_delivered(), 0u);
  // A second request reuses the pooled communicators: no new bootstrap.
  auto again = testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), r);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *got);
  EXPECT_EQ(sender_->bootstraps(), bootstraps);
}

TEST_F(NcclWiringTest, DecodeHangingMidTransferFailsTheRequestAndTheWorkersCarryOn) {
  // Warm up so the hang hits an established communicator, then hang after a few chunks.
  const GenerationRequest r = Request();
  auto warm = testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), r);
  ASSERT_TRUE(warm.ok()) << warm.status();
  const uint64_t aborts = sender_->aborts();
  sink_.FreezeAfter(static_cast<int>(receiver_->chunks_delivered()) + 3);
  auto failed = testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), r);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kDeadlineExceeded) << failed.status();
  // The chunk in flight fails with "communicator aborted", the ones queued behind it alone;
  // whichever the prefill saw first, it is the deadline.
  EXPECT_NE(failed.status().message().find("deadline passed"), std::string::npos)
      << failed.status();
  EXPECT_GT(sender_->aborts(), aborts);  // the watchdog fired
  // The peer comes back; the next request (on fresh communicators where they were aborted)
  // succeeds.
  // Chunks of the failed request still in flight reach their own deadline a moment later (the
  // prefill returned at the first); once they are aborted no staged buffer is left.
  for (int i = 0; i < 300 && sender_->staging_buffers_in_use() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(sender_->staging_buffers_in_use(), 0);
  net_.Freeze(kNcclDecodeRank, false);
  auto after = testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), r);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, *warm);
}

TEST_F(NcclWiringTest, DecodePeerDeathFailsTheRequestWithUnavailable) {
  const GenerationRequest r = Request();
  auto warm = testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), r);
  ASSERT_TRUE(warm.ok()) << warm.status();
  sink_.FailAfter(static_cast<int>(receiver_->chunks_delivered()) + 3);
  auto failed = testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), r);
  ASSERT_FALSE(failed.ok());
  // The prefill reports a transfer failure as ABORTED so the router resumes elsewhere.
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kAborted) << failed.status();
  EXPECT_NE(failed.status().message().find("remote process died"), std::string::npos)
      << failed.status();
  auto after = testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), r);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, *warm);
}

TEST_F(NcclWiringTest, ChunkTheDecodeCannotDeliverFailsTheRequestThere) {
  sink_.RefuseChunk(4);
  const GenerationRequest r = Request();
  auto got = testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), r);
  ASSERT_FALSE(got.ok());
  // The prefill's sends completed (no ACK over NCCL); Start on the decode fails.
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted) << got.status();
  EXPECT_NE(got.status().message().find("not delivered"), std::string::npos) << got.status();
  // RunPrefillThenDecode does not cancel after a failed Start; the service's guard does.
  auto retry = testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), r);
  ASSERT_TRUE(retry.ok()) << retry.status();
}

TEST_F(NcclWiringTest, BootstrapOfAWorkerWithoutNcclIsUnimplemented) {
  DecodeService plain(decode_.get(), testing::TestInternalAuth(), nullptr);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&plain);
  auto server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  NcclBootstrapFn bootstrap = MakeGrpcNcclBootstrap(
      "prefill-test", grpc::InsecureChannelCredentials(), testing::TestInternalAuth());
  auto id = bootstrap(absl::StrFormat("127.0.0.1:%d", port));
  EXPECT_EQ(id.status().code(), absl::StatusCode::kUnimplemented) << id.status();
  EXPECT_NE(id.status().message().find("--kv-transport=nccl"), std::string::npos) << id.status();
  server->Shutdown();
  // And the nccl worker answers a 128-byte id whose rank 0 it started.
  auto good = bootstrap(address_);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(receiver_->num_comms(), 1u);
}

// ---- real tandem-server processes ------------------------------------------------------------

// A worker started with --kv-transport=nccl on a machine without the library, libnccl or a GPU
// exits at once naming the flag (`timeout` turns a hang into exit 124).
TEST(NcclServerTest, NcclFlagFailsFastWithoutTheLibraryOrAGpu) {
  if (LoadNcclApi().ok()) GTEST_SKIP() << "libtandem_nccl.so and a GPU are here";
  for (const char* role : {"decode", "prefill"}) {
    const std::string cmd = absl::StrFormat(
        "timeout 60 %s/tandem-server --role=%s --kv-transport=nccl --model %s --router "
        "127.0.0.1:1 --cluster-secret-file %s 2>&1",
        testing::BinDir(), role, testing::Stories260K(), testing::TestClusterSecretFile());
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    const int status = pclose(p);
    ASSERT_TRUE(WIFEXITED(status)) << role;
    EXPECT_EQ(WEXITSTATUS(status), 2) << role << ": " << out;
    EXPECT_NE(out.find("--kv-transport=nccl"), std::string::npos) << role << ": " << out;
  }
}

// Mixed transports: the router refuses a worker whose transport differs from a registered one.
TEST(NcclServerTest, RouterRefusesAWorkerOfAnotherTransport) {
  const ServerProcess router =
      StartServerProcess(testing::BinDir() + "/tandem-server",
                         {"--role=router", "--model", testing::Stories260K(), "--tokenizer",
                          testing::Tok512(), "--host", "127.0.0.1", "--port", "0",
                          "--cluster-secret-file", testing::TestClusterSecretFile()});
  ASSERT_FALSE(router.address.empty());
  auto stub = v1::Registry::NewStub(
      grpc::CreateChannel(router.internal, grpc::InsecureChannelCredentials()));
  auto reg = [&](const std::string& id, v1::WorkerRole role, const std::string& transport) {
    v1::RegisterRequest req;
    req.set_worker_id(id);
    req.set_role(role);
    req.set_address("127.0.0.1:9");
    req.set_kv_transport(transport);
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    testing::ProveCluster(&ctx, internal_method::kRegister, router.internal, req,
                          role == v1::WORKER_ROLE_PREFILL ? PeerRole::kPrefill : PeerRole::kDecode);
    return stub->Register(&ctx, req, &resp);
  };
  EXPECT_TRUE(reg("d-tcp", v1::WORKER_ROLE_DECODE, "tcp").ok());
  const grpc::Status refused = reg("p-nccl", v1::WORKER_ROLE_PREFILL, "nccl");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("--kv-transport=nccl"), std::string::npos)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("d-tcp"), std::string::npos) << refused.error_message();
  EXPECT_TRUE(reg("p-tcp", v1::WORKER_ROLE_PREFILL, "tcp").ok());
  kill(router.pid, SIGTERM);
  int status = 0;
  waitpid(router.pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace tandem
