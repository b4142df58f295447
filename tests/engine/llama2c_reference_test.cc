// The engine against llama2.c itself (../shared/testdata/stories260K/reference.json, produced
// by run.c): greedy text and ids for the full length, and logits at every listed position.
#include <gtest/gtest.h>

#include "engine/generator.h"
#include "engine/loaders/model_writer.h"
#include "engine/model.h"
#include "tests/test_util.h"
#include "text/llama2c_tokenizer.h"

namespace tandem {
namespace {

using testing::LoadJson;

class Llama2cReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ref_ = LoadJson(testing::SharedDir() + "/testdata/stories260K/reference.json");
    ASSERT_TRUE(ref_.is_object()) << "reference.json missing";
    backend_ = MakeCpuBackend();
    auto model = Model::Load(testing::Stories260K(), backend_.get());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto tok = Llama2cTokenizer::Load(testing::Tok512(), model_->config().vocab_size);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
  }

  // Runs every greedy case through `model` and checks ids and text.
  void CheckGreedy(const Model& model, GeneratorOptions opts) {
    for (const auto& c : ref_["greedy"]) {
      const std::string prompt = c["prompt"];
      const std::vector<int> prompt_ids = c["prompt_ids"];
      const std::vector<int> after = c["ids_after_each_position"];
      ASSERT_EQ(tok_->Encode(prompt, true), prompt_ids) << prompt;
      GenerationRequest req;
      req.prompt = prompt_ids;
      req.sampling.temperature = 0;
      req.max_tokens = static_cast<int>(after.size() - (prompt_ids.size() - 1));
      Generator gen(&model, tok_.get(), opts);
      auto out = gen.Generate({&req, 1});
      ASSERT_TRUE(out.ok()) << out.status();
      std::vector<int> want(after.begin() + (prompt_ids.size() - 1), after.end());
      EXPECT_EQ((*out)[0].tokens, want) << "prompt \"" << prompt << "\"";
      // run.c prints the prompt's pieces, the generated pieces and a newline.
      const std::string printed = tok_->Decode(prompt_ids) + (*out)[0].text + "\n";
      EXPECT_EQ(printed, c["stdout"].get<std::string>()) << "prompt \"" << prompt << "\"";
    }
  }

  void CheckLogits(const Model& model) {
    const auto& L = ref_["logits"];
    const std::vector<int> ids = L["prompt_ids"];
    // Feed the forced tokens the reference fed (prompt, then its greedy picks), one position at
    // a time as run.c does, and compare each position's logits.
    std::vector<int> tokens;
    for (const auto& p : L["positions"]) tokens.push_back(p["token"]);
    auto cache = KvCache::Create(model.config(), 64, 16);
    ASSERT_TRUE(cache.ok());
    std::vector<int> table(64);
    for (int i = 0; i < 64; ++i) table[i] = i;
    std::vector<float> logits;
    int checked = 0;
    for (const auto& p : L["positions"]) {
      const int pos = p["pos"];
      SequenceChunk chunk{std::span<const int>(&tokens[pos], 1), pos, table, false};
      ASSERT_TRUE(model.Forward({&chunk, 1}, &*cache, &logits).ok());
      const std::vector<float> want = p["logits"];
      ASSERT_EQ(logits.size(), want.size());
      float max_err = 0;
      for (size_t v = 0; v < want.size(); ++v)
        max_err = std::max(max_err, std::abs(logits[v] - want[v]));
      // 1e-3 absolute: the reference's suggested tolerance; float32 sums in a different order
      // differ by ~1e-5 on logits of magnitude ~10.
      EXPECT_LT(max_err, 1e-3f) << "position " << pos;
      EXPECT_EQ(Argmax(logits), p["argmax"].get<int>()) << "position " << pos;
      ++checked;
    }
    EXPECT_EQ(checked, 8);
  }

  nlohmann::json ref_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Llama2cTokenizer> tok_;
};

TEST_F(Llama2cReferenceTest, GreedyTextAndIdsMatchRunC) { CheckGreedy(*model_, {}); }

TEST_F(Llama2cReferenceTest, LogitsMatchRunC) { CheckLogits(*model_); }

TEST_F(Llama2cReferenceTest, ConfigFromHeader) {
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{1});
}

// The same model converted to a Hugging Face directory (q/k permuted for rotate-half RoPE) and
// loaded through the HF path gives the same tokens and logits.
TEST_F(Llama2cReferenceTest, ConvertedHfModelMatches) {
  testing::TempDir dir;
  ASSERT_TRUE(ConvertLlama2cToHf(testing::Stories260K(), dir.path()).ok());
  auto hf = Model::Load(dir.path(), backend_.get());
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ((*hf)->config().rope_style, RopeStyle::kHalf);
  EXPECT_EQ((*hf)->config().architecture, "LlamaForCausalLM");
  CheckGreedy(**hf, {});
  CheckLogits(**hf);
}

}  // namespace
}  // namespace tandem
