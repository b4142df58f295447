// docs/reliability.md, row by row, with real processes on 127.0.0.1: kill -9, SIGSTOP /
// SIGCONT, SIGTERM and the binaries' --fault flags. Every test ends with the leak check over
// the processes still alive. Outputs after a fault are compared with a fault-free colocated
// (--role=all) process: greedy and seeded output must be identical (row 22).
//
// Rows 1-3, 12, 13 and 16 are in tests/serving/cluster_test.cc; 14 and 17 in the security tests;
// 15 is the fuzzing step (scripts/fuzz.sh); 20 (NCCL) is in tests/serving/nccl_wiring_test.cc;
// 24-31 are the attacks of tests/security/attack_test.cc.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "tests/reliability/fault_cluster.h"
#include "tests/serving/cluster.h"

namespace tandem {
namespace {

using testing::CallResult;
using testing::FaultCluster;

constexpr char kPrompt[] = "Once upon a time, there was a little girl named Lily.";
// ~120 tokens: with --prefill-chunk 16 its prefill takes 8 steps (a transfer in progress).
constexpr char kLongPrompt[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. "
    "One day, she saw a big tree with a red ball in it. She wanted the ball very much, so she "
    "asked her mom for help. Her mom smiled and said, \"Let us get it together.\" They walked to "
    "the tree and looked up at the ball. Lily was happy and said thank you to her mom. Then they "
    "played with the ball all day long and had a lot of fun in the park.";

v1::GenerateRequest Greedy(const std::string& prompt, int max_tokens) {
  v1::GenerateRequest r;
  r.set_text(prompt);
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0);
  return r;
}

v1::GenerateRequest Seeded(const std::string& prompt, int max_tokens, uint64_t seed) {
  v1::GenerateRequest r = Greedy(prompt, max_tokens);
  r.mutable_sampling()->set_temperature(0.8f);
  r.mutable_sampling()->set_top_p(0.9f);
  r.mutable_sampling()->set_seed(seed);
  return r;
}

// Seeded, with every logit processor: after a resume the penalties must still count the tokens
// generated before it as output (PrefillRequest/DecodeAdmit.output_tokens).
v1::GenerateRequest Penalized(const std::string& prompt, int max_tokens, uint64_t seed) {
  v1::GenerateRequest r = Seeded(prompt, max_tokens, seed);
  v1::SamplingParams* s = r.mutable_sampling();
  s->set_presence_penalty(0.5f);
  s->set_frequency_penalty(0.7f);
  s->set_repetition_penalty(1.2f);
  s->set_min_tokens(max_tokens);
  (*s->mutable_logit_bias())[13] = -3.0f;
  return r;
}

// Seeded, with structured output: after a resume the schema's matcher must replay the tokens
// generated before it (they come back as output), or the JSON would break at the seam.
v1::GenerateRequest Structured(const std::string& prompt, uint64_t seed) {
  v1::GenerateRequest r = Seeded(prompt, 200, seed);
  r.set_ignore_eos(false);
  r.mutable_sampling()->set_json_schema(
      R"({"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 8,
          "maxItems": 8})");
  return r;
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// A stream read message by message, so a test can act in the middle of it.
class Stream {
 public:
  Stream(v1::Generation::Stub* stub, const v1::GenerateRequest& req, int deadline_ms = 60000) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
    reader_ = stub->Generate(&ctx_, req);
  }
  // Reads until at least `n` tokens arrived (false if the stream ended first).
  bool ReadUntil(size_t n) {
    v1::GenerateResponse resp;
    while (tokens.size() < n) {
      if (!reader_->Read(&resp)) return false;
      tokens.insert(tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
    }
    return true;
  }
  grpc::Status Finish() {
    v1::GenerateResponse resp;
    while (reader_->Read(&resp)) {
      tokens.insert(tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
    }
    return reader_->Finish();
  }
  void Cancel() { ctx_.TryCancel(); }
  std::vector<int> tokens;

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader_;
};

class ReliabilityTest : public ::testing::Test {
 protected:
  // The fault-free colocated process all outputs are compared with.
  static void SetUpTestSuite() { reference_ = new testing::Cluster(0, 0); }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
  }
  static std::vector<int> Reference(const v1::GenerateRequest& req) {
    static std::map<std::string, std::vector<int>>* cache =
        new std::map<std::string, std::vector<int>>();
    const std::string key = req.SerializeAsString();
    auto it = cache->find(key);
    if (it != cache->end()) return it->second;
    auto out = testing::Generate(reference_->generation(), req);
    EXPECT_TRUE(out.status.ok()) << out.status.error_message();
    (*cache)[key] = out.tokens;
    return out.tokens;
  }

  static testing::Cluster* reference_;
};
testing::Cluster* ReliabilityTest::reference_ = nullptr;

// Streams `req`, kills -9 the decode worker serving it once 20 tokens arrived, and expects the
// resumed stream to finish OK with exactly `want`.
void KillDecodeMidStreamAndExpect(FaultCluster& c, const v1::GenerateRequest& req,
                                  const std::vector<int>& want) {
  Stream s(c.generation(), req);
  ASSERT_TRUE(s.ReadUntil(20));
  int busy = -1;
  ASSERT_TRUE(FaultCluster::WaitFor([&] { return (busy = c.Busy("decode")) >= 0; }));
  c.Kill(busy);
  const grpc::Status st = s.Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(s.tokens, want) << "resumed output differs from the fault-free run";
}

// Rows 4 and 22: kill -9 the decode worker mid-stream. The router resumes the request on
// another decode worker, and the client's stream continues with no duplicated or missing token,
// greedy, seeded, with the logit processors and with structured output; with no spare worker
// the stream ends UNAVAILABLE.
TEST_F(ReliabilityTest, Row04_KillDecodeMidStreamResumesIdentically) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter();
  const int p = c.StartWorker("prefill");
  const std::vector<std::string> slow = {"--fault", "step_delay_ms=15"};
  // One decode worker per request below is killed, and the last part kills the one left.
  std::vector<int> decode = {c.StartWorker("decode", slow), c.StartWorker("decode", slow),
                             c.StartWorker("decode", slow), c.StartWorker("decode", slow),
                             c.StartWorker("decode", slow)};
  ASSERT_GE(p, 0);
  for (int d : decode) ASSERT_GE(d, 0);

  int resumes_expected = 0;
  for (const v1::GenerateRequest& req : {Greedy(kPrompt, 120), Seeded(kPrompt, 120, 11),
                                         Penalized(kPrompt, 120, 5), Structured(kPrompt, 9)}) {
    const std::vector<int> want = Reference(req);
    if (req.ignore_eos()) {
      ASSERT_EQ(want.size(), 120u);
    } else {
      ASSERT_GE(want.size(), 25u);  // past the kill below
    }
    Stream s(c.generation(), req);
    ASSERT_TRUE(s.ReadUntil(20));
    int busy = -1;
    ASSERT_TRUE(FaultCluster::WaitFor([&] { return (busy = c.Busy("decode")) >= 0; }));
    c.Kill(busy);
    const auto killed = std::chrono::steady_clock::now();
    ++resumes_expected;
    ASSERT_TRUE(s.ReadUntil(s.tokens.size() + 1)) << s.Finish().error_message();
    std::printf("row 4: decode worker killed -9; the stream continued after %.3f s\n",
                SecondsSince(killed));
    const grpc::Status st = s.Finish();
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(s.tokens, want) << "resumed output differs from the fault-free run";
  }
  EXPECT_EQ(c.Metric(0, "tandem_resumes_total"), resumes_expected);

  // One decode worker left: kill it mid-stream too. No spare: UNAVAILABLE, nothing hangs.
  Stream s(c.generation(), Greedy(kPrompt, 120));
  ASSERT_TRUE(s.ReadUntil(20));
  int last = -1;
  ASSERT_TRUE(FaultCluster::WaitFor([&] { return (last = c.Busy("decode")) >= 0; }));
  c.Kill(last);
  EXPECT_EQ(s.Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Row 4 with speculative decoding: decode workers that speculate (prompt lookup) are killed
// mid-stream; the resumed stream equals the fault-free run without speculation, token for token.
TEST_F(ReliabilityTest, Row04_SpeculatingDecodeKilledMidStreamResumesIdentically) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter();
  const int p = c.StartWorker("prefill");
  const std::vector<std::string> flags = {"--fault", "step_delay_ms=15", "--speculative",
                                          "ngram",   "--spec-tokens",    "5"};
  std::vector<int> decode = {c.StartWorker("decode", flags), c.StartWorker("decode", flags),
                             c.StartWorker("decode", flags)};
  ASSERT_GE(p, 0);
  for (int d : decode) ASSERT_GE(d, 0);
  int resumes_expected = 0;
  for (const v1::GenerateRequest& req : {Greedy(kPrompt, 120), Seeded(kPrompt, 120, 11)}) {
    const std::vector<int> want = Reference(req);
    ASSERT_GE(want.size(), 25u);
    KillDecodeMidStreamAndExpect(c, req, want);
    ++resumes_expected;
  }
  EXPECT_EQ(c.Metric(0, "tandem_resumes_total"), resumes_expected);
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Row 4 for the tiny model in HF directory `dir`: a decode worker killed -9 mid-stream, greedy
// and seeded; the resumed stream equals the fault-free colocated run of the same model, token for
// token.
void KillTinyModelDecodeMidStream(const std::string& dir, const std::string& prompt) {
  const std::vector<std::string> model = {"--model", dir, "--tokenizer", dir};
  testing::Cluster reference(0, 0, {}, {}, model);
  ASSERT_TRUE(reference.ready());
  FaultCluster c(model);
  c.StartRouter();
  const int p = c.StartWorker("prefill");
  const std::vector<std::string> slow = {"--fault", "step_delay_ms=15"};
  std::vector<int> decode = {c.StartWorker("decode", slow), c.StartWorker("decode", slow),
                             c.StartWorker("decode", slow)};
  ASSERT_GE(p, 0);
  for (int d : decode) ASSERT_GE(d, 0);
  int resumes_expected = 0;
  for (const v1::GenerateRequest& req : {Greedy(prompt, 120), Seeded(prompt, 120, 11)}) {
    const testing::Streamed want = testing::Generate(reference.generation(), req);
    ASSERT_TRUE(want.status.ok()) << want.status.error_message();
    ASSERT_EQ(want.tokens.size(), 120u);
    KillDecodeMidStreamAndExpect(c, req, want.tokens);
    ++resumes_expected;
  }
  EXPECT_EQ(c.Metric(0, "tandem_resumes_total"), resumes_expected);
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Qwen3 (tests/fixtures/hf/qwen3_f32): per-head q/k norms, head_dim 16 where hidden / heads is 8.
TEST_F(ReliabilityTest, Row04_Qwen3DecodeKilledMidStreamResumesIdentically) {
  KillTinyModelDecodeMidStream(testing::Qwen3Dir(), kPrompt);
}

// Gemma 3 (tests/fixtures/hf/gemma3_f32): the resumed worker recomputes past the sliding layers'
// 4-position window.
TEST_F(ReliabilityTest, Row04_Gemma3DecodeKilledMidStreamResumesIdentically) {
  KillTinyModelDecodeMidStream(testing::Gemma3Dir(), kPrompt);
}

// Qwen3-MoE (tests/fixtures/hf/qwen3_moe_f32): the resumed worker routes the recomputed tokens
// to the same experts.
TEST_F(ReliabilityTest, Row04_Qwen3MoeDecodeKilledMidStreamResumesIdentically) {
  KillTinyModelDecodeMidStream(testing::MoeDir("qwen3_moe_f32"), kPrompt);
}

// Row 5: kill -9 the prefill worker while it is computing and shipping a chunked prefill. The
// decode worker frees the lease, the router re-prefills on the other prefill worker.
TEST_F(ReliabilityTest, Row05_KillPrefillMidTransferReprefillsElsewhere) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter();
  // 8 chunks of 16 tokens, 250 ms apart: KV of the first chunks is on the decode worker when
  // the prefill worker dies.
  const std::vector<std::string> slow = {"--prefill-chunk", "16", "--fault", "step_delay_ms=250"};
  const int p1 = c.StartWorker("prefill", slow);
  const int p2 = c.StartWorker("prefill", slow);
  const int d = c.StartWorker("decode");
  ASSERT_GE(p1, 0);
  ASSERT_GE(p2, 0);
  ASSERT_GE(d, 0);
  const v1::GenerateRequest req = Greedy(kLongPrompt, 30);
  const std::vector<int> want = Reference(req);
  std::vector<int> got;
  grpc::Status st;
  std::thread client([&] {
    auto out = testing::Generate(c.generation(), req);
    st = out.status;
    got = out.tokens;
  });
  int busy = -1;
  ASSERT_TRUE(FaultCluster::WaitFor([&] { return (busy = c.Busy("prefill")) >= 0; }));
  // Let a few chunks go out first.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ASSERT_GT(c.Metric(d, "tandem_kv_transfer_bytes_total"), 0) << "no KV arrived before the kill";
  c.Kill(busy);
  const auto killed = std::chrono::steady_clock::now();
  client.join();
  std::printf("row 5: prefill worker killed -9 mid-transfer; request done %.3f s later\n",
              SecondsSince(killed));
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(got, want);
  EXPECT_EQ(c.Metric(0, "tandem_resumes_total"), 1);
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Row 6: a corrupted KV chunk is caught by its checksum (DATA_LOSS), a dropped one by the
// prefill timeout (which bounds compute and transfer); both requests are resumed and give the
// fault-free output.
TEST_F(ReliabilityTest, Row06_CorruptedOrMissingChunkIsResumed) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter({"--prefill-timeout-ms", "1500"});
  // The short prompt fits one prefill step: 5 chunks (one per layer) per attempt. Request 1 has
  // chunks 0-4 (2 corrupted), resumed as 5-9; request 2 has 10-14 (11 dropped), resumed as
  // 15-19.
  const int p = c.StartWorker("prefill", {"--fault", "kv_corrupt_chunk=2,kv_drop_chunk=11"});
  const int d = c.StartWorker("decode");
  ASSERT_GE(p, 0);
  ASSERT_GE(d, 0);
  const v1::GenerateRequest req = Greedy(kPrompt, 40);
  const std::vector<int> want = Reference(req);
  auto first = testing::Generate(c.generation(), req);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.tokens, want);
  EXPECT_EQ(c.Metric(0, "tandem_resumes_total"), 1);
  auto second = testing::Generate(c.generation(), req);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(second.tokens, want);
  EXPECT_EQ(c.Metric(0, "tandem_resumes_total"), 2);
  EXPECT_EQ(c.Metric(p, "tandem_kv_transfer_failures_total"), 2);
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Row 7: SIGSTOP the prefill worker past the lease deadline, then SIGCONT. The decode worker
// expires and frees the lease; the late writer's chunks are refused; the router resumes.
TEST_F(ReliabilityTest, Row07_StoppedPrefillPastLeaseDeadlineIsRefusedWhenItWakes) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter({"--prefill-timeout-ms", "10000"});
  const int p = c.StartWorker("prefill", {"--prefill-chunk", "16", "--fault", "step_delay_ms=200"});
  const int d = c.StartWorker("decode", {"--lease-timeout-ms", "1000"});
  ASSERT_GE(p, 0);
  ASSERT_GE(d, 0);
  const v1::GenerateRequest req = Greedy(kLongPrompt, 30);
  const std::vector<int> want = Reference(req);
  std::vector<int> got;
  grpc::Status st;
  std::thread client([&] {
    auto out = testing::Generate(c.generation(), req);
    st = out.status;
    got = out.tokens;
  });
  ASSERT_TRUE(
      FaultCluster::WaitFor([&] { return c.Metric(d, "tandem_kv_transfer_bytes_total") > 0; }));
  c.Signal(p, SIGSTOP);
  ASSERT_TRUE(FaultCluster::WaitFor(
      [&] { return c.Metric(d, "tandem_kv_leases_expired_total") >= 1; }, 5000))
      << "the lease did not expire";
  EXPECT_EQ(c.Metric(d, "tandem_kv_leases_waiting"), 0) << "the expired lease was not freed";
  c.Signal(p, SIGCONT);
  client.join();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(got, want);
  EXPECT_GE(c.Metric(d, "tandem_kv_chunks_rejected_total"), 1) << "the late writer was accepted";
  EXPECT_GE(c.Metric(0, "tandem_resumes_total"), 1);
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Row 8: twice the capacity for a while, then a burst of 2000 requests at once. What cannot be
// queued is refused fast with RESOURCE_EXHAUSTED and a retry hint; every admitted request
// completes with the right output; every call ends exactly once; the router's memory stays
// bounded.
TEST_F(ReliabilityTest, Row08_OverloadAndBurstAreRefusedFastAndAdmittedWorkCompletes) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter({"--max-inflight", "48", "--max-queued", "16", "--queue-timeout-ms", "20000"});
  const int p = c.StartWorker("prefill");
  // Capacity: 8 sequences, a step every >= 5 ms.
  const int d = c.StartWorker("decode", {"--max-running", "8", "--fault", "step_delay_ms=5"});
  ASSERT_GE(p, 0);
  ASSERT_GE(d, 0);
  const v1::GenerateRequest req = Greedy(kPrompt, 16);
  const std::vector<int> want = Reference(req);
  const int64_t rss0 = c.RssKb(0);

  auto check = [&](const std::vector<CallResult>& results, int* ok, int* refused) {
    for (const CallResult& r : results) {
      EXPECT_EQ(r.terminal_events, 1);
      if (r.code == grpc::StatusCode::OK) {
        ++*ok;
        EXPECT_EQ(r.tokens, want);
      } else {
        EXPECT_EQ(r.code, grpc::StatusCode::RESOURCE_EXHAUSTED) << r.message;
        ++*refused;
      }
    }
  };
  // 2x capacity: 16 in flight where 8 run; the other 8 wait in the router's queue (16 places)
  // and every request completes.
  int ok = 0, refused = 0;
  check(testing::RunAsync(c.generation(), 200, 16, [&](int) { return req; }), &ok, &refused);
  EXPECT_EQ(ok, 200);
  EXPECT_EQ(refused, 0);
  // The burst.
  int burst_ok = 0, burst_refused = 0;
  const auto burst = testing::RunAsync(c.generation(), 2000, 0, [&](int) { return req; });
  check(burst, &burst_ok, &burst_refused);
  EXPECT_GT(burst_ok, 0);
  EXPECT_GT(burst_refused, 1000);
  int with_hint = 0;
  double slowest_refusal = 0;
  for (const CallResult& r : burst) {
    if (r.code != grpc::StatusCode::RESOURCE_EXHAUSTED) continue;
    with_hint += r.retry_pushback;
    slowest_refusal = std::max(slowest_refusal, r.seconds);
  }
  // The router's own refusals carry the hint; gRPC's thread-pool refusals (if any) do not.
  EXPECT_GT(with_hint, 0);
  std::printf(
      "overload: 2x phase %d ok / %d refused; burst %d ok / %d refused (%d with a "
      "retry hint), slowest refusal %.3f s; router RSS %lld -> %lld KiB\n",
      ok, refused, burst_ok, burst_refused, with_hint, slowest_refusal,
      static_cast<long long>(rss0), static_cast<long long>(c.RssKb(0)));
  EXPECT_LT(c.RssKb(0), rss0 + 256 * 1024) << "router memory grew by more than 256 MiB";
  // Still serving normally.
  auto after = testing::Generate(c.generation(), req);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens, want);
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Row 9: a decode worker's step loop wedges. Its health turns NOT_SERVING, the router stops
// routing to it, and the request stuck there is resumed on a healthy worker.
TEST_F(ReliabilityTest, Row09_WedgedWorkerTurnsNotServingAndItsRequestMoves) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter();
  const int p = c.StartWorker("prefill");
  const int wedged =
      c.StartWorker("decode", {"--fault", "wedge_after_steps=10", "--wedge-timeout-ms", "500"});
  ASSERT_GE(p, 0);
  ASSERT_GE(wedged, 0);
  EXPECT_EQ(c.Health(wedged), grpc::health::v1::HealthCheckResponse::SERVING);
  const v1::GenerateRequest req = Greedy(kPrompt, 60);
  const std::vector<int> want = Reference(req);
  Stream s(c.generation(), req);
  ASSERT_TRUE(s.ReadUntil(5));
  const auto t_wedge = std::chrono::steady_clock::now();
  ASSERT_TRUE(FaultCluster::WaitFor([&] {
    return c.Health(wedged) == grpc::health::v1::HealthCheckResponse::NOT_SERVING;
  })) << "a wedged worker still says SERVING";
  std::printf("row 9: wedged step loop NOT_SERVING %.3f s after its last token (timeout 0.5 s)\n",
              SecondsSince(t_wedge));
  ASSERT_TRUE(FaultCluster::WaitFor([&] { return !c.WorkerHealthy(wedged); }));
  const int spare = c.StartWorker("decode");
  ASSERT_GE(spare, 0);
  const grpc::Status st = s.Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(s.tokens, want);
  // New work goes to the healthy worker only.
  auto next = testing::Generate(c.generation(), req);
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.tokens, want);
  EXPECT_GT(c.Metric(spare, "tandem_generation_tokens_total"), 0);
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why, {wedged})) << why;
  c.Kill(wedged);
}

// Row 10: SIGTERM. NOT_SERVING at once; the request in flight finishes; new requests are
// refused; the process exits 0 within the drain deadline. For a decode worker and the router.
TEST_F(ReliabilityTest, Row10_SigtermDrainsInFlightWorkAndExitsZero) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter({"--drain-timeout-ms", "20000"});
  const int p = c.StartWorker("prefill");
  const int d =
      c.StartWorker("decode", {"--fault", "step_delay_ms=20", "--drain-timeout-ms", "20000"});
  ASSERT_GE(p, 0);
  ASSERT_GE(d, 0);
  const v1::GenerateRequest req = Greedy(kPrompt, 80);
  const std::vector<int> want = Reference(req);

  Stream s(c.generation(), req);
  ASSERT_TRUE(s.ReadUntil(10));
  c.Signal(d, SIGTERM);
  const auto term = std::chrono::steady_clock::now();
  ASSERT_TRUE(FaultCluster::WaitFor(
      [&] { return c.Health(d) == grpc::health::v1::HealthCheckResponse::NOT_SERVING; }, 1000))
      << "not NOT_SERVING right after SIGTERM";
  std::printf("row 10: NOT_SERVING %.3f s after SIGTERM\n", SecondsSince(term));
  ASSERT_TRUE(FaultCluster::WaitFor([&] { return !c.WorkerHealthy(d); }, 2000));
  // No other decode worker: a new request is refused while the old one finishes.
  auto refused = testing::Generate(c.generation(), req);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << refused.status.error_message();
  const grpc::Status st = s.Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(s.tokens, want) << "the draining worker did not finish its request";
  EXPECT_EQ(c.WaitExit(d, 20000), 0);

  // The router: a request in flight finishes, a new one is refused, exit 0.
  const int d2 = c.StartWorker("decode", {"--fault", "step_delay_ms=20"});
  ASSERT_GE(d2, 0);
  Stream s2(c.generation(), req);
  ASSERT_TRUE(s2.ReadUntil(10));
  c.Signal(0, SIGTERM);
  ASSERT_TRUE(FaultCluster::WaitFor(
      [&] { return c.Health(0) == grpc::health::v1::HealthCheckResponse::NOT_SERVING; }, 1000));
  auto refused2 = testing::Generate(c.generation(), req);
  EXPECT_EQ(refused2.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  const grpc::Status st2 = s2.Finish();
  ASSERT_TRUE(st2.ok()) << st2.error_message();
  EXPECT_EQ(s2.tokens, want);
  EXPECT_EQ(c.WaitExit(0, 20000), 0);
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Row 11: a prefill worker whose every transfer fails is ejected after 3 consecutive failures,
// and tried again after the back-off. Every request still completes (resumed elsewhere).
TEST_F(ReliabilityTest, Row11_FailingWorkerIsEjectedThenRetriedAfterBackoff) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter({"--ejection-ms", "2000"});
  // Worker ids order the ties: "a-bad" is picked first whenever it is eligible.
  const int bad =
      c.StartWorker("prefill", {"--worker-id", "a-bad", "--fault", "kv_corrupt_every=1"});
  const int good = c.StartWorker("prefill", {"--worker-id", "b-good"});
  const int d = c.StartWorker("decode");
  ASSERT_GE(bad, 0);
  ASSERT_GE(good, 0);
  ASSERT_GE(d, 0);
  const v1::GenerateRequest req = Greedy(kPrompt, 20);
  const std::vector<int> want = Reference(req);
  auto routed_to_bad = [&] {
    return testing::MetricValue(c.Metrics(0), "tandem_routing_decisions_total",
                                {{"worker", "a-bad"}});
  };
  for (int i = 0; i < 3; ++i) {
    auto out = testing::Generate(c.generation(), req);
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    EXPECT_EQ(out.tokens, want);
  }
  EXPECT_EQ(c.Metric(0, "tandem_resumes_total"), 3);
  EXPECT_FALSE(c.WorkerHealthy(bad)) << "3 consecutive failures did not eject the worker";
  const double before = routed_to_bad();
  for (int i = 0; i < 3; ++i) {
    auto out = testing::Generate(c.generation(), req);
    ASSERT_TRUE(out.status.ok());
    EXPECT_EQ(out.tokens, want);
  }
  EXPECT_EQ(routed_to_bad(), before) << "an ejected worker got traffic";
  EXPECT_EQ(c.Metric(0, "tandem_resumes_total"), 3);
  // After the back-off it is tried again (and fails again: resumed once more).
  ASSERT_TRUE(FaultCluster::WaitFor([&] { return c.WorkerHealthy(bad); }, 5000));
  auto out = testing::Generate(c.generation(), req);
  ASSERT_TRUE(out.status.ok());
  EXPECT_EQ(out.tokens, want);
  EXPECT_GT(routed_to_bad(), before);
  EXPECT_EQ(c.Metric(0, "tandem_resumes_total"), 4);
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Row 18: a client that never reads its stream. Other streams are unaffected; cancelling the
// silent one frees everything.
TEST_F(ReliabilityTest, Row18_ClientThatNeverReadsDoesNotHarmOthers) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter();
  const int p = c.StartWorker("prefill");
  const int d = c.StartWorker("decode", {"--fault", "step_delay_ms=2"});
  ASSERT_GE(p, 0);
  ASSERT_GE(d, 0);
  grpc::ClientContext silent_ctx;
  auto silent = c.generation()->Generate(&silent_ctx, Greedy(kPrompt, 400));  // never read
  const int64_t rss0 = c.RssKb(0);
  const v1::GenerateRequest req = Greedy(kPrompt, 40);
  const std::vector<int> want = Reference(req);
  const auto others = testing::RunAsync(c.generation(), 16, 8, [&](int) { return req; });
  for (const CallResult& r : others) {
    EXPECT_EQ(r.code, grpc::StatusCode::OK) << r.message;
    EXPECT_EQ(r.tokens, want);
  }
  EXPECT_LT(c.RssKb(0), rss0 + 64 * 1024);
  silent_ctx.TryCancel();
  silent->Finish().ok();
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Row 19: a peer silently gone (SIGSTOP: no FIN, no RST). The router notices it (heartbeats and
// keepalive), resumes the stream on another worker; with no spare, UNAVAILABLE.
TEST_F(ReliabilityTest, Row19_SilentlyGonePeerIsDetected) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  // With no healthy decode worker a request waits in the queue, then fails: 2 s here.
  c.StartRouter({"--keepalive-ms", "1000", "--queue-timeout-ms", "2000"});
  const int p = c.StartWorker("prefill");
  const std::vector<std::string> slow = {"--fault", "step_delay_ms=15"};
  const int d1 = c.StartWorker("decode", slow);
  const int d2 = c.StartWorker("decode", slow);
  ASSERT_GE(p, 0);
  ASSERT_GE(d1, 0);
  ASSERT_GE(d2, 0);
  const v1::GenerateRequest req = Greedy(kPrompt, 100);
  const std::vector<int> want = Reference(req);
  Stream s(c.generation(), req);
  ASSERT_TRUE(s.ReadUntil(10));
  int busy = -1;
  ASSERT_TRUE(FaultCluster::WaitFor([&] { return (busy = c.Busy("decode")) >= 0; }));
  c.Signal(busy, SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  ASSERT_TRUE(s.ReadUntil(s.tokens.size() + 1));
  std::printf("row 19: decode worker silent (SIGSTOP); the stream continued after %.3f s\n",
              SecondsSince(stopped));
  const grpc::Status st = s.Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(s.tokens, want);
  const int other = busy == d1 ? d2 : d1;
  // The last decode worker goes silent too: UNAVAILABLE, not a hang.
  Stream s2(c.generation(), req, 30000);
  ASSERT_TRUE(s2.ReadUntil(10));
  c.Signal(other, SIGSTOP);
  EXPECT_EQ(s2.Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why, {busy, other})) << why;
  c.Kill(busy);
  c.Kill(other);
}

// Row 32: the only prefill worker, then the only decode worker, stalls for a few seconds
// (SIGSTOP, SIGCONT). Requests sent during the stall wait in the router's bounded queue (no
// healthy worker of the role) or in their call, and complete with exactly the tokens of a quiet
// run: a stall delays requests, it does not fail them.
TEST_F(ReliabilityTest, Row32_AStalledOnlyWorkerDelaysRequestsWithoutFailingThem) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter();
  const int p = c.StartWorker("prefill");
  const int d = c.StartWorker("decode");
  ASSERT_GE(p, 0);
  ASSERT_GE(d, 0);
  const v1::GenerateRequest req = Greedy(kPrompt, 24);
  const std::vector<int> want = Reference(req);
  for (const int stalled : {p, d}) {
    c.Signal(stalled, SIGSTOP);
    const auto stopped = std::chrono::steady_clock::now();
    // Some requests go out while the router still counts the worker healthy, the rest after
    // its heartbeats stopped (1 s).
    std::vector<std::thread> clients;
    std::vector<testing::Streamed> got(6);
    for (int i = 0; i < 6; ++i) {
      clients.emplace_back([&, i] {
        std::this_thread::sleep_for(std::chrono::milliseconds(400 * i));
        got[i] = testing::Generate(c.generation(), req, 30000);
      });
    }
    std::this_thread::sleep_for(std::chrono::seconds(3));
    c.Signal(stalled, SIGCONT);
    for (auto& t : clients) t.join();
    std::printf("row 32: %s stalled 3 s; %zu requests sent during it all completed after %.1f s\n",
                stalled == p ? "prefill" : "decode", got.size(), SecondsSince(stopped));
    for (const testing::Streamed& s : got) {
      EXPECT_TRUE(s.status.ok()) << s.status.error_message();
      EXPECT_EQ(s.tokens, want);
    }
  }
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Sends `n` copies of `req` at once; returns how many completed with `want`, the quiet run's
// tokens (each failure or difference is a test failure too).
int AllExact(FaultCluster& c, const v1::GenerateRequest& req, const std::vector<int>& want, int n) {
  int ok = 0;
  for (const CallResult& r : testing::RunAsync(c.generation(), n, n, [&](int) { return req; })) {
    EXPECT_EQ(r.code, grpc::StatusCode::OK) << r.message;
    if (r.code == grpc::StatusCode::OK) {
      EXPECT_EQ(r.tokens, want);
      ok += r.tokens == want;
    }
  }
  return ok;
}

// Row 40: a busy prefill worker is not a stalled one. Twelve long prompts at once on one prefill
// worker whose every step is slowed: most wait seconds in its queue, far past the 1 s prefill
// timeout, which bounds only their compute. No attempt is abandoned (no resume), every request
// completes with the quiet run's tokens.
TEST_F(ReliabilityTest, Row40_AQueuedPrefillHasNotTimedOut) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter({"--prefill-timeout-ms", "1000"});
  // One 64-token chunk a step (each prompt takes two, ~0.3 s), so the prompts queue.
  const int p = c.StartWorker(
      "prefill", {"--prefill-chunk", "64", "--token-budget", "64", "--fault", "step_delay_ms=150"});
  const int d = c.StartWorker("decode");
  ASSERT_GE(p, 0);
  ASSERT_GE(d, 0);
  const v1::GenerateRequest req = Greedy(kLongPrompt, 8);
  const std::vector<int> want = Reference(req);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(AllExact(c, req, want, 12), 12);
  const double seconds = SecondsSince(t0);
  EXPECT_GT(seconds, 2.0) << "the prompts did not queue behind each other";
  EXPECT_EQ(c.Metric(0, "tandem_resumes_total"), 0) << "a queued prefill was abandoned";
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// A thread spinning on every core at the test's priority, until destroyed.
class CpuHog {
 public:
  CpuHog() {
    for (unsigned i = 0; i < std::max(1u, std::thread::hardware_concurrency()); ++i) {
      threads_.emplace_back([this] {
        volatile uint64_t sink = 0;
        while (!stop_.load(std::memory_order_relaxed)) sink = sink + 1;
      });
    }
  }
  ~CpuHog() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// Row 43: slow is not dead. Health tells a worker whose steps advance, however slowly, from one
// whose step never returns (row 9), and a started prefill times out only when its worker stops
// making progress; so load never spends a request's resumes.
//   - Every forward step of both workers computes for 400 ms (noting its progress), longer than
//     their 250 ms wedge timeout and the router's 300 ms prefill timeout: both stay SERVING, no
//     attempt is abandoned, every output equals a quiet run's.
//   - Every process at nice 19 beside a CPU hog on every core, 3 s wedge and prefill timeouts,
//     sixteen long prompts at once: 0 failures, 0 resumes, every output equals a quiet run's.
TEST_F(ReliabilityTest, Row43_SlowWorkersAreNotTakenForDeadOnes) {
  ASSERT_TRUE(reference_->ready());
  {
    FaultCluster c;
    c.StartRouter({"--prefill-timeout-ms", "300"});
    const std::vector<std::string> slow = {"--fault", "slow_step_ms=400", "--wedge-timeout-ms",
                                           "250"};
    const int p = c.StartWorker("prefill", slow);
    const int d = c.StartWorker("decode", slow);
    ASSERT_GE(p, 0);
    ASSERT_GE(d, 0);
    const v1::GenerateRequest req = Greedy(kPrompt, 10);
    const std::vector<int> want = Reference(req);
    std::atomic<bool> done{false};
    int not_serving = 0;
    std::thread watch([&] {
      while (!done) {
        for (int i : {p, d}) {
          not_serving += c.Health(i) != grpc::health::v1::HealthCheckResponse::SERVING;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(AllExact(c, req, want, 4), 4);
    const double seconds = SecondsSince(t0);
    done = true;
    watch.join();
    std::printf(
        "row 43: 400 ms steps, 250 ms wedge timeout: 4 requests in %.1f s, %d health "
        "checks not SERVING\n",
        seconds, not_serving);
    EXPECT_GT(seconds, 4.0) << "the steps were not slow";
    EXPECT_EQ(not_serving, 0) << "a slow worker said NOT_SERVING";
    EXPECT_EQ(c.Metric(0, "tandem_resumes_total"), 0) << "a slow attempt was abandoned";
    std::string why;
    EXPECT_TRUE(c.NoLeaks(&why)) << why;
  }
  FaultCluster c;
  // 3 s: at nice 19 beside a hog on every core and another test's processes (ctest -j2), the
  // scheduler has left a worker without a time slice for over 1 s.
  c.StartRouter({"--prefill-timeout-ms", "3000"});
  const std::vector<std::string> quick = {"--wedge-timeout-ms", "3000"};
  const int p = c.StartWorker("prefill", quick);
  const int d = c.StartWorker("decode", quick);
  ASSERT_GE(p, 0);
  ASSERT_GE(d, 0);
  for (int i : {0, p, d}) ASSERT_TRUE(c.Nice(i, 19));
  const v1::GenerateRequest req = Greedy(kLongPrompt, 48);
  const std::vector<int> want = Reference(req);
  const auto t0 = std::chrono::steady_clock::now();
  {
    CpuHog hog;
    EXPECT_EQ(AllExact(c, req, want, 16), 16);
  }
  std::printf("row 43: nice 19 beside a CPU hog: 16 long prompts in %.1f s, %g resumes\n",
              SecondsSince(t0), c.Metric(0, "tandem_resumes_total"));
  EXPECT_EQ(c.Metric(0, "tandem_resumes_total"), 0) << "a loaded worker was taken for a dead one";
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Row 42: the only prefill worker stops (SIGSTOP) mid-transfer. The router gives its attempt up
// once the worker turns unhealthy (no heartbeat for a second), and the decode worker's lease
// for it is freed at once by that, long before its own 60 s lease timeout; when the worker
// continues, the request resumes and completes with the quiet run's tokens.
TEST_F(ReliabilityTest, Row42_AnAbandonedPrefillFreesItsDecodeLeaseAtOnce) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter();
  const int p = c.StartWorker("prefill", {"--prefill-chunk", "16", "--fault", "step_delay_ms=200"});
  const int d = c.StartWorker("decode", {"--lease-timeout-ms", "60000"});
  ASSERT_GE(p, 0);
  ASSERT_GE(d, 0);
  const v1::GenerateRequest req = Greedy(kLongPrompt, 20);
  const std::vector<int> want = Reference(req);
  std::vector<int> got;
  grpc::Status st;
  std::thread client([&] {
    auto out = testing::Generate(c.generation(), req);
    st = out.status;
    got = out.tokens;
  });
  ASSERT_TRUE(
      FaultCluster::WaitFor([&] { return c.Metric(d, "tandem_kv_transfer_bytes_total") > 0; }));
  ASSERT_GE(c.Metric(d, "tandem_kv_leases_waiting"), 1);
  c.Signal(p, SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      FaultCluster::WaitFor([&] { return c.Metric(d, "tandem_kv_leases_waiting") == 0; }, 5000))
      << "the abandoned attempt's lease was not freed";
  const double freed_after = SecondsSince(stopped);
  std::printf("row 42: the lease was freed %.2f s after the prefill worker stopped\n", freed_after);
  EXPECT_EQ(c.Metric(d, "tandem_kv_leases_expired_total"), 0) << "freed by expiry, not at once";
  c.Signal(p, SIGCONT);
  client.join();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(got, want);
  EXPECT_GE(c.Metric(0, "tandem_resumes_total"), 1);
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Row 41: a decode worker's KV cache holds two of these requests at a time. Sixteen arrive at
// once: they wait in the router's line (first come, first admitted) for blocks to free, far past
// the queue timeout (which bounds only the wait for a healthy worker), and every one completes
// with the quiet run's tokens; none is refused.
TEST_F(ReliabilityTest, Row41_ShortKvWaitsInLineInsteadOfFailing) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  c.StartRouter({"--queue-timeout-ms", "300"});
  const int p = c.StartWorker("prefill");
  // 12 blocks of 16: a prompt of ~15 tokens and 40 more need 4 blocks (3 with room to grow).
  const int d = c.StartWorker(
      "decode", {"--num-blocks", "12", "--block-size", "16", "--fault", "step_delay_ms=20"});
  ASSERT_GE(p, 0);
  ASSERT_GE(d, 0);
  const v1::GenerateRequest req = Greedy(kPrompt, 40);
  const std::vector<int> want = Reference(req);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(AllExact(c, req, want, 16), 16);
  const double seconds = SecondsSince(t0);
  EXPECT_GT(seconds, 1.0) << "the requests did not wait for room";
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Row 21: out of device memory (injected: every forward step fails). The request fails cleanly,
// health says NOT_SERVING, the process stays up and frees everything.
TEST_F(ReliabilityTest, Row21_OutOfMemoryFailsTheRequestCleanly) {
  FaultCluster c;
  c.StartRouter();
  const int p = c.StartWorker("prefill");
  const int d = c.StartWorker("decode", {"--fault", "fail_step_every=1"});
  ASSERT_GE(p, 0);
  ASSERT_GE(d, 0);
  auto out = testing::Generate(c.generation(), Greedy(kPrompt, 20));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << out.status.error_message();
  EXPECT_NE(out.status.error_message().find("out of device memory"), std::string::npos);
  EXPECT_TRUE(FaultCluster::WaitFor(
      [&] { return c.Health(d) == grpc::health::v1::HealthCheckResponse::NOT_SERVING; }, 2000));
  EXPECT_EQ(::kill(c.proc(d).pid, 0), 0) << "the worker died";
  std::string why;
  EXPECT_TRUE(c.NoLeaks(&why)) << why;
}

// Row 23: the soak. 2000 requests, 32 at a time, over two prefill and two decode workers: one
// prefill worker corrupts every 61st KV chunk, the other drops every 127th; 10% of the clients
// cancel after 3 tokens and 10% have a deadline of 50-300 ms; halfway through a decode worker
// is killed -9 and replaced. Every request ends in exactly one terminal status; completed ones
// (resumed or not) equal the fault-free output; cancelled ones got a prefix of it; nothing
// else fails; blocks, leases, request maps, descriptors and RSS return to their baseline.
TEST_F(ReliabilityTest, Row23_SoakWithCancellationsAndInjectedFaults) {
  ASSERT_TRUE(reference_->ready());
  FaultCluster c;
  // Resumes are allowed generously: a request meets a fault on ~10% of its attempts, and the
  // soak must not fail by bad luck (8 failed attempts in a row: ~1e-8).
  c.StartRouter({"--prefill-timeout-ms", "1000", "--max-resumes", "8"});
  const int pa = c.StartWorker("prefill", {"--fault", "kv_corrupt_every=61"});
  const int pb = c.StartWorker("prefill", {"--fault", "kv_drop_every=127"});
  const int d1 = c.StartWorker("decode");
  const int d2 = c.StartWorker("decode");
  for (int w : {pa, pb, d1, d2}) ASSERT_GE(w, 0);
  const std::vector<std::string> prompts = {kPrompt, "The cat sat on the mat.",
                                            "One day, a little dog found a big bone.",
                                            "Tom and Sue went to the park to play."};
  std::vector<std::vector<int>> want;
  for (const auto& p : prompts) want.push_back(Reference(Greedy(p, 24)));
  // Warm up every path, then take the baselines.
  for (const auto& p : prompts) {
    for (int i = 0; i < 4; ++i)
      ASSERT_TRUE(testing::Generate(c.generation(), Greedy(p, 8)).status.ok());
  }
  std::string why;
  ASSERT_TRUE(c.NoLeaks(&why)) << why;
  const std::vector<int> steady = {0, pa, pb, d2};
  std::map<int, int> fds0;
  std::map<int, int64_t> rss0;
  for (int i : steady) {
    fds0[i] = c.Fds(i);
    rss0[i] = c.RssKb(i);
  }
  const double resumes0 = c.Metric(0, "tandem_resumes_total");

  constexpr int kRequests = 2000;
  auto prompt_of = [&](int i) { return i % static_cast<int>(prompts.size()); };
  auto max_tokens_of = [](int i) { return 4 + (i * 7) % 21; };
  auto cancels = [](int i) { return i % 10 == 3; };
  auto deadline_of = [](int i) { return i % 10 == 7 ? 50 + (i * 37) % 251 : 0; };
  std::atomic<int> replacement{-1};
  std::thread chaos([&] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    c.Kill(d1);
    replacement = c.StartWorker("decode");
  });
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = testing::RunAsync(
      c.generation(), kRequests, 32,
      [&](int i) { return Greedy(prompts[prompt_of(i)], max_tokens_of(i)); }, deadline_of,
      [&](int i) { return cancels(i) ? 3 : -1; });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  chaos.join();
  ASSERT_GE(replacement.load(), 0);

  std::map<std::string, int> by_status;
  int lost = 0, failed = 0;
  for (int i = 0; i < kRequests; ++i) {
    const CallResult& r = results[i];
    if (r.terminal_events != 1) ++lost;
    by_status[absl::StrFormat("%d", static_cast<int>(r.code))]++;
    const std::vector<int>& full = want[prompt_of(i)];
    const std::vector<int> expected(full.begin(), full.begin() + max_tokens_of(i));
    const bool prefix = r.tokens.size() <= expected.size() &&
                        std::equal(r.tokens.begin(), r.tokens.end(), expected.begin());
    EXPECT_TRUE(prefix) << "request " << i << ": tokens differ from the fault-free run";
    if (r.code == grpc::StatusCode::OK) {
      EXPECT_EQ(r.tokens, expected) << "request " << i;
    } else if (r.code == grpc::StatusCode::CANCELLED && cancels(i)) {
    } else if (r.code == grpc::StatusCode::DEADLINE_EXCEEDED && deadline_of(i) > 0) {
    } else {
      ++failed;
      ADD_FAILURE() << "request " << i << " ended " << r.code << ": " << r.message;
    }
  }
  EXPECT_EQ(lost, 0);
  EXPECT_EQ(failed, 0);
  ASSERT_TRUE(c.NoLeaks(&why)) << why;
  const double resumes = c.Metric(0, "tandem_resumes_total") - resumes0;
  const double corrupt = c.Metric(pa, "tandem_kv_transfer_failures_total");
  const double dropped = c.Metric(pb, "tandem_kv_transfer_failures_total");
  std::printf("soak: %d requests in %.1f s; statuses:", kRequests, seconds);
  for (const auto& [code, n] : by_status) std::printf(" %s=%d", code.c_str(), n);
  std::printf(
      "; lost %d, failed %d; resumes %.0f; KV transfers failed: corrupted %.0f, dropped "
      "%.0f; decode killed -9 once\n",
      lost, failed, resumes, corrupt, dropped);
  EXPECT_GT(resumes, 0);
  EXPECT_GT(corrupt, 0);
  for (int i : steady) {
    // Persistent connections may be new, not leaked: the router's channel to the replacement
    // decode worker, a prefill worker's KV connection to a decode worker it had not sent to
    // before the baseline (one per decode peer), and its other end on that decode worker (one
    // per prefill peer: the warm-up's routing may not have paired every prefill with it).
    const int new_peers = i == 0 ? 4 : 2;
    EXPECT_LE(c.Fds(i), fds0[i] + new_peers) << c.proc(i).role << " leaks descriptors";
    EXPECT_LT(c.RssKb(i), rss0[i] + 64 * 1024) << c.proc(i).role << " RSS grew by 64 MiB";
    std::printf("  %s %d: fds %d -> %d, RSS %lld -> %lld KiB\n", c.proc(i).role.c_str(), i, fds0[i],
                c.Fds(i), static_cast<long long>(rss0[i]), static_cast<long long>(c.RssKb(i)));
  }
}

}  // namespace
}  // namespace tandem
