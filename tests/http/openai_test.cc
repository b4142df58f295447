// The OpenAI translation layer without sockets: request bodies to GenerateRequest (every bad field
// named), the one status-to-HTTP mapping, the router ingress's field names renamed to OpenAI's,
// chat prompts through the model's template, and the response shapes (JSON and SSE).
// The Llama 3, Mistral-Instruct and Qwen3 templates themselves are checked byte for byte against
// jinja2 in tests/text/chat_template/chat_template_test.cc; unsupported Jinja in jinja_test.cc.
#include "http/openai.h"

#include <gtest/gtest.h>

#include <random>

#include "engine/sampling/output_constraint.h"
#include "engine/sampling/sampler.h"
#include "http/responses.h"
#include "router/ingress.h"
#include "structured/json_matcher.h"
#include "tests/test_util.h"
#include "text/llama2c_tokenizer.h"

namespace tandem::openai {
namespace {

using Json = nlohmann::ordered_json;

class OpenAiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = std::move(*Llama2cTokenizer::Load(testing::Tok512(), 512));
    model_.id = "stories260K";
    model_.max_context = 512;
    model_.tokenizer = tokenizer_.get();
    // A Llama 3 style template (as in chat_template_test.cc) over this model's tokenizer.
    model_.chat_template = TokenizerChatTemplate::FromConfig(Json{
        {"bos_token", "<s>"},
        {"chat_template",
         "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] | "
         "trim + '<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' "
         "}}{% endif %}"}}.dump());
    ASSERT_TRUE(model_.chat_template.ok()) << model_.chat_template.status();
  }

  absl::StatusOr<Request> Parse(Endpoint e, const std::string& body) {
    return ParseRequest(e, body, model_, /*random_seed=*/99);
  }

  // Serves tests/fixtures/chat/qwen2.5_tools.jinja, a template that renders tools and tool
  // calls, instead of the plain one.
  void UseQwenToolsTemplate() {
    auto source =
        ReadFileToString(testing::SourceDir() + "/tests/fixtures/chat/qwen2.5_tools.jinja");
    ASSERT_TRUE(source.ok());
    model_.chat_template = TokenizerChatTemplate::FromConfig(
        Json{{"chat_template", *source}, {"eos_token", "<|im_end|>"}}.dump());
    ASSERT_TRUE(model_.chat_template.ok()) << model_.chat_template.status();
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  ServedModel model_;
};

TEST_F(OpenAiTest, CompletionFieldsBecomeAGenerateRequest) {
  auto r = Parse(Endpoint::kCompletions,
                 R"({"model": "stories260K", "prompt": "Once upon", "max_tokens": 7,
                     "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 3, "stop": ["a", "b"],
                     "n": 1, "stream": true, "stream_options": {"include_usage": true},
                     "logprobs": 2, "ignore_eos": true, "user": "x", "presence_penalty": 0.5,
                     "frequency_penalty": -0.25, "repetition_penalty": 1.1, "min_tokens": 3,
                     "logit_bias": {"5": -100, "17": 2.5}})");
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::GenerateRequest& g = r->generate;
  EXPECT_EQ(g.text(), "Once upon");
  EXPECT_EQ(g.max_tokens(), 7);
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().top_k(), 40);
  EXPECT_EQ(g.sampling().seed(), 3u);
  EXPECT_TRUE(g.sampling().logprobs());
  EXPECT_EQ(g.sampling().top_logprobs(), 2);
  ASSERT_EQ(g.stop_size(), 2);
  EXPECT_EQ(g.stop(1), "b");
  EXPECT_TRUE(g.ignore_eos());
  EXPECT_FALSE(g.disable_speculation());
  EXPECT_FLOAT_EQ(g.sampling().presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().frequency_penalty(), -0.25f);
  EXPECT_FLOAT_EQ(g.sampling().repetition_penalty(), 1.1f);
  EXPECT_EQ(g.sampling().min_tokens(), 3);
  ASSERT_EQ(g.sampling().logit_bias_size(), 2);
  EXPECT_FLOAT_EQ(g.sampling().logit_bias().at(5), -100.0f);
  EXPECT_FLOAT_EQ(g.sampling().logit_bias().at(17), 2.5f);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);

  // Defaults: 16 tokens, an unseeded request gets the random seed, no logprobs.
  r = Parse(Endpoint::kCompletions, R"({"prompt": [1, 2, 3], "stop": "x"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.tokens().ids_size(), 3);
  EXPECT_EQ(r->generate.max_tokens(), 16);
  EXPECT_EQ(r->generate.sampling().seed(), 99u);
  EXPECT_FALSE(r->generate.sampling().has_temperature());
  EXPECT_FALSE(r->generate.sampling().logprobs());
  EXPECT_EQ(r->generate.stop(0), "x");
  // "speculative": false opts the request out of the decode workers' speculative decoding.
  r = Parse(Endpoint::kCompletions, R"({"prompt": "a", "speculative": false})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->generate.disable_speculation());
  // vLLM's "priority": the request's place among its tenant's waiting requests.
  EXPECT_EQ(r->generate.priority(), 0);
  r = Parse(Endpoint::kCompletions, R"({"prompt": "a", "priority": -5})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.priority(), -5);
  r = Parse(Endpoint::kChatCompletions,
            R"({"messages": [{"role": "user", "content": "a"}], "priority": 3})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.priority(), 3);
  r = Parse(Endpoint::kCompletions, R"({"prompt": "a", "priority": "high"})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("priority"), std::string::npos) << r.status();
  r = Parse(Endpoint::kCompletions, R"({"prompt": ["one"]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generate.text(), "one");
  r = Parse(Endpoint::kCompletions, R"({"prompt": [[5, 6]], "seed": -1})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generate.tokens().ids(1), 6);
  EXPECT_EQ(r->generate.sampling().seed(), ~uint64_t{0});

  // response_format: the schema travels as JSON text; json_object is any object; text is none.
  r = Parse(Endpoint::kChatCompletions,
            R"({"messages": [{"role": "user", "content": "a"}], "response_format": {
                "type": "json_schema", "json_schema": {"name": "p", "strict": true,
                "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(
      nlohmann::json::parse(r->generate.sampling().json_schema()),
      nlohmann::json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}})"));
  r = Parse(Endpoint::kCompletions,
            R"({"prompt": "a", "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.sampling().json_schema(), kJsonObjectSchema);
  r = Parse(Endpoint::kCompletions, R"({"prompt": "a", "response_format": {"type": "text"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.sampling().json_schema(), "");
}

TEST_F(OpenAiTest, ChatRendersTheTemplateAndTokenizesWithoutSpecialTokens) {
  auto r = Parse(Endpoint::kChatCompletions,
                 R"({"messages": [{"role": "system", "content": " Be brief. "},
                                  {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                               {"type": "text", "text": "there"}]}],
                     "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 3})");
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string rendered =
      "<|system|>\nBe brief.<|end|>\n<|user|>\nHi\nthere<|end|>\n<|assistant|>\n";
  const std::vector<int> want = tokenizer_->Encode(rendered, /*add_special_tokens=*/false);
  EXPECT_EQ(std::vector<int>(r->generate.tokens().ids().begin(), r->generate.tokens().ids().end()),
            want);
  EXPECT_EQ(r->generate.max_tokens(), 9);
  EXPECT_EQ(r->max_tokens_param, "max_completion_tokens");
  EXPECT_TRUE(r->generate.sampling().logprobs());
  EXPECT_EQ(r->generate.sampling().top_logprobs(), 3);
  // Without max tokens, chat runs to the end of the context, at most chat_default_max_tokens.
  r = Parse(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generate.max_tokens(), 512 - r->generate.tokens().ids_size());
  model_.chat_default_max_tokens = 100;
  r = Parse(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->generate.max_tokens(), 100);
}

// n and several prompts: every prompt n times, prompt-major, choice i seeded ChoiceSeed(seed, i).
TEST_F(OpenAiTest, ChoicesAreEveryPromptNTimes) {
  auto r = Parse(Endpoint::kCompletions,
                 R"({"prompt": ["one", "two"], "n": 3, "seed": 5, "echo": true})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->choices.size(), 6u);
  EXPECT_EQ(r->n, 3);
  EXPECT_TRUE(r->echo);
  for (int p = 0; p < 2; ++p) {
    for (int i = 0; i < 3; ++i) {
      const v1::GenerateRequest& c = r->choices[p * 3 + i];
      EXPECT_EQ(c.text(), p == 0 ? "one" : "two");
      EXPECT_EQ(c.sampling().seed(), ChoiceSeed(5, i));
    }
  }
  EXPECT_EQ(r->choices[0].SerializeAsString(), r->generate.SerializeAsString());
  EXPECT_EQ(ChoiceSeed(5, 0), 5u);
  EXPECT_NE(ChoiceSeed(5, 1), ChoiceSeed(5, 2));
  r = Parse(Endpoint::kCompletions, R"({"prompt": [[1, 2], [3]]})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->choices.size(), 2u);
  EXPECT_EQ(r->choices[1].tokens().ids_size(), 1);
  r = Parse(Endpoint::kChatCompletions,
            R"({"messages": [{"role": "user", "content": "x"}], "n": 2})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->choices.size(), 2u);
  EXPECT_EQ(r->choices[1].tokens().ids_size(), r->generate.tokens().ids_size());
}

// Each bad body: the HTTP status and the parameter named.
TEST_F(OpenAiTest, BadFieldsAreNamed) {
  struct Case {
    Endpoint endpoint;
    std::string body;
    int http_status;
    std::string param;  // "" for null
  };
  const Endpoint kC = Endpoint::kCompletions, kChat = Endpoint::kChatCompletions;
  const std::vector<Case> cases = {
      {kC, "{not json", 400, ""},
      {kC, "[1, 2]", 400, ""},
      {kC, R"({"prompt": "a", "model": "gpt-4"})", 404, "model"},
      {kC, R"({"prompt": "a", "model": 5})", 400, "model"},
      {kC, R"({})", 400, "prompt"},
      {kC, R"({"prompt": 5})", 400, "prompt"},
      {kC, R"({"prompt": ["a", 5]})", 400, "prompt"},
      {kC, R"({"prompt": [[1], []]})", 400, "prompt"},
      {kC, R"({"prompt": [1, "b"]})", 400, "prompt"},
      {kC, R"({"prompt": "a", "max_tokens": "3"})", 400, "max_tokens"},
      {kC, R"({"prompt": "a", "max_tokens": 1e20})", 400, "max_tokens"},
      {kC, R"({"prompt": "a", "temperature": "hot"})", 400, "temperature"},
      {kC, R"({"prompt": "a", "top_p": [1]})", 400, "top_p"},
      {kC, R"({"prompt": "a", "top_k": 1.5})", 400, "top_k"},
      {kC, R"({"prompt": "a", "seed": 1.5})", 400, "seed"},
      {kC, R"({"prompt": "a", "stop": 3})", 400, "stop"},
      {kC, R"({"prompt": "a", "stop": ["x", 3]})", 400, "stop"},
      {kC, R"({"prompt": "a", "n": 0})", 400, "n"},
      {kC, R"({"prompt": "a", "n": 65})", 400, "n"},
      {kC, R"({"prompt": ["a", "b", "c"], "n": 22})", 400, "n"},
      {kC, R"({"prompt": "a", "echo": "yes"})", 400, "echo"},
      {kC, R"({"prompt": "a", "speculative": "no"})", 400, "speculative"},
      {kC, R"({"prompt": "a", "max_tokens": 0})", 400, "max_tokens"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": 0})", 400,
       "max_tokens"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 0})",
       400, "max_completion_tokens"},
      {kC, R"({"prompt": "a", "prompt_logprobs": 21})", 400, "prompt_logprobs"},
      {kC, R"({"prompt": "a", "prompt_logprobs": true})", 400, "prompt_logprobs"},
      {kC, R"({"prompt": "a", "prompt_logprobs": 1, "stream": true})", 400, "prompt_logprobs"},
      {kC, R"({"prompt": "a", "guided_regex": ["[a-z]+"]})", 400, "guided_regex"},
      {kC, R"({"prompt": "a", "guided_regex": "[a-z]+", "guided_choice": ["a"]})", 400,
       "guided_regex"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "guided_grammar": "root ::= x"})",
       400, "guided_grammar"},
      {kC, R"({"prompt": "a", "guided_whitespace_pattern": " "})", 400,
       "guided_whitespace_pattern"},
      {kC, R"({"prompt": "a", "structural_tag": "{}"})", 400, "structural_tag"},
      {kC, R"({"prompt": "a", "structured_outputs": {"regex": 5}})", 400,
       "structured_outputs.regex"},
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}], "structured_outputs": {"grammar": "x"}})",
       400, "structured_outputs.grammar"},
      {kC, R"({"prompt": "a", "structured_outputs": {"cfg": "x"}})", 400, "structured_outputs.cfg"},
      {kC, R"({"prompt": "a", "structured_outputs": {"disable_additional_properties": true}})", 400,
       "structured_outputs.disable_additional_properties"},
      {kC, R"({"prompt": "a", "structured_outputs": "json"})", 400, "structured_outputs"},
      {kC, R"({"prompt": "a", "guided_json": 5})", 400, "guided_json"},
      {kC, R"({"prompt": "a", "guided_choice": "yes"})", 400, "guided_choice"},
      {kC, R"({"prompt": "a", "guided_choice": []})", 400, "guided_choice"},
      {kC, R"({"prompt": "a", "guided_choice": ["a", 1]})", 400, "guided_choice"},
      {kC, R"({"prompt": "a", "guided_choice": ["a"], "guided_json": {}})", 400, "guided_choice"},
      {kC, R"({"prompt": "a", "guided_choice": ["a"], "structured_outputs": {"json": {}}})", 400,
       "structured_outputs.json"},
      {kC, R"({"prompt": "a", "guided_json": {}, "response_format": {"type": "json_object"}})", 400,
       "guided_json"},
      {kC, R"({"prompt": "a", "guided_decoding_backend": 1})", 400, "guided_decoding_backend"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "echo": true})", 400, "echo"},
      {kC, R"({"prompt": "a", "stream": "yes"})", 400, "stream"},
      {kC, R"({"prompt": "a", "stream_options": {"include_usage": true}})", 400, "stream_options"},
      {kC, R"({"prompt": "a", "stream": true, "stream_options": {"include_usage": 1}})", 400,
       "stream_options.include_usage"},
      {kC, R"({"prompt": "a", "logprobs": true})", 400, "logprobs"},
      {kC, R"({"prompt": "a", "n": 3, "best_of": 2})", 400, "best_of"},
      {kC, R"({"prompt": "a", "best_of": 3, "stream": true})", 400, "best_of"},
      {kC, R"({"prompt": ["a", "b"], "best_of": 40})", 400, "best_of"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "best_of": 2})", 400, "best_of"},
      {kC, R"({"prompt": "a", "presence_penalty": "x"})", 400, "presence_penalty"},
      {kC, R"({"prompt": "a", "frequency_penalty": [1]})", 400, "frequency_penalty"},
      {kC, R"({"prompt": "a", "repetition_penalty": true})", 400, "repetition_penalty"},
      {kC, R"({"prompt": "a", "min_tokens": 1.5})", 400, "min_tokens"},
      {kC, R"({"prompt": "a", "logit_bias": [1]})", 400, "logit_bias"},
      {kC, R"({"prompt": "a", "logit_bias": {"a": 1}})", 400, "logit_bias"},
      {kC, R"({"prompt": "a", "logit_bias": {"-5": 1}})", 400, "logit_bias"},
      {kC, R"({"prompt": "a", "logit_bias": {"99999999999": 1}})", 400, "logit_bias"},
      {kC, R"({"prompt": "a", "logit_bias": {"5": "x"}})", 400, "logit_bias"},
      {kC, R"({"prompt": "a", "suffix": "z"})", 400, "suffix"},
      {kChat, R"({})", 400, "messages"},
      {kChat, R"({"messages": []})", 400, "messages"},
      {kChat, R"({"messages": ["hi"]})", 400, "messages[0]"},
      {kChat, R"({"messages": [{"content": "hi"}]})", 400, "messages[0].role"},
      {kChat, R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages[0].content"},
      {kChat, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", 400,
       "messages[0].content[0].type"},
      {kChat,
       R"({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"type":
           "function", "function": {"name": "f", "arguments": "{\"x\": "}}]}]})",
       400, "messages[0].tool_calls[0].function.arguments"},
      {kChat,
       R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function":
           {"name": "f", "arguments": 5}}]}]})",
       400, "messages[0].tool_calls[0].function.arguments"},
      {kChat, R"({"messages": [{"role": "assistant", "tool_calls": {"id": "x"}}]})", 400,
       "messages[0].tool_calls"},
      {kChat, R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]})", 400,
       "messages[0].tool_calls[0].function"},
      {kChat,
       R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]})",
       400, "messages[0].tool_calls[0].function.name"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "logprobs": 1})", 400,
       "logprobs"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})", 400,
       "top_logprobs"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": "x"})",
       400, "max_completion_tokens"},
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]})", 400,
       "tools[0].function.name"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "x"}]})", 400,
       "tools[0].type"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "tools": 5})", 400, "tools"},
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}], "tool_choice": "always",
           "tools": [{"type": "function", "function": {"name": "f"}}]})",
       400, "tool_choice"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "tool_choice": "required"})", 400,
       "tool_choice"},
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}],
           "tool_choice": {"type": "function", "function": {"name": "g"}},
           "tools": [{"type": "function", "function": {"name": "f"}}]})",
       400, "tool_choice.function.name"},
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}], "tool_choice": "required",
           "tools": [{"type": "function", "function": {"name": "f", "parameters":
           {"type": "object", "properties": {"x": {"type": "integer", "minimum": 1}}}}}]})",
       400, "tools[0].function.parameters"},
      // A forced call whose parameters no finite value satisfies, or whose references go round
      // without a schema: named by the tool's index.
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}],
           "tool_choice": {"type": "function", "function": {"name": "g"}}, "tools": [
           {"type": "function", "function": {"name": "f"}},
           {"type": "function", "function": {"name": "g", "parameters": {"type": "object",
           "properties": {"x": {"$ref": "#/$defs/t"}}, "required": ["x"], "$defs": {"t":
           {"type": "array", "items": {"$ref": "#/$defs/t"}, "minItems": 1}}}}}]})",
       400, "tools[1].function.parameters"},
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}], "tool_choice": "required",
           "tools": [{"type": "function", "function": {"name": "f", "parameters":
           {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "$defs": {
           "a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}}}]})",
       400, "tools[0].function.parameters"},
      // "required" over several tools: each tool's parameters are checked, and named; two
      // tools of one name cannot be told apart.
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}], "tool_choice": "required",
           "tools": [{"type": "function", "function": {"name": "f"}},
           {"type": "function", "function": {"name": "g", "parameters": {"type": "object",
           "properties": {"x": {"type": "integer", "minimum": 1}}}}}]})",
       400, "tools[1].function.parameters"},
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}], "tool_choice": "required",
           "tools": [{"type": "function", "function": {"name": "f"}},
           {"type": "function", "function": {"name": "f"}}]})",
       400, "tools[1].function.name"},
      // functions is the legacy chat API; completions never had it.
      {kC, R"({"prompt": "a", "functions": [{"name": "f"}]})", 400, "functions"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "functions": [{"name": "f"}]})",
       400, "functions"},
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}], "tool_choice": "required",
           "response_format": {"type": "json_object"},
           "tools": [{"type": "function", "function": {"name": "f"}}]})",
       400, "response_format"},
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "xml"}})",
       400, "response_format.type"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "response_format": "json"})", 400,
       "response_format"},
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}],
           "response_format": {"type": "json_schema"}})",
       400, "response_format.json_schema"},
      {kChat,
       R"({"messages": [{"role": "user", "content": "a"}],
           "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})",
       400, "response_format.json_schema.schema"},
      {kChat, R"({"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": 1})", 400,
       "chat_template_kwargs"},
  };
  for (const Case& c : cases) {
    auto r = Parse(c.endpoint, c.body);
    ASSERT_FALSE(r.ok()) << c.body;
    const ApiError e = ToApiError(r.status(), nullptr);
    EXPECT_EQ(e.http_status, c.http_status) << c.body << ": " << e.message;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    if (!c.param.empty()) {
      EXPECT_TRUE(e.message.starts_with(c.param + ": ")) << e.message;
    }
    const Json body = Json::parse(ErrorBody(e));
    EXPECT_EQ(body["error"]["message"], e.message);
    EXPECT_EQ(body["error"]["type"], e.type);
    if (c.param.empty()) {
      EXPECT_TRUE(body["error"]["param"].is_null());
    } else {
      EXPECT_EQ(body["error"]["param"], c.param);
    }
  }
}

// Bodies over the JSON limits are 400 naming the object or the place (http/json_limits.h), and
// large objects within them parse in linear time: 4096 keys in each of many objects, the chat
// template given every one of them, costs no more than their bytes.
TEST_F(OpenAiTest, JsonLimitsAreNamedAndLargeObjectsParseLinearly) {
  auto keys = [](int n) {
    std::string out = "{";
    for (int i = 0; i < n; ++i) absl::StrAppend(&out, i ? ", " : "", "\"", i, "\": 1");
    return out + "}";
  };
  absl::StatusOr<Request> r = Parse(
      Endpoint::kCompletions, absl::StrCat(R"({"prompt": "a", "logit_bias": )", keys(5000), "}"));
  ASSERT_FALSE(r.ok());
  ApiError e = ToApiError(r.status(), nullptr);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "logit_bias");
  EXPECT_EQ(e.message, "logit_bias: a JSON object with more than 4096 keys");
  // Within the limits: 64 messages of 4096 keys each reach the template (as dicts, linearly).
  std::string messages = "[";
  for (int i = 0; i < 64; ++i) {
    std::string m = keys(4094);
    m.pop_back();
    absl::StrAppend(&messages, i ? ", " : "", m, R"(, "role": "user", "content": "hi"})");
  }
  r = Parse(Endpoint::kChatCompletions, absl::StrCat(R"({"messages": )", messages, "]}"));
  EXPECT_TRUE(r.ok()) << r.status();
  // A client gone while its body is parsed: the parse stops, CANCELLED.
  std::string prompt = R"({"prompt": [)";
  for (int i = 0; i < 100000; ++i) absl::StrAppend(&prompt, i ? ",1" : "1");
  int polls = 0;
  r = ParseRequest(Endpoint::kCompletions, prompt + "]}", model_, 99, [&] { return ++polls > 1; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
}

// Range checks belong to the router's ingress; its field names come back as OpenAI's.
// A field Tandem does not know is ignored and logged once by name, not once per request.
TEST_F(OpenAiTest, UnknownFieldsAreLoggedOnce) {
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Parse(Endpoint::kCompletions,
                      R"({"prompt": "a", "frobnicate_level": 3, "user": "u", "metadata": {}})")
                    .ok());
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(log, "[tandem-http] ignoring the unknown request field \"frobnicate_level\"\n");
}

TEST_F(OpenAiTest, IngressErrorsNameTheOpenAiParameter) {
  ModelConfig config;
  config.vocab_size = 512;
  config.max_seq_len = 512;
  struct Case {
    Endpoint endpoint;
    std::string body;
    std::string param;
  };
  const std::vector<Case> cases = {
      {Endpoint::kCompletions, R"({"prompt": "a", "temperature": -1})", "temperature"},
      {Endpoint::kCompletions, R"({"prompt": "a", "top_p": 1.5})", "top_p"},
      {Endpoint::kCompletions, R"({"prompt": "a", "top_k": -2})", "top_k"},
      {Endpoint::kCompletions, R"({"prompt": "a", "max_tokens": -1})", "max_tokens"},
      {Endpoint::kCompletions, R"({"prompt": "a", "logprobs": 21})", "logprobs"},
      {Endpoint::kCompletions, R"({"prompt": ""})", "prompt"},
      {Endpoint::kCompletions, R"({"prompt": [600]})", "prompt"},
      {Endpoint::kCompletions, R"({"prompt": "a", "stop": [""]})", "stop"},
      {Endpoint::kCompletions, R"({"prompt": "a", "presence_penalty": 3})", "presence_penalty"},
      {Endpoint::kCompletions, R"({"prompt": "a", "frequency_penalty": -2.5})",
       "frequency_penalty"},
      {Endpoint::kCompletions, R"({"prompt": "a", "repetition_penalty": 0})", "repetition_penalty"},
      {Endpoint::kCompletions, R"({"prompt": "a", "min_tokens": -1})", "min_tokens"},
      {Endpoint::kCompletions, R"({"prompt": "a", "min_tokens": 17})", "min_tokens"},
      {Endpoint::kCompletions, R"({"prompt": "a", "logit_bias": {"600": 1}})", "logit_bias"},
      {Endpoint::kCompletions, R"({"prompt": "a", "logit_bias": {"5": 200}})", "logit_bias"},
      {Endpoint::kCompletions,
       R"({"prompt": "a", "response_format": {"type": "json_schema",
           "json_schema": {"schema": {"type": "integer", "minimum": 1}}}})",
       "response_format"},
      {Endpoint::kCompletions,
       R"({"prompt": "a", "response_format": {"type": "json_object"}, "min_tokens": 2})",
       "min_tokens"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "a"}], "logprobs": true, "top_logprobs": 21})",
       "top_logprobs"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": -1})",
       "max_completion_tokens"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "a"}], "max_tokens": 9999})", "max_tokens"},
      {Endpoint::kCompletions,
       R"({"prompt": "a", "guided_json": {"type": "string", "minimum": 1}})", "guided_json"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "a"}], "guided_json": "{\"pattern\": 1}"})",
       "guided_json"},
      {Endpoint::kCompletions, R"({"prompt": "a", "guided_choice": ["a", ""]})", "guided_choice"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "a"}], "structured_outputs": {"choice": ["x"]},
           "stop": ["y"]})",
       "stop"},
      {Endpoint::kChatCompletions,
       R"({"messages": [{"role": "user", "content": "a"}],
           "structured_outputs": {"json": {"type": "object", "not": {}}}})",
       "structured_outputs.json"},
      {Endpoint::kCompletions, R"({"prompt": "a", "guided_choice": ["a"], "ignore_eos": true})",
       "ignore_eos"},
  };
  for (const Case& c : cases) {
    auto r = Parse(c.endpoint, c.body);
    ASSERT_TRUE(r.ok()) << c.body << ": " << r.status();
    auto checked = ValidateGenerateRequest(r->generate, config, *tokenizer_);
    ASSERT_FALSE(checked.ok()) << c.body;
    const ApiError e = ToApiError(checked.status(), &*r);
    EXPECT_EQ(e.http_status, 400);
    EXPECT_EQ(e.param, c.param) << c.body << ": " << checked.status();
    EXPECT_TRUE(e.message.starts_with(c.param + ": ")) << e.message;
  }
}

TEST_F(OpenAiTest, StatusCodesMapToHttp) {
  const std::vector<std::pair<grpc::StatusCode, int>> cases = {
      {grpc::StatusCode::INVALID_ARGUMENT, 400},
      {grpc::StatusCode::OUT_OF_RANGE, 400},
      {grpc::StatusCode::FAILED_PRECONDITION, 400},
      {grpc::StatusCode::UNAUTHENTICATED, 401},
      {grpc::StatusCode::PERMISSION_DENIED, 403},
      {grpc::StatusCode::NOT_FOUND, 404},
      {grpc::StatusCode::ALREADY_EXISTS, 409},
      {grpc::StatusCode::RESOURCE_EXHAUSTED, 429},
      {grpc::StatusCode::CANCELLED, 499},
      {grpc::StatusCode::UNIMPLEMENTED, 501},
      {grpc::StatusCode::UNAVAILABLE, 503},
      {grpc::StatusCode::DEADLINE_EXCEEDED, 504},
      {grpc::StatusCode::INTERNAL, 500},
      {grpc::StatusCode::UNKNOWN, 500},
      {grpc::StatusCode::DATA_LOSS, 500},
  };
  for (const auto& [code, http] : cases) {
    const ApiError e = ToApiError(grpc::Status(code, "something went wrong"), nullptr);
    EXPECT_EQ(e.http_status, http) << code;
    EXPECT_EQ(e.message, "something went wrong");
    EXPECT_TRUE(e.param.empty());
    EXPECT_EQ(e.type.empty(), false);
  }
  EXPECT_EQ(ToApiError(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "busy"), nullptr).type,
            "rate_limit_error");
  // Only a request's fault names a field.
  const ApiError full = ToApiError(
      grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "router: 3 in flight"), nullptr);
  EXPECT_TRUE(full.param.empty());
  EXPECT_EQ(full.message, "router: 3 in flight");
}

TEST_F(OpenAiTest, UnusableChatTemplatesAreClearErrors) {
  model_.chat_template = absl::NotFoundError("no chat template");
  auto r = Parse(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "a"}]})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(ToApiError(r.status(), nullptr).http_status, 400);
  EXPECT_NE(r.status().message().find("no chat template"), std::string::npos);
  // A template using Jinja the engine does not implement: the server's fault, named.
  model_.chat_template =
      TokenizerChatTemplate::FromConfig(R"({"chat_template": "{% include 'x.jinja' %}"})");
  ASSERT_FALSE(model_.chat_template.ok());
  r = Parse(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "a"}]})");
  ASSERT_FALSE(r.ok());
  const ApiError e = ToApiError(r.status(), nullptr);
  EXPECT_EQ(e.http_status, 501);
  EXPECT_NE(e.message.find("include"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("line 1"), std::string::npos) << e.message;
  // raise_exception() in a template: the request's fault, with the template's message.
  model_.chat_template = TokenizerChatTemplate::FromConfig(
      R"({"chat_template": "{{ raise_exception('Conversation roles must alternate') }}"})");
  ASSERT_TRUE(model_.chat_template.ok());
  r = Parse(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "a"}]})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(ToApiError(r.status(), nullptr).param, "messages");
  EXPECT_NE(r.status().message().find("Conversation roles must alternate"), std::string::npos);
}

v1::GenerateResponse Message(std::vector<int> ids, std::string text, bool last) {
  v1::GenerateResponse m;
  m.set_request_id("req-7");
  for (int id : ids) {
    m.add_token_ids(id);
    v1::TokenLogprobs* l = m.add_logprobs();
    l->set_logprob(-0.5f);
    v1::TopLogprob* t = l->add_top();
    t->set_token_id(id);
    t->set_logprob(-0.5f);
  }
  m.set_text(std::move(text));
  if (last) {
    m.set_finish_reason(v1::FINISH_REASON_LENGTH);
    m.mutable_usage()->set_prompt_tokens(4);
    m.mutable_usage()->set_completion_tokens(3);
  }
  return m;
}

std::vector<Json> Events(const std::string& sse) {
  std::vector<Json> out;
  size_t p = 0;
  while ((p = sse.find("data: ", p)) != std::string::npos) {
    const size_t end = sse.find("\n\n", p);
    const std::string data = sse.substr(p + 6, end - p - 6);
    out.push_back(data == "[DONE]" ? Json("[DONE]") : Json::parse(data));
    p = end;
  }
  return out;
}

TEST_F(OpenAiTest, ChatResponsesInBothShapes) {
  auto r = Parse(Endpoint::kChatCompletions,
                 R"({"messages": [{"role": "user", "content": "a"}], "logprobs": true,
                     "top_logprobs": 1, "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(r.ok()) << r.status();
  ResponseBuilder b(*r, model_, 1700000000);
  std::vector<Json> events = Events(b.Add(Message({300}, "He", false)));
  ASSERT_EQ(events.size(), 2u);  // the role, then the content
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["id"], "chatcmpl-req-7");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(events[0]["usage"].is_null());
  EXPECT_EQ(events[1]["choices"][0]["delta"]["content"], "He");
  const Json& lp = events[1]["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], ToValidUtf8(tokenizer_->Decode(std::vector<int>{300})));
  EXPECT_FLOAT_EQ(lp["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(lp["top_logprobs"].size(), 1u);
  events = Events(b.Add(Message({301, 302}, "llo", true)));
  ASSERT_EQ(events.size(), 2u);  // the content, then the finish reason
  EXPECT_EQ(events[1]["choices"][0]["finish_reason"], "length");
  events = Events(b.StreamEnd());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[0]["choices"].empty());
  EXPECT_EQ(events[0]["usage"]["total_tokens"], 7);
  EXPECT_EQ(events[1], "[DONE]");

  r->stream = false;
  ResponseBuilder whole(*r, model_, 1700000000);
  EXPECT_EQ(whole.Add(Message({300}, "He", false)), "");
  whole.Add(Message({301, 302}, "llo", true));
  const Json body = Json::parse(whole.Body());
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][0]["logprobs"]["content"].size(), 3u);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
}

TEST(ToolCallParserTest, BlocksBecomeCallsWhereverTheTextIsCut) {
  const std::string text =
      "Let me check. <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}</tool_call>\n<tool_call>{\"name\": \"now\"}</tool_call> <tool_call>not "
      "json</tool_call> a < b <tool";
  // Every split of the text into two pieces gives the same content and calls.
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ToolCallParser p("r");
    std::string content = p.Add(text.substr(0, cut));
    content += p.Add(text.substr(cut));
    content += p.Flush();
    const auto calls = p.TakeCalls();
    ASSERT_EQ(calls.size(), 2u) << cut;
    EXPECT_EQ(calls[0]["id"], "call_r_0");
    EXPECT_EQ(calls[0]["type"], "function");
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(calls[0]["function"]["arguments"], R"({"city":"Paris"})");
    EXPECT_EQ(calls[1]["function"]["name"], "now");
    EXPECT_EQ(calls[1]["function"]["arguments"], "{}");
    EXPECT_EQ(content, "Let me check. \n <tool_call>not json</tool_call> a < b <tool") << cut;
    EXPECT_EQ(p.total_calls(), 2);
  }
  // Text that might start a tag is held back until it cannot.
  ToolCallParser p("r");
  EXPECT_EQ(p.Add("ok <tool_"), "ok ");
  EXPECT_EQ(p.Add("x"), "<tool_x");
  EXPECT_EQ(p.Add("<tool_call>{\"name\": \"f\""), "");
  EXPECT_EQ(p.Flush(), "<tool_call>{\"name\": \"f\"");  // unterminated, not a call: text
  EXPECT_TRUE(p.TakeCalls().empty());
  // An unterminated last block that holds a whole call is the call (a forced call ends at its
  // value; a model may stop before the closing tag), as vLLM's Hermes parser takes it.
  ToolCallParser q("q");
  EXPECT_EQ(q.Add("<tool_call>\n{\"name\":\"f\",\"arguments\":{\"x\":1}}"), "");
  EXPECT_EQ(q.Flush(), "");
  const auto calls = q.TakeCalls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["name"], "f");
  EXPECT_EQ(calls[0]["function"]["arguments"], R"({"x":1})");
}

TEST_F(OpenAiTest, ToolsReachTheTemplateAndCallsComeBackInBothShapes) {
  model_.chat_template = TokenizerChatTemplate::FromConfig(Json{
      {"chat_template",
       "{% if tools %}{% for t in tools %}tool {{ t['function']['name'] }}\n{% endfor %}{% endif "
       "%}{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"}}
                                                               .dump());
  ASSERT_TRUE(model_.chat_template.ok());
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "get_weather", "parameters":
         {"type": "object", "properties": {"city": {"type": "string"}}}}}])";
  auto r = Parse(Endpoint::kChatCompletions,
                 R"({"messages": [{"role": "user", "content": "hi"}], )" + tools + "}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->parse_tool_calls);
  const std::string prompt = tokenizer_->Decode(
      std::vector<int>(r->generate.tokens().ids().begin(), r->generate.tokens().ids().end()));
  EXPECT_NE(prompt.find("tool get_weather\nuser: hi\n"), std::string::npos) << prompt;
  // tool_choice "none": no tools rendered, nothing parsed.
  auto none = Parse(
      Endpoint::kChatCompletions,
      R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "none", )" + tools + "}");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->parse_tool_calls);
  EXPECT_LT(none->generate.tokens().ids_size(), r->generate.tokens().ids_size());

  // A forced call: one Hermes block whose JSON names the function, with its parameters' schema
  // (the $defs moved to the top); "required" with several tools: any of their names.
  auto forced = Parse(Endpoint::kChatCompletions,
                      R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice":
                {"type": "function", "function": {"name": "get_weather"}}, )" +
                          tools + "}");
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_TRUE(forced->parse_tool_calls);
  const v1::SamplingParams& fs = forced->generate.sampling();
  EXPECT_EQ(fs.json_prefix(), "<tool_call>\n");
  EXPECT_EQ(fs.json_suffix(), "") << "the block ends at its value (the parser takes it so)";
  const auto schema =
      *structured::JsonSchema::Compile(fs.json_schema(), fs.json_prefix(), fs.json_suffix());
  auto matches = [&](const std::string& text) {
    structured::JsonMatcher m(*schema);
    return m.Feed(text) && m.Complete();
  };
  EXPECT_TRUE(matches(R"(<tool_call>
{"name":"get_weather","arguments":{"city":"Paris"}})"));
  EXPECT_FALSE(matches(R"(<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris"}})"))
      << "compact: no spaces";
  EXPECT_FALSE(matches("<tool_call>\n{\"name\":\"other\",\"arguments\":{}}"));
  EXPECT_FALSE(matches("{\"name\":\"get_weather\",\"arguments\":{}}"));
  // "required" over several tools: the block is one of their calls, the arguments following
  // the schema of the function it names (each tool's $defs kept apart).
  auto required = Parse(
      Endpoint::kChatCompletions,
      R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required", "tools": [
          {"type": "function", "function": {"name": "a"}},
          {"type": "function", "function": {"name": "b", "parameters": {"$defs": {"n":
           {"type": "integer"}}, "type": "object", "properties": {"k": {"$ref": "#/$defs/n"}},
           "required": ["k"]}}},
          {"type": "function", "function": {"name": "c", "parameters": {"$defs": {"n":
           {"type": "string", "maxLength": 3}}, "type": "object", "properties": {"k":
           {"$ref": "#/$defs/n"}}, "required": ["k"], "additionalProperties": false}}}]})");
  ASSERT_TRUE(required.ok()) << required.status();
  const v1::SamplingParams& rs = required->generate.sampling();
  const auto union_schema =
      *structured::JsonSchema::Compile(rs.json_schema(), rs.json_prefix(), rs.json_suffix());
  auto call_matches = [&](const std::string& call) {
    structured::JsonMatcher m(*union_schema);
    return m.Feed("<tool_call>\n" + call) && m.Complete();
  };
  EXPECT_TRUE(call_matches(R"({"name":"a","arguments":{"x":[1]}})"));
  EXPECT_TRUE(call_matches(R"({"name":"b","arguments":{"k":3}})"));
  EXPECT_TRUE(call_matches(R"({"name":"c","arguments":{"k":"abc"}})"));
  EXPECT_FALSE(call_matches(R"({"name":"b","arguments":{"k":"abc"}})"));
  EXPECT_FALSE(call_matches(R"({"name":"c","arguments":{"k":3}})"));
  EXPECT_FALSE(call_matches(R"({"name":"c","arguments":{"k":"abcd"}})"));
  // What the issue saw: a long description instead of the arguments.
  EXPECT_FALSE(call_matches(R"({"name":"c","arguments":{"description":"a tool that"}})"));
  EXPECT_FALSE(call_matches(R"({"name":"b","arguments":{}})"));
  EXPECT_FALSE(call_matches(R"({"name":"d","arguments":{}})"));
  // Any text the constraint lets through to the end is one call the parser returns, with
  // arguments its function accepts.
  std::mt19937 rng(3);
  int names[3] = {0, 0, 0};
  for (int walk = 0; walk < 60; ++walk) {
    structured::JsonMatcher m(*union_schema);
    std::string text;
    while (!(m.Complete() && m.Done()) && text.size() < 400) {
      std::vector<char> ok;
      for (int c = 0x0a; c < 0x7f; ++c) {  // newline and printable ASCII
        structured::JsonMatcher trial = m;
        if ((c == '\n' || c >= 0x20) && trial.Feed(static_cast<unsigned char>(c))) ok.push_back(c);
      }
      ASSERT_FALSE(ok.empty()) << text;
      // Past 200 bytes, close what is open.
      std::vector<char> closing;
      for (char c : ok) {
        if (c == '"' || c == '}' || c == ']') closing.push_back(c);
      }
      const std::vector<char>& from = text.size() > 200 && !closing.empty() ? closing : ok;
      const char pick = from[rng() % from.size()];
      ASSERT_TRUE(m.Feed(static_cast<unsigned char>(pick)));
      text += pick;
    }
    ASSERT_TRUE(m.Complete()) << text;
    ToolCallParser parser("w");
    std::string content = parser.Add(text);
    content += parser.Flush();
    const auto parsed = parser.TakeCalls();
    ASSERT_EQ(parsed.size(), 1u) << text;
    EXPECT_EQ(content, "") << text;
    const std::string name = parsed[0]["function"]["name"];
    const Json args = Json::parse(parsed[0]["function"]["arguments"].get<std::string>());
    ASSERT_TRUE(name == "a" || name == "b" || name == "c") << text;
    ++names[name[0] - 'a'];
    if (name == "b") {
      EXPECT_TRUE(args["k"].is_number_integer()) << text;
    }
    if (name == "c") {
      EXPECT_EQ(args.size(), 1u) << text;
      const std::string k = args["k"];
      EXPECT_LE(std::count_if(k.begin(), k.end(), [](char b) { return (b & 0xC0) != 0x80; }), 3)
          << text;  // characters, not bytes (\uXXXX escapes)
    }
  }
  EXPECT_GT(names[0] * names[1] * names[2], 0) << "every tool called in some walk";
  auto one = Parse(
      Endpoint::kChatCompletions,
      R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required", "tools": [
          {"type": "function", "function": {"name": "b", "parameters": {"$defs": {"n":
           {"type": "integer"}}, "type": "object", "properties": {"k": {"$ref": "#/$defs/n"}}}}}]})");
  ASSERT_TRUE(one.ok()) << one.status();
  const Json os = Json::parse(one->generate.sampling().json_schema());
  EXPECT_EQ(os["$defs"]["n"]["type"], "integer");
  EXPECT_FALSE(os["properties"]["arguments"].contains("$defs"));

  auto stop = [](std::string text) {
    v1::GenerateResponse m = Message({300}, std::move(text), true);
    m.set_finish_reason(v1::FINISH_REASON_STOP);
    return m;
  };
  ResponseBuilder whole(*r, model_, 1700000000);
  whole.Add(Message({300}, "<tool_call>{\"name\": \"get_weather\", ", false));
  whole.Add(stop("\"arguments\": {\"city\": \"Paris\"}}</tool_call>"));
  const Json body = Json::parse(whole.Body());
  const Json& message = body["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null()) << body.dump();
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");

  r->stream = true;
  ResponseBuilder streamed(*r, model_, 1700000000);
  std::vector<Json> events = Events(streamed.Add(Message({300}, "Sure. <tool_", false)));
  ASSERT_EQ(events.size(), 2u);  // the role, then the content before the (possible) tag
  EXPECT_EQ(events[1]["choices"][0]["delta"]["content"], "Sure. ");
  events = Events(streamed.Add(stop("call>{\"name\": \"get_weather\"}</tool_call>")));
  ASSERT_EQ(events.size(), 2u);  // the call, then the finish reason
  const Json& call = events[0]["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(call["index"], 0);
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(events[1]["choices"][0]["finish_reason"], "tool_calls");
}

// An agent loop's turns as the openai SDK sends them back (an assistant turn with content null
// and tool_calls whose arguments are JSON text, then role "tool" results) reach the template as
// transformers and vLLM pass them: the prompt is jinja2's rendering of
// tests/fixtures/chat/qwen2.5_tools.json (content "", arguments as objects).
TEST_F(OpenAiTest, AgentLoopTurnsRenderAsJinja2Does) {
  const std::string dir = testing::SourceDir() + "/tests/fixtures/chat/";
  ASSERT_NO_FATAL_FAILURE(UseQwenToolsTemplate());
  const Json oracle = Json::parse(*ReadFileToString(dir + "qwen2.5_tools.json"));
  int cases = 0;
  for (const Json& c : oracle["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    Json messages = c["messages"];
    for (Json& m : messages) {
      if (!m.contains("tool_calls")) continue;
      if (m["content"] == "") m["content"] = nullptr;  // what the SDK sends back
      for (Json& call : m["tool_calls"]) {
        call["function"]["arguments"] = call["function"]["arguments"].dump();
      }
    }
    Json body = {{"messages", messages}, {"add_generation_prompt", c["add_generation_prompt"]}};
    if (!c["tools"].is_null()) body["tools"] = c["tools"];
    auto r = Parse(Endpoint::kChatCompletions, body.dump());
    ASSERT_TRUE(r.ok()) << r.status();
    const std::vector<int> want = tokenizer_->Encode(c["rendered"].get<std::string>(), false);
    EXPECT_EQ(
        std::vector<int>(r->generate.tokens().ids().begin(), r->generate.tokens().ids().end()),
        want);
    ++cases;
  }
  EXPECT_EQ(cases, 5);
  // A message without content, or with tool_calls null, renders as one with "" and none.
  auto bare = Parse(Endpoint::kChatCompletions,
                    R"({"messages": [{"role": "user", "content": "Hello!"},
                                     {"role": "assistant", "tool_calls": null}],
                        "add_generation_prompt": false})");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(
      std::vector<int>(bare->generate.tokens().ids().begin(), bare->generate.tokens().ids().end()),
      tokenizer_->Encode("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You "
                         "are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello!"
                         "<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n",
                         false));
}

// best_of: every candidate generated with its logprobs, the n most likely returned in order,
// logprobs only when asked.
TEST_F(OpenAiTest, BestOfReturnsTheMostLikelyCandidates) {
  auto r = Parse(Endpoint::kCompletions, R"({"prompt": "a", "n": 2, "best_of": 3, "seed": 4})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->choices.size(), 3u);
  EXPECT_TRUE(r->choices[2].sampling().logprobs());
  EXPECT_EQ(r->choices[2].sampling().seed(), ChoiceSeed(4, 2));
  EXPECT_FALSE(r->want_logprobs);
  ResponseBuilder b(*r, model_, 1700000000);
  const float logprob[3] = {-3.0f, -1.0f, -2.0f};
  for (int i = 0; i < 3; ++i) {
    v1::GenerateResponse m = Message({300}, "text" + std::to_string(i), true);
    m.mutable_logprobs(0)->set_logprob(logprob[i]);
    b.Add(i, m);
  }
  const Json body = Json::parse(b.Body());
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["text"], "text1");
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][1]["text"], "text2");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(body["usage"]["completion_tokens"], 9);  // every candidate's tokens
  EXPECT_EQ(body["usage"]["prompt_tokens"], 4);      // the prompt once

  // With echo and logprobs every candidate leads with the same prompt entries (the first null).
  r = Parse(Endpoint::kCompletions,
            R"({"prompt": [1, 300], "n": 2, "best_of": 3, "echo": true, "logprobs": 0})");
  ASSERT_TRUE(r.ok()) << r.status();
  ResponseBuilder echoed(*r, model_, 1700000000);
  v1::ScoreResponse score;
  score.add_logprobs(-0.25f);
  score.add_ranks(1);
  echoed.SetPromptScore(0, {1, 300}, score);
  for (int i = 0; i < 3; ++i) {
    v1::GenerateResponse m = Message({300}, "text" + std::to_string(i), true);
    m.mutable_logprobs(0)->set_logprob(logprob[i]);
    echoed.Add(i, m);
  }
  const Json echo_body = Json::parse(echoed.Body());
  ASSERT_EQ(echo_body["choices"].size(), 2u);
  EXPECT_EQ(echo_body["choices"][0]["logprobs"]["token_logprobs"],
            Json::parse("[null, -0.25, -1.0]"));
}

TEST_F(OpenAiTest, CompletionResponsesInBothShapes) {
  auto r = Parse(Endpoint::kCompletions, R"({"prompt": "a", "logprobs": 1, "stream": true})");
  ASSERT_TRUE(r.ok());
  ResponseBuilder b(*r, model_, 1700000000);
  std::vector<Json> events = Events(b.Add(Message({300, 301}, "Hel", false)));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["object"], "text_completion");
  EXPECT_EQ(events[0]["choices"][0]["text"], "Hel");
  EXPECT_TRUE(events[0]["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(events[0].contains("usage"));  // not asked for
  const Json& lp = events[0]["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"].size(), 2u);
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(lp["text_offset"][1], lp["tokens"][0].get<std::string>().size());
  events = Events(b.StreamEnd());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0], "[DONE]");
  const Json err =
      Json::parse(ResponseBuilder::StreamError(
                      ToApiError(grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone"), &*r))
                      .substr(6));
  EXPECT_EQ(err["error"]["code"], "service_unavailable");
}

// vLLM's structured-output fields become the schema or the choice response_format would give;
// a backend's name changes nothing.
TEST_F(OpenAiTest, VllmStructuredOutputFieldsMapToASchemaOrAChoice) {
  const std::string chat = R"("messages": [{"role": "user", "content": "a"}])";
  struct Case {
    Endpoint endpoint;
    std::string body;
    std::string schema;               // sampling.json_schema, or
    std::vector<std::string> choice;  // sampling.choice
    std::string param;
  };
  const std::vector<Case> cases = {
      {Endpoint::kCompletions,
       R"({"prompt": "a", "guided_json": {"type": "integer"}})",
       R"({"type":"integer"})",
       {},
       "guided_json"},
      {Endpoint::kChatCompletions,
       "{" + chat + R"(, "guided_json": "{\"type\": \"integer\"}", "guided_decoding_backend":
          "xgrammar"})",
       R"({"type": "integer"})",
       {},
       "guided_json"},
      {Endpoint::kCompletions,
       R"({"prompt": "a", "guided_choice": ["yes", "no"]})",
       "",
       {"yes", "no"},
       "guided_choice"},
      {Endpoint::kChatCompletions,
       "{" + chat + R"(, "structured_outputs": {"choice": ["b", "a"], "disable_fallback": true,
          "regex": null}})",
       "",
       {"b", "a"},
       "structured_outputs.choice"},
      {Endpoint::kCompletions,
       R"({"prompt": "a", "structured_outputs": {"json": {"enum": [1]}}})",
       R"({"enum":[1]})",
       {},
       "structured_outputs.json"},
      {Endpoint::kCompletions,
       R"({"prompt": "a", "structured_outputs": {"json_object": true},
           "response_format": {"type": "text"}})",
       kJsonObjectSchema,
       {},
       "structured_outputs.json_object"},
  };
  for (const Case& c : cases) {
    auto r = Parse(c.endpoint, c.body);
    ASSERT_TRUE(r.ok()) << c.body << ": " << r.status();
    for (const v1::GenerateRequest& g : r->choices) {
      EXPECT_EQ(g.sampling().json_schema(), c.schema) << c.body;
      EXPECT_EQ(
          std::vector<std::string>(g.sampling().choice().begin(), g.sampling().choice().end()),
          c.choice)
          << c.body;
    }
    EXPECT_EQ(r->schema_param, c.param);
    ModelConfig config;
    config.vocab_size = 512;
    config.max_seq_len = 512;
    auto checked = ValidateGenerateRequest(r->generate, config, *tokenizer_);
    EXPECT_TRUE(checked.ok()) << c.body << ": " << checked.status();
  }
  auto none = Parse(Endpoint::kCompletions, R"({"prompt": "a", "guided_json": null})");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->generate.sampling().json_schema().empty());
  EXPECT_EQ(none->schema_param, "response_format");
}

// Completions' echo with logprobs and vLLM's prompt_logprobs: the prompt's Score in OpenAI's
// legacy shape (first token null) before the completion's entries, and in vLLM's shape.
TEST_F(OpenAiTest, PromptLogprobsInBothShapes) {
  auto r = Parse(Endpoint::kCompletions,
                 R"({"prompt": [1, 300, 301], "echo": true, "logprobs": 1, "max_tokens": 0,
                     "prompt_logprobs": 2})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->echo_logprobs);
  EXPECT_TRUE(r->score_only);
  EXPECT_EQ(r->prompt_logprobs, 2);
  v1::ScoreResponse score;
  for (int k = 0; k < 2; ++k) {
    score.add_logprobs(-1.5f - k);
    score.add_ranks(3 + k);
    v1::TokenLogprobs* top = score.add_top_logprobs();
    top->set_logprob(-1.5f - k);
    for (int id : {7, 8}) {
      v1::TopLogprob* t = top->add_top();
      t->set_token_id(id);
      t->set_logprob(-0.1f * id);
    }
  }
  ResponseBuilder b(*r, model_, 1700000000);
  b.SetPromptScore(0, {1, 300, 301}, score);
  v1::GenerateResponse end;
  end.set_request_id("req-1");
  end.set_finish_reason(v1::FINISH_REASON_LENGTH);
  end.mutable_usage()->set_prompt_tokens(3);
  b.Add(0, end);
  const Json body = Json::parse(b.Body());
  const Json& choice = body["choices"][0];
  EXPECT_EQ(choice["text"], tokenizer_->Decode(std::vector<int>{1, 300, 301}));
  EXPECT_EQ(choice["finish_reason"], "length");
  const Json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 3u);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(lp["token_logprobs"][1].get<float>(), -1.5f);
  EXPECT_FLOAT_EQ(lp["token_logprobs"][2].get<float>(), -2.5f);
  EXPECT_EQ(lp["top_logprobs"][1].size(), 1u);  // logprobs: 1
  EXPECT_EQ(lp["text_offset"][0], 0);
  const Json& vllm = choice["prompt_logprobs"];
  ASSERT_EQ(vllm.size(), 3u);
  EXPECT_TRUE(vllm[0].is_null());
  EXPECT_EQ(vllm[1]["300"]["rank"], 3);
  EXPECT_FLOAT_EQ(vllm[1]["300"]["logprob"].get<float>(), -1.5f);
  EXPECT_EQ(vllm[1]["7"]["rank"], 1);
  EXPECT_EQ(vllm[1]["8"]["rank"], 2);
  EXPECT_EQ(vllm[2]["301"]["rank"], 4);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(body["usage"]["completion_tokens"], 0);

  // Streamed with a completion: the prompt's entries lead the first chunk's logprobs.
  r = Parse(Endpoint::kCompletions,
            R"({"prompt": [1, 300, 301], "echo": true, "logprobs": 1, "stream": true})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->score_only);
  ResponseBuilder s(*r, model_, 1700000000);
  s.SetPromptScore(0, {1, 300, 301}, score);
  std::vector<Json> events = Events(s.Add(0, Message({302}, "x", false)));
  ASSERT_EQ(events.size(), 1u);
  const Json& first = events[0]["choices"][0]["logprobs"];
  ASSERT_EQ(first["token_logprobs"].size(), 4u);
  EXPECT_TRUE(first["token_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(first["token_logprobs"][3].get<float>(), -0.5f);
  EXPECT_EQ(first["text_offset"][3],
            first["text_offset"][2].get<int>() + first["tokens"][2].get<std::string>().size());
}

TEST_F(OpenAiTest, TokenizeAndDetokenizeBodies) {
  auto t = ParseTokenizeRequest(R"({"model": "stories260K", "prompt": "Once"})", model_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->text, "Once");
  EXPECT_TRUE(t->add_special_tokens);
  t = ParseTokenizeRequest(R"({"messages": [{"role": "user", "content": "hi"}],
                               "add_generation_prompt": false, "return_token_strs": true})",
                           model_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->text, "<|user|>\nhi<|end|>\n");
  EXPECT_FALSE(t->add_special_tokens);  // the template writes them
  EXPECT_TRUE(t->return_token_strs);
  auto written = [&](const std::vector<int>& ids, bool strs, int* pieces = nullptr) {
    std::string out;
    int n = 0;
    EXPECT_TRUE(WriteTokenizeResponse(ids, strs, model_, [&](std::string_view piece) {
      out += piece;
      ++n;
      return true;
    }));
    if (pieces != nullptr) *pieces = n;
    return out;
  };
  const Json body = Json::parse(written({1, 300}, true));
  EXPECT_EQ(body["count"], 2);
  EXPECT_EQ(body["max_model_len"], 512);
  EXPECT_EQ(body["tokens"], Json::parse("[1, 300]"));
  EXPECT_EQ(body["token_strs"].size(), 2u);
  EXPECT_TRUE(Json::parse(written({1}, false))["token_strs"].is_null());
  // A long answer comes in pieces, each well under the whole, and reads as the whole: every id
  // of the vocabulary (byte tokens, quotes and backslashes among them) many times over.
  std::vector<int> many;
  for (int i = 0; i < 40000; ++i) many.push_back(i % 512);
  int pieces = 0;
  const std::string long_text = written(many, true, &pieces);
  EXPECT_GT(pieces, 4);
  const Json long_body = Json::parse(long_text);
  EXPECT_EQ(long_body["count"], 40000);
  EXPECT_EQ(long_body["tokens"].size(), 40000u);
  ASSERT_EQ(long_body["token_strs"].size(), 40000u);
  EXPECT_EQ(long_body["token_strs"][300], body["token_strs"][1]);
  EXPECT_EQ(long_body["token_strs"][512 + 300], body["token_strs"][1]);
  // A writer that stops (the client left) stops the building.
  int calls = 0;
  EXPECT_FALSE(WriteTokenizeResponse(many, true, model_, [&](std::string_view) {
    ++calls;
    return false;
  }));
  EXPECT_EQ(calls, 1);
  auto ids = ParseDetokenizeRequest(R"({"tokens": [1, 300]})", model_);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int>{1, 300}));
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({})", "prompt"},
           {R"({"prompt": 5})", "prompt"},
           {R"({"prompt": "a", "add_special_tokens": "no"})", "add_special_tokens"},
           {R"({"prompt": "a", "messages": []})", "messages"},
           {R"({"messages": [{"content": "a"}]})", "messages[0].role"},
           {R"({"prompt": "a", "model": "gpt-4"})", "model"}}) {
    auto bad = ParseTokenizeRequest(body, model_);
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_EQ(ToApiError(bad.status(), nullptr).param, param) << bad.status();
  }
  for (const auto& [body, param] :
       std::vector<std::pair<std::string, std::string>>{{R"({})", "tokens"},
                                                        {R"({"tokens": [1, 512]})", "tokens[1]"},
                                                        {R"({"tokens": [-1]})", "tokens[0]"},
                                                        {R"({"tokens": ["a"]})", "tokens[0]"}}) {
    auto bad = ParseDetokenizeRequest(body, model_);
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_EQ(ToApiError(bad.status(), nullptr).param, param) << bad.status();
  }
}

// ---- /v1/responses: input items as chat messages, the answer as a response object or events ----

std::vector<int> PromptIds(const Request& r) {
  return std::vector<int>(r.generate.tokens().ids().begin(), r.generate.tokens().ids().end());
}

// Every Responses input item reaches the chat template as the chat message it stands for (the
// agent loop's turns as the openai SDK sends them back: the output items of the first answer,
// then the function's result), so the prompt is chat completions' prompt for those messages;
// function tools, tool_choice and text.format become chat's.
TEST_F(OpenAiTest, ResponsesInputIsTheChatPrompt) {
  ASSERT_NO_FATAL_FAILURE(UseQwenToolsTemplate());
  const Json params = Json::parse(
      R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})");
  const Json response = {
      {"instructions", "Be brief."},
      {"input",
       {{{"role", "user"},
         {"content",
          {{{"type", "input_text"}, {"text", "Weather in"}},
           {{"type", "input_text"}, {"text", "Paris?"}}}}},
        {{"type", "message"},
         {"id", "msg_1"},
         {"role", "assistant"},
         {"status", "completed"},
         {"content", {{{"type", "output_text"}, {"text", "Checking."}, {"annotations", {}}}}}},
        {{"type", "function_call"},
         {"id", "fc_1"},
         {"call_id", "call_a"},
         {"name", "get_weather"},
         {"arguments", R"({"city": "Paris"})"},
         {"status", "completed"}},
        {{"type", "function_call"},
         {"call_id", "call_b"},
         {"name", "get_weather"},
         {"arguments", R"({"city": "Lyon"})"}},
        {{"type", "function_call_output"}, {"call_id", "call_a"}, {"output", "22 C"}},
        {{"type", "function_call_output"},
         {"call_id", "call_b"},
         {"output", {{{"type", "input_text"}, {"text", "19 C"}}}}},
        {{"role", "developer"}, {"content", "Answer in French."}}}},
      {"tools",
       {{{"type", "function"},
         {"name", "get_weather"},
         {"description", "The weather now"},
         {"parameters", params},
         {"strict", true}}}},
      {"max_output_tokens", 20},
      {"temperature", 0.5},
      {"top_p", 0.9},
      {"seed", 4}};
  auto r = ParseResponsesRequest(response.dump(), model_, 99);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->endpoint, Endpoint::kResponses);
  EXPECT_TRUE(r->parse_tool_calls);
  EXPECT_EQ(r->choices.size(), 1u);
  const Json calls = {
      {{"id", "call_a"},
       {"type", "function"},
       {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Paris"})"}}}},
      {{"id", "call_b"},
       {"type", "function"},
       {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Lyon"})"}}}}};
  const Json chat = {{"messages",
                      {{{"role", "system"}, {"content", "Be brief."}},
                       {{"role", "user"}, {"content", "Weather in\nParis?"}},
                       {{"role", "assistant"}, {"content", "Checking."}, {"tool_calls", calls}},
                       {{"role", "tool"},
                        {"tool_call_id", "call_a"},
                        {"name", "get_weather"},
                        {"content", "22 C"}},
                       {{"role", "tool"},
                        {"tool_call_id", "call_b"},
                        {"name", "get_weather"},
                        {"content", "19 C"}},
                       {{"role", "system"}, {"content", "Answer in French."}}}},
                     {"tools",
                      {{{"type", "function"},
                        {"function",
                         {{"name", "get_weather"},
                          {"description", "The weather now"},
                          {"parameters", params},
                          {"strict", true}}}}}},
                     {"max_completion_tokens", 20},
                     {"temperature", 0.5},
                     {"top_p", 0.9},
                     {"seed", 4}};
  auto want = Parse(Endpoint::kChatCompletions, chat.dump());
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(PromptIds(*r), PromptIds(*want));
  const std::string prompt = tokenizer_->Decode(PromptIds(*r));
  EXPECT_NE(prompt.find("get_weather"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("Lyon"), std::string::npos) << prompt;
  EXPECT_EQ(r->generate.max_tokens(), 20);
  EXPECT_FLOAT_EQ(r->generate.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(r->generate.sampling().top_p(), 0.9f);
  EXPECT_EQ(r->generate.sampling().seed(), 4u);
  EXPECT_EQ(r->response_fields["instructions"], "Be brief.");
  EXPECT_EQ(r->response_fields["tools"], response["tools"]);

  // A string is one user message.
  auto plain = ParseResponsesRequest(R"({"input": "Hello", "stream": true})", model_, 99);
  auto plain_chat =
      Parse(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "Hello"}]})");
  ASSERT_TRUE(plain.ok() && plain_chat.ok()) << plain.status();
  EXPECT_EQ(PromptIds(*plain), PromptIds(*plain_chat));
  EXPECT_TRUE(plain->stream);
  EXPECT_FALSE(plain->parse_tool_calls);
  EXPECT_EQ(plain->generate.max_tokens(), plain_chat->generate.max_tokens());

  // A forced call constrains as chat's does; text.format is response_format.
  const std::string tools =
      R"("tools": [{"type": "function", "name": "get_weather", "parameters": )" + params.dump() +
      "}]";
  auto forced = ParseResponsesRequest(
      R"({"input": "hi", "tool_choice": {"type": "function", "name": "get_weather"}, )" + tools +
          "}",
      model_, 99);
  auto forced_chat =
      Parse(Endpoint::kChatCompletions,
            R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "function",
          "function": {"name": "get_weather"}}, "tools": [{"type": "function", "function":
          {"name": "get_weather", "parameters": )" +
                params.dump() + "}}]}");
  ASSERT_TRUE(forced.ok() && forced_chat.ok()) << forced.status();
  EXPECT_EQ(forced->generate.sampling().json_schema(),
            forced_chat->generate.sampling().json_schema());
  EXPECT_EQ(forced->generate.sampling().json_prefix(), "<tool_call>\n");
  EXPECT_EQ(forced->schema_param, "tool_choice");
  auto required = ParseResponsesRequest(
      R"({"input": "hi", "tool_choice": "required", "parallel_tool_calls": false, )" + tools + "}",
      model_, 99);
  ASSERT_TRUE(required.ok()) << required.status();
  EXPECT_EQ(required->generate.sampling().json_schema(), forced->generate.sampling().json_schema());
  auto formatted = ParseResponsesRequest(
      R"({"input": "hi", "text": {"format": {"type": "json_schema", "name": "city", "schema":
          {"type": "object", "properties": {"name": {"type": "string"}}}, "strict": true},
          "verbosity": "medium"}})",
      model_, 99);
  ASSERT_TRUE(formatted.ok()) << formatted.status();
  EXPECT_EQ(Json::parse(formatted->generate.sampling().json_schema()),
            Json::parse(R"({"type": "object", "properties": {"name": {"type": "string"}}})"));
  EXPECT_EQ(formatted->response_fields["text"]["format"]["name"], "city");
  auto object = ParseResponsesRequest(R"({"input": "hi", "text": {"format": {"type":
      "json_object"}}, "store": false, "include": ["reasoning.encrypted_content"],
      "truncation": "disabled", "reasoning": {"effort": null}, "metadata": {"k": "v"},
      "user": "u", "max_tool_calls": 3, "top_logprobs": 0})",
                                      model_, 99);
  ASSERT_TRUE(object.ok()) << object.status();
  EXPECT_FALSE(object->generate.sampling().json_schema().empty());

  // The router's errors name the Responses fields.
  ModelConfig config;
  config.vocab_size = 512;
  config.max_seq_len = 512;
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"input": "a", "max_output_tokens": -1})", "max_output_tokens"},
           {R"({"input": "a", "temperature": -1})", "temperature"},
           {R"({"input": "a", "text": {"format": {"type": "json_schema", "schema":
                {"type": "string", "minimum": 1}}}})",
            "text.format"}}) {
    auto parsed = ParseResponsesRequest(body, model_, 99);
    ASSERT_TRUE(parsed.ok()) << body << ": " << parsed.status();
    auto checked = ValidateGenerateRequest(parsed->generate, config, *tokenizer_);
    ASSERT_FALSE(checked.ok()) << body;
    const ApiError e = ToApiError(checked.status(), &*parsed);
    EXPECT_EQ(e.param, param) << body << ": " << checked.status();
    EXPECT_TRUE(e.message.starts_with(param + ": ")) << e.message;
  }
  EXPECT_EQ(
      ToApiError(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "text: too long"), &*plain).param,
      "input");
}

// What /v1/responses refuses: a bad item or field, named; anything that needs a stored response
// or a built-in tool, or would change the answer and is not supported.
TEST_F(OpenAiTest, ResponsesBadFieldsAreNamed) {
  const std::string tool = R"({"type": "function", "name": "f", "parameters": {"type": "object",
      "properties": {"x": {"type": "integer", "minimum": 1}}}})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({})", "input"},
      {R"({"input": 5})", "input"},
      {R"({"input": []})", "input"},
      {R"({"input": [5]})", "input[0]"},
      {R"({"input": [{"role": "tool", "content": "x"}]})", "input[0].role"},
      {R"({"input": [{"role": "user"}]})", "input[0].content"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})",
       "input[0].content[0].type"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_text"}]}]})",
       "input[0].content[0].text"},
      {R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})",
       "input[0].call_id"},
      {R"({"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]})",
       "input[0].name"},
      {R"({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{x"}]})",
       "input[0].arguments"},
      {R"({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]})",
       "input[0].arguments"},
      {R"({"input": [{"role": "user", "content": "a"},
           {"type": "function_call_output", "call_id": "c", "output": "x"}]})",
       "input[1].call_id"},
      {R"({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
           {"type": "function_call_output", "call_id": "c"}]})",
       "input[1].output"},
      {R"({"input": [{"type": "reasoning", "summary": []}]})", "input[0].type"},
      {R"({"input": [{"type": "item_reference", "id": "msg_1"}]})", "input[0].type"},
      {R"({"input": "a", "instructions": 5})", "instructions"},
      {R"({"input": "a", "previous_response_id": 5})", "previous_response_id"},
      {R"({"input": "a", "conversation": "conv_1"})", "conversation"},
      {R"({"input": "a", "prompt": {"id": "pmpt_1"}})", "prompt"},
      {R"({"input": "a", "store": "yes"})", "store"},
      {R"({"input": "a", "background": true})", "background"},
      {R"({"input": "a", "truncation": "auto"})", "truncation"},
      {R"({"input": "a", "reasoning": {"effort": "high"}})", "reasoning.effort"},
      {R"({"input": "a", "top_logprobs": 2})", "top_logprobs"},
      {R"({"input": "a", "include": ["message.output_text.logprobs"]})", "include[0]"},
      {R"({"input": "a", "tools": [{"type": "web_search"}]})", "tools[0].type"},
      {R"({"input": "a", "tools": [{"type": "function"}]})", "tools[0].name"},
      {R"({"input": "a", "tool_choice": "required", "tools": [)" + tool + "]}",
       "tools[0].parameters"},
      {R"({"input": "a", "tool_choice": {"type": "function", "name": "g"}, "tools": [)" + tool +
           "]}",
       "tool_choice.name"},
      {R"({"input": "a", "tool_choice": {"type": "file_search"}})", "tool_choice.type"},
      {R"({"input": "a", "tool_choice": "required"})", "tool_choice"},
      {R"({"input": "a", "parallel_tool_calls": false, "tools": [{"type": "function",
           "name": "f"}]})",
       "parallel_tool_calls"},
      {R"({"input": "a", "max_output_tokens": "x"})", "max_output_tokens"},
      {R"({"input": "a", "temperature": "hot"})", "temperature"},
      {R"({"input": "a", "stream": 1})", "stream"},
      {R"({"input": "a", "text": {"format": {"type": "json_schema"}}})", "text.format.schema"},
      {R"({"input": "a", "text": {"format": {"type": "xml"}}})", "text.format.type"},
      {R"({"input": "a", "text": {"verbosity": "low"}})", "text.verbosity"},
      {R"({"input": "a", "model": "gpt-4"})", "model"},
  };
  for (const auto& [body, param] : cases) {
    auto r = ParseResponsesRequest(body, model_, 99);
    ASSERT_FALSE(r.ok()) << body;
    const ApiError e = ToApiError(r.status(), nullptr);
    EXPECT_EQ(e.http_status, param == "model" ? 404 : 400) << body << ": " << e.message;
    EXPECT_EQ(e.param, param) << body << ": " << e.message;
    EXPECT_TRUE(e.message.starts_with(param + ": ")) << e.message;
  }
  // The chat template's refusal is the input's.
  model_.chat_template = absl::NotFoundError("no chat template");
  auto r = ParseResponsesRequest(R"({"input": "a"})", model_, 99);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(ToApiError(r.status(), nullptr).param, "input");
}

// The events of a Responses stream: "event: TYPE" lines, each with its data's type and a
// sequence number counting from 0.
std::vector<Json> ResponseEvents(const std::string& sse) {
  std::vector<Json> out;
  size_t p = 0;
  while ((p = sse.find("event: ", p)) != std::string::npos) {
    const size_t nl = sse.find('\n', p);
    const std::string type = sse.substr(p + 7, nl - p - 7);
    EXPECT_EQ(sse.compare(nl + 1, 6, "data: "), 0);
    const size_t end = sse.find("\n\n", nl);
    Json data = Json::parse(sse.substr(nl + 7, end - nl - 7));
    EXPECT_EQ(data["type"], type);
    out.push_back(std::move(data));
    p = end;
  }
  return out;
}

std::vector<std::string> Types(const std::vector<Json>& events) {
  std::vector<std::string> types;
  for (const Json& e : events) types.push_back(e["type"]);
  return types;
}

TEST_F(OpenAiTest, ResponsesAnswersInBothShapes) {
  auto r = ParseResponsesRequest(R"({"input": "a", "stream": true, "max_output_tokens": 3})",
                                 model_, 99);
  ASSERT_TRUE(r.ok()) << r.status();
  ResponsesBuilder b(*r, model_, 1700000000);
  std::vector<Json> events = ResponseEvents(b.Add(0, Message({300}, "He", false)));
  events.push_back(Json());  // a marker between the two messages' events
  for (Json& e : ResponseEvents(b.Add(0, Message({301, 302}, "llo", true)))) events.push_back(e);
  for (Json& e : ResponseEvents(b.StreamEnd())) events.push_back(e);
  const std::vector<std::string> want = {
      "response.created",           "response.in_progress",
      "response.output_item.added", "response.content_part.added",
      "response.output_text.delta", "",
      "response.output_text.delta", "response.output_text.done",
      "response.content_part.done", "response.output_item.done",
      "response.incomplete"};
  std::vector<std::string> types;
  int sequence = 0;
  for (const Json& e : events) {
    types.push_back(e.is_null() ? "" : e["type"].get<std::string>());
    if (!e.is_null()) {
      EXPECT_EQ(e["sequence_number"], sequence++);
    }
  }
  EXPECT_EQ(types, want);
  EXPECT_EQ(events[0]["response"]["id"], "resp_req-7");
  EXPECT_EQ(events[0]["response"]["status"], "in_progress");
  EXPECT_TRUE(events[0]["response"]["output"].empty());
  EXPECT_EQ(events[4]["delta"], "He");
  EXPECT_EQ(events[6]["delta"], "llo");
  EXPECT_EQ(events[7]["text"], "Hello");
  EXPECT_EQ(events[4]["item_id"], events[2]["item"]["id"]);
  const Json& done = events.back()["response"];
  EXPECT_EQ(done["status"], "incomplete");  // max_output_tokens
  EXPECT_EQ(done["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(done["max_output_tokens"], 3);
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "Hello");
  EXPECT_EQ(done["usage"]["input_tokens"], 4);
  EXPECT_EQ(done["usage"]["output_tokens"], 3);
  EXPECT_EQ(done["usage"]["total_tokens"], 7);
  const std::string failure = b.StreamFailure(
      ToApiError(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no decode worker"), &*r));
  EXPECT_EQ(Types(ResponseEvents(failure)), (std::vector<std::string>{"error", "response.failed"}));
  EXPECT_EQ(ResponseEvents(failure)[1]["response"]["error"]["code"], "service_unavailable");

  r->stream = false;
  ResponsesBuilder whole(*r, model_, 1700000000);
  EXPECT_EQ(whole.Add(0, Message({300}, "He", false)), "");
  auto last = Message({301}, "llo", true);
  last.set_finish_reason(v1::FINISH_REASON_STOP);
  whole.Add(0, last);
  const Json body = Json::parse(whole.Body());
  EXPECT_EQ(body["object"], "response");
  EXPECT_EQ(body["status"], "completed");
  EXPECT_EQ(body["model"], "stories260K");
  EXPECT_EQ(body["created_at"], 1700000000);
  EXPECT_TRUE(body["incomplete_details"].is_null());
  ASSERT_EQ(body["output"].size(), 1u);
  const Json& message = body["output"][0];
  EXPECT_EQ(message["type"], "message");
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["status"], "completed");
  EXPECT_EQ(message["content"][0]["type"], "output_text");
  EXPECT_EQ(message["content"][0]["text"], "Hello");
  EXPECT_EQ(body["store"], true);  // OpenAI's default
  EXPECT_TRUE(body["previous_response_id"].is_null());
  EXPECT_EQ(body["tool_choice"], "auto");
}

// previous_response_id: the stored conversation comes after this request's instructions and
// before its input, and a call it made can be answered by a function_call_output item; the
// conversation kept for the next turn leaves the instructions out. An unknown id is NOT_FOUND.
TEST_F(OpenAiTest, ResponsesContinueAStoredConversation) {
  const Json stored = Json::parse(R"([{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_7", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}])");
  PreviousConversation previous = [&](const std::string& id) -> std::optional<Json> {
    if (id == "resp_1") return stored;
    return std::nullopt;
  };
  auto r = ParseResponsesRequest(R"({"input": [{"type": "function_call_output",
      "call_id": "call_7", "output": "sunny"}], "previous_response_id": "resp_1",
      "instructions": "Be brief."})",
                                 model_, 1, {}, previous);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->store);
  ASSERT_EQ(r->conversation.size(), 3u) << r->conversation.dump();
  EXPECT_EQ(r->conversation[0], stored[0]);
  EXPECT_EQ(r->conversation[1], stored[1]);
  EXPECT_EQ(r->conversation[2]["role"], "tool");
  EXPECT_EQ(r->conversation[2]["name"], "get_weather");
  EXPECT_EQ(r->conversation[2]["content"], "sunny");
  EXPECT_EQ(r->response_fields["previous_response_id"], "resp_1");

  auto unknown = ParseResponsesRequest(R"({"input": "a", "previous_response_id": "resp_2"})",
                                       model_, 1, {}, previous);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("previous_response_id"), std::string::npos);
  auto off = ParseResponsesRequest(R"({"input": "a", "store": false})", model_, 1);
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->store);

  // What the store keeps: the conversation, then the answer as an assistant message.
  auto plain = ParseResponsesRequest(R"({"input": "hi", "instructions": "x"})", model_, 1);
  ASSERT_TRUE(plain.ok());
  ResponsesBuilder b(*plain, model_, 1700000000);
  b.Add(0, Message({300}, "Hello", true));
  const StoredResponse kept = b.ToStore();
  EXPECT_EQ(kept.object["id"], b.id());
  EXPECT_EQ(kept.object, Json::parse(b.Body()));  // as the answer said
  ASSERT_EQ(kept.messages.size(), 2u) << kept.messages.dump();
  EXPECT_EQ(kept.messages[0], Json({{"role", "user"}, {"content", "hi"}}));
  EXPECT_EQ(kept.messages[1], Json({{"role", "assistant"}, {"content", "Hello"}}));
}

// The store: scoped, bounded in bytes (oldest out first), expired after its TTL, deletable.
TEST(ResponseStoreTest, ScopedBoundedExpiringAndDeletable) {
  ResponseStore::Limits limits;
  limits.max_bytes = 400;
  limits.ttl = absl::Minutes(10);
  ResponseStore store(limits);
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1000);
  auto response = [](int n) {
    return StoredResponse{Json{{"id", n}}, Json::array({Json{{"content", std::string(80, 'x')}}})};
  };
  store.Put("key:a", "resp_1", response(1), t0);
  store.Put("key:a", "resp_2", response(2), t0 + absl::Minutes(1));
  EXPECT_TRUE(store.Get("key:a", "resp_1", t0).has_value());
  EXPECT_FALSE(store.Get("key:b", "resp_1", t0).has_value());  // another tenant's
  EXPECT_LE(store.bytes(), limits.max_bytes);
  for (int i = 3; i <= 6; ++i) store.Put("key:a", "resp_" + std::to_string(i), response(i), t0);
  EXPECT_LE(store.bytes(), limits.max_bytes);
  EXPECT_FALSE(store.Get("key:a", "resp_1", t0).has_value());  // the oldest made room
  EXPECT_TRUE(store.Get("key:a", "resp_6", t0).has_value());
  EXPECT_TRUE(store.Delete("key:a", "resp_6"));
  EXPECT_FALSE(store.Delete("key:a", "resp_6"));
  EXPECT_FALSE(store.Get("key:a", "resp_6", t0).has_value());
  EXPECT_FALSE(store.Get("key:a", "resp_5", t0 + absl::Minutes(11)).has_value());  // expired
  EXPECT_EQ(store.size(), 0u);
}

// Tool calls among the text: items in the order they came (a message, each call), whitespace
// between them no message; a call's arguments as one delta and done.
TEST_F(OpenAiTest, ResponsesToolCallsAreFunctionCallItems) {
  auto r = ParseResponsesRequest(R"({"input": "a", "stream": true, "tools": [{"type": "function",
      "name": "get_weather"}, {"type": "function", "name": "now"}]})",
                                 model_, 99);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->parse_tool_calls);
  auto stop = [](std::string text) {
    v1::GenerateResponse m = Message({300}, std::move(text), true);
    m.set_finish_reason(v1::FINISH_REASON_STOP);
    return m;
  };
  const std::string first = "Sure. <tool_call>{\"name\": \"get_weather\", \"arguments\": ";
  const std::string second =
      "{\"city\": \"Paris\"}}</tool_call>\n<tool_call>{\"name\": \"now\"}</tool_call>\n";
  ResponsesBuilder b(*r, model_, 1700000000);
  std::vector<Json> events = ResponseEvents(b.Add(0, Message({300}, first, false)));
  for (Json& e : ResponseEvents(b.Add(0, stop(second)))) events.push_back(e);
  for (Json& e : ResponseEvents(b.StreamEnd())) events.push_back(e);
  EXPECT_EQ(Types(events), (std::vector<std::string>{
                               "response.created",
                               "response.in_progress",
                               "response.output_item.added",  // the message "Sure. "
                               "response.content_part.added",
                               "response.output_text.delta",
                               "response.output_text.done",
                               "response.content_part.done",
                               "response.output_item.done",
                               "response.output_item.added",  // get_weather
                               "response.function_call_arguments.delta",
                               "response.function_call_arguments.done",
                               "response.output_item.done",
                               "response.output_item.added",  // now
                               "response.function_call_arguments.delta",
                               "response.function_call_arguments.done",
                               "response.output_item.done",
                               "response.completed",
                           }));
  EXPECT_EQ(events[4]["delta"], "Sure. ");
  EXPECT_EQ(events[8]["output_index"], 1);
  EXPECT_EQ(events[8]["item"]["status"], "in_progress");
  EXPECT_EQ(events[9]["delta"], R"({"city":"Paris"})");
  EXPECT_EQ(events[10]["name"], "get_weather");
  const Json& call = events[11]["item"];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(call["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(call["status"], "completed");
  EXPECT_TRUE(call["call_id"].get<std::string>().starts_with("call_"));
  const Json& done = events.back()["response"];
  ASSERT_EQ(done["output"].size(), 3u) << done.dump();
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "Sure. ");
  EXPECT_EQ(done["output"][1], call);
  EXPECT_EQ(done["output"][2]["name"], "now");
  EXPECT_EQ(done["output"][2]["arguments"], "{}");
  EXPECT_NE(done["output"][1]["call_id"], done["output"][2]["call_id"]);

  // The same in one piece, not streamed: the same items.
  r->stream = false;
  ResponsesBuilder whole(*r, model_, 1700000000);
  EXPECT_EQ(whole.Add(0, stop(first + second)), "");
  EXPECT_EQ(Json::parse(whole.Body())["output"], done["output"]);
}

}  // namespace
}  // namespace tandem::openai
