// The prefill and decode engines wired together without RPC, over both KV transports: the
// disaggregated path gives exactly the tokens of the engine alone, and leaks nothing.
#include <gtest/gtest.h>

#include <thread>

#include "decode_node/decode_engine.h"
#include "engine/generator.h"
#include "engine/kv/block_table.h"
#include "engine/sampling/sampler.h"
#include "prefill_node/prefill_engine.h"
#include "tests/cluster_auth.h"
#include "tests/serving/engine_pair.h"
#include "tests/test_util.h"
#include "text/llama2c_tokenizer.h"
#include "text/load_tokenizer.h"

namespace tandem {
namespace {

class EnginesTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = MakeCpuBackend();
    model_ = std::move(*Model::Load(testing::Stories260K(), backend_.get()));
    tok_ = std::move(*Llama2cTokenizer::Load(testing::Tok512(), 512));
    KvSenderOptions so;
    so.auth.secret = testing::TestClusterSecret();
    auto sender = MakeKvSender(GetParam(), so);
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = std::move(*sender);
    PrefillEngineOptions po;
    po.block_size = 16;
    po.num_blocks = 256;
    po.scheduler.chunk_size = 7;  // several chunks per prompt, mixed in batches
    auto p = PrefillEngine::Create(model_.get(), sender_.get(), po);
    ASSERT_TRUE(p.ok()) << p.status();
    prefill_ = std::move(*p);
    DecodeEngineOptions dopt;
    dopt.block_size = 4;  // differs from the prefill's: the wire carries token ranges
    dopt.num_blocks = 2048;
    dopt.transport = GetParam();
    dopt.listen = GetParam() == "tcp" ? "127.0.0.1:0" : "engines-test";
    dopt.receiver.auth.secret = testing::TestClusterSecret();
    auto d = DecodeEngine::Create(model_.get(), dopt);
    ASSERT_TRUE(d.ok()) << d.status();
    decode_ = std::move(*d);
  }
  void TearDown() override {
    // The leak check: nothing queued, no lease, no block referenced, no sender bookkeeping.
    EXPECT_TRUE(prefill_->Idle());
    EXPECT_TRUE(decode_->Idle());
    EXPECT_EQ(sender_->num_targets(), 0u);
    decode_.reset();
    prefill_.reset();
    sender_.reset();
  }

  // Runs one request through prefill then decode; returns the generated ids.
  absl::StatusOr<std::vector<int>> RunDisaggregated(const GenerationRequest& r) {
    return testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), r);
  }

  // A greedy request of "Once upon a time" that runs to `max_tokens`.
  GenerationRequest Greedy(int max_tokens) const {
    GenerationRequest r;
    r.prompt = tok_->Encode("Once upon a time", true);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    return r;
  }

  struct Prefilled {
    uint64_t handle;
    int first_token;
  };
  // Admits `r` on the decode engine and prefills it into the lease (not yet started).
  absl::StatusOr<Prefilled> AdmitAndPrefill(const GenerationRequest& r) {
    auto adm = decode_->Admit(r);
    if (!adm.ok()) return adm.status();
    auto pre = prefill_->Prefill(adm->handle, r.prompt, r.sampling, adm->target,
                                 absl::Now() + absl::Seconds(30));
    if (!pre.ok()) return pre.status();
    return Prefilled{adm->handle, pre->first_token};
  }

  void ExpectTinyModelMatchesTheEngineAlone(const std::string& dir, const std::string& name);

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Llama2cTokenizer> tok_;
  std::unique_ptr<KvSender> sender_;
  std::unique_ptr<PrefillEngine> prefill_;
  std::unique_ptr<DecodeEngine> decode_;
};

TEST_P(EnginesTest, SameTokensAsTheEngineAloneGreedyAndSeeded) {
  const auto ref = testing::LoadJson(testing::SharedDir() + "/testdata/stories260K/reference.json");
  std::vector<GenerationRequest> reqs;
  for (const auto& c : ref["greedy"]) {
    for (int seeded = 0; seeded < 2; ++seeded) {
      GenerationRequest r;
      r.prompt = c["prompt_ids"].get<std::vector<int>>();
      r.max_tokens = 60;
      r.sampling.temperature = seeded ? 0.8f : 0.0f;
      r.sampling.top_p = seeded ? 0.9f : 1.0f;
      r.sampling.seed = 1234;
      reqs.push_back(r);
    }
  }
  // Concurrently: prompts share prefill steps and decode steps.
  testing::ExpectTokensOfTheEngineAlone(model_.get(), prefill_.get(), decode_.get(), reqs);
}

TEST_P(EnginesTest, PrefixCacheHitGivesTheSameTokens) {
  GenerationRequest r;
  r.prompt = tok_->Encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her big red ball and her friend Tom.",
      true);
  r.max_tokens = 20;
  r.sampling.temperature = 0;
  auto first = RunDisaggregated(r);
  auto second = RunDisaggregated(r);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*first, *second);
  EXPECT_GT(prefill_->prefix_cache_hits(), 0);
}

// A forged collision plants nothing. With a block hash that ignores the blocks before (as a
// forger who found colliding chains would make it), an attacker's prompt computes the KV of a
// block that the victim's prompt also has, after another first block; the victim's prompt, run
// twice (the second time its own first block hits), still gives the engine alone's tokens.
TEST_P(EnginesTest, ForgedPrefixCollisionsPlantNothing) {
  SetBlockHashForTesting([](uint64_t, std::span<const int> tokens) {
    uint64_t h = 1469598103934665603ull;
    for (int t : tokens) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
    return h;  // the same block after any prefix: the same hash
  });
  const std::vector<int> shared = tok_->Encode(
      " park with her big red ball and her friend Tom. They played all day long.", false);
  GenerationRequest attacker, victim;
  attacker.prompt = tok_->Encode("Yesterday a dragon flew over the old castle near town.", true);
  victim.prompt = tok_->Encode("Once upon a time, there was a little girl named Lily who", true);
  attacker.prompt.resize(16);  // one whole block (the prefill's block size) each
  victim.prompt.resize(16);
  attacker.prompt.insert(attacker.prompt.end(), shared.begin(), shared.end());
  victim.prompt.insert(victim.prompt.end(), shared.begin(), shared.end());
  for (GenerationRequest* r : {&attacker, &victim}) {
    r->max_tokens = 12;
    r->sampling.temperature = 0;
  }
  ASSERT_TRUE(RunDisaggregated(attacker).ok());  // plants the shared block after its own first
  for (int round = 0; round < 2; ++round) {
    testing::ExpectTokensOfTheEngineAlone(model_.get(), prefill_.get(), decode_.get(), {victim});
  }
  EXPECT_GT(prefill_->prefix_cache_hits(), 0);  // the victim's own first block, the second time
  SetBlockHashForTesting(nullptr);
}

TEST_P(EnginesTest, LeaseThatNeverCompletesExpiresAndFreesItsBlocks) {
  DecodeEngineOptions dopt;
  dopt.num_blocks = 64;
  dopt.lease_timeout = absl::Milliseconds(200);
  dopt.transport = GetParam();
  dopt.listen = GetParam() == "tcp" ? "127.0.0.1:0" : "engines-test-expiry";
  dopt.receiver.auth.secret = testing::TestClusterSecret();
  auto d = DecodeEngine::Create(model_.get(), dopt);
  ASSERT_TRUE(d.ok());
  GenerationRequest r;
  r.prompt = {1, 403, 407};
  r.max_tokens = 5;
  auto adm = (*d)->Admit(r);
  ASSERT_TRUE(adm.ok());
  EXPECT_LT((*d)->Load().free_blocks, 64);
  EXPECT_EQ((*d)->state(adm->handle), DecodeEngine::RequestState::kAdmitted);
  // No prefill ever sends: the lease expires and the request fails.
  for (int i = 0; i < 500 && (*d)->state(adm->handle) == DecodeEngine::RequestState::kAdmitted;
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ((*d)->state(adm->handle), DecodeEngine::RequestState::kFailed);
  DecodeEngine::Output o = (*d)->Next(adm->handle, absl::Seconds(5));
  EXPECT_EQ(o.error.code(), absl::StatusCode::kDeadlineExceeded) << o.error;
  EXPECT_EQ((*d)->Load().free_blocks, 64);
  EXPECT_TRUE((*d)->Idle());
}

// A request's one lifecycle: admitted, running once started, finished when its last token is
// out (still there for its reader), and forgotten once the reader has seen the end; one
// cancelled before it starts is forgotten at once.
TEST_P(EnginesTest, RequestStatesFollowOneLifecycle) {
  const GenerationRequest r = Greedy(6);
  auto adm = AdmitAndPrefill(r);
  ASSERT_TRUE(adm.ok()) << adm.status();
  EXPECT_EQ(decode_->state(adm->handle), DecodeEngine::RequestState::kAdmitted);
  ASSERT_TRUE(decode_->Start(adm->handle, adm->first_token).ok());
  EXPECT_NE(decode_->state(adm->handle), DecodeEngine::RequestState::kAdmitted);
  EXPECT_EQ(decode_->Start(adm->handle, adm->first_token).code(),
            absl::StatusCode::kFailedPrecondition);
  for (int i = 0; i < 500 && decode_->state(adm->handle) != DecodeEngine::RequestState::kFinished;
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(decode_->state(adm->handle), DecodeEngine::RequestState::kFinished);
  DecodeEngine::Output o = decode_->Next(adm->handle, absl::Seconds(5));
  EXPECT_EQ(o.tokens.size(), 5u);
  EXPECT_EQ(o.finish, FinishReason::kLength);
  EXPECT_EQ(decode_->state(adm->handle), std::nullopt);

  auto adm2 = decode_->Admit(r);
  ASSERT_TRUE(adm2.ok()) << adm2.status();
  decode_->Cancel(adm2->handle);
  EXPECT_EQ(decode_->state(adm2->handle), std::nullopt);
  EXPECT_EQ(decode_->Start(adm2->handle, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(decode_->Idle());
}

TEST_P(EnginesTest, CancelFreesBlocksOnBothSides) {
  const GenerationRequest r = Greedy(400);
  auto adm = AdmitAndPrefill(r);
  ASSERT_TRUE(adm.ok()) << adm.status();
  ASSERT_TRUE(decode_->Start(adm->handle, adm->first_token).ok());
  auto o = decode_->Next(adm->handle, absl::Seconds(5));
  EXPECT_FALSE(o.tokens.empty());
  decode_->Cancel(adm->handle);
  for (int i = 0; i < 100 && !decode_->Idle(); ++i) absl::SleepFor(absl::Milliseconds(10));
  // A prefill cancelled mid-way is aborted: a long prompt computed one token per step (~480
  // steps) on its own engine, cancelled at the waiter's first poll after it was queued.
  PrefillEngineOptions slow;
  slow.num_blocks = 64;
  slow.scheduler.chunk_size = 1;
  auto slow_prefill = PrefillEngine::Create(model_.get(), sender_.get(), slow);
  ASSERT_TRUE(slow_prefill.ok());
  GenerationRequest long_req = r;
  long_req.prompt.resize(480);
  for (int i = 1; i < 480; ++i) long_req.prompt[i] = 3 + (i * 37) % 500;
  long_req.max_tokens = 10;
  auto adm2 = decode_->Admit(long_req);
  ASSERT_TRUE(adm2.ok()) << adm2.status();
  int polls = 0;
  auto pre2 = (*slow_prefill)
                  ->Prefill(adm2->handle, long_req.prompt, long_req.sampling, adm2->target,
                            absl::Now() + absl::Seconds(30),
                            [&] { return ++polls > 1; });  // not before it starts
  EXPECT_EQ(pre2.status().code(), absl::StatusCode::kCancelled) << pre2.status();
  EXPECT_TRUE((*slow_prefill)->Idle());
  decode_->Cancel(adm2->handle);
}

// Admissions (map insertions) while requests decode must not disturb the running ones: the
// step loop holds on to them across the unlocked forward pass.
TEST_P(EnginesTest, AdmissionsDuringDecodeLeaveRunningRequestsIntact) {
  GenerationRequest r;
  r.prompt = tok_->Encode("Once upon a time", true);
  r.max_tokens = 300;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  Generator alone(model_.get(), nullptr, {});
  auto want = alone.Generate({&r, 1});
  ASSERT_TRUE(want.ok());
  absl::StatusOr<std::vector<int>> got = absl::UnknownError("not run");
  std::thread runner([&] { got = RunDisaggregated(r); });
  GenerationRequest small;
  small.prompt = {1, 403};
  small.max_tokens = 1;
  // Kept admitted, so the request map grows (and rehashes) while the long request decodes.
  std::vector<uint64_t> handles;
  for (int i = 0; i < 200; ++i) {
    auto adm = decode_->Admit(small);
    if (adm.ok()) handles.push_back(adm->handle);
  }
  runner.join();
  for (uint64_t h : handles) decode_->Cancel(h);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (*want)[0].tokens);
}

// The tiny model in HF directory `dir` (checked against transformers in hf_transformers_test,
// with the cut-down Qwen3 tokenizer beside it) through the pair, greedy and seeded at once: the
// engine alone's tokens, from a decode engine with room to spare and from one so small that it
// preempts and recomputes sequences. Nothing is left behind in either.
void EnginesTest::ExpectTinyModelMatchesTheEngineAlone(const std::string& dir,
                                                       const std::string& name) {
  auto model = Model::Load(dir, backend_.get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto tok = LoadTokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::vector<GenerationRequest> reqs;
  for (const char* text : {"Once upon a time", "The capital of France is",
                           "<|im_start|>user\nName three colours.<|im_end|>\n"
                           "<|im_start|>assistant\n",
                           "def f(x):\n    return x * 2  # 123"}) {
    for (int seeded = 0; seeded < 2; ++seeded) {
      GenerationRequest r;
      r.prompt = (*tok)->Encode(text, false);
      r.max_tokens = 80;
      r.ignore_eos = true;
      r.sampling.temperature = seeded ? 0.8f : 0.0f;
      r.sampling.top_p = seeded ? 0.9f : 1.0f;
      r.sampling.seed = 99;
      reqs.push_back(r);
    }
  }
  PrefillEngineOptions po;
  po.num_blocks = 256;
  po.scheduler.chunk_size = 7;
  auto prefill = PrefillEngine::Create(model->get(), sender_.get(), po);
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  // 96 blocks of 4 tokens take the eight prompts (13 to 30 tokens: 50 blocks), not their growth.
  for (int num_blocks : {2048, 96}) {
    SCOPED_TRACE(num_blocks);
    DecodeEngineOptions dopt;
    dopt.block_size = 4;
    dopt.num_blocks = num_blocks;
    dopt.transport = GetParam();
    dopt.listen = GetParam() == "tcp" ? "127.0.0.1:0"
                                      : "engines-test-" + name + "-" + std::to_string(num_blocks);
    dopt.receiver.auth.secret = testing::TestClusterSecret();
    // Slowed steps, so that a thread the machine schedules late still starts decoding before
    // the first ones have finished (80 steps take at least 160 ms).
    if (num_blocks == 96 && FaultSpec::Compiled()) dopt.faults.step_delay_ms = 2;
    auto decode = DecodeEngine::Create(model->get(), dopt);
    ASSERT_TRUE(decode.ok()) << decode.status();
    // Decoding all eight at once (about 210 blocks) is what makes the small one preempt.
    testing::ExpectTokensOfTheEngineAlone(model->get(), prefill->get(), decode->get(), reqs,
                                          /*start_together=*/num_blocks == 96);
    if (num_blocks == 96) {
      EXPECT_GT((*decode)->preemptions(), 0);
    }
    EXPECT_TRUE((*decode)->Idle());
    EXPECT_EQ((*decode)->Load().free_blocks, num_blocks);
  }
  EXPECT_TRUE((*prefill)->Idle());
}

// Gemma 3's sliding layers (window 4) keep only their window on the decode engine: admission
// takes the global layer's blocks for the whole prompt and the sliding layers' for the window's
// only, the prefill ships the sliding layers from the window on, and the greedy tokens equal a
// forward pass that keeps every block (one token per call over a contiguous table).
TEST_P(EnginesTest, Gemma3DecodeHoldsOnlyTheSlidingWindowAndGivesTheSameTokens) {
  auto model = Model::Load(testing::Gemma3Dir(), backend_.get());
  ASSERT_TRUE(model.ok()) << model.status();
  const Model& m = **model;
  GenerationRequest r;
  for (int i = 0; i < 200; ++i) r.prompt.push_back((i * 7 + 3) % m.config().vocab_size);
  r.max_tokens = 40;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;  // greedy

  // Every block kept: the prompt in one call, then a token per call.
  const KvTableLayout whole = KvCacheSpec::For(m.config(), 4, DType::kF32).table_layout();
  const std::vector<int> table = ContiguousTable(whole, 240);
  auto cache = KvCache::Create(m.config(), static_cast<int>(table.size()), 4);
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::vector<int> want;
  std::vector<float> logits;
  SequenceChunk chunk{r.prompt, 0, table, false};
  ASSERT_TRUE(m.Forward({&chunk, 1}, &*cache, &logits).ok());
  for (int pos = 200; static_cast<int>(want.size()) < r.max_tokens; ++pos) {
    want.push_back(Argmax(logits));
    if (static_cast<int>(want.size()) == r.max_tokens) break;
    chunk = {std::span<const int>(&want.back(), 1), pos, table, false};
    ASSERT_TRUE(m.Forward({&chunk, 1}, &*cache, &logits).ok());
  }

  PrefillEngineOptions po;
  po.num_blocks = 1024;
  po.scheduler.chunk_size = 64;
  auto prefill = PrefillEngine::Create(&m, sender_.get(), po);
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  DecodeEngineOptions dopt;
  dopt.block_size = 4;
  dopt.num_blocks = 2048;
  dopt.transport = GetParam();
  dopt.listen = GetParam() == "tcp" ? "127.0.0.1:0" : "engines-test-gemma3-window";
  dopt.receiver.auth.secret = testing::TestClusterSecret();
  auto decode = DecodeEngine::Create(&m, dopt);
  ASSERT_TRUE(decode.ok()) << decode.status();
  const KvTableLayout layout = (*decode)->kv_spec().table_layout();
  ASSERT_EQ(layout.n_groups(), 3);  // [sliding, full, sliding]: a group a layer
  auto adm = (*decode)->Admit(r);
  ASSERT_TRUE(adm.ok()) << adm.status();
  // 201 positions: 51 blocks of the global layer, 2 of each sliding one (positions 197..200).
  EXPECT_EQ(2048 - (*decode)->Load().free_blocks, 51 + 2 + 2);
  auto pre = (*prefill)->Prefill(adm->handle, r.prompt, r.sampling, adm->target,
                                 absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(pre.ok()) << pre.status();
  ASSERT_TRUE((*decode)->Start(adm->handle, pre->first_token).ok());
  std::vector<int> got = {pre->first_token};
  for (;;) {
    DecodeEngine::Output o = (*decode)->Next(adm->handle, absl::Seconds(10));
    got.insert(got.end(), o.tokens.begin(), o.tokens.end());
    ASSERT_TRUE(o.error.ok()) << o.error;
    if (o.finish) break;
  }
  EXPECT_EQ(got, want);
  EXPECT_TRUE((*decode)->Idle());
  EXPECT_EQ((*decode)->Load().free_blocks, 2048);
  EXPECT_TRUE((*prefill)->Idle());
}

// Qwen3: per-head q/k norms, head_dim 16 where hidden / heads is 8.
TEST_P(EnginesTest, Qwen3GivesTheTokensOfTheEngineAloneAlsoWhenPreempting) {
  ExpectTinyModelMatchesTheEngineAlone(testing::Qwen3Dir(), "qwen3");
}

// Gemma 3: GeGLU, sandwich norms, a sliding layer (window 4) between full ones with their own
// RoPE bases; prompts of 13 to 30 tokens run far past the window.
TEST_P(EnginesTest, Gemma3GivesTheTokensOfTheEngineAloneAlsoWhenPreempting) {
  ExpectTinyModelMatchesTheEngineAlone(testing::Gemma3Dir(), "gemma3");
}

// Mixtures of experts: each step's tokens (of every sequence in it) grouped by the experts they
// chose; Qwen3-MoE with its q/k norms, Mixtral with untied classifier.
TEST_P(EnginesTest, Qwen3MoeGivesTheTokensOfTheEngineAloneAlsoWhenPreempting) {
  ExpectTinyModelMatchesTheEngineAlone(testing::MoeDir("qwen3_moe_f32"), "qwen3moe");
}

TEST_P(EnginesTest, MixtralGivesTheTokensOfTheEngineAloneAlsoWhenPreempting) {
  ExpectTinyModelMatchesTheEngineAlone(testing::MoeDir("mixtral_f32"), "mixtral");
}

INSTANTIATE_TEST_SUITE_P(Transports, EnginesTest, ::testing::Values("local", "tcp"));

}  // namespace
}  // namespace tandem
