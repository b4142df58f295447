// GenerateTransaction (router/generate_transaction.h) against fake workers: gRPC servers on
// loopback that speak the workers' protocol over a deterministic toy "model" (the next token is a
// function of the sequence so far), scripted to refuse, die or stall. The router is the real one,
// called in process (Router::GenerateStream); the client is a StreamCall that collects what it
// is sent. What is checked is what a client sees (every token, in order, once; the final status)
// and what the workers were asked (the resumed prompt, the worker a resume goes to), and that the
// router holds nothing afterwards.
#include "router/generate_transaction.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "router/router.h"
#include "tests/test_util.h"
#include "text/llama2c_tokenizer.h"

namespace tandem {
namespace {

constexpr int kVocab = 512;

// The toy model: the token after `seq`. Ids from 3 (past BOS and EOS).
int NextToken(const std::vector<int>& seq) {
  return 3 + static_cast<int>((seq.back() * 31 + seq.size() * 7) % 400);
}

// What the engine alone would give: `n` tokens after `prompt`.
std::vector<int> Expected(std::vector<int> prompt, int n) {
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(NextToken(prompt));
    prompt.push_back(out.back());
  }
  return out;
}

// A gRPC server on 127.0.0.1:0 for `service`.
struct FakeServer {
  explicit FakeServer(grpc::Service* service) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service);
    server = b.BuildAndStart();
  }
  ~FakeServer() { server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1)); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

class FakePrefill final : public v1::PrefillWorker::Service {
 public:
  struct Call {
    std::vector<int> prompt;
    int output_tokens;
    std::string kv_endpoint;
  };
  grpc::Status Prefill(grpc::ServerContext*, const v1::PrefillRequest* req,
                       v1::PrefillResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<int> prompt(req->prompt_ids().begin(), req->prompt_ids().end());
    calls.push_back({prompt, req->output_tokens(), req->kv_target().endpoint()});
    if (bad_token_answers > 0) {
      --bad_token_answers;
      resp->set_first_token(kVocab + 5);  // outside the vocabulary: a misbehaving worker
      return grpc::Status::OK;
    }
    resp->set_first_token(NextToken(prompt));
    return grpc::Status::OK;
  }
  std::mutex mu;
  std::vector<Call> calls;
  int bad_token_answers = 0;
};

// Shared by the decode workers of a test: how many attempts may still die mid-stream.
struct DecodeScript {
  std::atomic<int> deaths_left{0};
  int die_after_tokens = 5;           // tokens sent (after the first) before dying
  std::atomic<int> refusals_left{0};  // admissions answered RESOURCE_EXHAUSTED
  int token_delay_ms = 0;             // between token messages
};

class FakeDecode final : public v1::DecodeWorker::Service {
 public:
  FakeDecode(std::string kv_endpoint, DecodeScript* script)
      : kv_endpoint_(std::move(kv_endpoint)), script_(script) {}
  struct Admission {
    std::vector<int> prompt;
    int max_tokens;
    int output_tokens;
  };
  grpc::Status Decode(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::DecodeServerMessage, v1::DecodeClientMessage>* stream) override {
    v1::DecodeClientMessage in;
    if (!stream->Read(&in) || !in.has_admit()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "admit first");
    }
    const v1::DecodeAdmit admit = in.admit();  // a copy: `in` takes the Start next
    std::vector<int> seq(admit.prompt_ids().begin(), admit.prompt_ids().end());
    {
      std::lock_guard<std::mutex> lock(mu);
      admissions.push_back({seq, admit.max_tokens(), admit.output_tokens()});
    }
    if (script_->refusals_left.fetch_sub(1) > 0) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "need 3 KV blocks, 0 free");
    }
    v1::DecodeServerMessage out;
    out.mutable_admitted()->mutable_kv_target()->set_endpoint(kv_endpoint_);
    out.mutable_admitted()->mutable_kv_target()->set_lease_id(++leases_);
    if (!stream->Write(out) || !stream->Read(&in) || !in.has_start()) return grpc::Status::OK;
    seq.push_back(in.start().first_token());
    const bool dies = script_->deaths_left.fetch_sub(1) > 0;
    for (int generated = 1, sent = 0; generated < admit.max_tokens(); ++generated, ++sent) {
      if (dies && sent == script_->die_after_tokens) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker died");
      }
      if (script_->token_delay_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(script_->token_delay_ms));
      }
      if (ctx->IsCancelled()) {
        saw_cancel = true;
        return grpc::Status::CANCELLED;
      }
      seq.push_back(NextToken(seq));
      out.Clear();
      out.mutable_tokens()->add_ids(seq.back());
      if (!stream->Write(out)) {
        saw_cancel = ctx->IsCancelled();
        return grpc::Status::OK;
      }
    }
    out.Clear();
    out.mutable_finished()->set_reason(v1::FINISH_REASON_LENGTH);
    out.mutable_finished()->set_generated(admit.max_tokens());
    stream->Write(out);
    return grpc::Status::OK;
  }
  std::vector<Admission> Admissions() {
    std::lock_guard<std::mutex> lock(mu);
    return admissions;
  }
  std::atomic<bool> saw_cancel{false};

 private:
  std::mutex mu;
  std::vector<Admission> admissions;
  std::string kv_endpoint_;
  DecodeScript* script_;
  std::atomic<uint64_t> leases_{0};
};

// What the client was sent, and the final status.
struct ClientView {
  std::vector<int> tokens;
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  int messages = 0;
  grpc::Status status;
};

class GenerateTransactionTest : public ::testing::Test {
 protected:
  // A router with `decode_workers` fake decode workers (each `blocks` KV blocks of 16 tokens)
  // and one fake prefill worker, registered and kept healthy by heartbeats.
  void StartCluster(int decode_workers, int blocks = 1000, RouterOptions options = {}) {
    ModelConfig config;
    config.architecture = "llama2c";
    config.vocab_size = kVocab;
    config.max_seq_len = 512;
    auto tok = Llama2cTokenizer::Load(testing::Tok512(), kVocab);
    ASSERT_TRUE(tok.ok()) << tok.status();
    options.registry.heartbeat_timeout = absl::Seconds(2);
    router_ = std::make_unique<Router>(config, std::move(*tok), options);
    prefill_server_ = std::make_unique<FakeServer>(&prefill_);
    Register("prefill-0", v1::WORKER_ROLE_PREFILL, prefill_server_->address(), "", 0);
    for (int i = 0; i < decode_workers; ++i) {
      const std::string endpoint = absl::StrCat("tcp://127.0.0.1:", 40000 + i);
      decodes_.push_back(std::make_unique<FakeDecode>(endpoint, &script_));
      decode_servers_.push_back(std::make_unique<FakeServer>(decodes_.back().get()));
      Register(absl::StrCat("decode-", i), v1::WORKER_ROLE_DECODE,
               decode_servers_.back()->address(), endpoint, blocks);
    }
    blocks_ = blocks;
    heartbeats_ = std::thread([this, decode_workers] {
      while (!stop_) {
        Heartbeat("prefill-0", 0);
        for (int i = 0; i < decode_workers; ++i) Heartbeat(absl::StrCat("decode-", i), blocks_);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  void TearDown() override {
    stop_ = true;
    if (heartbeats_.joinable()) heartbeats_.join();
    if (router_) {
      EXPECT_EQ(router_->InFlight(), 0) << "the router holds a request";
    }
  }

  static v1::WorkerLoad Load(int blocks) {
    v1::WorkerLoad load;
    load.set_free_kv_blocks(blocks);
    load.set_total_kv_blocks(blocks);
    load.set_block_size(16);
    return load;
  }
  void Register(const std::string& id, v1::WorkerRole role, const std::string& address,
                const std::string& kv_endpoint, int blocks) {
    v1::RegisterRequest req;
    req.set_worker_id(id);
    req.set_role(role);
    req.set_address(address);
    req.set_kv_endpoint(kv_endpoint);
    *req.mutable_load() = Load(blocks);
    v1::RegisterResponse resp;
    ASSERT_TRUE(router_->Register(&req, "", &resp).ok()) << id;
  }
  void Heartbeat(const std::string& id, int blocks) {
    v1::HeartbeatRequest req;
    req.set_worker_id(id);
    req.set_serving(true);
    *req.mutable_load() = Load(blocks);
    v1::HeartbeatResponse resp;
    router_->Heartbeat(&req, "", &resp);
  }

  // One request of `prompt` for `max_tokens` greedy tokens; `cancel_after` > 0: the client goes
  // away after that many messages.
  ClientView Generate(const std::vector<int>& prompt, int max_tokens, int cancel_after = 0) {
    v1::GenerateRequest req;
    req.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
    req.set_max_tokens(max_tokens);
    req.set_ignore_eos(true);
    req.mutable_sampling()->set_temperature(0);
    ClientView view;
    std::atomic<bool> gone{false};
    StreamCall call;
    call.deadline = absl::Now() + absl::Seconds(60);
    call.cancelled = [&] { return gone.load(); };
    call.write = [&](const v1::GenerateResponse& r) {
      view.tokens.insert(view.tokens.end(), r.token_ids().begin(), r.token_ids().end());
      view.text += r.text();
      if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) view.finish = r.finish_reason();
      if (++view.messages == cancel_after) gone = true;
      return true;
    };
    view.status = router_->GenerateStream(req, call);
    return view;
  }

  const std::vector<int> prompt_ = {1, 403, 261, 410, 299, 17, 88, 140, 356, 31};
  DecodeScript script_;
  FakePrefill prefill_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<FakeServer> prefill_server_;
  std::vector<std::unique_ptr<FakeDecode>> decodes_;
  std::vector<std::unique_ptr<FakeServer>> decode_servers_;
  std::atomic<bool> stop_{false};
  std::atomic<int> blocks_{0};
  std::thread heartbeats_;
};

TEST_F(GenerateTransactionTest, StreamsThePrefillsFirstTokenThenTheDecodeWorkers) {
  StartCluster(1);
  const ClientView v = Generate(prompt_, 20);
  ASSERT_TRUE(v.status.ok()) << v.status.error_message();
  EXPECT_EQ(v.tokens, Expected(prompt_, 20));
  EXPECT_EQ(v.finish, v1::FINISH_REASON_LENGTH);
  const auto admissions = decodes_[0]->Admissions();
  ASSERT_EQ(admissions.size(), 1u);
  EXPECT_EQ(admissions[0].prompt, prompt_);
  EXPECT_EQ(admissions[0].max_tokens, 20);
  EXPECT_EQ(admissions[0].output_tokens, 0);
  ASSERT_EQ(prefill_.calls.size(), 1u);
  EXPECT_EQ(prefill_.calls[0].kv_endpoint, "tcp://127.0.0.1:40000") << "into the decode's lease";
}

// A decode worker that dies mid-stream: the request resumes on the other worker from prompt +
// the tokens the client already has, and the client sees every token once, in order.
TEST_F(GenerateTransactionTest, ADecodeWorkerThatDiesIsResumedElsewhereWithTheSameTokens) {
  StartCluster(2);
  script_.deaths_left = 1;
  script_.die_after_tokens = 5;
  const ClientView v = Generate(prompt_, 20);
  ASSERT_TRUE(v.status.ok()) << v.status.error_message();
  EXPECT_EQ(v.tokens, Expected(prompt_, 20));
  const auto a0 = decodes_[0]->Admissions(), a1 = decodes_[1]->Admissions();
  ASSERT_EQ(a0.size(), 1u);
  ASSERT_EQ(a1.size(), 1u) << "the resume goes to the worker that has not failed the request";
  const auto& first = a0[0].output_tokens == 0 ? a0[0] : a1[0];
  const auto& resumed = a0[0].output_tokens == 0 ? a1[0] : a0[0];
  EXPECT_EQ(first.prompt, prompt_);
  // The first token and the 5 streamed before the death reached the client.
  std::vector<int> want = prompt_;
  for (int t : Expected(prompt_, 6)) want.push_back(t);
  EXPECT_EQ(resumed.prompt, want);
  EXPECT_EQ(resumed.output_tokens, 6);
  EXPECT_EQ(resumed.max_tokens, 14);
  ASSERT_EQ(prefill_.calls.size(), 2u);
  EXPECT_EQ(prefill_.calls[1].prompt, want);
  EXPECT_EQ(prefill_.calls[1].output_tokens, 6);
}

// A prefill worker that answers a token outside the vocabulary is not believed: the request
// resumes (here on the same, only, prefill worker) and the client never sees the bad id.
TEST_F(GenerateTransactionTest, AFirstTokenOutsideTheVocabularyIsResumed) {
  StartCluster(1);
  prefill_.bad_token_answers = 1;
  const ClientView v = Generate(prompt_, 12);
  ASSERT_TRUE(v.status.ok()) << v.status.error_message();
  EXPECT_EQ(v.tokens, Expected(prompt_, 12));
  EXPECT_EQ(prefill_.calls.size(), 2u);
}

// A decode worker without room refuses; the request waits in the router's queue and is admitted
// when it has room, rather than failing.
TEST_F(GenerateTransactionTest, ADecodeWorkerWithoutRoomMakesTheRequestWaitNotFail) {
  StartCluster(1);
  script_.refusals_left = 3;
  const ClientView v = Generate(prompt_, 10);
  ASSERT_TRUE(v.status.ok()) << v.status.error_message();
  EXPECT_EQ(v.tokens, Expected(prompt_, 10));
  EXPECT_EQ(decodes_[0]->Admissions().size(), 4u);
}

// Workers that keep dying: the request gives up after max_resumes, naming the count, and what
// the client got until then is a prefix of the right tokens.
TEST_F(GenerateTransactionTest, GivesUpAfterMaxResumes) {
  RouterOptions o;
  o.max_resumes = 2;
  StartCluster(2, 1000, o);
  script_.deaths_left = 100;
  script_.die_after_tokens = 2;
  const ClientView v = Generate(prompt_, 40);
  EXPECT_EQ(v.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(v.status.error_message().find("gave up after 2 resumes"), std::string::npos)
      << v.status.error_message();
  // Three attempts, each the first token and 2 more.
  ASSERT_EQ(v.tokens.size(), 9u);
  EXPECT_EQ(v.tokens, Expected(prompt_, 9));
}

// A request that could not fit in any decode worker's whole cache is refused at once, naming
// the sizes, instead of waiting for room that never comes.
TEST_F(GenerateTransactionTest, ARequestLargerThanEveryCacheIsRefusedAtOnce) {
  StartCluster(1, /*blocks=*/4);  // 64 tokens
  const auto start = absl::Now();
  const ClientView v = Generate(prompt_, 100);
  EXPECT_EQ(v.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(v.status.error_message().find("holds 64"), std::string::npos)
      << v.status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(decodes_[0]->Admissions().empty());
}

// The client going away cancels the decode worker's stream (which frees its blocks there).
TEST_F(GenerateTransactionTest, AClientThatLeavesCancelsTheDecodeStream) {
  StartCluster(1);
  script_.token_delay_ms = 20;
  const ClientView v = Generate(prompt_, 400, /*cancel_after=*/5);
  EXPECT_EQ(v.status.error_code(), grpc::StatusCode::CANCELLED) << v.status.error_message();
  EXPECT_LT(v.tokens.size(), 400u);
  for (int i = 0; i < 200 && !decodes_[0]->saw_cancel; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(decodes_[0]->saw_cancel);
}

}  // namespace
}  // namespace tandem
