// The prefill and decode engines on the CUDA device model (--device=cuda) against the engine on
// the CPU: the same tokens (greedy, and seeded: the draw is counter-based, on the device or on
// the host) for the stories260K reference prompts, run concurrently so
// prompts share prefill and decode steps (mixed batches, decode graphs of several buckets), a
// prefix-cache hit, and KV moving between a CPU prefill and a CUDA decode worker (the wire
// layout is the same), and a speculating decode worker. Skipped where no GPU (or no CUDA library)
// is present; scripts/ gpu_check.sh runs it on a machine with one.
#include <gtest/gtest.h>

#include "decode_node/decode_engine.h"
#include "engine/generator.h"
#include "kernels/backend_loader.h"
#include "prefill_node/prefill_engine.h"
#include "tests/serving/engine_pair.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

class CudaEnginesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto api = LoadCudaApi();
    if (!api.ok()) GTEST_SKIP() << api.status().message();
    backend_ = MakeCpuBackend();
    model_ = std::move(*Model::Load(testing::Stories260K(), backend_.get()));
    sender_ = std::move(*MakeKvSender("local"));
  }
  void TearDown() override {
    if (prefill_) {
      EXPECT_TRUE(prefill_->Idle());
    }
    if (decode_) {
      EXPECT_TRUE(decode_->Idle());
    }
    decode_.reset();
    prefill_.reset();
  }
  void Start(const std::string& prefill_device, const std::string& decode_device,
             SpeculativeConfig speculative = {}) {
    PrefillEngineOptions po;
    po.block_size = 16;
    po.num_blocks = 256;
    po.scheduler.chunk_size = 7;  // several chunks per prompt, mixed in batches
    po.device = prefill_device;
    auto p = PrefillEngine::Create(model_.get(), sender_.get(), po);
    ASSERT_TRUE(p.ok()) << p.status();
    prefill_ = std::move(*p);
    DecodeEngineOptions dopt;
    dopt.block_size = 64;  // differs from the prefill's: the wire carries token ranges
    dopt.num_blocks = 256;
    dopt.transport = "local";
    dopt.listen = "cuda-engines-test-" + prefill_device + decode_device;
    dopt.device = decode_device;
    dopt.speculative = speculative;
    auto d = DecodeEngine::Create(model_.get(), dopt);
    ASSERT_TRUE(d.ok()) << d.status();
    decode_ = std::move(*d);
  }
  void ExpectTokensOfTheCpuEngine() {
    const auto ref =
        testing::LoadJson(testing::SharedDir() + "/testdata/stories260K/reference.json");
    std::vector<GenerationRequest> reqs;
    // Greedy, seeded (sampled on the device by the CUDA decode worker) and seeded with
    // logprobs (sampled on the host from the downloaded logits).
    for (const auto& c : ref["greedy"]) {
      for (int kind = 0; kind < 3; ++kind) {
        GenerationRequest r;
        r.prompt = c["prompt_ids"].get<std::vector<int>>();
        r.max_tokens = 40;
        r.sampling.temperature = kind == 0 ? 0.0f : 0.8f;
        r.sampling.top_p = kind == 0 ? 1.0f : 0.9f;
        r.sampling.top_k = kind == 2 ? 50 : 0;
        r.sampling.seed = 1234;
        r.sampling.logprobs = kind == 2;
        reqs.push_back(r);
      }
    }
    const std::vector<GenerationOutput> want =
        testing::ExpectTokensOfTheEngineAlone(model_.get(), prefill_.get(), decode_.get(), reqs);
    ASSERT_EQ(want.size(), reqs.size());
    // A repeated prompt hits the prefix cache: the cached KV is packed from the device. The
    // reference prompts are shorter than a block (16), and only full blocks are cached: the
    // prompt here is the first one followed by its greedy completion (45 tokens, 2 blocks).
    GenerationRequest longer = reqs[0];
    longer.prompt.insert(longer.prompt.end(), want[0].tokens.begin(), want[0].tokens.end());
    const std::vector<GenerationRequest> longer_reqs = {longer};
    Generator alone(model_.get(), nullptr, {});
    auto want_longer = alone.Generate(longer_reqs);
    ASSERT_TRUE(want_longer.ok());
    int cached = -1;
    auto first = testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), longer, &cached);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(*first, (*want_longer)[0].tokens);
    EXPECT_EQ(cached, 0);
    auto again = testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), longer, &cached);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, (*want_longer)[0].tokens);
    EXPECT_EQ(cached, 32);  // two full blocks of 16
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvSender> sender_;
  std::unique_ptr<PrefillEngine> prefill_;
  std::unique_ptr<DecodeEngine> decode_;
};

TEST_F(CudaEnginesTest, CudaPrefillCudaDecode) {
  Start("cuda", "cuda");
  ExpectTokensOfTheCpuEngine();
}

TEST_F(CudaEnginesTest, CpuPrefillCudaDecode) {
  Start("cpu", "cuda");
  ExpectTokensOfTheCpuEngine();
}

TEST_F(CudaEnginesTest, CudaPrefillCpuDecode) {
  Start("cuda", "cpu");
  ExpectTokensOfTheCpuEngine();
}

// A speculating CUDA decode worker: verify steps (a logit row per token, drawn on the device, or
// on the host for the requests with logprobs) beside plain decode steps, the same tokens as the
// CPU engine alone.
TEST_F(CudaEnginesTest, CudaDecodeSpeculatingByPromptLookup) {
  SpeculativeConfig spec;
  spec.method = SpeculativeMethod::kNgram;
  spec.num_tokens = 5;
  Start("cuda", "cuda", spec);
  ExpectTokensOfTheCpuEngine();
  EXPECT_GT(decode_->speculation().accepted_tokens, 0);
}

}  // namespace
}  // namespace tandem
