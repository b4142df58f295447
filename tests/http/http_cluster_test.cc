// The OpenAI-compatible HTTP API against real processes on loopback, through curl: completions
// and chat completions (JSON and server-sent events) give the gRPC path's tokens, greedy and
// seeded; logprobs agree with gRPC and with Score; errors come in OpenAI's shape with the right
// status and the field named; API keys; a client that disconnects frees its request on every
// worker; the deadline is 504; a full router is 429.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "engine/loaders/model_writer.h"
#include "engine/sampling/sampler.h"
#include "structured/json_matcher.h"
#include "tests/http/http_client.h"
#include "tests/metrics/metrics_text.h"
#include "tests/serving/cluster.h"
#include "tests/tools/up_cluster.h"
#include "text/chat_template/chat_template.h"
#include "text/llama2c_tokenizer.h"
#include "text/load_tokenizer.h"

namespace tandem {
namespace {

using nlohmann::json;
using testing::Cluster;
using testing::Curl;
using testing::CurlMethod;
using testing::HttpReply;
using testing::SseEvents;

// A chat template written for the test (stories260K ships none).
constexpr char kTemplate[] =
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] | trim + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}";

// What a shell command prints (curl with flags Curl does not take: its headers, another
// source address).
std::string Shell(const std::string& cmd) {
  std::string out;
  if (FILE* f = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) out.append(buf, n);
    ::pclose(f);
  }
  return out;
}

std::string WriteFile(const testing::TempDir& dir, const std::string& name,
                      const std::string& text) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::unique_ptr<Tokenizer> Tok() {
  return std::move(*Llama2cTokenizer::Load(testing::Tok512(), 512));
}

std::string FinishName(v1::FinishReason r) {
  return r == v1::FINISH_REASON_STOP ? "stop" : "length";
}

// The text of a streamed completion or chat completion, and its finish reason and usage.
struct StreamResult {
  std::string text;
  std::string finish;
  json usage;
  bool done = false;
  bool role_first = false;
};

StreamResult Collect(const std::string& body, bool chat) {
  StreamResult r;
  const std::vector<json> events = SseEvents(body);
  for (size_t i = 0; i < events.size(); ++i) {
    const json& e = events[i];
    if (e == "[DONE]") {
      r.done = i + 1 == events.size();
      continue;
    }
    if (e.contains("usage") && !e["usage"].is_null()) r.usage = e["usage"];
    if (e["choices"].empty()) continue;
    const json& c = e["choices"][0];
    if (chat) {
      if (i == 0) r.role_first = c["delta"].value("role", "") == "assistant";
      r.text += c["delta"].value("content", "");
    } else {
      r.text += c["text"].get<std::string>();
    }
    if (!c["finish_reason"].is_null()) r.finish = c["finish_reason"];
  }
  return r;
}

TEST(HttpClusterTest, CompletionsAndChatGiveTheGrpcTokens) {
  testing::TempDir dir;
  const std::string tmpl = WriteFile(dir, "chat.jinja", kTemplate);
  Cluster c(1, 1, {}, {"--chat-template", tmpl});
  ASSERT_TRUE(c.ready());
  ASSERT_FALSE(c.http().empty());
  struct Case {
    std::string prompt;
    float temperature;
    float top_p;
  };
  for (const Case& k : std::vector<Case>{{"Once upon a time", 0.0f, 1.0f},
                                         {"The cat", 0.8f, 0.9f},
                                         {"Lily and Ben", 1.0f, 1.0f}}) {
    SCOPED_TRACE(k.prompt + " T=" + std::to_string(k.temperature));
    v1::GenerateRequest g;
    g.set_text(k.prompt);
    g.set_max_tokens(40);
    g.mutable_sampling()->set_temperature(k.temperature);
    g.mutable_sampling()->set_top_p(k.top_p);
    g.mutable_sampling()->set_seed(7);
    const testing::Streamed want = testing::Generate(c.generation(), g);
    ASSERT_TRUE(want.status.ok()) << want.status.error_message();

    json body = {{"model", "stories260K"},       {"prompt", k.prompt}, {"max_tokens", 40},
                 {"temperature", k.temperature}, {"top_p", k.top_p},   {"seed", 7}};
    HttpReply r = Curl(c.http(), "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    json j = r.Json();
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_EQ(j["model"], "stories260K");
    EXPECT_EQ(j["choices"][0]["text"], want.text);
    EXPECT_EQ(j["choices"][0]["finish_reason"], FinishName(want.finish));
    EXPECT_EQ(j["usage"]["completion_tokens"], want.tokens.size());
    EXPECT_EQ(j["usage"]["total_tokens"],
              j["usage"]["prompt_tokens"].get<int>() + static_cast<int>(want.tokens.size()));

    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    r = Curl(c.http(), "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    StreamResult s = Collect(r.body, false);
    EXPECT_TRUE(s.done);
    EXPECT_EQ(s.text, want.text);
    EXPECT_EQ(s.finish, FinishName(want.finish));
    EXPECT_EQ(s.usage["completion_tokens"], want.tokens.size());

    // Chat: the template rendered here, tokenized without special tokens, through gRPC.
    const json messages = json::array({{{"role", "system"}, {"content", "You tell stories."}},
                                       {{"role", "user"}, {"content", k.prompt}}});
    auto chat_template =
        TokenizerChatTemplate::FromConfig(json{{"chat_template", kTemplate}}.dump());
    ASSERT_TRUE(chat_template.ok());
    auto rendered = chat_template->Apply(messages, true);
    ASSERT_TRUE(rendered.ok());
    v1::GenerateRequest gc = g;
    const std::vector<int> ids = Tok()->Encode(*rendered, false);
    gc.mutable_tokens()->mutable_ids()->Add(ids.begin(), ids.end());
    const testing::Streamed want_chat = testing::Generate(c.generation(), gc);
    ASSERT_TRUE(want_chat.status.ok());
    json chat = {{"messages", messages},
                 {"max_completion_tokens", 40},
                 {"temperature", k.temperature},
                 {"top_p", k.top_p},
                 {"seed", 7}};
    r = Curl(c.http(), "/v1/chat/completions", chat.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    j = r.Json();
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
    EXPECT_EQ(j["choices"][0]["message"]["content"], want_chat.text);
    EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());
    EXPECT_EQ(j["usage"]["completion_tokens"], want_chat.tokens.size());
    chat["stream"] = true;
    r = Curl(c.http(), "/v1/chat/completions", chat.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    s = Collect(r.body, true);
    EXPECT_TRUE(s.done);
    EXPECT_TRUE(s.role_first);
    EXPECT_EQ(s.text, want_chat.text);
    EXPECT_EQ(s.finish, FinishName(want_chat.finish));
    EXPECT_TRUE(s.usage.is_null());  // not asked for
  }
  EXPECT_TRUE(c.AllBlocksFree());
}

// n, best_of, several prompts, echo and the penalties over HTTP: choice i of each prompt is the
// gRPC generation with seed ChoiceSeed(seed, i) and the same sampling, in JSON and in the stream.
TEST(HttpClusterTest, ChoicesPromptsEchoAndPenaltiesGiveTheGrpcTokens) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  const std::vector<std::string> prompts = {"Once upon a time", "The cat"};
  const int n = 3;
  std::vector<std::string> want;  // prompt-major
  for (const std::string& prompt : prompts) {
    for (int i = 0; i < n; ++i) {
      v1::GenerateRequest g;
      g.set_text(prompt);
      g.set_max_tokens(30);
      v1::SamplingParams* sp = g.mutable_sampling();
      sp->set_temperature(0.9f);
      sp->set_seed(ChoiceSeed(11, i));
      sp->set_presence_penalty(0.5f);
      sp->set_frequency_penalty(0.3f);
      sp->set_repetition_penalty(1.2f);
      sp->set_min_tokens(30);
      (*sp->mutable_logit_bias())[13] = -5.0f;
      const testing::Streamed got = testing::Generate(c.generation(), g);
      ASSERT_TRUE(got.status.ok()) << got.status.error_message();
      want.push_back(prompt + got.text);
    }
  }
  EXPECT_NE(want[0], want[1]);  // the choices differ
  json body = {{"prompt", prompts},
               {"n", n},
               {"max_tokens", 30},
               {"temperature", 0.9},
               {"seed", 11},
               {"echo", true},
               {"presence_penalty", 0.5},
               {"frequency_penalty", 0.3},
               {"repetition_penalty", 1.2},
               {"min_tokens", 30},
               {"logit_bias", {{"13", -5}}}};
  HttpReply r = Curl(c.http(), "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  ASSERT_EQ(j["choices"].size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], want[i]) << "choice " << i;
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 30 * want.size());

  body["stream"] = true;
  r = Curl(c.http(), "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<std::string> streamed(want.size());
  for (const json& e : SseEvents(r.body)) {
    if (e == "[DONE]" || e["choices"].empty()) continue;
    const json& ch = e["choices"][0];
    streamed.at(ch["index"].get<size_t>()) += ch["text"].get<std::string>();
  }
  EXPECT_EQ(streamed, want);

  // best_of 3, n 1: the gRPC candidate (seed ChoiceSeed(5, i)) with the highest cumulative
  // log-probability.
  std::string best;
  double best_logprob = -1e300;
  for (int i = 0; i < 3; ++i) {
    v1::GenerateRequest g;
    g.set_text(prompts[0]);
    g.set_max_tokens(20);
    g.mutable_sampling()->set_temperature(1.0f);
    g.mutable_sampling()->set_seed(ChoiceSeed(5, i));
    g.mutable_sampling()->set_logprobs(true);
    grpc::ClientContext ctx;
    auto reader = c.generation()->Generate(&ctx, g);
    v1::GenerateResponse m;
    std::string text;
    double logprob = 0;
    while (reader->Read(&m)) {
      text += m.text();
      for (const auto& l : m.logprobs()) logprob += l.logprob();
    }
    ASSERT_TRUE(reader->Finish().ok());
    if (logprob > best_logprob) best_logprob = logprob, best = text;
  }
  json pick = {{"prompt", prompts[0]},
               {"max_tokens", 20},
               {"temperature", 1.0},
               {"seed", 5},
               {"best_of", 3}};
  r = Curl(c.http(), "/v1/completions", pick.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  j = r.Json();
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["text"], best);
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(c.AllBlocksFree());
}

// response_format json_schema and json_object on both endpoints: the text is the gRPC text for
// the same schema, one JSON value that validates (structured/ has the schema checks against the
// jsonschema package), streamed or not; a forced tool_choice gives one call with valid
// arguments; an unsupported schema is a 400 naming response_format.
TEST(HttpClusterTest, ResponseFormatGivesTheGrpcTokensAsValidJson) {
  testing::TempDir dir;
  Cluster c(1, 1, {}, {"--chat-template", WriteFile(dir, "chat.jinja", kTemplate)});
  ASSERT_TRUE(c.ready());
  const json schema = json::parse(R"({"type": "object", "properties": {
      "title": {"type": "string", "maxLength": 10}, "pages": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["cat", "dog", "sun"]}, "maxItems": 3}},
      "required": ["title", "pages", "tags"], "additionalProperties": false})");
  const std::string prompt = "Once upon a time";
  for (float temperature : {0.0f, 0.8f}) {
    v1::GenerateRequest g;
    g.set_text(prompt);
    g.set_max_tokens(150);
    g.mutable_sampling()->set_temperature(temperature);
    g.mutable_sampling()->set_seed(3);
    g.mutable_sampling()->set_json_schema(schema.dump());
    const testing::Streamed want = testing::Generate(c.generation(), g);
    ASSERT_TRUE(want.status.ok()) << want.status.error_message();
    EXPECT_EQ(want.finish, v1::FINISH_REASON_STOP) << want.text << " " << want.tokens.size();
    const auto compiled = *structured::JsonSchema::Compile(schema.dump());
    structured::JsonMatcher m(compiled->root());
    EXPECT_TRUE(m.Feed(want.text) && m.Complete()) << want.text;
    const json value = json::parse(want.text, nullptr, false);
    ASSERT_TRUE(value.is_object()) << want.text;
    EXPECT_TRUE(value["pages"].is_number_integer()) << want.text;

    json body = {
        {"prompt", prompt},
        {"max_tokens", 150},
        {"temperature", temperature},
        {"seed", 3},
        {"response_format",
         {{"type", "json_schema"}, {"json_schema", {{"name", "book"}, {"schema", schema}}}}}};
    HttpReply r = Curl(c.http(), "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.Json()["choices"][0]["text"], want.text);
    EXPECT_EQ(r.Json()["choices"][0]["finish_reason"], "stop");
    body["stream"] = true;
    r = Curl(c.http(), "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    std::string streamed;
    for (const json& e : SseEvents(r.body)) {
      if (e == "[DONE]" || e["choices"].empty()) continue;
      streamed += e["choices"][0]["text"].get<std::string>();
    }
    EXPECT_EQ(streamed, want.text);
  }

  // json_object through the chat API: any object.
  json chat = {{"messages", {{{"role", "user"}, {"content", "Tell a story"}}}},
               {"max_tokens", 200},
               {"temperature", 0.7},
               {"seed", 1},
               {"response_format", {{"type", "json_object"}}}};
  HttpReply r = Curl(c.http(), "/v1/chat/completions", chat.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json choice = r.Json()["choices"][0];
  if (choice["finish_reason"] == "stop") {
    const std::string content = choice["message"]["content"];
    EXPECT_TRUE(json::parse(content, nullptr, false).is_object()) << content;
  } else {  // out of tokens: still a prefix of an object
    structured::JsonMatcher m(structured::JsonSchema::AnyObject()->root());
    EXPECT_TRUE(m.Feed(choice["message"]["content"].get<std::string>()));
  }

  // A forced tool call: one call to the named function whose arguments fit its parameters,
  // streamed or not, whatever the model would have said.
  json tool_chat = json::parse(R"({
      "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
      "max_tokens": 300, "temperature": 0.7, "seed": 2,
      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
          "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
          "days": {"type": "integer"}}, "required": ["city", "days"]}}}],
      "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})");
  for (bool stream : {false, true}) {
    tool_chat["stream"] = stream;
    r = Curl(c.http(), "/v1/chat/completions", tool_chat.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    json call;
    std::string finish;
    if (stream) {
      for (const json& e : SseEvents(r.body)) {
        if (e == "[DONE]" || e["choices"].empty()) continue;
        const json& ch = e["choices"][0];
        if (ch["delta"].contains("tool_calls")) call = ch["delta"]["tool_calls"][0];
        if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
      }
    } else {
      const json reply = r.Json();
      const json& ch = reply["choices"][0];
      ASSERT_EQ(ch["message"]["tool_calls"].size(), 1u) << r.body;
      EXPECT_TRUE(ch["message"]["content"].is_null()) << r.body;
      call = ch["message"]["tool_calls"][0];
      finish = ch["finish_reason"];
    }
    EXPECT_EQ(finish, "tool_calls") << r.body;
    ASSERT_TRUE(call.is_object()) << r.body;
    EXPECT_EQ(call["function"]["name"], "get_weather") << r.body;
    const json args = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(args.is_object()) << r.body;
    EXPECT_TRUE(args["city"].is_string()) << r.body;
    EXPECT_TRUE(args["days"].is_number_integer()) << r.body;
  }

  chat["response_format"] = {
      {"type", "json_schema"},
      {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"minimum", 1}}}}}};
  r = Curl(c.http(), "/v1/chat/completions", chat.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.Json()["error"]["param"], "response_format") << r.body;
  EXPECT_NE(r.body.find("minimum"), std::string::npos) << r.body;
  EXPECT_TRUE(c.AllBlocksFree());
}

// An agent loop over HTTP with a template that renders tools, calls and results as Qwen2.5's
// does, in few tokens (tests/fixtures/chat/tools_short.jinja): a forced call,
// then the second turn exactly as the openai SDK sends it back (the assistant message with
// content null and arguments as JSON text, the tool's result with tool_call_id), whose answer is
// the gRPC generation of the prompt the template renders from the messages in transformers'
// form (content "", arguments an object). tests/clients/ runs the same loop with the SDK itself.
TEST(HttpClusterTest, AgentLoopToolCallResultAndAnswer) {
  const std::string tmpl_path = testing::SourceDir() + "/tests/fixtures/chat/tools_short.jinja";
  Cluster c(1, 1, {}, {"--chat-template", tmpl_path});
  ASSERT_TRUE(c.ready());
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string",
      "maxLength": 12}}, "required": ["city"]}}}])");
  json messages = json::array({{{"role", "user"}, {"content", "What is the weather in Paris?"}}});
  json first = {{"messages", messages},
                {"tools", tools},
                {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                {"max_tokens", 300},
                {"temperature", 0.7},
                {"seed", 2}};
  HttpReply r = Curl(c.http(), "/v1/chat/completions", first.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json assistant = r.Json()["choices"][0]["message"];
  ASSERT_EQ(r.Json()["choices"][0]["finish_reason"], "tool_calls") << r.body;
  ASSERT_TRUE(assistant["content"].is_null()) << r.body;
  ASSERT_EQ(assistant["tool_calls"].size(), 1u) << r.body;
  const json call = assistant["tool_calls"][0];
  const json args = json::parse(call["function"]["arguments"].get<std::string>());
  // The SDK's second turn: its own message back, then the tool's result.
  messages.push_back({{"content", nullptr}, {"role", "assistant"}, {"tool_calls", {call}}});
  messages.push_back({{"role", "tool"},
                      {"tool_call_id", call["id"]},
                      {"content", "{\"city\": " + args["city"].dump() + ", \"celsius\": 22}"}});
  const json second = {{"messages", messages},
                       {"tools", tools},
                       {"max_tokens", 24},
                       {"temperature", 0.7},
                       {"seed", 5}};
  r = Curl(c.http(), "/v1/chat/completions", second.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json answer = r.Json();
  ASSERT_TRUE(answer["choices"][0]["message"]["content"].is_string()) << r.body;

  // The same turn through gRPC: the template given transformers' form of the messages.
  json expected = messages;
  expected[1]["content"] = "";
  expected[1]["tool_calls"][0]["function"]["arguments"] = args;
  auto config = TokenizerChatTemplate::FromConfig(
      json{{"chat_template", *ReadFileToString(tmpl_path)}}.dump());
  ASSERT_TRUE(config.ok());
  auto rendered = config->Apply(expected, true, json{{"tools", tools}});
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_NE(rendered->find("<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": "),
            std::string::npos)
      << *rendered;
  EXPECT_NE(rendered->find("\ntool: {\"city\": "), std::string::npos) << *rendered;
  const std::vector<int> ids = Tok()->Encode(*rendered, false);
  v1::GenerateRequest g;
  g.mutable_tokens()->mutable_ids()->Add(ids.begin(), ids.end());
  g.set_max_tokens(24);
  g.mutable_sampling()->set_temperature(0.7f);
  g.mutable_sampling()->set_seed(5);
  const testing::Streamed want = testing::Generate(c.generation(), g);
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  EXPECT_EQ(answer["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(answer["choices"][0]["message"]["content"], want.text);
  EXPECT_TRUE(c.AllBlocksFree());
}

// tool_choice "required" over several tools on a real cluster: whatever the tiny model would
// say, one call to one of the tools whose arguments fit that tool's parameters, streamed or not.
TEST(HttpClusterTest, RequiredToolChoiceConstrainsTheArgumentsOfTheToolNamed) {
  const std::string tmpl_path = testing::SourceDir() + "/tests/fixtures/chat/tools_short.jinja";
  Cluster c(1, 1, {}, {"--chat-template", tmpl_path});
  ASSERT_TRUE(c.ready());
  json request = json::parse(R"({
      "messages": [{"role": "user", "content": "What is the weather in Paris, and the time?"}],
      "max_tokens": 200, "temperature": 1.0, "tool_choice": "required",
      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
          "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
          "required": ["city"], "additionalProperties": false}}},
                {"type": "function", "function": {"name": "get_time", "parameters": {
          "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]},
          "seconds": {"type": "boolean"}}, "required": ["zone", "seconds"]}}}]})");
  std::set<std::string> named;
  for (int seed = 0; seed < 8; ++seed) {
    for (bool stream : {false, true}) {
      SCOPED_TRACE(absl::StrFormat("seed %d stream %d", seed, stream));
      request["seed"] = seed;
      request["stream"] = stream;
      const HttpReply r = Curl(c.http(), "/v1/chat/completions", request.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      json call;
      std::string finish;
      int calls = 0;
      if (stream) {
        for (const json& e : SseEvents(r.body)) {
          if (e == "[DONE]" || e["choices"].empty()) continue;
          const json& ch = e["choices"][0];
          if (ch["delta"].contains("tool_calls")) {
            call = ch["delta"]["tool_calls"][0];
            ++calls;
          }
          if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
        }
      } else {
        const json reply = r.Json();
        const json& ch = reply["choices"][0];
        calls = static_cast<int>(ch["message"]["tool_calls"].size());
        if (calls > 0) call = ch["message"]["tool_calls"][0];
        finish = ch["finish_reason"];
      }
      ASSERT_EQ(calls, 1) << r.body;
      EXPECT_EQ(finish, "tool_calls") << r.body;
      const std::string name = call["function"]["name"];
      const json args = json::parse(call["function"]["arguments"].get<std::string>());
      named.insert(name);
      if (name == "get_weather") {
        ASSERT_EQ(args.size(), 1u) << args.dump();
        EXPECT_TRUE(args["city"].is_string()) << args.dump();
      } else {
        ASSERT_EQ(name, "get_time");
        EXPECT_TRUE(args["zone"] == "UTC" || args["zone"] == "CET") << args.dump();
        EXPECT_TRUE(args["seconds"].is_boolean()) << args.dump();
      }
    }
  }
  EXPECT_FALSE(named.empty());  // which tool the tiny model picks is its choice
  EXPECT_TRUE(c.AllBlocksFree());
}

// The text of a Responses answer's message items.
std::string OutputText(const json& response) {
  std::string text;
  for (const json& item : response["output"]) {
    if (item["type"] != "message") continue;
    for (const json& part : item["content"]) text += part["text"].get<std::string>();
  }
  return text;
}

// /v1/responses on a real cluster: text as chat completions gives it for the same messages
// (which give the gRPC tokens), streamed as the Responses API's events; an agent loop (a forced
// function call, the call and its output sent back as input items, the answer) as chat's; the
// fields it cannot honour are 400 naming them.
TEST(HttpClusterTest, ResponsesApiIsChatCompletions) {
  const std::string tmpl_path = testing::SourceDir() + "/tests/fixtures/chat/tools_short.jinja";
  Cluster c(1, 1, {}, {"--chat-template", tmpl_path});
  ASSERT_TRUE(c.ready());
  const json plain = {{"input", "Tell me a story"},
                      {"instructions", "You tell stories."},
                      {"max_output_tokens", 24},
                      {"temperature", 0.7},
                      {"seed", 5}};
  HttpReply r = Curl(c.http(), "/v1/responses", plain.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json response = r.Json();
  const json chat = {{"messages",
                      {{{"role", "system"}, {"content", "You tell stories."}},
                       {{"role", "user"}, {"content", "Tell me a story"}}}},
                     {"max_tokens", 24},
                     {"temperature", 0.7},
                     {"seed", 5}};
  HttpReply want = Curl(c.http(), "/v1/chat/completions", chat.dump());
  ASSERT_EQ(want.status, 200) << want.body;
  const json completion = want.Json();
  EXPECT_EQ(response["object"], "response");
  EXPECT_TRUE(response["id"].get<std::string>().starts_with("resp_")) << r.body;
  EXPECT_EQ(response["model"], "stories260K");
  EXPECT_EQ(OutputText(response), completion["choices"][0]["message"]["content"]) << r.body;
  EXPECT_EQ(response["status"],
            completion["choices"][0]["finish_reason"] == "length" ? "incomplete" : "completed");
  EXPECT_EQ(response["usage"]["input_tokens"], completion["usage"]["prompt_tokens"]);
  EXPECT_EQ(response["usage"]["output_tokens"], completion["usage"]["completion_tokens"]);
  EXPECT_EQ(response["instructions"], "You tell stories.");

  // Streamed: the events, numbered, whose deltas make the same text.
  json streamed_request = plain;
  streamed_request["stream"] = true;
  r = Curl(c.http(), "/v1/responses", streamed_request.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find("event: response.created\ndata: "), std::string::npos) << r.body;
  const std::vector<json> events = SseEvents(r.body);
  ASSERT_GE(events.size(), 4u) << r.body;
  std::string deltas;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["sequence_number"], i);
    if (events[i]["type"] == "response.output_text.delta") deltas += events[i]["delta"];
  }
  EXPECT_EQ(events.front()["type"], "response.created");
  EXPECT_EQ(events.back()["type"], "response." + response["status"].get<std::string>());
  EXPECT_EQ(deltas, OutputText(response));
  EXPECT_EQ(OutputText(events.back()["response"]), OutputText(response));

  // An agent loop: a forced call, then the call and its output as the SDK sends them back.
  const json tools = json::parse(R"([{"type": "function", "name": "get_weather",
      "description": "The weather now", "parameters": {"type": "object", "properties":
      {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}])");
  json input = json::array({{{"role", "user"}, {"content", "What is the weather in Paris?"}}});
  json first = {{"input", input},
                {"tools", tools},
                {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}},
                {"max_output_tokens", 300},
                {"temperature", 0.7},
                {"seed", 2}};
  for (bool stream : {false, true}) {
    first["stream"] = stream;
    r = Curl(c.http(), "/v1/responses", first.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    json answer = stream ? SseEvents(r.body).back()["response"] : r.Json();
    ASSERT_EQ(answer["status"], "completed") << r.body;
    ASSERT_EQ(answer["output"].size(), 1u) << r.body;
    const json call = answer["output"][0];
    EXPECT_EQ(call["type"], "function_call");
    EXPECT_EQ(call["name"], "get_weather");
    const json args = json::parse(call["arguments"].get<std::string>());
    EXPECT_TRUE(args["city"].is_string()) << r.body;
    if (stream) {
      std::string arguments;
      for (const json& e : SseEvents(r.body)) {
        if (e["type"] == "response.function_call_arguments.delta") arguments += e["delta"];
      }
      EXPECT_EQ(arguments, call["arguments"]);
      continue;
    }
    input.push_back(call);  // the SDK's output item, id and status included
    input.push_back({{"type", "function_call_output"},
                     {"call_id", call["call_id"]},
                     {"output", "{\"city\": " + args["city"].dump() + ", \"celsius\": 22}"}});
    // The same turn through chat completions, as the openai SDK sends it there.
    const json messages = {
        {{"role", "user"}, {"content", "What is the weather in Paris?"}},
        {{"role", "assistant"},
         {"content", nullptr},
         {"tool_calls",
          {{{"id", call["call_id"]},
            {"type", "function"},
            {"function", {{"name", "get_weather"}, {"arguments", call["arguments"]}}}}}}},
        {{"role", "tool"}, {"tool_call_id", call["call_id"]}, {"content", input.back()["output"]}}};
    json chat_tools = json::array();
    for (const json& t : tools) {
      chat_tools.push_back({{"type", "function"},
                            {"function",
                             {{"name", t["name"]},
                              {"description", t["description"]},
                              {"parameters", t["parameters"]}}}});
    }
    want = Curl(c.http(), "/v1/chat/completions",
                json{{"messages", messages},
                     {"tools", chat_tools},
                     {"max_tokens", 24},
                     {"temperature", 0.7},
                     {"seed", 5}}
                    .dump());
    ASSERT_EQ(want.status, 200) << want.body;
    r = Curl(c.http(), "/v1/responses",
             json{{"input", input},
                  {"tools", tools},
                  {"max_output_tokens", 24},
                  {"temperature", 0.7},
                  {"seed", 5}}
                 .dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.Json()["usage"]["input_tokens"], want.Json()["usage"]["prompt_tokens"]);
    EXPECT_GT(r.Json()["usage"]["input_tokens"], answer["usage"]["input_tokens"]);
    // The same answer: its text, or (the template shows the tool) the same calls.
    const json message = want.Json()["choices"][0]["message"];
    std::vector<std::pair<std::string, std::string>> want_calls, got_calls;
    for (const json& tc : message.value("tool_calls", json::array())) {
      want_calls.emplace_back(tc["function"]["name"], tc["function"]["arguments"]);
    }
    const json reply = r.Json();
    for (const json& item : reply["output"]) {
      if (item["type"] == "function_call") got_calls.emplace_back(item["name"], item["arguments"]);
    }
    EXPECT_EQ(got_calls, want_calls) << r.body;
    if (want_calls.empty()) {
      EXPECT_EQ(OutputText(r.Json()), message["content"]) << r.body;
    }
  }

  // What it cannot honour, named.
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"input": "a", "background": true})", "background"},
           {R"({"input": "a", "tools": [{"type": "web_search"}]})", "tools[0].type"},
           {R"({"input": "a", "max_output_tokens": 100000})", "max_output_tokens"},
           {R"({"input": [{"type": "function_call_output", "call_id": "x", "output": "1"}]})",
            "input[0].call_id"}}) {
    r = Curl(c.http(), "/v1/responses", body);
    EXPECT_EQ(r.status, 400) << body << " " << r.body;
    EXPECT_EQ(r.Json()["error"]["param"], param) << r.body;
  }
  r = Curl(c.http(), "/v1/responses/resp_1");
  EXPECT_EQ(r.status, 404) << r.body;
  r = Curl(c.http(), "/v1/responses", R"({"input": "a", "previous_response_id": "resp_1"})");
  EXPECT_EQ(r.status, 404) << r.body;
  EXPECT_NE(r.body.find("previous_response_id"), std::string::npos) << r.body;

  // Stored by default: read back, continued (the second turn's prompt holds the first turn and
  // its answer), deleted.
  const HttpReply turn1 =
      Curl(c.http(), "/v1/responses", R"({"input": "Tell me a story.", "max_output_tokens": 8})");
  ASSERT_EQ(turn1.status, 200) << turn1.body;
  const std::string id = turn1.Json()["id"];
  EXPECT_EQ(turn1.Json()["store"], true);
  r = Curl(c.http(), "/v1/responses/" + id);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["output"], turn1.Json()["output"]);
  const json next = {
      {"input", "And then?"}, {"previous_response_id", id}, {"max_output_tokens", 4}};
  const HttpReply second = Curl(c.http(), "/v1/responses", next.dump());
  ASSERT_EQ(second.status, 200) << second.body;
  EXPECT_EQ(second.Json()["previous_response_id"], id);
  const json alone = {{"input", "And then?"}, {"max_output_tokens", 4}, {"store", false}};
  const HttpReply fresh = Curl(c.http(), "/v1/responses", alone.dump());
  ASSERT_EQ(fresh.status, 200) << fresh.body;
  EXPECT_GT(second.Json()["usage"]["input_tokens"].get<int>(),
            fresh.Json()["usage"]["input_tokens"].get<int>() +
                turn1.Json()["usage"]["output_tokens"].get<int>());
  EXPECT_EQ(Curl(c.http(), "/v1/responses/" + fresh.Json()["id"].get<std::string>()).status, 404);
  EXPECT_EQ(CurlMethod(c.http(), "DELETE", "/v1/responses/" + id).status, 200);
  EXPECT_EQ(Curl(c.http(), "/v1/responses/" + id).status, 404);
  EXPECT_TRUE(c.AllBlocksFree());
}

// vLLM's structured-output fields on both endpoints: guided_choice and structured_outputs.choice
// give exactly one of the strings, guided_json and structured_outputs.json a value of the schema,
// each the gRPC tokens for sampling.choice or sampling.json_schema; a regex or a grammar is a
// 400 naming the field.
TEST(HttpClusterTest, VllmGuidedFieldsGiveTheGrpcTokens) {
  testing::TempDir dir;
  Cluster c(1, 1, {}, {"--chat-template", WriteFile(dir, "chat.jinja", kTemplate)});
  ASSERT_TRUE(c.ready());
  const json choices = {"happy ending", "sad ending", "no ending at all"};
  const json schema = json::parse(R"({"type": "object", "properties": {"mood":
      {"enum": ["calm", "wild"]}, "n": {"type": "integer"},
      "code": {"type": "string", "pattern": "^[a-z]{2}-[0-9]$"}},
      "required": ["mood", "n", "code"]})");
  // A pattern std::regex checks the output against independently.
  const std::string pattern = R"((The|A) (cat|dog|bird) (sat|ran|flew) [0-9]{1,3} times\.)";
  enum Kind { kChoice, kJson, kRegex };
  struct Case {
    std::string field;  // as the client writes it
    json value;
    Kind kind;
  };
  const std::vector<Case> cases = {
      {"guided_choice", choices, kChoice}, {"structured_outputs", {{"choice", choices}}, kChoice},
      {"guided_json", schema, kJson},      {"structured_outputs", {{"json", schema}}, kJson},
      {"guided_regex", pattern, kRegex},   {"structured_outputs", {{"regex", pattern}}, kRegex}};
  for (bool chat : {false, true}) {
    const json messages = {{{"role", "user"}, {"content", "How does it end?"}}};
    v1::GenerateRequest g;
    if (chat) {
      auto tmpl = TokenizerChatTemplate::FromConfig(json{{"chat_template", kTemplate}}.dump());
      ASSERT_TRUE(tmpl.ok());
      const std::vector<int> ids = Tok()->Encode(*tmpl->Apply(messages, true), false);
      g.mutable_tokens()->mutable_ids()->Add(ids.begin(), ids.end());
    } else {
      g.set_text("The story ends with");
    }
    g.set_max_tokens(120);
    g.mutable_sampling()->set_temperature(0.9f);
    g.mutable_sampling()->set_seed(4);
    for (const Case& k : cases) {
      SCOPED_TRACE(k.field + (chat ? " chat" : " completions"));
      v1::GenerateRequest want_req = g;
      if (k.kind == kChoice) {
        for (const json& x : choices) want_req.mutable_sampling()->add_choice(x);
      } else if (k.kind == kRegex) {
        want_req.mutable_sampling()->set_regex(pattern);
      } else {
        want_req.mutable_sampling()->set_json_schema(schema.dump());
      }
      const testing::Streamed want = testing::Generate(c.generation(), want_req);
      ASSERT_TRUE(want.status.ok()) << want.status.error_message();
      EXPECT_EQ(want.finish, v1::FINISH_REASON_STOP) << want.text;
      if (k.kind == kChoice) {
        EXPECT_NE(std::find(choices.begin(), choices.end(), want.text), choices.end()) << want.text;
      } else if (k.kind == kRegex) {
        EXPECT_TRUE(std::regex_match(want.text, std::regex(pattern))) << want.text;
      } else {
        const json value = json::parse(want.text, nullptr, false);
        ASSERT_TRUE(value.is_object()) << want.text;
        EXPECT_TRUE(
            std::regex_match(value["code"].get<std::string>(), std::regex("[a-z]{2}-[0-9]")))
            << want.text;
      }
      json body = {{"max_tokens", 120}, {"temperature", 0.9}, {"seed", 4}, {k.field, k.value}};
      if (chat) {
        body["messages"] = messages;
      } else {
        body["prompt"] = "The story ends with";
      }
      const HttpReply r =
          Curl(c.http(), chat ? "/v1/chat/completions" : "/v1/completions", body.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      const json reply = r.Json();
      const json& ch = reply["choices"][0];
      EXPECT_EQ(chat ? ch["message"]["content"] : ch["text"], want.text);
      EXPECT_EQ(ch["finish_reason"], "stop");
    }
    // What Tandem cannot constrain by is refused, naming the field.
    for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
             {"guided_regex", "(a)\\1"},
             {"guided_grammar", "root ::= \"x\""},
             {"structured_outputs", {{"regex", "(?=a)a"}}},
             {"structured_outputs", {{"grammar", "root ::= \"x\""}}}}) {
      json body = {{field, value}};
      if (chat) {
        body["messages"] = messages;
      } else {
        body["prompt"] = "a";
      }
      const HttpReply r =
          Curl(c.http(), chat ? "/v1/chat/completions" : "/v1/completions", body.dump());
      EXPECT_EQ(r.status, 400) << r.body;
      const std::string param = r.Json()["error"]["param"];
      EXPECT_TRUE(param == field || param.starts_with(field + ".")) << r.body;
      EXPECT_NE(r.body.find("not supported"), std::string::npos) << r.body;
    }
  }
  EXPECT_TRUE(c.AllBlocksFree());
}

// Prompt log-probabilities: echo with logprobs and max_tokens 0 (lm-evaluation-harness's
// loglikelihood request) returns the prompt's tokens with gRPC Score's log-probabilities and
// top_logprobs, the first null; max_tokens 1 adds the generated token after them; vLLM's
// prompt_logprobs gives the same numbers with ranks, on both endpoints.
TEST(HttpClusterTest, PromptLogprobsEqualGrpcScore) {
  testing::TempDir dir;
  Cluster c(1, 1, {}, {"--chat-template", WriteFile(dir, "chat.jinja", kTemplate)});
  ASSERT_TRUE(c.ready());
  const std::vector<int> prompt = Tok()->Encode("Once upon a time, there was a cat", true);
  v1::ScoreRequest sr;
  sr.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
  sr.set_top_logprobs(3);
  v1::ScoreResponse score;
  grpc::ClientContext ctx;
  ASSERT_TRUE(c.generation()->Score(&ctx, sr, &score).ok());
  ASSERT_EQ(score.logprobs_size(), static_cast<int>(prompt.size()) - 1);
  ASSERT_EQ(score.top_logprobs_size(), score.logprobs_size());
  ASSERT_EQ(score.ranks_size(), score.logprobs_size());
  for (int i = 0; i < score.logprobs_size(); ++i) {
    const v1::TokenLogprobs& t = score.top_logprobs(i);
    ASSERT_EQ(t.top_size(), 3);
    EXPECT_EQ(t.logprob(), score.logprobs(i));
    EXPECT_LE(score.logprobs(i), t.top(0).logprob());
    EXPECT_EQ(score.ranks(i) == 1, t.top(0).token_id() == prompt[i + 1]) << i;
  }
  // The lm-evaluation-harness request: token ids, text prompts too, in JSON and streamed.
  for (const json& p : {json(prompt), json("Once upon a time, there was a cat")}) {
    for (bool stream : {false, true}) {
      SCOPED_TRACE(p.dump() + (stream ? " streamed" : ""));
      json body = {{"prompt", p},     {"echo", true},     {"logprobs", 3},
                   {"max_tokens", 0}, {"temperature", 0}, {"stream", stream}};
      const HttpReply r = Curl(c.http(), "/v1/completions", body.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      json choice;
      if (stream) {
        const std::vector<json> events = SseEvents(r.body);
        ASSERT_EQ(events.size(), 2u) << r.body;
        choice = events[0]["choices"][0];
      } else {
        choice = r.Json()["choices"][0];
        EXPECT_EQ(r.Json()["usage"]["prompt_tokens"], prompt.size());
        EXPECT_EQ(r.Json()["usage"]["completion_tokens"], 0);
      }
      EXPECT_EQ(choice["finish_reason"], "length");
      EXPECT_EQ(choice["text"], Tok()->Decode(prompt));
      const json& lp = choice["logprobs"];
      ASSERT_EQ(lp["token_logprobs"].size(), prompt.size()) << r.body;
      EXPECT_TRUE(lp["token_logprobs"][0].is_null());
      EXPECT_TRUE(lp["top_logprobs"][0].is_null());
      for (size_t i = 1; i < prompt.size(); ++i) {
        EXPECT_EQ(lp["token_logprobs"][i].get<float>(), score.logprobs(i - 1)) << i;
        EXPECT_EQ(lp["tokens"][i], ToValidUtf8(Tok()->Decode(std::vector<int>{prompt[i]})));
        const json& top = lp["top_logprobs"][i];
        EXPECT_LE(top.size(), 3u);
        const v1::TopLogprob& best = score.top_logprobs(i - 1).top(0);
        EXPECT_EQ(top[ToValidUtf8(Tok()->Decode(std::vector<int>{best.token_id()}))].get<float>(),
                  best.logprob());
      }
    }
  }
  // max_tokens 1 (the harness's newer request): the prompt's entries, then the generated one's.
  json body = {
      {"prompt", prompt}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 1}, {"temperature", 0}};
  HttpReply r = Curl(c.http(), "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json lp = r.Json()["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), prompt.size() + 1) << r.body;
  EXPECT_EQ(lp["token_logprobs"][1].get<float>(), score.logprobs(0));
  EXPECT_EQ(lp["text_offset"][prompt.size()],
            lp["text_offset"][prompt.size() - 1].get<int>() +
                lp["tokens"][prompt.size() - 1].get<std::string>().size());
  // vLLM's prompt_logprobs, on completions (per choice) and chat (beside the choices).
  body = {{"prompt", prompt}, {"prompt_logprobs", 2}, {"max_tokens", 2}};
  r = Curl(c.http(), "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json vllm = r.Json()["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(vllm.size(), prompt.size()) << r.body;
  EXPECT_TRUE(vllm[0].is_null());
  for (size_t i = 1; i < prompt.size(); ++i) {
    const json& entry = vllm[i][std::to_string(prompt[i])];
    EXPECT_EQ(entry["logprob"].get<float>(), score.logprobs(i - 1));
    EXPECT_EQ(entry["rank"], score.ranks(i - 1));
    const v1::TopLogprob& best = score.top_logprobs(i - 1).top(0);
    EXPECT_EQ(vllm[i][std::to_string(best.token_id())]["rank"], 1);
  }
  const json messages = {{{"role", "user"}, {"content", "Tell me a story"}}};
  r = Curl(c.http(), "/v1/chat/completions",
           json{{"messages", messages}, {"prompt_logprobs", 0}, {"max_tokens", 2}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  auto tmpl = TokenizerChatTemplate::FromConfig(json{{"chat_template", kTemplate}}.dump());
  const std::vector<int> chat_ids = Tok()->Encode(*tmpl->Apply(messages, true), false);
  v1::ScoreRequest chat_sr;
  chat_sr.mutable_tokens()->mutable_ids()->Add(chat_ids.begin(), chat_ids.end());
  v1::ScoreResponse chat_score;
  grpc::ClientContext chat_ctx;
  ASSERT_TRUE(c.generation()->Score(&chat_ctx, chat_sr, &chat_score).ok());
  const json chat_lp = r.Json()["prompt_logprobs"];
  ASSERT_EQ(chat_lp.size(), chat_ids.size()) << r.body;
  for (size_t i = 1; i < chat_ids.size(); ++i) {
    ASSERT_EQ(chat_lp[i].size(), 1u);  // prompt_logprobs 0: the token alone
    EXPECT_EQ(chat_lp[i][std::to_string(chat_ids[i])]["logprob"].get<float>(),
              chat_score.logprobs(i - 1));
  }
  EXPECT_TRUE(c.AllBlocksFree());
}

// vLLM's /tokenize, /detokenize, /version and /ping: the gRPC Tokenize and Detokenize answers in
// vLLM's shapes; a chat's tokens are those chat completions would generate from.
TEST(HttpClusterTest, TokenizeDetokenizeVersionAndPing) {
  testing::TempDir dir;
  Cluster c(0, 0, {}, {"--chat-template", WriteFile(dir, "chat.jinja", kTemplate)});
  ASSERT_TRUE(c.ready());
  v1::TokenizeRequest tr;
  tr.set_text("Once upon a time");
  tr.set_add_special_tokens(true);
  v1::TokenizeResponse want;
  grpc::ClientContext ctx;
  ASSERT_TRUE(c.generation()->Tokenize(&ctx, tr, &want).ok());
  HttpReply r = Curl(c.http(), "/tokenize", R"({"prompt": "Once upon a time"})");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<int> ids(want.token_ids().begin(), want.token_ids().end());
  EXPECT_EQ(r.Json()["tokens"], json(ids));
  EXPECT_EQ(r.Json()["count"], ids.size());
  EXPECT_EQ(r.Json()["max_model_len"], 512);
  EXPECT_TRUE(r.Json()["token_strs"].is_null());
  r = Curl(
      c.http(), "/tokenize",
      R"({"prompt": "Once upon a time", "add_special_tokens": false, "return_token_strs": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["tokens"], json(Tok()->Encode("Once upon a time", false)));
  EXPECT_EQ(r.Json()["token_strs"].size(), r.Json()["tokens"].size());
  // A chat: the prompt chat completions generate from (their usage counts it).
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  r = Curl(c.http(), "/tokenize", chat.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json gen = chat;
  gen["max_tokens"] = 1;
  const HttpReply completion = Curl(c.http(), "/v1/chat/completions", gen.dump());
  ASSERT_EQ(completion.status, 200) << completion.body;
  EXPECT_EQ(r.Json()["count"], completion.Json()["usage"]["prompt_tokens"]);
  r = Curl(c.http(), "/detokenize", json{{"tokens", ids}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  v1::DetokenizeRequest dr;
  dr.mutable_token_ids()->Add(ids.begin(), ids.end());
  v1::DetokenizeResponse text;
  grpc::ClientContext dctx;
  ASSERT_TRUE(c.generation()->Detokenize(&dctx, dr, &text).ok());
  EXPECT_EQ(r.Json()["prompt"], text.text());
  r = Curl(c.http(), "/detokenize", R"({"tokens": [1, 99999]})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.Json()["error"]["param"], "tokens[1]");
  r = Curl(c.http(), "/tokenize", R"({"prompt": 5})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.Json()["error"]["param"], "prompt");
  EXPECT_EQ(Curl(c.http(), "/tokenize").status, 405);  // GET

  // vLLM's /tokenizer_info (its body is openai_test's): the chat template as given; llama2.c's
  // BOS and EOS have no text, so they are null.
  r = Curl(c.http(), "/tokenizer_info");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["model_max_length"], 512);
  EXPECT_EQ(r.Json()["chat_template"], kTemplate);
  EXPECT_TRUE(r.Json()["eos_token"].is_null()) << r.body;
  EXPECT_EQ(r.Json()["add_bos_token"], true);
  EXPECT_EQ(Curl(c.http(), "/tokenizer_info", "{}").status, 405);  // POST

  r = Curl(c.http(), "/version");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(r.Json()["version"].is_string()) << r.body;
  EXPECT_EQ(Curl(c.http(), "/ping").status, 200);
  EXPECT_EQ(Curl(c.http(), "/ping", "{}").status, 200);  // POST, as SageMaker sends it
}

// By default /metrics on the HTTP port is the router's registry, as its metrics port serves it
// (and vLLM its API port), with vLLM's model_name label and the per-request token histograms.
// With --no-http-metrics the port serves no metrics (they name workers and their load).
TEST(HttpClusterTest, MetricsOnTheHttpPortWithVllmLabels) {
  {
    Cluster closed(0, 0, {}, {"--no-http-metrics"});
    ASSERT_TRUE(closed.ready());
    const HttpReply r = Curl(closed.http(), "/metrics");
    EXPECT_EQ(r.status, 404) << r.body;
    EXPECT_NE(r.body.find("--no-http-metrics"), std::string::npos) << r.body;
  }
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  for (int max_tokens : {5, 9}) {
    json body = {{"prompt", "Once upon a time"}, {"max_tokens", max_tokens}, {"ignore_eos", true}};
    ASSERT_EQ(Curl(c.http(), "/v1/completions", body.dump()).status, 200);
  }
  const auto http = testing::Scrape(c.http());
  const auto port = testing::Scrape(c.metrics()[0]);
  ASSERT_FALSE(http.empty());
  const std::map<std::string, std::string> vllm = {{"model_name", "stories260K"},
                                                   {"role", "router"}};
  EXPECT_EQ(testing::MetricValue(http, "tandem_request_generation_tokens_count", vllm), 2);
  EXPECT_EQ(testing::MetricValue(http, "tandem_request_generation_tokens_sum", vllm), 14);
  EXPECT_EQ(testing::MetricValue(http, "tandem_request_prompt_tokens_count", vllm), 2);
  EXPECT_EQ(testing::MetricValue(http, "tandem_request_success_total", vllm),
            testing::MetricValue(port, "tandem_request_success_total", vllm));
  EXPECT_EQ(testing::MetricValue(http, "tandem_generation_tokens_total", vllm), 14);
  // The decode worker's own endpoint has the per-step token histogram.
  const auto decode = testing::Scrape(c.metrics()[2]);
  EXPECT_GE(testing::MetricValue(decode, "tandem_iteration_tokens_total_count",
                                 {{"role", "decode"}, {"model_name", "stories260K"}}),
            12);
}

// Logprobs are the model's own distribution (log-softmax of the raw logits), so the generated
// tokens' logprobs are what Score gives for the same sequence, whatever the temperature.
TEST(HttpClusterTest, LogprobsAgreeWithGrpcAndScore) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  const std::vector<int> prompt = Tok()->Encode("Once upon a time", true);
  for (float temperature : {0.0f, 0.7f}) {
    SCOPED_TRACE("T=" + std::to_string(temperature));
    v1::GenerateRequest g;
    g.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
    g.set_max_tokens(24);
    g.mutable_sampling()->set_temperature(temperature);
    g.mutable_sampling()->set_seed(3);
    g.mutable_sampling()->set_logprobs(true);
    g.mutable_sampling()->set_top_logprobs(3);
    grpc::ClientContext ctx;
    auto reader = c.generation()->Generate(&ctx, g);
    std::vector<int> ids;
    std::vector<v1::TokenLogprobs> lps;
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
      ASSERT_EQ(m.logprobs_size(), m.token_ids_size());
      ids.insert(ids.end(), m.token_ids().begin(), m.token_ids().end());
      lps.insert(lps.end(), m.logprobs().begin(), m.logprobs().end());
    }
    ASSERT_TRUE(reader->Finish().ok());
    ASSERT_EQ(ids.size(), 24u);

    v1::ScoreRequest sr;
    sr.mutable_tokens()->mutable_ids()->Add(prompt.begin(), prompt.end());
    sr.mutable_tokens()->mutable_ids()->Add(ids.begin(), ids.end());
    v1::ScoreResponse score;
    grpc::ClientContext sctx;
    ASSERT_TRUE(c.generation()->Score(&sctx, sr, &score).ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      // Decode steps and one full-sequence prefill sum in different orders: float rounding.
      EXPECT_NEAR(lps[i].logprob(), score.logprobs(prompt.size() - 1 + i), 1e-3) << i;
      ASSERT_EQ(lps[i].top_size(), 3);
      for (int k = 1; k < 3; ++k) EXPECT_GE(lps[i].top(k - 1).logprob(), lps[i].top(k).logprob());
      EXPECT_LE(lps[i].logprob(), lps[i].top(0).logprob());
      if (temperature == 0) {
        EXPECT_EQ(lps[i].top(0).token_id(), ids[i]);  // greedy: the most likely token
        EXPECT_EQ(lps[i].top(0).logprob(), lps[i].logprob());
      }
    }

    // The HTTP API reports the same numbers.
    json body = {{"prompt", prompt},
                 {"max_tokens", 24},
                 {"temperature", temperature},
                 {"seed", 3},
                 {"logprobs", 3}};
    HttpReply r = Curl(c.http(), "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json lp = r.Json()["choices"][0]["logprobs"];
    ASSERT_EQ(lp["token_logprobs"].size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), lps[i].logprob(), 1e-6);
      EXPECT_EQ(lp["tokens"][i], ToValidUtf8(Tok()->Decode(std::vector<int>{ids[i]})));
      EXPECT_LE(lp["top_logprobs"][i].size(), 3u);
    }
    body["stream"] = true;
    r = Curl(c.http(), "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200);
    std::vector<double> streamed;
    for (const json& e : SseEvents(r.body)) {
      if (e == "[DONE]" || e["choices"][0]["logprobs"].is_null()) continue;
      for (const json& x : e["choices"][0]["logprobs"]["token_logprobs"]) streamed.push_back(x);
    }
    ASSERT_EQ(streamed.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_NEAR(streamed[i], lps[i].logprob(), 1e-6);
  }
}

// `tandem up` passes --served-model-name and --chat-template through to its router.
TEST(HttpClusterTest, UpPassesTheServedNameAndChatTemplateToTheRouter) {
  testing::TempDir dir;
  const std::string tmpl = dir.path() + "/t.jinja";
  std::ofstream(tmpl) << "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
  testing::UpCluster up(dir.path() + "/up.log",
                        {"--served-model-name", "story", "--chat-template", tmpl});
  ASSERT_GT(up.pid(), 0);
  const std::string http = up.WaitForHttp();
  ASSERT_FALSE(http.empty()) << up.Log();
  const HttpReply models = Curl(http, "/v1/models");
  EXPECT_EQ(models.status, 200);
  EXPECT_EQ(models.Json()["data"][0]["id"], "story") << models.body;
  const HttpReply chat =
      Curl(http, "/v1/chat/completions",
           R"({"model": "story", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
          "temperature": 0, "logprobs": false})");
  // stories260K has no chat template of its own: a chat answer means --chat-template arrived,
  // and the prompt is the template's rendering.
  EXPECT_EQ(chat.status, 200) << chat.body;
  auto tok = LoadTokenizer(testing::Tok512(), 512);
  ASSERT_TRUE(tok.ok());
  const int rendered = static_cast<int>((*tok)->Encode("<user>hi", false).size());
  const int prompt_tokens = chat.Json()["usage"]["prompt_tokens"].get<int>();
  EXPECT_TRUE(prompt_tokens == rendered || prompt_tokens == rendered + 1) << chat.body;
  EXPECT_TRUE(up.Stop());
}

TEST(HttpClusterTest, ErrorsModelsAndHealth) {
  testing::TempDir dir;
  Cluster c(1, 1, {}, {"--chat-template", WriteFile(dir, "chat.jinja", kTemplate)});
  ASSERT_TRUE(c.ready());
  auto expect_error = [&](const std::string& path, const std::string& body, int status,
                          const std::string& param) {
    SCOPED_TRACE(path + " " + body);
    const HttpReply r = Curl(c.http(), path, body);
    EXPECT_EQ(r.status, status) << r.body;
    const json j = r.Json();
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    EXPECT_TRUE(j["error"]["type"].is_string());
    EXPECT_TRUE(j["error"].contains("code"));
    if (param.empty()) {
      EXPECT_TRUE(j["error"]["param"].is_null());
    } else {
      EXPECT_EQ(j["error"]["param"], param);
      EXPECT_TRUE(j["error"]["message"].get<std::string>().starts_with(param + ": "));
    }
  };
  int invalid = 0;
  auto bad = [&](const std::string& body, const std::string& param) {
    expect_error("/v1/completions", body, 400, param);
    ++invalid;
  };
  bad("{\"prompt\": \"a\",", "");  // malformed JSON
  bad(R"({"prompt": "a", "temperature": -1})", "temperature");
  bad(R"({"prompt": "a", "top_p": 2})", "top_p");
  bad(R"({"prompt": "a", "top_k": -5})", "top_k");
  bad(R"({"prompt": "a", "max_tokens": 0})", "max_tokens");
  bad(R"({"prompt": "a", "max_tokens": 100000})", "max_tokens");
  bad(R"({"prompt": "a", "n": 100})", "n");
  bad(R"({"prompt": "a", "logprobs": 30})", "logprobs");
  bad(R"({"prompt": "a", "stop": 5})", "stop");
  bad(R"({"prompt": ""})", "prompt");
  bad(R"({"prompt": [9999]})", "prompt");
  bad(R"({"prompt": "a", "seed": "x"})", "seed");
  bad(R"({"prompt": "a", "stream": true, "stream_options": 3})", "stream_options");
  bad(R"({"prompt": "a", "stream": true, "temperature": -1})", "temperature");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}],
      "logprobs": true, "top_logprobs": 21})",
               400, "top_logprobs");
  expect_error("/v1/chat/completions", R"({"messages": [{"content": "a"}]})", 400,
               "messages[0].role");
  invalid += 2;
  expect_error("/v1/completions", R"({"model": "gpt-4", "prompt": "a"})", 404, "model");
  expect_error("/v1/nothing", "", 404, "");
  expect_error("/v1/completions/extra", R"({"prompt": "a"})", 404, "");
  expect_error("/v1/models/gpt-4", "", 404, "model");

  // Every request that reached a generation endpoint is counted with its status, as gRPC's.
  const auto samples = testing::Scrape(c.metrics()[0]);
  EXPECT_EQ(
      testing::MetricValue(samples, "tandem_requests_total", {{"status", "INVALID_ARGUMENT"}}),
      invalid);
  EXPECT_EQ(testing::MetricValue(samples, "tandem_requests_total", {{"status", "NOT_FOUND"}}), 1);

  HttpReply r = Curl(c.http(), "/v1/models");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.Json()["object"], "list");
  EXPECT_EQ(r.Json()["data"][0]["id"], "stories260K");
  EXPECT_EQ(r.Json()["data"][0]["max_model_len"], 512);
  r = Curl(c.http(), "/v1/models/stories260K");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.Json()["id"], "stories260K");
  r = Curl(c.http(), "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.Json()["status"], "ok");
  EXPECT_EQ(r.Json()["decode_workers"], 1);
  // The servers still serve.
  r = Curl(c.http(), "/v1/completions", R"({"prompt": "a", "max_tokens": 3})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(c.AllBlocksFree());
}

TEST(HttpClusterTest, ApiKeysGuardEveryV1Endpoint) {
  testing::TempDir dir;
  const std::string key = "sk-tandem-test-0123456789";
  const std::string keys = WriteFile(dir, "keys.txt", "# test keys\n" + key + "\n");
  Cluster c(0, 0, {}, {"--api-keys-file", keys});
  ASSERT_TRUE(c.ready());
  const std::string body = R"({"prompt": "Once", "max_tokens": 3})";
  for (const std::string& path : {"/v1/models", "/v1/completions"}) {
    SCOPED_TRACE(path);
    const std::string b = path == std::string("/v1/models") ? "" : body;
    HttpReply r = Curl(c.http(), path, b);
    EXPECT_EQ(r.status, 401) << r.body;
    EXPECT_EQ(r.Json()["error"]["type"], "authentication_error");
    EXPECT_EQ(r.Json()["error"]["code"], "invalid_api_key");
    r = Curl(c.http(), path, b, {"Authorization: Bearer sk-not-the-right-key-00"});
    EXPECT_EQ(r.status, 401) << r.body;
    r = Curl(c.http(), path, b, {"Authorization: Bearer " + key});
    EXPECT_EQ(r.status, 200) << r.body;
  }
  // /metrics on the HTTP port takes the key too (Prometheus sends it as a bearer token), and so
  // do /tokenize and /detokenize (as gRPC's Tokenize and Detokenize); /ping and /version do not.
  EXPECT_EQ(Curl(c.http(), "/metrics").status, 401);
  EXPECT_EQ(Curl(c.http(), "/metrics", "", {"Authorization: Bearer " + key}).status, 200);
  for (const auto& [path, request] : std::vector<std::pair<std::string, std::string>>{
           {"/tokenize", R"({"prompt": "Once"})"}, {"/detokenize", R"({"tokens": [1, 2]})"}}) {
    EXPECT_EQ(Curl(c.http(), path, request).status, 401) << path;
    EXPECT_EQ(Curl(c.http(), path, request, {"Authorization: Bearer " + key}).status, 200) << path;
  }
  EXPECT_EQ(Curl(c.http(), "/ping").status, 200);
  EXPECT_EQ(Curl(c.http(), "/version").status, 200);
  // Malformed JSON without a key is 401 first: nothing is read before the key.
  EXPECT_EQ(Curl(c.http(), "/v1/chat/completions", "{").status, 401);
  EXPECT_EQ(Curl(c.http(), "/health").status, 200);
  // /v1/responses too (with the key, past it: this model has no chat template, a 400).
  EXPECT_EQ(Curl(c.http(), "/v1/responses", R"({"input": "Once"})").status, 401);
  const HttpReply no_template =
      Curl(c.http(), "/v1/responses", R"({"input": "Once"})", {"Authorization: Bearer " + key});
  EXPECT_EQ(no_template.status, 400) << no_template.body;
  EXPECT_EQ(no_template.Json()["error"]["param"], "input") << no_template.body;
  // tandem_requests_total counts generation requests: the four refused ones (two completions
  // above, the malformed chat one, the response), not the two refused /v1/models calls.
  EXPECT_EQ(testing::MetricValue(testing::Scrape(c.metrics()[0]), "tandem_requests_total",
                                 {{"status", "UNAUTHENTICATED"}}),
            4);
}

// An API key's limits (rpc/api_keys.h): choices per request are refused 400 naming the field,
// a second generation in flight past max_concurrent and a request past the minute's
// tokens_per_minute are refused 429 with Retry-After; another key is not touched.
TEST(HttpClusterTest, ApiKeyLimitsHoldPerKey) {
  testing::TempDir dir;
  const std::string limited = "sk-tandem-limited-0123456789";
  const std::string free_key = "sk-tandem-free-0123456789abc";
  const std::string keys =
      WriteFile(dir, "keys.txt",
                limited + " max_concurrent=1 max_n=2 tokens_per_minute=60\n" + free_key + "\n");
  Cluster c(1, 1, {"--fault", "step_delay_ms=20"}, {"--api-keys-file", keys});
  ASSERT_TRUE(c.ready());
  const std::vector<std::string> as_limited = {"Authorization: Bearer " + limited};
  const std::vector<std::string> as_free = {"Authorization: Bearer " + free_key};
  HttpReply r = Curl(c.http(), "/v1/completions", R"({"prompt": "Once", "max_tokens": 2, "n": 3})",
                     as_limited);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("max_n"), std::string::npos) << r.body;
  EXPECT_EQ(r.Json()["error"]["param"], "n") << r.body;
  // One long generation in flight (40 tokens at 20 ms a step); a second is refused.
  std::thread first([&] {
    HttpReply long_one =
        Curl(c.http(), "/v1/completions",
             R"({"prompt": "Once", "max_tokens": 40, "ignore_eos": true})", as_limited);
    EXPECT_EQ(long_one.status, 200) << long_one.body;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  r = Curl(c.http(), "/v1/completions", R"({"prompt": "Once", "max_tokens": 2})", as_limited);
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_NE(r.body.find("max_concurrent"), std::string::npos) << r.body;
  r = Curl(c.http(), "/v1/completions", R"({"prompt": "Once", "max_tokens": 2})", as_free);
  EXPECT_EQ(r.status, 200) << r.body;
  first.join();
  // The first generation used its prompt and 40 tokens, then a second prompt tips the minute
  // past 60: the next is refused until the minute has passed, with Retry-After saying when.
  r = Curl(c.http(), "/v1/completions", R"({"prompt": "Once", "max_tokens": 20})", as_limited);
  EXPECT_EQ(r.status, 200) << r.body;
  const std::string cmd = "curl -s -i --max-time 30 -H 'Authorization: Bearer " + limited +
                          "' -H 'Content-Type: application/json' -d '{\"prompt\": \"Once\", "
                          "\"max_tokens\": 2}' http://" +
                          c.http() + "/v1/completions";
  const std::string head = Shell(cmd);
  EXPECT_NE(head.find("HTTP/1.1 429"), std::string::npos) << head;
  EXPECT_NE(head.find("tokens_per_minute"), std::string::npos) << head;
  EXPECT_NE(head.find("Retry-After: "), std::string::npos) << head;
  EXPECT_EQ(
      Curl(c.http(), "/v1/completions", R"({"prompt": "Once", "max_tokens": 2})", as_free).status,
      200);
  EXPECT_TRUE(c.AllBlocksFree());
}

// Fair shares of the decode batch: a tenant holding every place (four, --max-running 4) with
// eight more waiting does not make another tenant's request wait for one of its own to end: the
// newcomer takes the place of the flood's newest sequence, which resumes after its tokens so far.
// Every flood output still equals the quiet run's.
TEST(HttpClusterTest, AWaitingTenantTakesAPlaceFromTheTenantHoldingThemAll) {
  Cluster c(1, 1, {"--max-running", "4", "--fault", "step_delay_ms=20"});
  ASSERT_TRUE(c.ready());
  const std::string body =
      R"({"prompt": "Once upon a time", "max_tokens": 150, "temperature": 0, "ignore_eos": true})";
  const HttpReply quiet = Curl(c.http(), "/v1/completions", body);
  ASSERT_EQ(quiet.status, 200) << quiet.body;
  const std::string expected = quiet.Json()["choices"][0]["text"];
  std::vector<std::string> texts(12);
  std::vector<std::thread> flood;
  for (int i = 0; i < 12; ++i) {
    flood.emplace_back([&, i] {
      const HttpReply r = Curl(c.http(), "/v1/completions", body);
      texts[i] = r.status == 200 ? std::string(r.Json()["choices"][0]["text"]) : r.body;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // four streaming, eight waiting
  // One 150-token flood request takes 3 s here: without taking a place the newcomer would wait
  // about that long.
  const std::string cmd =
      "curl -s --max-time 30 --interface 127.0.0.2 -o /dev/null -w "
      "'%{http_code} %{time_total}' -H 'Content-Type: application/json' -d "
      "'{\"prompt\": \"Once\", \"max_tokens\": 2, \"temperature\": 0}' "
      "http://" +
      c.http() + "/v1/completions";
  const std::string out = Shell(cmd);
  int status = 0;
  double seconds = 0;
  ASSERT_EQ(std::sscanf(out.c_str(), "%d %lf", &status, &seconds), 2) << out;
  EXPECT_EQ(status, 200);
  EXPECT_LT(seconds, 1.5) << "the newcomer waited for a flood request to end";
  for (std::thread& t : flood) t.join();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(texts[i], expected) << "flood request " << i;
  EXPECT_TRUE(c.AllBlocksFree());
}

// Whole responses are built in memory: what one may reach (choices x max_tokens with their
// logprobs) is reserved against --http-max-building-bytes, past which it is refused 503 naming
// `stream`; the same request streamed, or without logprobs, is served.
TEST(HttpClusterTest, WholeResponsesAreBuiltWithinABudget) {
  Cluster c(0, 0, {}, {"--http-max-building-bytes", "1048576"});
  ASSERT_TRUE(c.ready());
  const std::string big =
      R"({"prompt": "Once", "n": 8, "max_tokens": 400, "logprobs": 5, "temperature": 0.8)";
  HttpReply r = Curl(c.http(), "/v1/completions", big + "}");
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.Json()["error"]["param"], "stream") << r.body;
  r = Curl(c.http(), "/v1/completions", big + R"(, "stream": true})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find("[DONE]"), std::string::npos);
  r = Curl(c.http(), "/v1/completions",
           R"({"prompt": "Once", "n": 8, "max_tokens": 400, "temperature": 0.8})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["choices"].size(), 8u);
  EXPECT_TRUE(c.AllBlocksFree());
}

// A forced one-argument tool call costs few tokens with a real chat model (SmolLM2-135M-Instruct):
// its JSON is compact, the text the constraint forces is written in the vocabulary's longest
// tokens, and the block ends at its value; agent code's 40-60 token limits hold it whole.
TEST(HttpClusterTest, AForcedToolCallFitsInTwentyFiveTokensWithSmolLM2) {
  const std::string gguf = testing::SmolLM2Path();
  if (gguf.empty() || !std::filesystem::exists(gguf)) {
    GTEST_SKIP() << "SmolLM2 is missing: run scripts/fetch_model.sh --smollm2";
  }
  Cluster c(0, 0, {}, {}, {"--model", gguf});
  ASSERT_TRUE(c.ready());
  for (const std::string city : {"Paris", "New York", "Tokyo"}) {
    json request = {
        {"messages", {{{"role", "user"}, {"content", "What is the weather in " + city + "?"}}}},
        {"tools",
         {{{"type", "function"},
           {"function",
            {{"name", "get_weather"},
             {"description", "Get the weather for a city"},
             {"parameters",
              {{"type", "object"},
               {"properties", {{"city", {{"type", "string"}}}}},
               {"required", {"city"}}}}}}}}},
        {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
        {"max_tokens", 40},
        {"temperature", 0}};
    const HttpReply r = Curl(c.http(), "/v1/chat/completions", request.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json answer = r.Json();
    EXPECT_EQ(answer["choices"][0]["finish_reason"], "tool_calls") << r.body;
    const json& call = answer["choices"][0]["message"]["tool_calls"][0]["function"];
    EXPECT_EQ(call["name"], "get_weather") << r.body;
    EXPECT_EQ(json::parse(call["arguments"].get<std::string>())["city"], city) << r.body;
    EXPECT_LE(answer["usage"]["completion_tokens"], 25) << r.body;
  }
}

// A Hugging Face tokenizer (Mistral's tokenizer.json) and Mistral-Instruct's template (as in
// chat_template_test.cc) in a real router: the template writes <s> and [INST] as text, and they
// become the special tokens once (tokenized without adding special tokens, as transformers does).
TEST(HttpClusterTest, MistralTemplateWithAHuggingFaceTokenizer) {
  testing::TempDir dir;
  auto config = RandomModelConfig("stories15M");  // vocab 32000, as Mistral's tokenizer
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(WriteRandomModel(*config, DType::kBF16, 1, dir.path() + "/model").ok());
  const std::string tokenizer =
      testing::SharedDir() + "/testdata/tokenizers/mistral.tokenizer.json";
  json tconfig = testing::LoadJson(testing::SharedDir() +
                                   "/testdata/tokenizers/mistral.tokenizer_config.json");
  tconfig["chat_template"] =
      "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
      "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
      "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
      "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
      "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
      "roles are supported!') }}{% endif %}{% endfor %}";
  const std::string config_path = WriteFile(dir, "tokenizer_config.json", tconfig.dump());
  Cluster c(1, 1, {}, {"--chat-template", config_path},
            {"--model", dir.path() + "/model", "--tokenizer", tokenizer});
  ASSERT_TRUE(c.ready());

  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}},
                                     {{"role", "assistant"}, {"content", "Hello"}},
                                     {{"role", "user"}, {"content", "Again"}}});
  auto tok = LoadTokenizer(tokenizer);
  ASSERT_TRUE(tok.ok());
  auto tmpl = TokenizerChatTemplate::FromConfig(tconfig.dump());
  ASSERT_TRUE(tmpl.ok());
  auto rendered = tmpl->Apply(messages, true);
  ASSERT_TRUE(rendered.ok());
  ASSERT_EQ(*rendered, "<s>[INST] Hi [/INST]Hello</s>[INST] Again [/INST]");
  const std::vector<int> ids = (*tok)->Encode(*rendered, false);
  ASSERT_EQ(ids[0], 1);  // <s>, once
  ASSERT_NE(ids[1], 1);
  v1::GenerateRequest g;
  g.mutable_tokens()->mutable_ids()->Add(ids.begin(), ids.end());
  g.set_max_tokens(8);
  g.set_ignore_eos(true);
  g.mutable_sampling()->set_temperature(0);
  const testing::Streamed want = testing::Generate(c.generation(), g);
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();

  json chat = {{"messages", messages}, {"max_tokens", 8}, {"ignore_eos", true}, {"temperature", 0}};
  HttpReply r = Curl(c.http(), "/v1/chat/completions", chat.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(r.Json()["choices"][0]["message"]["content"], want.text);
  // The template's own refusal is the request's fault, with its message.
  chat["messages"] =
      json::array({{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}});
  r = Curl(c.http(), "/v1/chat/completions", chat.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.Json()["error"]["param"], "messages");
  EXPECT_EQ(r.Json()["error"]["message"],
            "messages: Conversation roles must alternate user/assistant/user/assistant/...");
}

// Random weights in stories110M's shape (vocab 32000, as the Mistral tokenizer): decode is slow
// enough on a CPU that a request is still running when the test acts on it.
class SlowModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = RandomModelConfig("stories110M");
    ASSERT_TRUE(config.ok());
    ASSERT_TRUE(WriteRandomModel(*config, DType::kBF16, 1, dir_.path() + "/model").ok());
  }
  std::vector<std::string> ModelFlags() const {
    return {"--model", dir_.path() + "/model", "--tokenizer",
            testing::SharedDir() + "/testdata/tokenizers/mistral.tokenizer.json"};
  }
  testing::TempDir dir_;
};

// The value of a router metric (the first process's /metrics), waiting up to 10 s for `want`.
double WaitForMetric(Cluster& c, const std::string& name,
                     const std::map<std::string, std::string>& labels, double want) {
  double v = -1;
  for (int i = 0; i < 200; ++i) {
    v = testing::MetricValue(testing::Scrape(c.metrics()[0]), name, labels);
    if (v == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return v;
}

const char kLongRequest[] =
    R"({"prompt": [1, 100, 200], "max_tokens": 900, "ignore_eos": true, "temperature": 0)";

TEST_F(SlowModelTest, ClientDisconnectFreesTheRequestEverywhere) {
  Cluster c(1, 1, {}, {"--max-inflight", "1"}, ModelFlags());
  ASSERT_TRUE(c.ready());
  const std::map<std::string, std::string> router = {{"role", "router"}};
  {
    // Streaming: the client reads the first event and leaves.
    testing::RawPost post(c.http(), "/v1/completions",
                          std::string(kLongRequest) + ", \"stream\": true}");
    ASSERT_TRUE(post.sent());
    ASSERT_TRUE(post.ReadUntil("data: ")) << post.received();
    EXPECT_NE(post.received().find("200 OK"), std::string::npos);
    // Meanwhile the router is full (--max-inflight 1): 429 in OpenAI's shape.
    const HttpReply busy = Curl(c.http(), "/v1/completions", R"({"prompt": "x", "max_tokens": 2})");
    EXPECT_EQ(busy.status, 429) << busy.body;
    EXPECT_EQ(busy.Json()["error"]["type"], "rate_limit_error");
    post.Close();
  }
  EXPECT_EQ(WaitForMetric(c, "tandem_requests_total", {{"status", "CANCELLED"}}, 1), 1);
  EXPECT_EQ(testing::MetricValue(testing::Scrape(c.metrics()[0]), "tandem_requests_total",
                                 {{"status", "OK"}}),
            0);  // it never finished
  EXPECT_TRUE(c.AllBlocksFree());
  EXPECT_EQ(WaitForMetric(c, "tandem_num_requests_running", router, 0), 0);
  EXPECT_EQ(WaitForMetric(c, "tandem_num_requests_waiting", router, 0), 0);
  {
    // Not streaming: the client leaves while the request decodes.
    testing::RawPost post(c.http(), "/v1/completions", std::string(kLongRequest) + "}");
    ASSERT_TRUE(post.sent());
    ASSERT_EQ(WaitForMetric(c, "tandem_num_requests_running", router, 1), 1);
    post.Close();
  }
  EXPECT_EQ(WaitForMetric(c, "tandem_requests_total", {{"status", "CANCELLED"}}, 2), 2);
  EXPECT_TRUE(c.AllBlocksFree());
  EXPECT_EQ(WaitForMetric(c, "tandem_num_requests_running", router, 0), 0);
  // The cluster still serves.
  const HttpReply r = Curl(c.http(), "/v1/completions", R"({"prompt": [1, 5], "max_tokens": 2})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(c.AllBlocksFree());
}

TEST_F(SlowModelTest, DeadlineIs504) {
  Cluster c(0, 0, {}, {"--http-timeout-ms", "1000"}, ModelFlags());
  ASSERT_TRUE(c.ready());
  HttpReply r = Curl(c.http(), "/v1/completions", std::string(kLongRequest) + "}");
  EXPECT_EQ(r.status, 504) << r.body;
  EXPECT_EQ(r.Json()["error"]["code"], "timeout");
  // Streaming: the deadline passes after the first event; the error comes as the last event.
  r = Curl(c.http(), "/v1/completions", std::string(kLongRequest) + ", \"stream\": true}");
  EXPECT_EQ(r.status, 200);
  const std::vector<json> events = SseEvents(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[events.size() - 2]["error"]["code"], "timeout")
      << r.body.substr(r.body.size() - 300);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_TRUE(c.AllBlocksFree());
}

}  // namespace
}  // namespace tandem
