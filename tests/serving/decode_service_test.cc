// The decode worker's gRPC service over a real server and a real decode engine: its streams
// give the engine alone's tokens, hold no thread, and a cancelled one frees its place at once.
#include "decode_node/decode_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/generator.h"
#include "kv_transfer/kv_transfer.h"
#include "prefill_node/prefill_engine.h"
#include "rpc/grpc_util.h"
#include "tests/cluster_auth.h"
#include "tests/serving/engine_parts.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using DecodeStub = v1::DecodeWorker::Stub;

// The process's thread count (/proc/self/status).
int Threads() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// One Decode stream, as the router drives it.
struct Stream {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::DecodeClientMessage, v1::DecodeServerMessage>> rw;

  // Opens the stream with `r`'s Admit: the KV target, or the refusal.
  absl::StatusOr<KvTarget> Admit(DecodeStub* stub, const std::string& address,
                                 const GenerationRequest& r, const std::string& request_id = "",
                                 const std::string& replaces = "") {
    v1::DecodeClientMessage admit;
    v1::DecodeAdmit* a = admit.mutable_admit();
    a->set_request_id(request_id);
    a->set_replaces_request_id(replaces);
    a->mutable_prompt_ids()->Add(r.prompt.begin(), r.prompt.end());
    *a->mutable_sampling() = ToProto(r.sampling);
    a->set_max_tokens(r.max_tokens);
    a->set_ignore_eos(r.ignore_eos);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    testing::ProveCluster(&ctx, internal_method::kDecode, address, admit);
    rw = stub->Decode(&ctx);
    v1::DecodeServerMessage reply;
    if (rw->Write(admit) && rw->Read(&reply) && reply.has_admitted()) {
      return FromProto(reply.admitted().kv_target());
    }
    rw->WritesDone();
    return FromGrpc(rw->Finish());
  }

  // Starts decoding after `first_token` and reads to the end: every token, the first included.
  absl::StatusOr<std::vector<int>> Run(int first_token) {
    v1::DecodeClientMessage start;
    start.mutable_start()->set_first_token(first_token);
    std::vector<int> out = {first_token};
    if (!rw->Write(start)) return FromGrpc(rw->Finish());
    v1::DecodeServerMessage m;
    bool finished = false;
    while (!finished && rw->Read(&m)) {
      out.insert(out.end(), m.tokens().ids().begin(), m.tokens().ids().end());
      finished = m.has_finished();
    }
    rw->WritesDone();
    if (grpc::Status s = rw->Finish(); !s.ok()) return FromGrpc(s);
    if (!finished) return absl::InternalError("no Finished message");
    return out;
  }

  void Cancel() {
    ctx.TryCancel();
    rw->Finish();
  }
};

class DecodeServiceTest : public testing::StoriesEngineTest {
 protected:
  void SetUp() override {
    testing::StoriesEngineTest::SetUp();
    if (HasFatalFailure()) return;
    PrefillEngineOptions po;
    po.block_size = 16;
    po.num_blocks = 256;
    auto p = PrefillEngine::Create(model_.get(), sender_.get(), po);
    ASSERT_TRUE(p.ok()) << p.status();
    prefill_ = std::move(*p);
  }

  // The decode engine and its service on 127.0.0.1:0.
  void StartDecode(int max_running, int64_t step_delay_ms = 0) {
    DecodeEngineOptions dopt;
    dopt.block_size = 4;
    dopt.num_blocks = 2048;
    dopt.max_running = max_running;
    dopt.transport = "tcp";
    dopt.listen = "127.0.0.1:0";
    dopt.receiver.auth.secret = testing::TestClusterSecret();
    dopt.faults.step_delay_ms = step_delay_ms;
    auto d = DecodeEngine::Create(model_.get(), dopt);
    ASSERT_TRUE(d.ok()) << d.status();
    decode_ = std::move(*d);
    service_ = std::make_unique<DecodeService>(decode_.get(), testing::TestInternalAuth());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = absl::StrFormat("127.0.0.1:%d", port);
    stub_ = v1::DecodeWorker::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    // The leak check: every stream's request ended, every block free.
    if (decode_) {
      for (int i = 0; i < 500 && !decode_->Idle(); ++i) absl::SleepFor(absl::Milliseconds(10));
      EXPECT_TRUE(decode_->Idle());
    }
    EXPECT_TRUE(prefill_->Idle());
    server_.reset();
    service_.reset();
    decode_.reset();
    prefill_.reset();
    sender_.reset();
  }

  // Prefills `r` into `target`: the first token.
  absl::StatusOr<int> Prefill(uint64_t id, const GenerationRequest& r, const KvTarget& target) {
    auto pre = prefill_->Prefill(id, r.prompt, r.sampling, target, absl::Now() + absl::Seconds(30));
    if (!pre.ok()) return pre.status();
    return pre->first_token;
  }

  static GenerationRequest Request(std::vector<int> prompt, int max_tokens, float temperature) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = temperature;
    r.sampling.seed = 7;
    return r;
  }

  std::unique_ptr<PrefillEngine> prefill_;
  std::unique_ptr<DecodeEngine> decode_;
  std::unique_ptr<DecodeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<DecodeStub> stub_;
};

// Streams side by side, greedy and seeded, give the tokens of the engine alone.
TEST_F(DecodeServiceTest, StreamsGiveTheTokensOfTheEngineAlone) {
  StartDecode(/*max_running=*/16);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    reqs.push_back(Request({1, 403 + i, 407}, 40 + 7 * i, i % 2 ? 0.8f : 0.0f));
  }
  Generator alone(model_.get(), nullptr, {});
  auto want = alone.Generate(reqs);
  ASSERT_TRUE(want.ok()) << want.status();
  std::vector<absl::StatusOr<std::vector<int>>> got(reqs.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] {
      Stream s;
      absl::StatusOr<KvTarget> target = s.Admit(stub_.get(), address_, reqs[i]);
      if (!target.ok()) {
        got[i] = target.status();
        return;
      }
      absl::StatusOr<int> first = Prefill(100 + i, reqs[i], *target);
      if (!first.ok()) {
        s.Cancel();
        got[i] = first.status();
        return;
      }
      got[i] = s.Run(*first);
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << "request " << i << ": " << got[i].status();
    EXPECT_EQ(*got[i], (*want)[i].tokens) << "request " << i;
  }
}

// A hundred admitted streams waiting for their Start hold no server thread each.
TEST_F(DecodeServiceTest, AStreamHoldsNoThread) {
  StartDecode(/*max_running=*/128);
  // The first stream brings up the channel's and server's own threads.
  std::vector<std::unique_ptr<Stream>> streams;
  streams.push_back(std::make_unique<Stream>());
  ASSERT_TRUE(streams.back()->Admit(stub_.get(), address_, Request({1, 403}, 8, 0)).ok());
  const int before = Threads();
  for (int i = 0; i < 100; ++i) {
    streams.push_back(std::make_unique<Stream>());
    ASSERT_TRUE(streams.back()->Admit(stub_.get(), address_, Request({1, 403}, 8, 0)).ok()) << i;
  }
  EXPECT_EQ(decode_->Load().queue_depth, 101);
  EXPECT_LT(Threads() - before, 16) << "threads grew with the streams";
  for (auto& s : streams) s->Cancel();
}

// A cancelled stream's place in the batch (max_running) is free as soon as the cancel arrives,
// not at the next step boundary: with steps two seconds apart, a request refused at the limit
// is admitted within the step in which the other was cancelled.
TEST_F(DecodeServiceTest, ACancelledStreamFreesItsPlaceAtOnce) {
  if (!FaultSpec::Compiled()) GTEST_SKIP() << "needs fault injection (step_delay_ms)";
  StartDecode(/*max_running=*/2, /*step_delay_ms=*/2000);
  Stream a, b;
  std::vector<int> first(2);
  for (Stream* s : {&a, &b}) {
    const GenerationRequest r = Request({1, 403, 407}, 400, 0);
    absl::StatusOr<KvTarget> target = s->Admit(stub_.get(), address_, r);
    ASSERT_TRUE(target.ok()) << target.status();
    absl::StatusOr<int> tok = Prefill(s == &a ? 1 : 2, r, *target);
    ASSERT_TRUE(tok.ok()) << tok.status();
    v1::DecodeClientMessage start;
    start.mutable_start()->set_first_token(*tok);
    ASSERT_TRUE(s->rw->Write(start));
  }
  {
    Stream c;
    const absl::StatusOr<KvTarget> refused = c.Admit(stub_.get(), address_, Request({1}, 4, 0));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  }
  // Right after a step boundary: the next is two seconds away.
  const int64_t s0 = decode_->steps();
  for (int i = 0; i < 1000 && decode_->steps() == s0; ++i) absl::SleepFor(absl::Milliseconds(5));
  const int64_t s1 = decode_->steps();
  ASSERT_GT(s1, s0);
  a.Cancel();
  absl::StatusOr<KvTarget> admitted = absl::UnknownError("not tried");
  for (int i = 0; i < 300; ++i) {
    Stream attempt;
    admitted = attempt.Admit(stub_.get(), address_, Request({1}, 4, 0));
    if (admitted.ok()) {
      attempt.Cancel();
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ(decode_->steps(), s1) << "admitted only after the step boundary";
  b.Cancel();
}

// The router's fair shares name the request whose place an admission takes: the worker cancels
// it first, so the newcomer is admitted at once even before the router's cancel of that stream
// arrives; a name it does not know changes nothing.
TEST_F(DecodeServiceTest, AnAdmissionTakesThePlaceOfTheRequestItNames) {
  StartDecode(/*max_running=*/1);
  Stream a;
  ASSERT_TRUE(a.Admit(stub_.get(), address_, Request({1, 403}, 8, 0), "tenant-a-1").ok());
  {
    Stream refused;
    EXPECT_EQ(refused.Admit(stub_.get(), address_, Request({1}, 4, 0), "tenant-b-1", "nobody")
                  .status()
                  .code(),
              absl::StatusCode::kResourceExhausted);
  }
  Stream b;
  const absl::StatusOr<KvTarget> admitted =
      b.Admit(stub_.get(), address_, Request({1}, 4, 0), "tenant-b-2", "tenant-a-1");
  EXPECT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ(decode_->Load().queue_depth + decode_->Load().running, 1) << "a is gone";
  a.Cancel();
  b.Cancel();
}

}  // namespace
}  // namespace tandem
