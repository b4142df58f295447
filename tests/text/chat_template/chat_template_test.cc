// Chat templates of real model families, rendered as transformers' apply_chat_template does.
#include "text/chat_template/chat_template.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ojson = nlohmann::ordered_json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TokenizerData(const std::string& name) {
  return std::string(TANDEM_SHARED_DIR) + "/testdata/tokenizers/" + name;
}

// Every conversation of qwen3.chat.json (rendered by Python's jinja2 in Hugging Face's
// environment), byte for byte.
TEST(ChatTemplateTest, Qwen3MatchesJinja2Oracle) {
  const std::string config = ReadFile(TokenizerData("qwen3.tokenizer_config.json"));
  ASSERT_FALSE(config.empty()) << "missing " << TokenizerData("qwen3.tokenizer_config.json");
  const ojson oracle = ojson::parse(ReadFile(TokenizerData("qwen3.chat.json")));
  absl::StatusOr<TokenizerChatTemplate> tmpl = TokenizerChatTemplate::FromConfig(config);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EXPECT_EQ(tmpl->special_tokens()["eos_token"], "<|im_end|>");
  EXPECT_FALSE(tmpl->special_tokens().contains("bos_token"));  // null in the config

  int cases = 0;
  for (const ojson& c : oracle["cases"]) {
    SCOPED_TRACE(c["messages"].dump());
    ojson extra = ojson::object();
    // null: the oracle did not pass enable_thinking at all.
    if (!c["enable_thinking"].is_null()) extra["enable_thinking"] = c["enable_thinking"];
    absl::StatusOr<std::string> out =
        tmpl->Apply(c["messages"], c["add_generation_prompt"].get<bool>(), extra);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, c["rendered"].get<std::string>());
    // The one-shot helper agrees.
    absl::StatusOr<std::string> again = ApplyChatTemplate(
        config, nlohmann::json::parse(c["messages"].dump()), c["add_generation_prompt"].get<bool>(),
        nlohmann::json::parse(extra.dump()));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, *out);
    ++cases;
  }
  EXPECT_EQ(cases, 7);
}

// Tools, tool calls and consecutive tool responses; the expected text was rendered by Python's
// jinja2 in Hugging Face's environment.
TEST(ChatTemplateTest, Qwen3WithToolsMatchesJinja2) {
  absl::StatusOr<TokenizerChatTemplate> tmpl =
      TokenizerChatTemplate::FromConfig(ReadFile(TokenizerData("qwen3.tokenizer_config.json")));
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const ojson messages = ojson::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
      {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
    {"role": "tool", "content": "22"},
    {"role": "tool", "content": "sunny"}])");
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Météo", "parameters": {"type": "object", "properties":
    {"city": {"type": "string"}}, "required": ["city"]}}}])");
  absl::StatusOr<std::string> out = tmpl->Apply(messages, true, {{"tools", tools}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to "
            "assist with the user query.\n\nYou are provided with function signatures within "
            "<tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": "
            "{\"name\": \"get_weather\", \"description\": \"Météo\", \"parameters\": {\"type\": "
            "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
            "[\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with "
            "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
            "<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
            "\"unit\": \"c\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n22\n"
            "</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");

  // nlohmann::json sorts object keys, so `tojson` can only print them sorted; ordered_json keeps
  // the client's order as Python does.
  absl::StatusOr<std::string> sorted =
      tmpl->Apply(nlohmann::json::parse(messages.dump()), true,
                  nlohmann::json{{"tools", nlohmann::json::parse(tools.dump())}});
  ASSERT_TRUE(sorted.ok()) << sorted.status();
  EXPECT_NE(sorted->find("{\"function\": {\"description\": \"Météo\", \"name\""),
            std::string::npos);
}

// Qwen2.5-Instruct's tool-use template, and a short one for the cluster tests, over the
// conversations of an agent loop (a tool call, its result, parallel calls, the answer), in the
// form the HTTP API passes messages (tests/fixtures/chat/*.json, rendered by Python's jinja2 in
// Hugging Face's environment by scripts/make_chat_fixtures.py).
TEST(ChatTemplateTest, AgentLoopTemplatesMatchJinja2) {
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/chat/";
  for (const std::string name : {"qwen2.5_tools", "tools_short"}) {
    SCOPED_TRACE(name);
    const std::string source = ReadFile(dir + name + ".jinja");
    ASSERT_FALSE(source.empty());
    const ojson oracle = ojson::parse(ReadFile(dir + name + ".json"));
    absl::StatusOr<TokenizerChatTemplate> tmpl = TokenizerChatTemplate::FromConfig(
        ojson{{"chat_template", source}, {"eos_token", "<|im_end|>"}}.dump());
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    int cases = 0;
    for (const ojson& c : oracle["cases"]) {
      SCOPED_TRACE(c["name"].get<std::string>());
      absl::StatusOr<std::string> out =
          tmpl->Apply(c["messages"], c["add_generation_prompt"], ojson{{"tools", c["tools"]}});
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(*out, c["rendered"].get<std::string>());
      ++cases;
    }
    EXPECT_EQ(cases, 5);
  }
}

// The well-known Llama 3 Instruct template; expected strings derived by hand: bos_token once,
// each message as a header, its content `| trim`med (the filter binds tighter than `+`), then
// <|eot_id|>.
constexpr char kLlama3Template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

TEST(ChatTemplateTest, Llama3) {
  // A config as Meta ships it: the template as a string, bos_token as an AddedToken object.
  const ojson config = {
      {"bos_token",
       {{"__type", "AddedToken"}, {"content", "<|begin_of_text|>"}, {"lstrip", false}}},
      {"eos_token", "<|eot_id|>"},
      {"chat_template", kLlama3Template}};
  absl::StatusOr<TokenizerChatTemplate> tmpl = TokenizerChatTemplate::FromConfig(config.dump());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();

  const ojson messages = ojson::parse(R"([
    {"role": "system", "content": "You are a bot.\n"},
    {"role": "user", "content": "  Hi there \n"}])");
  absl::StatusOr<std::string> out = tmpl->Apply(messages, /*add_generation_prompt=*/true);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a bot."
            "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");

  const ojson turns = ojson::parse(R"([
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": " 4 "},
    {"role": "user", "content": "Thanks"}])");
  out = tmpl->Apply(turns, /*add_generation_prompt=*/false);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nThanks<|eot_id|>");
}

// Mistral-7B-v0.1's tokenizer_config.json (the base model) ships no chat template.
TEST(ChatTemplateTest, MistralConfigHasNoTemplate) {
  const std::string config = ReadFile(TokenizerData("mistral.tokenizer_config.json"));
  ASSERT_FALSE(config.empty());
  absl::StatusOr<TokenizerChatTemplate> tmpl = TokenizerChatTemplate::FromConfig(config);
  EXPECT_EQ(tmpl.status().code(), absl::StatusCode::kNotFound);
}

// Mistral-7B-Instruct-v0.1's template with the tokens of mistral.tokenizer_config.json; expected
// strings derived by hand: "<s>", then "[INST] user [/INST]" and "assistant</s>" alternating.
constexpr char kMistralInstructTemplate[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
    "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}";

TEST(ChatTemplateTest, MistralInstruct) {
  ojson config = ojson::parse(ReadFile(TokenizerData("mistral.tokenizer_config.json")));
  config["chat_template"] = kMistralInstructTemplate;
  absl::StatusOr<TokenizerChatTemplate> tmpl = TokenizerChatTemplate::FromConfig(config.dump());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();

  absl::StatusOr<std::string> out = tmpl->Apply(ojson::parse(R"([
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "Again"}])"),
                                                /*add_generation_prompt=*/true);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<s>[INST] Hi [/INST]Hello</s>[INST] Again [/INST]");

  absl::StatusOr<std::string> bad = tmpl->Apply(ojson::parse(R"([
    {"role": "user", "content": "a"}, {"role": "user", "content": "b"}])"),
                                                true);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "Conversation roles must alternate user/assistant/user/assistant/...");
  EXPECT_TRUE(IsRaisedByTemplate(bad.status()));
}

TEST(ChatTemplateTest, NamedTemplatesAndContext) {
  const ojson config = {
      {"eos_token", "</s>"},
      {"chat_template",
       {{{"name", "default"},
         {"template", "D{{ tools is none }}{{ documents is none }}{{ add_generation_prompt }}"}},
        {{"name", "tool_use"}, {"template", "T{{ tools|length }}{{ eos_token }}{{ extra }}"}}}}};
  absl::StatusOr<TokenizerChatTemplate> tmpl = TokenizerChatTemplate::FromConfig(config.dump());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EXPECT_EQ(*tmpl->Apply(ojson::array(), false), "DTrueTrueFalse");
  EXPECT_EQ(*tmpl->Apply(ojson::array(), true, {{"tools", {1, 2}}, {"extra", "!"}}), "T2</s>!");
  EXPECT_EQ(*tmpl->Apply(ojson::array(), true, {{"tools", nullptr}}), "DTrueTrueTrue");
}

TEST(ChatTemplateTest, ConfigErrors) {
  EXPECT_EQ(TokenizerChatTemplate::FromConfig("not json").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenizerChatTemplate::FromConfig("{}").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(TokenizerChatTemplate::FromConfig(R"({"chat_template": 3})").status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status status =
      TokenizerChatTemplate::FromConfig(R"({"chat_template": "{% if x %}"})").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("chat template: line 1"), std::string::npos) << status;
  EXPECT_EQ(ApplyChatTemplate(R"({"chat_template": "{{ messages|length }}"})",
                              nlohmann::json::array({1, 2}), false)
                .value(),
            "2");
  absl::StatusOr<TokenizerChatTemplate> tmpl =
      TokenizerChatTemplate::FromConfig(R"({"chat_template": "x"})");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_EQ(tmpl->Apply(ojson::array(), false, ojson::array()).status().code(),
            absl::StatusCode::kInvalidArgument);  // extra must be an object
}

}  // namespace
}  // namespace tandem
