// vLLM's /tokenizer_info body over a Hugging Face tokenizer (Qwen3's tokenizer.json and
// tokenizer_config.json from the shared test data), as lm_eval's remote tokenizer reads it: the
// special tokens' texts, which encode back to their ids, and the chat template as written.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "http/openai.h"
#include "tests/test_util.h"
#include "text/load_tokenizer.h"

namespace tandem {
namespace {

TEST(TokenizerInfoTest, SpecialTokensEncodeBackAndTheTemplateIsAsWritten) {
  const std::string dir = testing::SharedDir() + "/testdata/tokenizers/";
  auto tok = LoadTokenizer(dir + "qwen3.tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  openai::ServedModel model;
  model.id = "qwen3";
  model.max_context = 4096;
  model.tokenizer = tok->get();
  model.chat_template =
      LoadChatTemplate("", dir + "qwen3.tokenizer.json", dir + "qwen3.tokenizer_config.json");
  ASSERT_TRUE(model.chat_template.ok()) << model.chat_template.status();
  const nlohmann::ordered_json info = openai::TokenizerInfoBody(model);
  EXPECT_EQ(info["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(info["model_max_length"], 4096);
  EXPECT_EQ(info["vocab_size"], (*tok)->vocab_size());
  ASSERT_TRUE(info["eos_token"].is_string()) << info.dump();
  EXPECT_EQ(info["eos_token"], "<|im_end|>");  // tokenizer_config.json's, over the id's text
  const std::vector<int> eos = (*tok)->Encode(info["eos_token"].get<std::string>(), false);
  ASSERT_EQ(eos.size(), 1u);
  EXPECT_NE(std::find((*tok)->eos_ids().begin(), (*tok)->eos_ids().end(), eos[0]),
            (*tok)->eos_ids().end());
  ASSERT_TRUE(info["chat_template"].is_string());
  EXPECT_NE(info["chat_template"].get<std::string>().find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(info["add_bos_token"], false);  // Qwen adds no BOS
}

}  // namespace
}  // namespace tandem
