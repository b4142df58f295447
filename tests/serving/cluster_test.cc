// End to end with real processes on loopback: the engine alone, --role=all, 1 prefill + 1
// decode, 2 prefill + 3 decode with 32 concurrent requests, and a decode worker under KV
// pressure (preempting) all give the same tokens, greedy and seeded, with and without the logit
// processors (penalties, logit_bias, min_tokens) and with structured output (json_schema); so
// does a bf16 KV cache
// against the engine with a bf16 cache, and a worker of another KV dtype is refused; cancel and
// deadline free every block; bad fields get INVALID_ARGUMENT naming them.
#include "tests/serving/cluster.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <thread>

#include "engine/generator.h"
#include "engine/model.h"
#include "engine/sampling/output_constraint.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "rpc/grpc_util.h"
#include "structured/json_matcher.h"
#include "tests/metrics/metrics_text.h"
#include "text/llama2c_tokenizer.h"
#include "text/load_tokenizer.h"

namespace tandem {
namespace {

using testing::Cluster;

constexpr char kPersonSchema[] = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
    "happy": {"type": "boolean"}}, "required": ["name", "age", "happy"],
    "additionalProperties": false})";
constexpr int kJsonCases = 2;
// A regular expression the output must match as a whole (vLLM's guided_regex).
constexpr char kStoryRegex[] = R"((Lily|Tom) (saw|found) a (big|small) [a-z]{2,8}\.)";
constexpr int kRegexCases = 2;

struct Case {
  std::string prompt;
  SamplingParams sampling;  // the seed is ToRequest's
  int max_tokens;
};

SamplingParams Plain(float temperature, float top_p) {
  SamplingParams s;
  s.temperature = temperature;
  s.top_p = top_p;
  return s;
}

std::vector<Case> Cases() {
  const auto ref = testing::LoadJson(testing::SharedDir() + "/testdata/stories260K/reference.json");
  std::vector<Case> cases;
  for (const auto& c : ref["greedy"]) {
    const int n =
        static_cast<int>(c["ids_after_each_position"].size() - (c["prompt_ids"].size() - 1));
    cases.push_back({c["prompt"], Plain(0.0f, 1.0f), n});
    cases.push_back({c["prompt"], Plain(0.8f, 0.9f), 80});
  }
  const std::string prompt = ref["greedy"][1]["prompt"];
  // A regular expression, greedy and sampled (kRegexCases, before the JSON cases).
  for (float temperature : {0.0f, 0.9f}) {
    SamplingParams regex = Plain(temperature, 0.95f);
    regex.regex = kStoryRegex;
    cases.push_back({prompt, regex, 60});
  }
  // Structured output, greedy and sampled (kJsonCases of them, before the processor cases).
  for (float temperature : {0.0f, 0.9f}) {
    SamplingParams json = Plain(temperature, 0.95f);
    json.json_schema = kPersonSchema;
    cases.push_back({prompt, json, 120});
  }
  // The logit processors (appended last), greedy and sampled, with a min_tokens past where the
  // greedy story ends at EOS.
  SamplingParams greedy = Plain(0.0f, 1.0f);
  greedy.repetition_penalty = 1.3f;
  greedy.logit_bias = {{1, 30.0f}, {300, -4.0f}};  // 1 ends a story (BOS, as in run.c)
  greedy.min_tokens = 40;
  cases.push_back({prompt, greedy, 60});
  SamplingParams sampled = Plain(0.9f, 0.95f);
  sampled.presence_penalty = 0.6f;
  sampled.frequency_penalty = 0.4f;
  sampled.top_k = 40;
  cases.push_back({prompt, sampled, 90});
  return cases;
}

v1::GenerateRequest ToRequest(const Case& c, uint64_t seed = 7) {
  v1::GenerateRequest r;
  r.set_text(c.prompt.empty() ? std::string() : c.prompt);
  r.set_max_tokens(c.max_tokens);
  *r.mutable_sampling() = ToProto(c.sampling);
  r.mutable_sampling()->set_seed(seed);
  return r;
}

// A model and its tokenizer, as the servers' --model and --tokenizer flags name them.
struct ModelFiles {
  std::string model = testing::Stories260K();
  std::string tokenizer = testing::Tok512();
  std::vector<std::string> Flags() const { return {"--model", model, "--tokenizer", tokenizer}; }
};

// The engine alone, in this process: the expected tokens for every case, with the KV cache
// stored in `kv_dtype`.
std::vector<std::vector<int>> Expected(const std::vector<Case>& cases, DType kv_dtype = DType::kF32,
                                       const ModelFiles& files = {}) {
  auto backend = MakeCpuBackend();
  auto model = std::move(*Model::Load(files.model, backend.get()));
  std::shared_ptr<const Tokenizer> tok =
      *LoadTokenizer(files.tokenizer, model->config().vocab_size);
  std::vector<GenerationRequest> reqs;
  for (const auto& c : cases) {
    GenerationRequest r;
    r.prompt = tok->Encode(c.prompt, true);
    r.max_tokens = c.max_tokens;
    r.sampling = c.sampling;
    r.sampling.seed = 7;
    reqs.push_back(r);
  }
  GeneratorOptions options;
  options.kv_dtype = kv_dtype;
  options.constraints = std::make_shared<OutputConstraints>(tok);
  Generator gen(model.get(), tok.get(), options);
  auto out = gen.Generate(reqs);
  std::vector<std::vector<int>> tokens;
  for (const auto& o : *out) tokens.push_back(o.tokens);
  return tokens;
}

class ClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cases_ = new std::vector<Case>(Cases());
    expected_ = new std::vector<std::vector<int>>(Expected(*cases_));
  }
  static void TearDownTestSuite() {
    delete cases_;
    delete expected_;
  }
  // The reference prompt "" is sent as tokens ([BOS]): text must not be empty.
  static v1::GenerateRequest Request(const Case& c) {
    v1::GenerateRequest r = ToRequest(c);
    if (c.prompt.empty()) r.mutable_tokens()->add_ids(1);
    return r;
  }
  static v1::GenerateRequest Request(size_t i) { return Request((*cases_)[i]); }
  // Under KV pressure: `blocks` blocks per worker, `concurrency` requests at once.
  void ExpectTinyModelOnEveryPath(const std::string& dir, const std::string& gguf_file,
                                  int blocks = 40, int concurrency = 4);
  void CheckAllCases(Cluster& cluster, int concurrency) {
    CheckAllCases(cluster, concurrency, *expected_);
  }
  void CheckAllCases(Cluster& cluster, int concurrency,
                     const std::vector<std::vector<int>>& expected) {
    CheckCases(cluster, concurrency, *cases_, expected);
  }
  // Every case `concurrency` times at once: each output equals the engine alone's (`expected`,
  // per case), and every block is free afterwards.
  void CheckCases(Cluster& cluster, int concurrency, const std::vector<Case>& cases,
                  const std::vector<std::vector<int>>& expected) {
    ASSERT_TRUE(cluster.ready());
    const size_t n = cases.size();
    std::vector<testing::Streamed> got(n * concurrency);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < got.size(); ++i) {
      threads.emplace_back(
          [&, i] { got[i] = testing::Generate(cluster.generation(), Request(cases[i % n])); });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
      EXPECT_EQ(got[i].tokens, expected[i % n]) << "case " << i % n;
      // The last message's timings, as docs/api.md says: TTFT among them, within e2e.
      const v1::Timings& t = got[i].last_timings;
      EXPECT_GT(t.ttft_seconds(), 0) << "case " << i % n;
      EXPECT_LE(t.ttft_seconds(), t.e2e_seconds()) << "case " << i % n;
    }
    EXPECT_TRUE(cluster.AllBlocksFree());
  }
  static std::vector<Case>* cases_;
  static std::vector<std::vector<int>>* expected_;
};
std::vector<Case>* ClusterTest::cases_ = nullptr;
std::vector<std::vector<int>>* ClusterTest::expected_ = nullptr;

// The processor cases are not the plain ones in disguise: each changes the engine's output, and
// min_tokens holds off the EOS that the bias makes likely.
TEST_F(ClusterTest, LogitProcessorCasesChangeTheOutput) {
  const size_t n = cases_->size();
  std::vector<Case> other = {(*cases_)[n - 2], (*cases_)[n - 1], (*cases_)[n - 2]};
  other[0].sampling = Plain(0.0f, 1.0f);
  other[1].sampling = Plain(0.9f, 0.95f);
  other[1].sampling.top_k = 40;
  other[2].sampling.min_tokens = 0;
  const auto got = Expected(other);
  EXPECT_NE(got[0], (*expected_)[n - 2]);
  EXPECT_NE(got[1], (*expected_)[n - 1]);
  EXPECT_GE((*expected_)[n - 2].size(), 40u);
  EXPECT_EQ((*expected_)[n - 2].back(), 1) << "EOS once min_tokens allows it";
  EXPECT_LT(got[2].size(), 40u) << "without min_tokens the biased EOS comes early";
}

// The regex cases end in EOS after a text that matches the pattern (std::regex is the oracle).
TEST_F(ClusterTest, RegexOutputMatchesThePattern) {
  auto tok = std::move(*Llama2cTokenizer::Load(testing::Tok512(), 512));
  const size_t first = cases_->size() - 2 - kJsonCases - kRegexCases;
  for (size_t i = first; i < first + kRegexCases; ++i) {
    ASSERT_FALSE((*cases_)[i].sampling.regex.empty());
    std::vector<int> tokens = (*expected_)[i];
    ASSERT_FALSE(tokens.empty());
    EXPECT_EQ(tokens.back(), 1) << "case " << i << " ends in the model's EOS";
    tokens.pop_back();
    const std::string text = tok->Decode(tokens);
    EXPECT_TRUE(std::regex_match(text, std::regex(kStoryRegex))) << text;
  }
}

// The structured-output cases end in EOS after one JSON value that fits the schema (the
// schema's own checks are in tests/structured/, against the jsonschema package).
TEST_F(ClusterTest, StructuredOutputIsOneValidValue) {
  auto tok = std::move(*Llama2cTokenizer::Load(testing::Tok512(), 512));
  const auto schema = *structured::JsonSchema::Compile(kPersonSchema);
  const size_t first = cases_->size() - 2 - kJsonCases;
  for (size_t i = first; i < first + kJsonCases; ++i) {
    std::vector<int> tokens = (*expected_)[i];
    ASSERT_FALSE(tokens.empty());
    EXPECT_EQ(tokens.back(), 1) << "case " << i << " ends in the model's EOS (BOS, as in run.c)";
    tokens.pop_back();
    const std::string text = tok->Decode(tokens);
    structured::JsonMatcher m(schema->root());
    EXPECT_TRUE(m.Feed(text) && m.Complete()) << text;
    const auto value = nlohmann::json::parse(text, nullptr, false);
    ASSERT_TRUE(value.is_object()) << text;
    EXPECT_TRUE(value["name"].is_string() && value["name"].get<std::string>().size() <= 12);
    EXPECT_TRUE(value["age"].is_number_integer()) << text;
    EXPECT_TRUE(value["happy"].is_boolean()) << text;
    EXPECT_EQ(value.size(), 3u) << text;
  }
}

TEST_F(ClusterTest, ColocatedRoleAllMatchesEngine) {
  Cluster c(0, 0);
  CheckAllCases(c, 1);
}

TEST_F(ClusterTest, OnePrefillOneDecodeMatchesEngine) {
  Cluster c(1, 1);
  CheckAllCases(c, 1);
}

TEST_F(ClusterTest, TwoPrefillThreeDecode32ConcurrentMatchEngine) {
  Cluster c(2, 3);
  CheckAllCases(c, 4);  // 8 cases x 4 = 32 requests in flight at once
  // Both roles took part.
  const v1::ListWorkersResponse workers = c.Workers();
  for (const auto& w : workers.workers()) EXPECT_TRUE(w.healthy()) << w.worker_id();
}

// KV pressure: a decode worker with room for a few sequences (40 blocks of 16 tokens) and 32
// greedy and seeded requests at once. Blocks are taken as tokens arrive; when the cache fills
// the newest sequences are preempted and later recomputed on the worker, and no client sees it:
// every output equals the engine alone's, and nothing is left behind.
TEST_F(ClusterTest, KvPressurePreemptsAndRecomputesIdentically) {
  Cluster c(1, 1, {"--num-blocks", "40"});
  CheckAllCases(c, 4);
  const double preemptions =
      testing::MetricValue(testing::Scrape(c.metrics()[2]), "tandem_num_preemptions_total");
  EXPECT_GT(preemptions, 0);
  std::printf("32 requests through a 40-block decode worker: %.0f preemptions\n", preemptions);
}

// A tiny model (checked against transformers in hf_transformers_test, with the cut-down Qwen3
// tokenizer) as its HF directory (tokenizer.json and chat template beside it) and as a GGUF file
// (the tokenizer from the metadata): --role=all, 1 prefill + 1 decode, and a decode worker under
// KV pressure give the engine alone's tokens, greedy and seeded, and leave nothing behind.
void ClusterTest::ExpectTinyModelOnEveryPath(const std::string& dir, const std::string& gguf_file,
                                             int blocks, int concurrency) {
  std::vector<Case> cases;
  for (const char* prompt : {"Once upon a time", "The capital of France is",
                             "<|im_start|>user\nName three colours.<|im_end|>\n"
                             "<|im_start|>assistant\n",
                             "def f(x):\n    return x * 2  # 123"}) {
    cases.push_back({prompt, Plain(0.0f, 1.0f), 80});
    cases.push_back({prompt, Plain(0.8f, 0.9f), 80});
  }
  const ModelFiles hf{dir, dir};
  const ModelFiles gguf{gguf_file, gguf_file};
  struct Setup {
    int prefill, decode;
    ModelFiles files;
    std::vector<std::string> flags;
    int concurrency;
  };
  const Setup setups[] = {
      {0, 0, hf, {}, 1},
      {1, 1, hf, {}, 1},
      {1, 1, gguf, {}, 1},
      // 32 requests of up to ~110 tokens
      {1, 1, hf, {"--num-blocks", absl::StrCat(blocks)}, concurrency},
  };
  for (const Setup& s : setups) {
    SCOPED_TRACE(absl::StrFormat("%s, %d prefill + %d decode, %d blocks", s.files.model, s.prefill,
                                 s.decode, s.flags.empty() ? 0 : blocks));
    Cluster c(s.prefill, s.decode, s.flags, {}, s.files.Flags());
    const std::vector<std::vector<int>> expected = Expected(cases, DType::kF32, s.files);
    CheckCases(c, s.concurrency, cases, expected);
    if (!s.flags.empty()) {
      // The load must have made the decode worker preempt. How far requests overlap depends on
      // the machine's pace, so a round that happened not to is run again (at most twice more),
      // each round held to the same tokens.
      auto preemptions = [&] {
        return testing::MetricValue(testing::Scrape(c.metrics()[2]),
                                    "tandem_num_preemptions_total");
      };
      for (int round = 0; round < 2 && preemptions() == 0; ++round) {
        CheckCases(c, s.concurrency, cases, expected);
      }
      EXPECT_GT(preemptions(), 0);
    }
  }
}

// Qwen3: per-head q/k norms, head_dim 16 where hidden / heads is 8.
TEST_F(ClusterTest, Qwen3MatchesEngineColocatedDisaggregatedAndPreempting) {
  ExpectTinyModelOnEveryPath(testing::Qwen3Dir(), testing::Qwen3Gguf("qwen3_q8_0"));
}

// Qwen3-MoE: 4 experts, 2 per token, as an HF directory and as a qwen3moe GGUF. (The f32 file:
// a quantized matmul rounds its activations differently for under 8 rows, and how many rows an
// expert gets in a step depends on which sequences share it, so quantized experts give the
// engine alone's tokens only up to that rounding; moe_test holds the Q8_0 file to transformers.)
TEST_F(ClusterTest, Qwen3MoeMatchesEngineColocatedDisaggregatedAndPreempting) {
  ExpectTinyModelOnEveryPath(testing::MoeDir("qwen3_moe_f32"),
                             testing::MoeGguf("qwen3_moe", "qwen3_moe_f32"));
}

// Gemma 3: GeGLU, sandwich norms, sliding layers (window 4) between full ones with their own
// RoPE bases, as an HF directory and as a gemma3 GGUF. Its KV blocks hold one layer each (three
// groups: the full layer and the two sliding ones), and a sliding layer keeps about one block
// per sequence, so the worker under pressure gets 100 one-layer blocks (the prefill worker holds
// a 512-token prompt in 96) and 16 requests at once (~10 blocks each) to preempt.
TEST_F(ClusterTest, Gemma3MatchesEngineColocatedDisaggregatedAndPreempting) {
  ExpectTinyModelOnEveryPath(
      testing::Gemma3Dir(),
      testing::SourceDir() + "/tests/fixtures/gguf/gemma3_tiny/gemma3_tiny_f32.gguf",
      /*blocks=*/100, /*concurrency=*/16);
}

// Gemma 3 270M (the real file, 32,768 positions of context) served with default flags: the
// prefill worker's KV cache is sized to hold one whole-context prompt (1 GiB would not), and
// --role=all and 1 prefill + 1 decode give transformers' greedy tokens for the fixture's plain
// and turn-marked prompts.
TEST_F(ClusterTest, Gemma270MServesWithDefaultFlagsAndGivesTransformersTokens) {
  const std::string path = testing::Gemma270MPath();
  if (path.empty() || !std::filesystem::exists(path)) {
    GTEST_SKIP() << "Gemma 3 270M is missing: run scripts/fetch_model.sh --gemma3";
  }
  const auto expected =
      testing::LoadJson(testing::SourceDir() + "/tests/fixtures/gguf/gemma3_270m/expected.json");
  ASSERT_TRUE(expected.is_object());
  for (const int workers : {0, 1}) {
    SCOPED_TRACE(workers == 0 ? "--role=all" : "1 prefill + 1 decode");
    Cluster c(workers, workers, {"--dtype", "f32"}, {}, {"--model", path});
    ASSERT_TRUE(c.ready());
    for (int i = 0; i < 2; ++i) {
      const auto& cs = expected["cases"][i];
      v1::GenerateRequest r;
      for (int id : cs["input_ids"].get<std::vector<int>>()) r.mutable_tokens()->add_ids(id);
      const std::vector<int> want = cs["greedy"];
      r.set_max_tokens(static_cast<int>(want.size()));
      r.set_ignore_eos(true);
      r.mutable_sampling()->set_temperature(0);
      const testing::Streamed got = testing::Generate(c.generation(), r);
      ASSERT_TRUE(got.status.ok()) << got.status.error_message();
      EXPECT_EQ(got.tokens, want) << cs["name"];
    }
  }
}

// Speculative decoding on the decode workers (prompt lookup colocated, a draft model
// disaggregated, prompt lookup under KV pressure): every output equals the engine alone's
// without speculation, proposals were scored and kept, and nothing is left behind.
TEST_F(ClusterTest, SpeculativeDecodingMatchesEngine) {
  struct Setup {
    int prefill, decode;
    std::vector<std::string> flags;
  };
  const Setup setups[] = {
      {0, 0, {"--speculative", "ngram", "--spec-tokens", "5"}},
      {1, 1, {"--speculative", "draft", "--draft-model", testing::Stories260K()}},
      {1, 1, {"--speculative", "ngram", "--num-blocks", "40"}},
  };
  for (const Setup& s : setups) {
    Cluster c(s.prefill, s.decode, s.flags);
    CheckAllCases(c, 2);
    const auto decode_metrics = testing::Scrape(c.metrics().back());
    const double proposed =
        testing::MetricValue(decode_metrics, "tandem_spec_decode_num_draft_tokens_total");
    const double accepted =
        testing::MetricValue(decode_metrics, "tandem_spec_decode_num_accepted_tokens_total");
    EXPECT_GT(proposed, 0) << s.flags[1];
    EXPECT_GT(accepted, 0) << s.flags[1];
    std::printf("--speculative %s: %.0f proposed, %.0f accepted\n", s.flags[1].c_str(), proposed,
                accepted);
  }
}

// A bf16 KV cache: prefill stores bf16, ships bf16 (half the bytes) and decode reads bf16; the
// cluster's tokens equal the engine alone's with the same cache dtype.
TEST_F(ClusterTest, Bf16KvCacheMatchesEngineWithBf16Cache) {
  Cluster c(1, 1, {"--kv-dtype", "bf16"});
  CheckAllCases(c, 2, Expected(*cases_, DType::kBF16));
}

// Every prefill and decode worker of a cluster stores KV in one dtype: a worker started with
// another is refused at registration (its error names the flag and the worker it conflicts
// with) and never receives a request; the cluster keeps serving.
TEST_F(ClusterTest, RouterRefusesAWorkerOfAnotherKvDtype) {
  Cluster c(1, 1, {"--kv-dtype", "bf16"});
  ASSERT_TRUE(c.ready());
  const ServerProcess fp8 = StartServerProcess(
      testing::BinDir() + "/tandem-server",
      {"--role=prefill", "--router", c.router_internal(), "--model", testing::Stories260K(),
       "--tokenizer", testing::Tok512(), "--host", "127.0.0.1", "--port", "0", "--kv-dtype", "fp8",
       "--cluster-secret-file", testing::TestClusterSecretFile()});
  ASSERT_FALSE(fp8.address.empty());
  c.pids().push_back(fp8.pid);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // several registration attempts
  const v1::ListWorkersResponse workers = c.Workers();
  EXPECT_EQ(workers.workers_size(), 2);
  for (const auto& w : workers.workers()) EXPECT_NE(w.address(), fp8.address);
  // The refusal itself, as the worker sees it.
  auto stub = v1::Registry::NewStub(
      grpc::CreateChannel(c.router_internal(), grpc::InsecureChannelCredentials()));
  v1::RegisterRequest req;
  req.set_worker_id("fp8-prefill");
  req.set_role(v1::WORKER_ROLE_PREFILL);
  req.set_address("127.0.0.1:9");
  req.set_kv_dtype("fp8");
  grpc::ClientContext ctx;
  testing::ProveCluster(&ctx, internal_method::kRegister, c.router_internal(), req,
                        PeerRole::kPrefill);
  v1::RegisterResponse resp;
  const grpc::Status refused = stub->Register(&ctx, req, &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("--kv-dtype=fp8"), std::string::npos)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("bf16"), std::string::npos) << refused.error_message();
  CheckAllCases(c, 1, Expected(*cases_, DType::kBF16));
}

TEST_F(ClusterTest, GreedyTextEqualsLlama2c) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  const auto ref = testing::LoadJson(testing::SharedDir() + "/testdata/stories260K/reference.json");
  for (size_t i = 0; i < ref["greedy"].size(); ++i) {
    const auto& rc = ref["greedy"][i];
    auto r = Request(2 * i);
    auto s = testing::Generate(c.generation(), r);
    ASSERT_TRUE(s.status.ok());
    // run.c prints the prompt, the completion and a newline.
    std::string printed = rc["prompt"].get<std::string>() + s.text + "\n";
    if (rc["prompt"].get<std::string>().empty()) printed = s.text + "\n";
    EXPECT_EQ(printed, rc["stdout"].get<std::string>());
  }
}

TEST_F(ClusterTest, CancelAndDeadlineFreeEveryBlock) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  v1::GenerateRequest r;
  r.set_text("Once upon a time");
  r.set_max_tokens(500);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0);
  {
    // Cancel mid-stream after a few tokens.
    grpc::ClientContext ctx;
    auto reader = c.generation()->Generate(&ctx, r);
    v1::GenerateResponse resp;
    int messages = 0;
    while (messages < 3 && reader->Read(&resp)) ++messages;
    EXPECT_EQ(messages, 3);
    ctx.TryCancel();
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(c.AllBlocksFree());
  // A deadline that passes mid-stream.
  // 10 ms: it passes before the first token or mid-stream, never after the last.
  auto s = testing::Generate(c.generation(), r, /*deadline_ms=*/10);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(c.AllBlocksFree());
  // The cluster still serves.
  r.set_max_tokens(5);
  EXPECT_TRUE(testing::Generate(c.generation(), r).status.ok());
  EXPECT_TRUE(c.AllBlocksFree());
}

TEST_F(ClusterTest, InvalidFieldsAreNamedAndServersKeepServing) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  v1::GenerateRequest good;
  good.set_text("The cat");
  good.set_max_tokens(8);
  struct Bad {
    std::string field;
    std::function<void(v1::GenerateRequest&)> mutate;
  } bad[] = {
      {"input", [](auto& r) { r.clear_text(); }},
      {"text", [](auto& r) { r.set_text(""); }},
      {"tokens.ids", [](auto& r) { r.mutable_tokens()->add_ids(9999); }},
      {"tokens.ids", [](auto& r) { r.mutable_tokens()->add_ids(-1); }},
      {"tokens.ids", [](auto& r) { r.mutable_tokens(); }},
      {"text", [](auto& r) { r.set_text(std::string(6000, 'a')); }},  // longer than the context
      {"max_tokens", [](auto& r) { r.set_max_tokens(0); }},
      {"max_tokens", [](auto& r) { r.set_max_tokens(-5); }},
      {"max_tokens", [](auto& r) { r.set_max_tokens(1 << 30); }},
      {"sampling.temperature", [](auto& r) { r.mutable_sampling()->set_temperature(-1); }},
      {"sampling.temperature", [](auto& r) { r.mutable_sampling()->set_temperature(NAN); }},
      {"sampling.temperature", [](auto& r) { r.mutable_sampling()->set_temperature(INFINITY); }},
      {"sampling.top_p", [](auto& r) { r.mutable_sampling()->set_top_p(0); }},
      {"sampling.top_p", [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); }},
      {"sampling.top_k", [](auto& r) { r.mutable_sampling()->set_top_k(-1); }},
      {"sampling.presence_penalty",
       [](auto& r) { r.mutable_sampling()->set_presence_penalty(2.5f); }},
      {"sampling.frequency_penalty",
       [](auto& r) { r.mutable_sampling()->set_frequency_penalty(NAN); }},
      {"sampling.repetition_penalty",
       [](auto& r) { r.mutable_sampling()->set_repetition_penalty(0); }},
      {"sampling.min_tokens", [](auto& r) { r.mutable_sampling()->set_min_tokens(-1); }},
      {"sampling.min_tokens", [](auto& r) { r.mutable_sampling()->set_min_tokens(9); }},
      {"sampling.logit_bias",
       [](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[512] = 1; }},
      {"sampling.logit_bias",
       [](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[-1] = 1; }},
      {"sampling.logit_bias",
       [](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[5] = 101; }},
      {"sampling.json_schema",
       [](auto& r) {
         r.mutable_sampling()->set_json_schema(R"({"type": "integer", "minimum": 1})");
       }},
      {"sampling.json_schema", [](auto& r) { r.mutable_sampling()->set_json_schema("{"); }},
      {"sampling.json_schema",
       [](auto& r) { r.mutable_sampling()->set_json_schema(std::string(70000, ' ')); }},
      {"ignore_eos",
       [](auto& r) {
         r.mutable_sampling()->set_json_schema("true");
         r.set_ignore_eos(true);
       }},
      {"sampling.regex", [](auto& r) { r.mutable_sampling()->set_regex("(a"); }},
      {"sampling.regex",
       [](auto& r) {
         r.mutable_sampling()->set_regex("a+");
         r.mutable_sampling()->add_choice("a");
       }},
      {"stop",
       [](auto& r) {
         r.mutable_sampling()->set_regex("a+");
         r.add_stop("a");
       }},
      {"stop", [](auto& r) { r.add_stop(""); }},
      {"request_id", [](auto& r) { r.set_request_id(std::string(1000, 'x')); }},
  };
  for (const auto& b : bad) {
    v1::GenerateRequest r = good;
    b.mutate(r);
    auto s = testing::Generate(c.generation(), r);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << b.field;
    EXPECT_EQ(s.status.error_message().rfind(b.field + ":", 0), 0u)
        << b.field << " vs " << s.status.error_message();
  }
  // Invalid UTF-8 in a proto3 string never reaches the router: the protobuf runtime refuses
  // the message (INTERNAL, "failed to parse") and the server is unaffected.
  v1::GenerateRequest bad_utf8 = good;
  bad_utf8.set_text("bad \xff utf8");
  EXPECT_FALSE(testing::Generate(c.generation(), bad_utf8).status.ok());
  auto ok = testing::Generate(c.generation(), good);
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens.size(), 8u);
  EXPECT_TRUE(c.AllBlocksFree());
}

TEST_F(ClusterTest, DuplicateRequestIdIsRejected) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  v1::GenerateRequest r;
  r.set_text("Once upon a time");
  r.set_max_tokens(300);
  r.set_ignore_eos(true);
  r.set_request_id("dup-1");
  grpc::ClientContext ctx;
  auto first = c.generation()->Generate(&ctx, r);
  v1::GenerateResponse resp;
  ASSERT_TRUE(first->Read(&resp));  // in flight now
  auto second = testing::Generate(c.generation(), r);
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  ctx.TryCancel();
  first->Finish();
  EXPECT_TRUE(c.AllBlocksFree());
}

// grpc.health.v1 answers for the whole process ("") and for each service it serves by name;
// an unknown name is NOT_FOUND.
TEST_F(ClusterTest, HealthAnswersForEveryServiceByName) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  auto check = [](const std::string& address, const std::string& service) {
    auto stub = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    const grpc::Status s = stub->Check(&ctx, req, &resp);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) return std::string("NOT_FOUND");
    return s.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status())
                  : "error " + std::to_string(s.error_code());
  };
  for (const std::string service : {"", "tandem.v1.Generation"}) {
    EXPECT_EQ(check(c.router(), service), "SERVING") << service;
  }
  EXPECT_EQ(check(c.router_internal(), "tandem.v1.Registry"), "SERVING");
  EXPECT_EQ(check(c.router(), "tandem.v1.Nothing"), "NOT_FOUND");
}

// On --kv-dtype bf16 workers, Score over gRPC gives the log-probabilities Generate reported for
// the same tokens: the prefill worker scores in its KV dtype, through its engine.
TEST_F(ClusterTest, ScoreEqualsGeneratesLogprobsOnBf16Kv) {
  Cluster c(1, 1, {"--kv-dtype", "bf16"});
  ASSERT_TRUE(c.ready());
  const std::vector<int> prompt = {1, 403, 407, 261, 378};
  v1::GenerateRequest g;
  g.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
  g.set_max_tokens(20);
  g.set_ignore_eos(true);
  g.mutable_sampling()->set_temperature(0);
  g.mutable_sampling()->set_logprobs(true);
  const testing::Streamed gen = testing::Generate(c.generation(), g);
  ASSERT_TRUE(gen.status.ok()) << gen.status.error_message();
  ASSERT_EQ(gen.tokens.size(), 20u);
  ASSERT_EQ(gen.logprobs.size(), 20u);
  v1::ScoreRequest sr;
  sr.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
  sr.mutable_tokens()->mutable_ids()->Add(gen.tokens.begin(), gen.tokens.end());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ScoreResponse scored;
  ASSERT_TRUE(c.generation()->Score(&ctx, sr, &scored).ok());
  ASSERT_EQ(scored.logprobs_size(), 24);
  for (int i = 0; i < 20; ++i) {
    EXPECT_NEAR(scored.logprobs(4 + i), gen.logprobs[i], 1e-4) << "token " << i;
    EXPECT_EQ(scored.ranks(4 + i), 1) << "greedy: the most likely, token " << i;
  }
  EXPECT_TRUE(c.AllBlocksFree());
}

TEST_F(ClusterTest, TokenizeDetokenizeModelInfoScore) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  grpc::ClientContext c1;
  v1::TokenizeRequest tr;
  tr.set_text("Once upon a time");
  tr.set_add_special_tokens(true);
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(c.generation()->Tokenize(&c1, tr, &tresp).ok());
  EXPECT_EQ(std::vector<int>(tresp.token_ids().begin(), tresp.token_ids().end()),
            (std::vector<int>{1, 403, 407, 261, 378}));
  grpc::ClientContext c2;
  v1::DetokenizeRequest dr;
  dr.mutable_token_ids()->CopyFrom(tresp.token_ids());
  v1::DetokenizeResponse dresp;
  ASSERT_TRUE(c.generation()->Detokenize(&c2, dr, &dresp).ok());
  EXPECT_EQ(dresp.text(), "Once upon a time");
  grpc::ClientContext c3;
  v1::ModelInfo info;
  ASSERT_TRUE(c.generation()->GetModelInfo(&c3, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.model(), "stories260K");  // the served name, as /v1/models has it
  EXPECT_EQ(info.vocab_size(), 512);
  EXPECT_EQ(info.prefill_workers(), 1);
  EXPECT_EQ(info.decode_workers(), 1);
  grpc::ClientContext c4;
  v1::ScoreRequest sr;
  sr.set_text("Once upon a time");
  v1::ScoreResponse sresp;
  ASSERT_TRUE(c.generation()->Score(&c4, sr, &sresp).ok());
  EXPECT_EQ(sresp.logprobs_size(), 4);
  EXPECT_GT(sresp.perplexity(), 1.0);

  // Score's prompt goes through Generate's validation: the same fields, the same messages.
  const std::pair<std::function<void(v1::ScoreRequest&)>, std::string> bad[] = {
      {[](v1::ScoreRequest& r) { r.clear_input(); }, "input: one of text or tokens is required"},
      {[](v1::ScoreRequest& r) { r.set_text(""); }, "text: must not be empty"},
      {[](v1::ScoreRequest& r) { r.mutable_tokens()->add_ids(1); },
       "tokens.ids: 1 tokens; at least 2 are needed"},
      {[](v1::ScoreRequest& r) {
         r.mutable_tokens()->add_ids(1);
         r.mutable_tokens()->add_ids(1 << 20);
       },
       "tokens.ids: id 1048576 at index 1 is outside [0, "},
  };
  for (const auto& [mutate, message] : bad) {
    v1::ScoreRequest r;
    mutate(r);
    grpc::ClientContext ctx;
    v1::ScoreResponse out;
    const grpc::Status st = c.generation()->Score(&ctx, r, &out);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << message;
    EXPECT_EQ(st.error_message().rfind(message, 0), 0u) << st.error_message();
  }
}

}  // namespace
}  // namespace tandem
