#include "http/responses.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "http/json_fields.h"
#include "http/json_limits.h"
#include "structured/json_parse.h"

namespace tandem::openai {
namespace {

using Json = nlohmann::ordered_json;

// Fields ParseResponsesRequest reads or refuses, and OpenAI's that change nothing here
// (metadata, user, caching and routing hints, max_tool_calls: only built-in tools count).
constexpr std::string_view kKnownFields[] = {"model",
                                             "input",
                                             "instructions",
                                             "max_output_tokens",
                                             "temperature",
                                             "top_p",
                                             "tools",
                                             "tool_choice",
                                             "parallel_tool_calls",
                                             "stream",
                                             "stream_options",
                                             "text",
                                             "store",
                                             "metadata",
                                             "user",
                                             "safety_identifier",
                                             "prompt_cache_key",
                                             "prompt_cache_retention",
                                             "service_tier",
                                             "max_tool_calls",
                                             "include",
                                             "truncation",
                                             "previous_response_id",
                                             "background",
                                             "conversation",
                                             "prompt",
                                             "reasoning",
                                             "top_logprobs",
                                             "seed",
                                             "top_k"};

constexpr char kNotStored[] =
    "is not supported: Tandem keeps stored responses only (previous_response_id), not "
    "conversations or background runs";

// The fields that would change the answer and are not supported, each a 400 naming it.
absl::Status CheckUnsupported(const Json& body) {
  if (Field(body, "conversation") != nullptr) return Invalid("conversation", kNotStored);
  if (Field(body, "prompt") != nullptr) {
    return Invalid("prompt", "is not supported: stored prompt templates are OpenAI's");
  }
  if (const Json* v = Field(body, "background")) {
    auto b = GetBool(*v, "background");
    if (!b.ok()) return b.status();
    if (*b) return Invalid("background", kNotStored);
  }
  if (const Json* v = Field(body, "truncation")) {
    if (!v->is_string() || (*v != "disabled" && *v != "auto")) {
      return Invalid("truncation", "must be \"disabled\" or \"auto\"");
    }
    if (*v == "auto") {
      return Invalid("truncation",
                     "\"auto\" is not supported: an input longer than the context is refused");
    }
  }
  if (const Json* v = Field(body, "reasoning")) {
    if (!v->is_object()) return Invalid("reasoning", "must be an object");
    for (const auto& [key, value] : v->items()) {
      if (!value.is_null()) {
        return Invalid("reasoning." + key, "is not supported: the model has no reasoning setting");
      }
    }
  }
  if (const Json* v = Field(body, "top_logprobs")) {
    auto n = GetInt(*v, "top_logprobs", 0, 20);
    if (!n.ok()) return n.status();
    if (*n > 0) return Invalid("top_logprobs", "is not supported on /v1/responses");
  }
  if (const Json* v = Field(body, "include")) {
    if (!v->is_array()) return Invalid("include", "must be a list of strings");
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& e = (*v)[i];
      if (!e.is_string()) return Invalid(absl::StrFormat("include[%d]", i), "must be a string");
      // The others add what Tandem never produces (reasoning, built-in tools' results).
      if (e == "message.output_text.logprobs") {
        return Invalid(absl::StrFormat("include[%d]", i), "is not supported on /v1/responses");
      }
    }
  }
  if (const Json* v = Field(body, "stream_options"); v != nullptr && !v->is_object()) {
    return Invalid("stream_options", "must be an object");  // include_obfuscation: none is sent
  }
  return absl::OkStatus();
}

// A message item's content (or a function_call_output's output): a string, or a list of
// input_text / output_text parts, joined with "\n" as chat content parts are.
absl::StatusOr<std::string> ItemText(const Json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return Invalid(where, "must be a string or a list of content parts");
  std::vector<std::string> texts;
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    const std::string pw = absl::StrFormat("%s[%d]", where, j);
    const Json* type = part.is_object() ? Field(part, "type") : nullptr;
    if (type == nullptr || !type->is_string() ||
        (*type != "input_text" && *type != "output_text")) {
      return Invalid(pw + ".type", "only input_text and output_text parts are supported");
    }
    const Json* text = Field(part, "text");
    if (text == nullptr || !text->is_string()) return Invalid(pw + ".text", "must be a string");
    texts.push_back(text->get<std::string>());
  }
  return absl::StrJoin(texts, "\n");
}

absl::StatusOr<std::string> RequiredString(const Json& item, const char* key,
                                           const std::string& where) {
  const Json* v = Field(item, key);
  if (v == nullptr || !v->is_string() || v->get<std::string>().empty()) {
    return Invalid(absl::StrCat(where, ".", key), "is required and must be a non-empty string");
  }
  return v->get<std::string>();
}

// The request as chat messages: `instructions` a system message; then the stored conversation
// it continues (`previous`: chat messages, whose calls its function_call_output items may
// answer); then `input`: message items with their role (developer as system) and text,
// function_call items the assistant's tool_calls (consecutive ones, and one right after an
// assistant message, join that turn), function_call_output items tool messages naming the call.
absl::StatusOr<Json> Messages(const Json& body, const Json& previous) {
  Json messages = Json::array();
  if (const Json* v = Field(body, "instructions")) {
    if (!v->is_string()) return Invalid("instructions", "must be a string");
    messages.push_back({{"role", "system"}, {"content", *v}});
  }
  std::map<std::string, std::string> call_names;  // call_id -> the function's name
  for (const Json& m : previous) {
    messages.push_back(m);
    if (!m.contains("tool_calls")) continue;
    for (const Json& call : m["tool_calls"]) {
      call_names[call["id"].get<std::string>()] = call["function"]["name"].get<std::string>();
    }
  }
  const Json* input = Field(body, "input");
  if (input == nullptr) return Invalid("input", "is required");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
    return messages;
  }
  if (!input->is_array() || input->empty()) {
    return Invalid("input", "must be a string or a non-empty list of items");
  }
  bool assistant_turn = false;  // the last message is an assistant's, open to more calls
  for (size_t i = 0; i < input->size(); ++i) {
    const Json& item = (*input)[i];
    const std::string where = absl::StrFormat("input[%d]", i);
    if (!item.is_object()) return Invalid(where, "must be an object");
    std::string type = "message";
    if (const Json* t = Field(item, "type")) {
      if (!t->is_string()) return Invalid(where + ".type", "must be a string");
      type = t->get<std::string>();
    }
    if (type == "message") {
      auto role = RequiredString(item, "role", where);
      if (!role.ok()) return role.status();
      if (*role != "user" && *role != "system" && *role != "developer" && *role != "assistant") {
        return Invalid(where + ".role", "must be user, system, developer or assistant");
      }
      const Json* content = Field(item, "content");
      if (content == nullptr) return Invalid(where + ".content", "is required");
      auto text = ItemText(*content, where + ".content");
      if (!text.ok()) return text.status();
      messages.push_back({{"role", *role == "developer" ? "system" : *role}, {"content", *text}});
      assistant_turn = *role == "assistant";
    } else if (type == "function_call") {
      auto call_id = RequiredString(item, "call_id", where);
      if (!call_id.ok()) return call_id.status();
      auto name = RequiredString(item, "name", where);
      if (!name.ok()) return name.status();
      const Json* args = Field(item, "arguments");
      if (args == nullptr || !args->is_string()) {
        return Invalid(where + ".arguments", "is required and must be the arguments' JSON text");
      }
      const std::string& text = args->get_ref<const std::string&>();
      absl::StatusOr<Json> parsed = CheckJsonLimits(text).ok()
                                        ? structured::ParseJson(text)
                                        : absl::InvalidArgumentError("over the JSON limits");
      if (!parsed.ok() || !parsed->is_object()) {
        return Invalid(where + ".arguments", "is not the JSON text of an object");
      }
      Json call = {{"id", *call_id},
                   {"type", "function"},
                   {"function", {{"name", *name}, {"arguments", text}}}};
      if (!assistant_turn) {
        messages.push_back({{"role", "assistant"}, {"content", nullptr}});
        assistant_turn = true;
      }
      messages.back()["tool_calls"].push_back(std::move(call));
      call_names[*call_id] = *name;
    } else if (type == "function_call_output") {
      auto call_id = RequiredString(item, "call_id", where);
      if (!call_id.ok()) return call_id.status();
      auto named = call_names.find(*call_id);
      if (named == call_names.end()) {
        return Invalid(where + ".call_id", "names no function_call item before it");
      }
      const Json* output = Field(item, "output");
      if (output == nullptr) return Invalid(where + ".output", "is required");
      auto text = ItemText(*output, where + ".output");
      if (!text.ok()) return text.status();
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", *call_id},
                          {"name", named->second},
                          {"content", *text}});
      assistant_turn = false;
    } else if (type == "item_reference") {
      return Invalid(where + ".type", absl::StrCat("\"item_reference\" ", kNotStored));
    } else {
      return Invalid(where + ".type",
                     absl::StrCat("\"", type,
                                  "\" items are not supported (message, function_call and "
                                  "function_call_output are)"));
    }
  }
  return messages;
}

// Responses' function tools ({"type": "function", "name", "description", "parameters",
// "strict"}) as chat's ({"type": "function", "function": {...}}).
absl::StatusOr<Json> Tools(const Json& tools) {
  if (!tools.is_array()) return Invalid("tools", "must be an array of tools");
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string where = absl::StrFormat("tools[%d]", i);
    const Json* type = t.is_object() ? Field(t, "type") : nullptr;
    if (type == nullptr || *type != "function") {
      return Invalid(where + ".type",
                     "only function tools are supported (not built-in tools such as web_search "
                     "or file_search)");
    }
    Json fn = Json::object();
    for (const char* key : {"name", "description", "parameters", "strict"}) {
      if (const Json* v = Field(t, key)) fn[key] = *v;
    }
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// tool_choice: "auto", "none", "required", or {"type": "function", "name": ...}.
absl::StatusOr<Json> ToolChoice(const Json& c) {
  if (c.is_string()) return c;  // chat checks the value
  const Json* type = c.is_object() ? Field(c, "type") : nullptr;
  if (type == nullptr || !type->is_string()) {
    return Invalid("tool_choice",
                   "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                   "\"name\": ...}");
  }
  if (*type != "function") {
    return Invalid("tool_choice.type", absl::StrCat("\"", type->get<std::string>(),
                                                    "\" is not supported (only \"function\")"));
  }
  const Json* name = Field(c, "name");
  if (name == nullptr || !name->is_string()) {
    return Invalid("tool_choice.name", "is required and must be a string");
  }
  return Json{{"type", "function"}, {"function", {{"name", *name}}}};
}

// text.format as chat's response_format; text.verbosity only at its default.
absl::StatusOr<Json> ResponseFormat(const Json& text) {
  if (!text.is_object()) return Invalid("text", "must be an object");
  if (const Json* v = Field(text, "verbosity"); v != nullptr && *v != "medium") {
    return Invalid("text.verbosity", "is not supported (only \"medium\")");
  }
  const Json* format = Field(text, "format");
  if (format == nullptr) return Json{{"type", "text"}};
  const Json* type = format->is_object() ? Field(*format, "type") : nullptr;
  if (type == nullptr || !type->is_string()) {
    return Invalid("text.format", "must be an object with a string \"type\"");
  }
  if (*type == "text" || *type == "json_object") return Json{{"type", *type}};
  if (*type != "json_schema") {
    return Invalid("text.format.type", "must be \"text\", \"json_object\" or \"json_schema\"");
  }
  const Json* schema = Field(*format, "schema");
  if (schema == nullptr || !(schema->is_object() || schema->is_boolean())) {
    return Invalid("text.format.schema", "must be a JSON Schema object");
  }
  Json spec = {{"schema", *schema}};
  if (const Json* name = Field(*format, "name")) spec["name"] = *name;
  if (const Json* strict = Field(*format, "strict")) spec["strict"] = *strict;
  return Json{{"type", "json_schema"}, {"json_schema", std::move(spec)}};
}

// A chat-completions error in the Responses API's names.
absl::Status Rename(const absl::Status& status) {
  const std::string message(status.message());
  const std::string field(FieldPrefix(message));
  if (field.empty()) return status;
  std::string renamed = field;
  if (field.starts_with("messages")) {
    renamed = "input";  // the template's errors; the items were checked before
  } else if (field == "max_completion_tokens") {
    renamed = "max_output_tokens";
  } else if (field.starts_with("tools[") && field.find("].function.") != std::string::npos) {
    const size_t at = field.find("].function.");
    renamed = field.substr(0, at + 2) + field.substr(at + 11);
  } else if (field == "tool_choice.function.name") {
    renamed = "tool_choice.name";
  } else if (field.starts_with("response_format")) {
    renamed = "text.format";
  }
  return absl::Status(status.code(), renamed + message.substr(field.size()));
}

}  // namespace

absl::StatusOr<Request> ParseResponsesRequest(std::string_view body_text, const ServedModel& model,
                                              uint64_t random_seed,
                                              const std::function<bool()>& cancelled,
                                              const PreviousConversation& previous) {
  absl::StatusOr<Json> parsed = ParseJsonBody(body_text, cancelled);
  if (!parsed.ok()) return parsed.status();
  const Json& body = *parsed;
  LogUnknownFields(body, kKnownFields);
  if (absl::Status s = CheckUnsupported(body); !s.ok()) return s;

  Json chat = Json::object();
  for (const char* key : {"model", "temperature", "top_p", "seed", "top_k", "stream"}) {
    if (body.contains(key)) chat[key] = body[key];
  }
  if (const Json* v = Field(body, "max_output_tokens")) chat["max_completion_tokens"] = *v;
  Json before = Json::array();
  if (const Json* v = Field(body, "previous_response_id")) {
    if (!v->is_string()) return Invalid("previous_response_id", "must be a string");
    std::optional<Json> found = previous ? previous(v->get<std::string>()) : std::optional<Json>();
    if (!found) {
      return absl::NotFoundError(absl::StrFormat(
          "previous_response_id: no stored response \"%s\" (the router keeps responses made "
          "with store in its memory for a while; they are lost when it restarts)",
          v->get<std::string>()));
    }
    before = *std::move(found);
  }
  bool store = true;  // OpenAI's default
  if (const Json* v = Field(body, "store")) {
    auto b = GetBool(*v, "store");
    if (!b.ok()) return b.status();
    store = *b;
  }
  auto messages = Messages(body, before);
  if (!messages.ok()) return messages.status();
  Json conversation = *messages;
  if (Field(body, "instructions") != nullptr) conversation.erase(conversation.begin());
  chat["messages"] = *std::move(messages);
  if (const Json* v = Field(body, "tools")) {
    auto tools = Tools(*v);
    if (!tools.ok()) return tools.status();
    chat["tools"] = *std::move(tools);
  }
  if (const Json* v = Field(body, "tool_choice")) {
    auto choice = ToolChoice(*v);
    if (!choice.ok()) return choice.status();
    chat["tool_choice"] = *std::move(choice);
  }
  Json format = {{"type", "text"}};
  if (const Json* v = Field(body, "text")) {
    auto f = ResponseFormat(*v);
    if (!f.ok()) return f.status();
    chat["response_format"] = *f;
    if (const Json* given = Field(*v, "format")) format = *given;
  }
  bool parallel = true;
  if (const Json* v = Field(body, "parallel_tool_calls")) {
    auto b = GetBool(*v, "parallel_tool_calls");
    if (!b.ok()) return b.status();
    parallel = *b;
  }

  absl::StatusOr<Request> r =
      ParseRequestBody(Endpoint::kChatCompletions, chat, model, random_seed);
  if (!r.ok()) return Rename(r.status());
  const bool forced = !r->generate.sampling().json_schema().empty() &&
                      !r->generate.sampling().json_prefix().empty();
  if (!parallel && r->parse_tool_calls && !forced) {
    // The model may write several calls; only a forced call is one.
    return Invalid("parallel_tool_calls",
                   "false is supported only with a forced tool_choice (\"required\" or a "
                   "function), which makes exactly one call");
  }
  r->endpoint = Endpoint::kResponses;
  r->store = store;
  r->conversation = std::move(conversation);
  r->max_tokens_param = "max_output_tokens";
  r->schema_param = forced ? "tool_choice" : "text.format";
  auto given = [&](const char* key, Json fallback) {
    const Json* v = Field(body, key);
    return v != nullptr ? *v : fallback;
  };
  r->response_fields = {{"instructions", given("instructions", nullptr)},
                        {"max_output_tokens", given("max_output_tokens", nullptr)},
                        {"metadata", given("metadata", Json::object())},
                        {"previous_response_id", given("previous_response_id", nullptr)},
                        {"parallel_tool_calls", parallel},
                        {"temperature", given("temperature", 1.0)},
                        {"text", {{"format", format}}},
                        {"tool_choice", given("tool_choice", "auto")},
                        {"tools", given("tools", Json::array())},
                        {"top_p", given("top_p", 1.0)},
                        {"user", given("user", nullptr)}};
  return r;
}

ResponsesBuilder::ResponsesBuilder(const Request& request, const ServedModel& model,
                                   int64_t created_unix)
    : request_(request), model_(model), created_(created_unix) {}

std::string ResponsesBuilder::Event(Json event) {
  const std::string type = event["type"];
  event["sequence_number"] = sequence_++;
  return absl::StrCat("event: ", type,
                      "\ndata: ", event.dump(-1, ' ', false, Json::error_handler_t::replace),
                      "\n\n");
}

Json ResponsesBuilder::Object(std::string_view status) const {
  const Json& e = request_.response_fields;
  auto echoed = [&](const char* key) { return e.contains(key) ? e[key] : Json(nullptr); };
  Json o = {{"id", id_},
            {"object", "response"},
            {"created_at", created_},
            {"status", status},
            {"background", false},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"instructions", echoed("instructions")},
            {"max_output_tokens", echoed("max_output_tokens")},
            {"max_tool_calls", nullptr},
            {"model", model_.id},
            {"output", output_},
            {"parallel_tool_calls", echoed("parallel_tool_calls")},
            {"previous_response_id", echoed("previous_response_id")},
            {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
            {"service_tier", "default"},
            {"store", request_.store},
            {"temperature", echoed("temperature")},
            {"text", echoed("text")},
            {"tool_choice", echoed("tool_choice")},
            {"tools", echoed("tools")},
            {"top_logprobs", 0},
            {"top_p", echoed("top_p")},
            {"truncation", "disabled"},
            {"usage", nullptr},
            {"user", echoed("user")},
            {"metadata", echoed("metadata")}};
  if (status == "incomplete") o["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (status != "in_progress") {
    o["usage"] = {{"input_tokens", input_tokens_},
                  {"input_tokens_details", {{"cached_tokens", 0}}},
                  {"output_tokens", output_tokens_},
                  {"output_tokens_details", {{"reasoning_tokens", 0}}},
                  {"total_tokens", input_tokens_ + output_tokens_}};
  }
  return o;
}

void ResponsesBuilder::AddText(std::string_view text, std::string* events) {
  if (text.empty()) return;
  std::string delta(text);
  if (!message_open_) {
    // Whitespace alone (between calls, after the last one) makes no message.
    if (delta.find_first_not_of(" \t\r\n") == std::string::npos && finish_.empty()) {
      pending_space_ += delta;
      return;
    }
    delta = std::exchange(pending_space_, "") + delta;
    message_open_ = true;
    message_text_.clear();
    const int index = static_cast<int>(output_.size());
    output_.push_back({{"id", absl::StrFormat("msg_%s_%d", request_id_, items_++)},
                       {"type", "message"},
                       {"status", "in_progress"},
                       {"content", Json::array()},
                       {"role", "assistant"}});
    *events += Event({{"type", "response.output_item.added"},
                      {"output_index", index},
                      {"item", output_.back()}});
    *events += Event({{"type", "response.content_part.added"},
                      {"item_id", output_.back()["id"]},
                      {"output_index", index},
                      {"content_index", 0},
                      {"part",
                       {{"type", "output_text"},
                        {"annotations", Json::array()},
                        {"logprobs", Json::array()},
                        {"text", ""}}}});
  }
  message_text_ += delta;
  *events += Event({{"type", "response.output_text.delta"},
                    {"item_id", output_.back()["id"]},
                    {"output_index", output_.size() - 1},
                    {"content_index", 0},
                    {"delta", delta},
                    {"logprobs", Json::array()}});
}

void ResponsesBuilder::CloseMessage(std::string* events) {
  if (!message_open_) return;
  message_open_ = false;
  const size_t index = output_.size() - 1;
  Json& item = output_[index];
  const Json part = {{"type", "output_text"},
                     {"annotations", Json::array()},
                     {"logprobs", Json::array()},
                     {"text", message_text_}};
  item["content"] = Json::array({part});
  item["status"] = finish_ == "length" ? "incomplete" : "completed";
  *events += Event({{"type", "response.output_text.done"},
                    {"item_id", item["id"]},
                    {"output_index", index},
                    {"content_index", 0},
                    {"text", message_text_},
                    {"logprobs", Json::array()}});
  *events += Event({{"type", "response.content_part.done"},
                    {"item_id", item["id"]},
                    {"output_index", index},
                    {"content_index", 0},
                    {"part", part}});
  *events +=
      Event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
}

void ResponsesBuilder::AddCall(const Json& call, std::string* events) {
  CloseMessage(events);
  pending_space_.clear();
  const size_t index = output_.size();
  const std::string arguments = call["function"]["arguments"];
  Json item = {{"id", absl::StrFormat("fc_%s_%d", request_id_, items_++)},
               {"type", "function_call"},
               {"status", "in_progress"},
               {"arguments", ""},
               {"call_id", call["id"]},
               {"name", call["function"]["name"]}};
  *events +=
      Event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
  *events += Event({{"type", "response.function_call_arguments.delta"},
                    {"item_id", item["id"]},
                    {"output_index", index},
                    {"delta", arguments}});
  *events += Event({{"type", "response.function_call_arguments.done"},
                    {"item_id", item["id"]},
                    {"output_index", index},
                    {"name", item["name"]},
                    {"arguments", arguments}});
  item["arguments"] = arguments;
  item["status"] = "completed";
  *events +=
      Event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
}

std::string ResponsesBuilder::Add(int index, const v1::GenerateResponse& msg) {
  if (index != 0) return "";  // one choice
  std::string events;
  if (!started_) {
    started_ = true;
    request_id_ = msg.request_id();
    id_ = "resp_" + request_id_;
    tools_ = std::make_unique<ToolCallParser>(request_id_);
    events += Event({{"type", "response.created"}, {"response", Object("in_progress")}});
    events += Event({{"type", "response.in_progress"}, {"response", Object("in_progress")}});
  }
  output_tokens_ += msg.token_ids_size();
  if (msg.has_usage()) {
    input_tokens_ = msg.usage().prompt_tokens();
    output_tokens_ = msg.usage().completion_tokens();
  }
  const std::string finish = FinishReasonName(msg.finish_reason());
  if (request_.parse_tool_calls) {
    const std::string content = tools_->Add(msg.text());
    size_t at = 0;
    for (const ToolCallParser::PlacedCall& p : tools_->TakePlacedCalls()) {
      AddText(std::string_view(content).substr(at, p.offset - at), &events);
      AddCall(p.call, &events);
      at = p.offset;
    }
    AddText(std::string_view(content).substr(at), &events);
  } else {
    AddText(msg.text(), &events);
  }
  if (!finish.empty()) {
    finish_ = finish;
    if (request_.parse_tool_calls) {
      const std::string rest = tools_->Flush();  // an unterminated last block may be a call
      for (const ToolCallParser::PlacedCall& p : tools_->TakePlacedCalls())
        AddCall(p.call, &events);
      AddText(rest, &events);
    }
    // A reply of whitespace alone is still the reply.
    if (output_.empty()) AddText(std::exchange(pending_space_, ""), &events);
    CloseMessage(&events);
  }
  return request_.stream ? events : "";
}

std::string ResponsesBuilder::StreamEnd() {
  const char* status = finish_ == "length" ? "incomplete" : "completed";
  return Event({{"type", absl::StrCat("response.", status)}, {"response", Object(status)}});
}

std::string ResponsesBuilder::StreamFailure(const ApiError& error) {
  auto nullable = [](const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); };
  std::string events = Event({{"type", "error"},
                              {"code", nullable(error.code)},
                              {"message", error.message},
                              {"param", nullable(error.param)}});
  Json failed = Object("failed");
  failed["error"] = {{"code", error.code.empty() ? error.type : error.code},
                     {"message", error.message}};
  return events + Event({{"type", "response.failed"}, {"response", std::move(failed)}});
}

std::string ResponsesBuilder::Body() const {
  return Object(finish_ == "length" ? "incomplete" : "completed")
      .dump(-1, ' ', false, Json::error_handler_t::replace);
}

StoredResponse ResponsesBuilder::ToStore() const {
  StoredResponse out;
  out.object = Object(finish_ == "length" ? "incomplete" : "completed");
  std::string text;
  Json calls = Json::array();
  for (const Json& item : output_) {
    if (item["type"] == "message") {
      for (const Json& part : item["content"]) text += part["text"].get<std::string>();
    } else if (item["type"] == "function_call") {
      calls.push_back({{"id", item["call_id"]},
                       {"type", "function"},
                       {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
    }
  }
  if (message_open_) text += message_text_;
  Json answer = {{"role", "assistant"}, {"content", text.empty() ? Json(nullptr) : Json(text)}};
  if (!calls.empty()) answer["tool_calls"] = std::move(calls);
  out.messages = request_.conversation;
  out.messages.push_back(std::move(answer));
  return out;
}

}  // namespace tandem::openai
