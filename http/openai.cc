#include "http/openai.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/sampling/output_constraint.h"
#include "engine/sampling/sampler.h"
#include "http/json_fields.h"
#include "http/json_limits.h"
#include "structured/json_parse.h"
#include "structured/json_schema.h"

namespace tandem::openai {
namespace {

using Json = nlohmann::ordered_json;

// The Hermes/Qwen tool-call block.
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();

// Parameters Tandem does not implement: accepted only at their neutral value, so that a client
// never gets an answer computed without what it asked for.
absl::Status CheckUnsupported(const Json& body, Endpoint endpoint) {
  if (const Json* v = Field(body, "suffix")) {
    if (!v->is_string() || !v->get<std::string>().empty())
      return Invalid("suffix", "is not supported");
  }
  // Both endpoints: completions has no functions at all, chat only as tools.
  if (const Json* v = Field(body, "functions")) {
    if (!v->is_array() || !v->empty()) {
      return Invalid("functions", endpoint == Endpoint::kChatCompletions
                                      ? "the legacy functions API is not supported (use tools)"
                                      : "is not supported on /v1/completions");
    }
  }
  return absl::OkStatus();
}

// Renames the $defs (and definitions) that `schema`'s "$ref"s name: "#/$defs/X" becomes
// "#/$defs/PREFIX" "X", so that several tools' definitions can share one document. Values that
// are data, not schemas (const, enum, default, examples), are left alone.
void PrefixRefs(Json& schema, const std::string& prefix) {
  if (schema.is_array()) {
    for (Json& v : schema) PrefixRefs(v, prefix);
    return;
  }
  if (!schema.is_object()) return;
  for (auto& [key, value] : schema.items()) {
    if (key == "const" || key == "enum" || key == "default" || key == "examples") continue;
    if (key == "$ref" && value.is_string()) {
      std::string ref = value.get<std::string>();
      for (std::string_view defs : {"#/$defs/", "#/definitions/"}) {
        if (ref.starts_with(defs)) {
          ref.insert(defs.size(), prefix);
          break;
        }
      }
      value = ref;
    } else {
      PrefixRefs(value, prefix);
    }
  }
}

// One candidate of a forced call: tools[index].function.
struct ForcedFunction {
  int index = 0;
  const Json* function = nullptr;
};

// A forced tool call (tool_choice "required" or a named function): the output is one Hermes
// block, "<tool_call>\n" {"name": ..., "arguments": {...}} "\n</tool_call>", which the tool-call
// parser then returns as the call. Each candidate's call is {"name": its name, "arguments": its
// `parameters`} (their $defs and definitions moved to the top, where their references point);
// with several candidates ("required" over several tools) the block is one of those shapes, a
// union told apart by the name, so that the arguments follow the schema of the function named.
// A schema refused names `tools[index].function.parameters`.
absl::Status ForceToolCall(const std::vector<ForcedFunction>& functions, v1::SamplingParams* s) {
  const std::string prefix = std::string(kCallOpen) + "\n";
  const std::string suffix = "\n" + std::string(kCallClose);
  const bool several = functions.size() > 1;
  Json shapes = Json::array();
  Json defs = Json::object();
  for (size_t k = 0; k < functions.size(); ++k) {
    const auto [index, fn] = functions[k];
    const std::string param = absl::StrFormat("tools[%d].function.parameters", index);
    for (size_t j = 0; j < k; ++j) {
      if ((*functions[j].function)["name"] == (*fn)["name"]) {
        return Invalid(absl::StrFormat("tools[%d].function.name", index),
                       absl::StrFormat("names the function tools[%d] names; a forced call needs "
                                       "distinct names",
                                       functions[j].index));
      }
    }
    Json params = {{"type", "object"}};
    if (const Json* p = Field(*fn, "parameters")) params = *p;
    if (params.dump().find(R"("$ref":"#")") != std::string::npos) {
      return Invalid(param, "a forced function's parameters may not refer to \"#\"");
    }
    Json shape = {
        {"type", "object"}, {"required", {"name", "arguments"}}, {"additionalProperties", false}};
    Json own_defs = Json::object();  // this function's, at the top of its own document
    for (const char* section : {"$defs", "definitions"}) {
      if (params.contains(section)) {
        own_defs[section] = params[section];
        params.erase(section);
      }
    }
    shape["properties"] = {{"name", {{"const", (*fn)["name"]}}}, {"arguments", params}};
    // Each function's schema alone first, so that what is wrong with it names its tool.
    Json alone = shape;
    for (const auto& [section, d] : own_defs.items()) alone[section] = d;
    if (auto compiled = structured::JsonSchema::Compile(alone.dump(), prefix, suffix);
        !compiled.ok()) {
      // Places inside the arguments, as the client wrote them ("at /properties/x: ...").
      std::string why(compiled.status().message());
      constexpr std::string_view kArguments = "at /properties/arguments";
      if (why.starts_with(kArguments)) {
        const std::string rest = why.substr(kArguments.size());
        why = absl::StrCat("at ", rest.starts_with("/") ? "" : "/", rest);
      }
      return Invalid(param, why);
    }
    if (!several) {
      s->set_json_schema(alone.dump());
      s->set_json_prefix(prefix);
      s->set_json_suffix(suffix);
      return absl::OkStatus();
    }
    const std::string rename = absl::StrFormat("tool%d_", index);
    PrefixRefs(shape, rename);
    for (auto& [section, d] : own_defs.items()) {
      for (auto& [name, sub] : d.items()) {
        Json renamed = sub;
        PrefixRefs(renamed, rename);
        defs[section][rename + name] = std::move(renamed);
      }
    }
    shapes.push_back(std::move(shape));
  }
  Json schema = {{"anyOf", std::move(shapes)}};
  for (auto& [section, d] : defs.items()) schema[section] = d;
  if (auto compiled = structured::JsonSchema::Compile(schema.dump(), prefix, suffix);
      !compiled.ok()) {
    return Invalid("tool_choice", compiled.status().message());
  }
  s->set_json_schema(schema.dump());
  s->set_json_prefix(prefix);
  s->set_json_suffix(suffix);
  return absl::OkStatus();
}

// response_format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema",
// "json_schema": {"name": ..., "schema": {...}, "strict": ...}} (OpenAI's shapes), on both
// endpoints as vLLM has it. The schema travels as JSON text; the router compiles it.
absl::Status SetResponseFormat(const Json& v, v1::SamplingParams* s) {
  const Json* type = v.is_object() ? Field(v, "type") : nullptr;
  if (type == nullptr || !type->is_string()) {
    return Invalid("response_format", "must be an object with a string \"type\"");
  }
  const std::string t = type->get<std::string>();
  if (t == "text") return absl::OkStatus();
  if (!s->json_schema().empty()) {
    return Invalid("response_format", "cannot be combined with a forced tool_choice");
  }
  if (t == "json_object") {
    s->set_json_schema(kJsonObjectSchema);
    return absl::OkStatus();
  }
  if (t != "json_schema") {
    return Invalid("response_format.type",
                   "must be \"text\", \"json_object\" or \"json_schema\", got \"" + t + "\"");
  }
  const Json* spec = Field(v, "json_schema");
  if (spec == nullptr || !spec->is_object()) {
    return Invalid("response_format.json_schema", "must be an object with a \"schema\"");
  }
  const Json* schema = Field(*spec, "schema");
  if (schema == nullptr || !(schema->is_object() || schema->is_boolean())) {
    return Invalid("response_format.json_schema.schema", "must be a JSON Schema object");
  }
  s->set_json_schema(schema->dump());
  return absl::OkStatus();
}

// vLLM's structured-output extensions: guided_json, guided_choice, and structured_outputs (its
// newer object: "json", "choice", "json_object", "regex") become sampling.json_schema,
// sampling.choice or sampling.regex, as response_format does. What Tandem cannot constrain output
// by (a grammar, a structural tag, a whitespace pattern) is refused naming the field, never
// ignored.
struct Guide {
  std::string param;  // the field that asked, for errors ("guided_json", "structured_outputs.json")
  const Json* json = nullptr;
  const Json* choice = nullptr;
  bool json_object = false;
  const Json* regex = nullptr;
};

constexpr char kNoGrammar[] =
    "is not supported: Tandem constrains output by a JSON schema (guided_json, response_format), "
    "a list of strings (guided_choice) or a regular expression (guided_regex) only";

// structured_outputs: {"json" | "choice" | "json_object", and flags that change nothing here}.
absl::Status StructuredOutputs(const Json& v, std::vector<Guide>* guides) {
  if (!v.is_object()) return Invalid("structured_outputs", "must be an object");
  for (const auto& [key, value] : v.items()) {
    const std::string param = "structured_outputs." + key;
    if (value.is_null()) continue;
    if (key == "json") {
      guides->push_back({param, &value});
    } else if (key == "choice") {
      guides->push_back({param, nullptr, &value});
    } else if (key == "json_object") {
      auto b = GetBool(value, param);
      if (!b.ok()) return b.status();
      if (*b) guides->push_back({param, nullptr, nullptr, true});
    } else if (key == "regex") {
      guides->push_back({param, nullptr, nullptr, false, &value});
    } else if (key == "grammar" || key == "structural_tag" || key == "whitespace_pattern") {
      return Invalid(param, kNoGrammar);
    } else if (key == "disable_fallback" || key == "disable_any_whitespace" ||
               key == "disable_additional_properties") {
      auto b = GetBool(value, param);
      if (!b.ok()) return b.status();
      // A backend's fallback changes nothing here; the other two would change the output.
      if (*b && key != "disable_fallback") return Invalid(param, "is not supported");
    } else {
      return Invalid(param, "is not a structured_outputs field Tandem knows");
    }
  }
  return absl::OkStatus();
}

absl::Status SetGuided(const Json& body, Request* r) {
  for (const char* key : {"guided_grammar", "guided_whitespace_pattern", "structural_tag"}) {
    if (Field(body, key) != nullptr) return Invalid(key, kNoGrammar);
  }
  if (const Json* v = Field(body, "guided_decoding_backend"); v != nullptr && !v->is_string()) {
    return Invalid("guided_decoding_backend", "must be a string");  // any: one engine here
  }
  std::vector<Guide> guides;
  if (const Json* v = Field(body, "guided_json")) guides.push_back({"guided_json", v});
  if (const Json* v = Field(body, "guided_choice")) guides.push_back({"guided_choice", nullptr, v});
  if (const Json* v = Field(body, "guided_regex")) {
    guides.push_back({"guided_regex", nullptr, nullptr, false, v});
  }
  if (const Json* v = Field(body, "structured_outputs")) {
    if (absl::Status st = StructuredOutputs(*v, &guides); !st.ok()) return st;
  }
  if (guides.empty()) return absl::OkStatus();
  const Guide& g = guides[0];
  if (guides.size() > 1) {
    return Invalid(guides[1].param, "cannot be combined with " + g.param);
  }
  v1::SamplingParams* s = r->generate.mutable_sampling();
  if (!s->json_schema().empty()) {
    return Invalid(g.param, "cannot be combined with response_format or a forced tool_choice");
  }
  if (g.regex != nullptr) {
    if (!g.regex->is_string() || g.regex->get<std::string>().empty()) {
      return Invalid(g.param, "must be a non-empty regular expression string");
    }
    s->set_regex(g.regex->get<std::string>());
  } else if (g.json_object) {
    s->set_json_schema(kJsonObjectSchema);
  } else if (g.json != nullptr) {
    if (g.json->is_string()) {
      s->set_json_schema(g.json->get<std::string>());  // the schema as JSON text
    } else if (g.json->is_object() || g.json->is_boolean()) {
      s->set_json_schema(g.json->dump());
    } else {
      return Invalid(g.param, "must be a JSON Schema object or its JSON text");
    }
  } else {
    if (!g.choice->is_array() || g.choice->empty()) {
      return Invalid(g.param, "must be a non-empty list of strings");
    }
    for (const Json& c : *g.choice) {
      if (!c.is_string()) return Invalid(g.param, "must be a non-empty list of strings");
      s->add_choice(c.get<std::string>());
    }
  }
  r->schema_param = g.param;  // the router's errors about the schema or choice name it
  return absl::OkStatus();
}

// `prompt` of /v1/completions as a list of prompts, each a string or a list of token ids: a
// string, a list of token ids, a list of strings, or a list of lists of token ids.
absl::StatusOr<std::vector<Json>> PromptList(const Json& prompt) {
  const char* kShape =
      "must be a string, a list of token ids, or a list of strings or of token-id lists";
  if (prompt.is_string()) return std::vector<Json>{prompt};
  if (!prompt.is_array() || prompt.empty()) return Invalid("prompt", kShape);
  if (prompt[0].is_number()) return std::vector<Json>{prompt};
  std::vector<Json> out;
  for (const Json& p : prompt) {
    if (!p.is_string() && !p.is_array()) return Invalid("prompt", kShape);
    out.push_back(p);
  }
  return out;
}

// One prompt of PromptList: a string or a list of token ids.
absl::Status SetPrompt(const Json& prompt, v1::GenerateRequest* out) {
  auto set_ids = [&](const Json& ids) -> absl::Status {
    if (ids.empty()) return Invalid("prompt", "must not be empty");
    v1::TokenIds* t = out->mutable_tokens();
    for (const Json& id : ids) {
      if (!id.is_number_integer()) return Invalid("prompt", "token ids must be integers");
      auto x = GetInt(id, "prompt", kInt32Min, kInt32Max);
      if (!x.ok()) return x.status();
      t->add_ids(static_cast<int32_t>(*x));
    }
    return absl::OkStatus();
  };
  if (prompt.is_string()) {
    out->set_text(prompt.get<std::string>());
    return absl::OkStatus();
  }
  return set_ids(prompt);
}

// A message's `content` as chat templates get it: a string as given; a list of text parts
// ([{"type": "text", "text": ...}, ...]) joined with "\n"; null or absent (an assistant turn
// that only called tools, as the openai SDK and LangChain send it back) "", as vLLM passes it,
// so that both a template's `if message.content` and its `'...' + message.content` work.
absl::StatusOr<std::string> MessageContent(const Json& m, const std::string& where) {
  const Json* content = Field(m, "content");
  if (content == nullptr) return std::string();
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) {
    return Invalid(where + ".content", "must be a string, null or an array of content parts");
  }
  std::vector<std::string> texts;
  for (size_t j = 0; j < content->size(); ++j) {
    const Json& part = (*content)[j];
    const std::string pw = absl::StrFormat("%s.content[%d]", where, j);
    const Json* type = part.is_object() ? Field(part, "type") : nullptr;
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text") {
      return Invalid(pw + ".type", "only \"text\" content parts are supported");
    }
    const Json* text = Field(part, "text");
    if (text == nullptr || !text->is_string()) return Invalid(pw + ".text", "must be a string");
    texts.push_back(text->get<std::string>());
  }
  return absl::StrJoin(texts, "\n");
}

// An assistant message's `tool_calls` as transformers' tool-use templates expect them (and
// vLLM passes them): [{"id", "type": "function", "function": {"name", "arguments"}}] with
// `arguments` an object, parsed from the JSON text OpenAI's API carries.
absl::StatusOr<Json> ToolCalls(const Json& calls, const std::string& where) {
  if (!calls.is_array()) return Invalid(where, "must be an array of tool calls");
  Json out = Json::array();
  for (size_t j = 0; j < calls.size(); ++j) {
    const std::string cw = absl::StrFormat("%s[%d]", where, j);
    const Json* fn = calls[j].is_object() ? Field(calls[j], "function") : nullptr;
    if (fn == nullptr || !fn->is_object()) return Invalid(cw + ".function", "must be an object");
    const Json* name = Field(*fn, "name");
    if (name == nullptr || !name->is_string()) {
      return Invalid(cw + ".function.name", "is required and must be a string");
    }
    Json call = calls[j];
    if (const Json* args = Field(*fn, "arguments"); args != nullptr && args->is_string()) {
      const std::string& text = args->get_ref<const std::string&>();
      absl::StatusOr<Json> parsed = CheckJsonLimits(text).ok()
                                        ? structured::ParseJson(text)
                                        : absl::InvalidArgumentError("over the JSON limits");
      if (!parsed.ok()) {
        return Invalid(cw + ".function.arguments",
                       absl::StrCat("is not valid JSON (", parsed.status().message(), ")"));
      }
      call["function"]["arguments"] = *std::move(parsed);
    } else if (args != nullptr && !args->is_object()) {
      return Invalid(cw + ".function.arguments", "must be a JSON object or its text");
    }
    out.push_back(std::move(call));
  }
  return out;
}

// `messages` of /v1/chat/completions, checked, as templates expect them: content a string
// (MessageContent), an assistant's tool_calls with parsed arguments (ToolCalls); a tool
// message's tool_call_id and name, and other keys, as given.
absl::StatusOr<Json> Messages(const Json& body) {
  const Json* messages = Field(body, "messages");
  if (messages == nullptr) return Invalid("messages", "is required");
  if (!messages->is_array() || messages->empty()) {
    return Invalid("messages", "must be a non-empty array of messages");
  }
  Json out = Json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string where = absl::StrFormat("messages[%d]", i);
    if (!m.is_object()) return Invalid(where, "must be an object");
    const Json* role = Field(m, "role");
    if (role == nullptr || !role->is_string()) {
      return Invalid(where + ".role", "is required and must be a string");
    }
    Json copy = m;
    absl::StatusOr<std::string> content = MessageContent(m, where);
    if (!content.ok()) return content.status();
    copy["content"] = *std::move(content);
    if (const Json* calls = Field(m, "tool_calls")) {
      absl::StatusOr<Json> parsed = ToolCalls(*calls, where + ".tool_calls");
      if (!parsed.ok()) return parsed.status();
      copy["tool_calls"] = *std::move(parsed);
    } else if (m.contains("tool_calls")) {
      copy.erase("tool_calls");  // null: none (a template's `if message.tool_calls` is false)
    }
    out.push_back(std::move(copy));
  }
  return out;
}

// The chat prompt's text: the model's template applied to the messages (and tools, and
// chat_template_kwargs). A forced tool_choice sets `sampling`'s schema; tools to parse out of
// the output set *parse_tool_calls.
absl::StatusOr<std::string> RenderChat(const Json& body, const ServedModel& model,
                                       v1::SamplingParams* sampling, bool* parse_tool_calls) {
  auto messages = Messages(body);
  if (!messages.ok()) return messages.status();
  bool add_generation_prompt = true;
  if (const Json* v = Field(body, "add_generation_prompt")) {
    auto b = GetBool(*v, "add_generation_prompt");
    if (!b.ok()) return b.status();
    add_generation_prompt = *b;
  }
  Json extra = Json::object();
  if (const Json* v = Field(body, "chat_template_kwargs")) {
    if (!v->is_object()) return Invalid("chat_template_kwargs", "must be an object");
    extra = *v;
  }
  // tools reach the template as transformers passes them: the list of {"type": "function",
  // "function": {...}} objects. tool_choice "none" renders none.
  if (const Json* tools = Field(body, "tools"); tools != nullptr && !tools->empty()) {
    if (!tools->is_array()) return Invalid("tools", "must be an array of tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      const std::string where = absl::StrFormat("tools[%d]", i);
      const Json* type = t.is_object() ? Field(t, "type") : nullptr;
      if (type == nullptr || *type != "function") {
        return Invalid(where + ".type", "only \"function\" tools are supported");
      }
      const Json* fn = Field(t, "function");
      const Json* name = fn != nullptr && fn->is_object() ? Field(*fn, "name") : nullptr;
      if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) {
        return Invalid(where + ".function.name", "is required and must be a string");
      }
      if (const Json* params = Field(*fn, "parameters");
          params != nullptr && !params->is_object()) {
        return Invalid(where + ".function.parameters", "must be a JSON schema object");
      }
    }
    std::string choice = "auto";
    std::vector<ForcedFunction> forced;  // the functions a forced call may name
    if (const Json* c = Field(body, "tool_choice")) {
      if (c->is_string() && (*c == "auto" || *c == "none" || *c == "required")) {
        choice = c->get<std::string>();
        if (choice == "required") {
          for (size_t i = 0; i < tools->size(); ++i) {
            forced.push_back({static_cast<int>(i), &(*tools)[i]["function"]});
          }
        }
      } else if (const Json* fn = c->is_object() ? Field(*c, "function") : nullptr;
                 fn != nullptr && fn->is_object() && Field(*fn, "name") != nullptr) {
        choice = "function";
        for (size_t i = 0; i < tools->size() && forced.empty(); ++i) {
          const Json& t = (*tools)[i];
          if (t["function"]["name"] == (*fn)["name"]) {
            forced.push_back({static_cast<int>(i), &t["function"]});
          }
        }
        if (forced.empty()) {
          return Invalid("tool_choice.function.name", "names no function in tools");
        }
      } else {
        return Invalid("tool_choice",
                       "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}");
      }
    }
    if (choice != "none") {
      extra["tools"] = *tools;
      *parse_tool_calls = true;
    }
    if (!forced.empty()) {
      if (absl::Status s = ForceToolCall(forced, sampling); !s.ok()) return s;
    }
  } else if (const Json* c = Field(body, "tool_choice");
             c != nullptr && !(c->is_string() && (*c == "auto" || *c == "none"))) {
    return Invalid("tool_choice", "forcing a call needs tools");
  }
  if (!model.chat_template.ok()) {
    const absl::Status& s = model.chat_template.status();
    if (absl::IsNotFound(s)) {
      return Invalid("messages",
                     "this model has no chat template (start the router with --chat-template, "
                     "or use /v1/completions)");
    }
    return absl::Status(s.code(), absl::StrCat("the model's chat template: ", s.message()));
  }
  auto text = model.chat_template->Apply(*messages, add_generation_prompt, extra);
  if (!text.ok()) {
    // The template refused these messages (raise_exception, a missing key, a runaway loop):
    // the request's fault.
    if (absl::IsInvalidArgument(text.status()) || absl::IsResourceExhausted(text.status())) {
      return Invalid("messages", text.status().message());
    }
    return text.status();
  }
  return text;
}

// The chat prompt: the model's template applied to the messages, tokenized without adding
// special tokens (the template writes them), as transformers' apply_chat_template(tokenize=True).
absl::Status SetChatPrompt(const Json& body, const ServedModel& model, v1::GenerateRequest* out,
                           bool* parse_tool_calls) {
  auto text = RenderChat(body, model, out->mutable_sampling(), parse_tool_calls);
  if (!text.ok()) return text.status();
  const std::vector<int> ids = model.tokenizer->Encode(*text, /*add_special_tokens=*/false);
  if (ids.empty()) return Invalid("messages", "the chat template rendered no tokens");
  out->mutable_tokens()->mutable_ids()->Add(ids.begin(), ids.end());
  return absl::OkStatus();
}

// The ingress's field names (router/ingress.cc) as OpenAI parameters of `r`.
std::string OpenAiParam(std::string_view field, const Request* r) {
  const bool chat = r != nullptr && r->endpoint == Endpoint::kChatCompletions;
  if (field == "text" || field == "tokens.ids" || field == "input") {
    // A parse error (no request yet) naming "input" is the Responses API's own field.
    if (r == nullptr ? field == "input" : r->endpoint == Endpoint::kResponses) return "input";
    return chat ? "messages" : "prompt";
  }
  if (field == "max_tokens") return r != nullptr ? r->max_tokens_param : "max_tokens";
  if (field == "sampling.top_logprobs") return chat ? "top_logprobs" : "logprobs";
  if (field == "sampling.json_schema" || field == "sampling.choice" || field == "sampling.regex") {
    return r != nullptr ? r->schema_param : "response_format";
  }
  if (field.starts_with("sampling.")) return std::string(field.substr(9));
  return std::string(field);
}

Json Nullable(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

// The text of one token, and its bytes (a token may be part of a UTF-8 character).
std::pair<std::string, Json> TokenText(const Tokenizer& tok, int id) {
  const std::string raw = tok.Decode(std::span<const int>(&id, 1));
  Json bytes = Json::array();
  for (unsigned char c : raw) bytes.push_back(static_cast<int>(c));
  return {ToValidUtf8(raw), std::move(bytes)};
}

}  // namespace

std::string_view FieldPrefix(std::string_view message) {
  const size_t colon = message.find(": ");
  if (colon == std::string_view::npos || colon == 0) return {};
  for (char c : message.substr(0, colon)) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '[' ||
          c == ']')) {
      return {};
    }
  }
  return message.substr(0, colon);
}

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
    case v1::FINISH_REASON_CONTEXT:
      return "length";
    default:
      return "";
  }
}

namespace {

// Fields ParseRequest reads, and OpenAI's that change nothing here (user, metadata, ...).
constexpr std::string_view kKnownFields[] = {"model",
                                             "prompt",
                                             "messages",
                                             "max_tokens",
                                             "max_completion_tokens",
                                             "temperature",
                                             "top_p",
                                             "top_k",
                                             "seed",
                                             "stop",
                                             "n",
                                             "stream",
                                             "stream_options",
                                             "logprobs",
                                             "top_logprobs",
                                             "ignore_eos",
                                             "speculative",
                                             "add_generation_prompt",
                                             "chat_template_kwargs",
                                             "echo",
                                             "best_of",
                                             "suffix",
                                             "tools",
                                             "functions",
                                             "tool_choice",
                                             "function_call",
                                             "parallel_tool_calls",
                                             "response_format",
                                             "presence_penalty",
                                             "frequency_penalty",
                                             "repetition_penalty",
                                             "min_tokens",
                                             "logit_bias",
                                             "user",
                                             "metadata",
                                             "store",
                                             "service_tier",
                                             "guided_json",
                                             "guided_choice",
                                             "guided_regex",
                                             "guided_grammar",
                                             "guided_whitespace_pattern",
                                             "guided_decoding_backend",
                                             "structural_tag",
                                             "structured_outputs",
                                             "prompt_logprobs"};

// n, and completions' best_of and echo (left as they are when absent).
absl::Status ParseChoiceCounts(const Json& body, bool chat, int* n_out, int* best_of_out,
                               bool* echo) {
  int n = 1;
  if (const Json* v = Field(body, "n")) {
    auto x = GetInt(*v, "n", 1, kMaxChoices);
    if (!x.ok()) return x.status();
    n = static_cast<int>(*x);
  }
  int best_of = n;
  if (const Json* v = Field(body, "best_of")) {
    if (chat) return Invalid("best_of", "is a completions parameter");
    auto x = GetInt(*v, "best_of", 1, kMaxChoices);
    if (!x.ok()) return x.status();
    if (*x < n)
      return Invalid("best_of", absl::StrFormat("must be at least n (%d), got %d", n, *x));
    best_of = static_cast<int>(*x);
  }
  if (const Json* v = Field(body, "echo")) {
    if (chat) return Invalid("echo", "is a completions parameter");
    auto b = GetBool(*v, "echo");
    if (!b.ok()) return b.status();
    *echo = *b;
  }
  *n_out = n;
  *best_of_out = best_of;
  return absl::OkStatus();
}

// The input of r->generate: chat's messages through the chat template, or the first of
// completions' prompts (all of which go to `prompts`).
absl::Status SetInput(const Json& body, const ServedModel& model, bool chat, int n, int best_of,
                      Request* r, std::vector<Json>* prompts) {
  v1::GenerateRequest& g = r->generate;
  if (chat) {
    if (absl::Status s = SetChatPrompt(body, model, &g, &r->parse_tool_calls); !s.ok()) return s;
  } else {
    const Json* prompt = Field(body, "prompt");
    if (prompt == nullptr) return Invalid("prompt", "is required");
    auto list = PromptList(*prompt);
    if (!list.ok()) return list.status();
    *prompts = *std::move(list);
    if (prompts->size() * best_of > static_cast<size_t>(kMaxChoices)) {
      return Invalid(best_of > n ? "best_of" : "n",
                     absl::StrFormat("%d prompts x %d gives more than %d choices", prompts->size(),
                                     best_of, kMaxChoices));
    }
    if (absl::Status s = SetPrompt((*prompts)[0], &g); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// max_tokens (or chat's max_completion_tokens) of r->generate, whose input is set.
absl::Status SetMaxTokens(const Json& body, const ServedModel& model, bool chat, Request* r) {
  v1::GenerateRequest& g = r->generate;
  // max_tokens: OpenAI's default is 16 for completions; chat runs to the end of the context
  // (bounded by chat_default_max_tokens).
  const Json* max_tokens = nullptr;
  if (chat) max_tokens = Field(body, "max_completion_tokens");
  if (max_tokens != nullptr) {
    r->max_tokens_param = "max_completion_tokens";
  } else {
    max_tokens = Field(body, "max_tokens");
  }
  if (max_tokens != nullptr) {
    auto n = GetInt(*max_tokens, r->max_tokens_param, kInt32Min, kInt32Max);
    if (!n.ok()) return n.status();
    g.set_max_tokens(static_cast<int32_t>(*n));
  } else {
    const int rest = model.max_context - g.tokens().ids_size();
    g.set_max_tokens(chat ? std::clamp(rest, 1, model.chat_default_max_tokens) : 16);
  }
  return absl::OkStatus();
}

// logit_bias: token ids (as strings) to biases.
absl::Status SetLogitBias(const Json& v, v1::SamplingParams* s) {
  if (!v.is_object()) {
    return Invalid("logit_bias", absl::StrCat("must be an object, got ", TypeName(v)));
  }
  for (const auto& [key, bias] : v.items()) {
    int64_t id = -1;
    if (key.empty() || key.size() > 10 ||
        !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        (id = std::stoll(key)) > kInt32Max) {
      return Invalid("logit_bias", "keys must be token ids (non-negative integers as strings)");
    }
    auto b = GetNumber(bias, "logit_bias");
    if (!b.ok()) return b.status();
    (*s->mutable_logit_bias())[static_cast<int32_t>(id)] = static_cast<float>(*b);
  }
  return absl::OkStatus();
}

// The sampling parameters: temperature, top_p, top_k, seed (`random_seed` when absent), the
// logit processors and response_format.
absl::Status SetSampling(const Json& body, uint64_t random_seed, v1::SamplingParams* s) {
  if (const Json* v = Field(body, "temperature")) {
    auto t = GetNumber(*v, "temperature");
    if (!t.ok()) return t.status();
    s->set_temperature(static_cast<float>(*t));
  }
  if (const Json* v = Field(body, "top_p")) {
    auto p = GetNumber(*v, "top_p");
    if (!p.ok()) return p.status();
    s->set_top_p(static_cast<float>(*p));
  }
  if (const Json* v = Field(body, "top_k")) {
    // vLLM's extension; -1 means off there.
    auto k = GetInt(*v, "top_k", kInt32Min, kInt32Max);
    if (!k.ok()) return k.status();
    s->set_top_k(*k == -1 ? 0 : static_cast<int32_t>(*k));
  }
  if (const Json* v = Field(body, "seed")) {
    if (!v->is_number_integer()) {
      return Invalid("seed", absl::StrCat("must be an integer, got ", TypeName(*v)));
    }
    // Negative seeds are as good as any: their two's complement keys the draw.
    s->set_seed(v->is_number_unsigned() ? v->get<uint64_t>()
                                        : static_cast<uint64_t>(v->get<int64_t>()));
  } else {
    s->set_seed(random_seed);
  }

  // The logit processors (engine/sampling/sampler.h); the router checks the ranges and ids.
  for (auto [key, setter] :
       {std::pair{"presence_penalty", &v1::SamplingParams::set_presence_penalty},
        std::pair{"frequency_penalty", &v1::SamplingParams::set_frequency_penalty},
        std::pair{"repetition_penalty", &v1::SamplingParams::set_repetition_penalty}}) {
    if (const Json* v = Field(body, key)) {
      auto x = GetNumber(*v, key);
      if (!x.ok()) return x.status();
      (s->*setter)(static_cast<float>(*x));
    }
  }
  if (const Json* v = Field(body, "min_tokens")) {
    auto n = GetInt(*v, "min_tokens", kInt32Min, kInt32Max);
    if (!n.ok()) return n.status();
    s->set_min_tokens(static_cast<int32_t>(*n));
  }
  if (const Json* v = Field(body, "logit_bias")) {
    if (absl::Status st = SetLogitBias(*v, s); !st.ok()) return st;
  }
  if (const Json* v = Field(body, "response_format")) {
    if (absl::Status st = SetResponseFormat(*v, s); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// Chat's logprobs and top_logprobs, or completions' logprobs (alternatives per token).
absl::Status SetLogprobs(const Json& body, bool chat, v1::SamplingParams* s) {
  if (chat) {
    if (const Json* v = Field(body, "logprobs")) {
      auto b = GetBool(*v, "logprobs");
      if (!b.ok()) return b.status();
      s->set_logprobs(*b);
    }
    if (const Json* v = Field(body, "top_logprobs")) {
      auto n = GetInt(*v, "top_logprobs", kInt32Min, kInt32Max);
      if (!n.ok()) return n.status();
      if (!s->logprobs()) return Invalid("top_logprobs", "needs logprobs to be true");
      s->set_top_logprobs(static_cast<int32_t>(*n));
    }
  } else if (const Json* v = Field(body, "logprobs")) {
    // Completions: logprobs is the number of alternatives per token.
    auto n = GetInt(*v, "logprobs", kInt32Min, kInt32Max);
    if (!n.ok()) return n.status();
    s->set_logprobs(true);
    s->set_top_logprobs(static_cast<int32_t>(*n));
  }
  return absl::OkStatus();
}

// stop (one string or a list), ignore_eos and speculative (false: the request opts out of the
// decode workers' speculative decoding).
absl::Status SetStop(const Json& body, v1::GenerateRequest* g) {
  if (const Json* v = Field(body, "stop")) {
    if (v->is_string()) {
      g->add_stop(v->get<std::string>());
    } else if (v->is_array()) {
      for (const Json& x : *v) {
        if (!x.is_string()) return Invalid("stop", "must be a string or a list of strings");
        g->add_stop(x.get<std::string>());
      }
    } else {
      return Invalid("stop", "must be a string or a list of strings");
    }
  }
  if (const Json* v = Field(body, "ignore_eos")) {
    auto b = GetBool(*v, "ignore_eos");
    if (!b.ok()) return b.status();
    g->set_ignore_eos(*b);
  }
  if (const Json* v = Field(body, "speculative")) {
    auto b = GetBool(*v, "speculative");
    if (!b.ok()) return b.status();
    g->set_disable_speculation(!*b);
  }
  return absl::OkStatus();
}

// Fills r->choices from r->generate: every prompt best_of times (chat has one prompt, the one
// r->generate holds).
absl::Status AddChoices(bool chat, int n, int best_of, std::vector<Json> prompts, Request* r) {
  v1::GenerateRequest& g = r->generate;
  v1::SamplingParams* s = g.mutable_sampling();
  // The choices: every prompt best_of (n) times, choice i of a prompt with seed
  // ChoiceSeed(seed, i). Picking the best needs every candidate's log-probabilities.
  r->want_logprobs = s->logprobs();
  if (best_of > n) s->set_logprobs(true);
  if (chat) prompts.push_back(Json());
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int i = 0; i < best_of; ++i) {
      v1::GenerateRequest c = g;
      if (!chat && p > 0) {
        c.clear_input();
        if (absl::Status st = SetPrompt(prompts[p], &c); !st.ok()) return st;
      }
      c.mutable_sampling()->set_seed(ChoiceSeed(g.sampling().seed(), i));
      r->choices.push_back(std::move(c));
    }
  }
  return absl::OkStatus();
}

// stream and stream_options.
absl::Status SetStreaming(const Json& body, int n, int best_of, Request* r) {
  if (const Json* v = Field(body, "stream")) {
    auto b = GetBool(*v, "stream");
    if (!b.ok()) return b.status();
    r->stream = *b;
    if (r->stream && best_of > n) return Invalid("best_of", "cannot be streamed (best_of > n)");
  }
  if (const Json* v = Field(body, "stream_options")) {
    if (!r->stream) return Invalid("stream_options", "is only allowed when stream is true");
    if (!v->is_object()) return Invalid("stream_options", "must be an object");
    if (const Json* u = Field(*v, "include_usage")) {
      auto b = GetBool(*u, "stream_options.include_usage");
      if (!b.ok()) return b.status();
      r->include_usage = *b;
    }
  }
  return absl::OkStatus();
}

// max_tokens 0 (the prompt alone, with echo) and vLLM's prompt_logprobs.
absl::Status SetPromptScoring(const Json& body, Request* r) {
  if (r->generate.max_tokens() == 0) {
    if (!r->echo) {
      return Invalid(r->max_tokens_param,
                     "must be >= 1 (0 only with echo, which returns the prompt alone: with "
                     "logprobs, its tokens' log-probabilities)");
    }
    r->score_only = true;
  }
  if (const Json* v = Field(body, "prompt_logprobs")) {
    auto n = GetInt(*v, "prompt_logprobs", 0, kMaxTopLogprobs);
    if (!n.ok()) return n.status();
    if (r->stream) return Invalid("prompt_logprobs", "cannot be streamed");
    r->prompt_logprobs = static_cast<int>(*n);
  }
  return absl::OkStatus();
}

}  // namespace

void LogUnknownFields(const Json& body, std::span<const std::string_view> known) {
  static std::mutex mu;
  static std::set<std::string>* seen = new std::set<std::string>();
  for (const auto& [key, value] : body.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string name = key.substr(0, 64);
    for (char& c : name) {
      if (c < 0x20 || c > 0x7e) c = '?';
    }
    std::lock_guard<std::mutex> lock(mu);
    if (seen->size() >= 64 || !seen->insert(name).second) continue;
    std::fprintf(stderr, "[tandem-http] ignoring the unknown request field \"%s\"\n", name.c_str());
  }
}

absl::StatusOr<Json> ParseJsonBody(std::string_view body_text,
                                   const std::function<bool()>& cancelled) {
  if (absl::Status s = CheckJsonLimits(body_text); !s.ok()) return s;
  absl::StatusOr<Json> body = structured::ParseJson(body_text, cancelled);
  if (absl::IsCancelled(body.status())) return body.status();
  if (!body.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is not valid JSON (", body.status().message(), ")"));
  }
  if (!body->is_object())
    return absl::InvalidArgumentError("the request body must be a JSON object");
  return body;
}

absl::StatusOr<Request> ParseRequest(Endpoint endpoint, std::string_view body_text,
                                     const ServedModel& model, uint64_t random_seed,
                                     const std::function<bool()>& cancelled) {
  absl::StatusOr<Json> parsed = ParseJsonBody(body_text, cancelled);
  if (!parsed.ok()) return parsed.status();
  LogUnknownFields(*parsed, kKnownFields);
  return ParseRequestBody(endpoint, *parsed, model, random_seed);
}

absl::StatusOr<Request> ParseRequestBody(Endpoint endpoint, const Json& body,
                                         const ServedModel& model, uint64_t random_seed) {
  if (endpoint == Endpoint::kResponses) {
    return absl::InvalidArgumentError("the Responses API is parsed by ParseResponsesRequest");
  }
  Request r;
  r.endpoint = endpoint;
  const bool chat = endpoint == Endpoint::kChatCompletions;

  if (const Json* v = Field(body, "model")) {
    if (!v->is_string()) return Invalid("model", "must be a string");
    if (v->get<std::string>() != model.id) {
      return absl::NotFoundError(
          absl::StrFormat("model: the model '%s' does not exist (this server has '%s')",
                          v->get<std::string>(), model.id));
    }
  }
  if (absl::Status s = CheckUnsupported(body, endpoint); !s.ok()) return s;
  int n = 1;
  int best_of = 1;
  if (absl::Status s = ParseChoiceCounts(body, chat, &n, &best_of, &r.echo); !s.ok()) return s;

  std::vector<Json> prompts;
  if (absl::Status s = SetInput(body, model, chat, n, best_of, &r, &prompts); !s.ok()) return s;
  if (absl::Status s = SetMaxTokens(body, model, chat, &r); !s.ok()) return s;

  v1::GenerateRequest& g = r.generate;
  v1::SamplingParams* s = g.mutable_sampling();
  if (absl::Status st = SetSampling(body, random_seed, s); !st.ok()) return st;
  if (absl::Status st = SetGuided(body, &r); !st.ok()) return st;
  if (absl::Status st = SetLogprobs(body, chat, s); !st.ok()) return st;
  if (absl::Status st = SetStop(body, &g); !st.ok()) return st;

  r.echo_logprobs = r.echo && s->logprobs();

  if (absl::Status st = AddChoices(chat, n, best_of, std::move(prompts), &r); !st.ok()) return st;
  r.n = n;
  r.best_of = best_of;

  if (absl::Status st = SetStreaming(body, n, best_of, &r); !st.ok()) return st;
  if (absl::Status st = SetPromptScoring(body, &r); !st.ok()) return st;
  return r;
}

namespace {

// The body of a request that is not a generation: an object whose `model`, if any, is ours.
absl::StatusOr<Json> ParseOtherBody(std::string_view body_text, const ServedModel& model) {
  absl::StatusOr<Json> body = ParseJsonBody(body_text, {});
  if (!body.ok()) return body.status();
  if (const Json* v = Field(*body, "model")) {
    if (!v->is_string()) return Invalid("model", "must be a string");
    if (v->get<std::string>() != model.id) {
      return absl::NotFoundError(
          absl::StrFormat("model: the model '%s' does not exist", v->get<std::string>()));
    }
  }
  return body;
}

}  // namespace

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body_text,
                                                     const ServedModel& model) {
  absl::StatusOr<Json> parsed = ParseOtherBody(body_text, model);
  if (!parsed.ok()) return parsed.status();
  const Json& body = *parsed;
  TokenizeRequest t;
  const Json* prompt = Field(body, "prompt");
  if (prompt != nullptr && Field(body, "messages") != nullptr) {
    return Invalid("messages", "give either prompt or messages");
  }
  if (prompt != nullptr) {
    if (!prompt->is_string()) return Invalid("prompt", "must be a string");
    t.text = prompt->get<std::string>();
  } else if (Field(body, "messages") != nullptr) {
    // The chat prompt, as chat completions render it; the template writes the special tokens.
    v1::SamplingParams unused;
    bool parse_tool_calls = false;
    auto text = RenderChat(body, model, &unused, &parse_tool_calls);
    if (!text.ok()) return text.status();
    t.text = *std::move(text);
    t.add_special_tokens = false;
  } else {
    return Invalid("prompt", "is required (or messages)");
  }
  for (auto [key, out] : {std::pair{"add_special_tokens", &t.add_special_tokens},
                          std::pair{"return_token_strs", &t.return_token_strs}}) {
    if (const Json* v = Field(body, key)) {
      auto b = GetBool(*v, key);
      if (!b.ok()) return b.status();
      *out = *b;
    }
  }
  return t;
}

std::string TokenizeResponseBody(const std::vector<int>& ids, bool token_strs,
                                 const ServedModel& model) {
  Json strs = nullptr;
  if (token_strs) {
    strs = Json::array();
    for (int id : ids) strs.push_back(TokenText(*model.tokenizer, id).first);
  }
  const Json body = {{"count", ids.size()},
                     {"max_model_len", model.max_context},
                     {"tokens", ids},
                     {"token_strs", std::move(strs)}};
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::StatusOr<std::vector<int>> ParseDetokenizeRequest(std::string_view body_text,
                                                        const ServedModel& model) {
  absl::StatusOr<Json> parsed = ParseOtherBody(body_text, model);
  if (!parsed.ok()) return parsed.status();
  const Json* tokens = Field(*parsed, "tokens");
  if (tokens == nullptr || !tokens->is_array()) {
    return Invalid("tokens", "is required and must be a list of token ids");
  }
  const size_t max_ids = std::max<size_t>(size_t{4} * model.max_context, 1 << 16);
  if (tokens->size() > max_ids) {
    return Invalid("tokens",
                   absl::StrFormat("%d ids, more than the limit of %d", tokens->size(), max_ids));
  }
  const int vocab = model.tokenizer->vocab_size();
  std::vector<int> ids;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const std::string where = absl::StrFormat("tokens[%d]", i);
    auto id = GetInt((*tokens)[i], where, 0, vocab - 1);
    if (!id.ok()) return id.status();
    ids.push_back(static_cast<int>(*id));
  }
  return ids;
}

ApiError ToApiError(const absl::Status& status, const Request* request) {
  return ToApiError(
      grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message())),
      request);
}

ApiError ToApiError(const grpc::Status& status, const Request* request) {
  ApiError e;
  e.message = status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION:
      e.http_status = 400;
      e.type = "invalid_request_error";
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
      e.http_status = 401;
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case grpc::StatusCode::PERMISSION_DENIED:
      e.http_status = 403;
      e.type = "permission_error";
      break;
    case grpc::StatusCode::NOT_FOUND:
      e.http_status = 404;
      e.type = "invalid_request_error";
      e.code = "not_found";
      break;
    case grpc::StatusCode::ALREADY_EXISTS:
      e.http_status = 409;
      e.type = "invalid_request_error";
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case grpc::StatusCode::CANCELLED:
      e.http_status = 499;  // the client left; nobody reads this
      e.type = "invalid_request_error";
      break;
    case grpc::StatusCode::UNIMPLEMENTED:
      e.http_status = 501;
      e.type = "server_error";
      break;
    case grpc::StatusCode::UNAVAILABLE:
      e.http_status = 503;
      e.type = "server_error";
      e.code = "service_unavailable";
      break;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      e.http_status = 504;
      e.type = "server_error";
      e.code = "timeout";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  // Only a request's fault names one of its fields ("router: full" is no field).
  const bool names_field = e.http_status == 400 || e.http_status == 404;
  if (const std::string_view field = names_field ? FieldPrefix(e.message) : std::string_view();
      !field.empty()) {
    e.param = OpenAiParam(field, request);
    e.message = e.param + e.message.substr(field.size());
    if (e.http_status == 404 && e.param == "model") e.code = "model_not_found";
  }
  return e;
}

std::string ErrorBody(const ApiError& error) {
  Json body;
  body["error"] = {{"message", error.message},
                   {"type", error.type},
                   {"param", Nullable(error.param)},
                   {"code", Nullable(error.code)}};
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTag(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}
}  // namespace

std::string ToolCallParser::Add(std::string_view text) {
  pending_.append(text);
  std::string content;
  while (true) {
    if (!in_call_) {
      const size_t open = pending_.find(kCallOpen);
      if (open == std::string::npos) {
        const size_t keep = PartialTag(pending_, kCallOpen);
        content += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return content;
      }
      content += pending_.substr(0, open);
      pending_.erase(0, open + kCallOpen.size());
      in_call_ = true;
    }
    const size_t close = pending_.find(kCallClose);
    if (close == std::string::npos) return content;
    const std::string body = pending_.substr(0, close);
    // A block over the JSON limits (the model's output is as unbounded as a client's) is text.
    const Json call =
        CheckJsonLimits(body).ok() ? structured::ParseJson(body).value_or(Json()) : Json();
    const Json* name = call.is_object() ? Field(call, "name") : nullptr;
    if (name != nullptr && name->is_string()) {
      const Json* args = Field(call, "arguments");
      if (args == nullptr) args = Field(call, "parameters");
      const std::string arguments = args == nullptr     ? "{}"
                                    : args->is_string() ? args->get<std::string>()
                                                        : args->dump();
      calls_.push_back({content.size(),
                        {{"id", absl::StrFormat("call_%s_%d", id_prefix_, total_++)},
                         {"type", "function"},
                         {"function", {{"name", *name}, {"arguments", arguments}}}}});
    } else {
      content += std::string(kCallOpen) + body + std::string(kCallClose);  // not a call: text
    }
    pending_.erase(0, close + kCallClose.size());
    in_call_ = false;
  }
}

std::string ToolCallParser::Flush() {
  std::string rest = (in_call_ ? std::string(kCallOpen) : std::string()) + pending_;
  pending_.clear();
  in_call_ = false;
  return rest;
}

std::vector<Json> ToolCallParser::TakeCalls() {
  std::vector<Json> calls;
  for (PlacedCall& c : calls_) calls.push_back(std::move(c.call));
  calls_.clear();
  return calls;
}

std::vector<ToolCallParser::PlacedCall> ToolCallParser::TakePlacedCalls() {
  return std::exchange(calls_, {});
}

ResponseBuilder::ResponseBuilder(const Request& request, const ServedModel& model,
                                 int64_t created_unix)
    : request_(request), model_(model), created_(created_unix) {
  choices_.resize(std::max<size_t>(1, request_.choices.size()));
  for (Choice& c : choices_) {
    if (request_.endpoint == Endpoint::kChatCompletions) {
      c.logprobs = {{"content", Json::array()}};
    } else {
      c.logprobs = {{"tokens", Json::array()},
                    {"token_logprobs", Json::array()},
                    {"top_logprobs", Json::array()},
                    {"text_offset", Json::array()}};
    }
  }
}

Json ResponseBuilder::Usage() const {
  // The prompt once per prompt (its n choices share it), the completions of every choice.
  int prompt = 0, completion = 0;
  for (size_t i = 0; i < choices_.size(); ++i) {
    if (i % request_.best_of == 0) prompt += choices_[i].prompt_tokens;
    completion += choices_[i].completion_tokens;
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion}};
}

Json ResponseBuilder::Chunk(Json choice) const {
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  Json c = {{"id", id_},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", model_.id},
            {"choices", Json::array({std::move(choice)})}};
  if (request_.include_usage) c["usage"] = nullptr;
  return c;
}

std::string ResponseBuilder::EchoText(int index) const {
  if (!request_.echo || index >= static_cast<int>(request_.choices.size())) return "";
  const v1::GenerateRequest& g = request_.choices[index];
  if (g.has_text()) return g.text();
  const std::vector<int> ids(g.tokens().ids().begin(), g.tokens().ids().end());
  return model_.tokenizer->Decode(ids);
}

Json ResponseBuilder::Logprobs(Choice& choice, const v1::GenerateResponse& msg) {
  if (!request_.generate.sampling().logprobs()) return nullptr;  // neither asked nor best_of
  const Tokenizer& tok = *model_.tokenizer;
  if (request_.endpoint == Endpoint::kChatCompletions) {
    Json content = Json::array();
    for (int i = 0; i < msg.logprobs_size() && i < msg.token_ids_size(); ++i) {
      const v1::TokenLogprobs& l = msg.logprobs(i);
      auto [text, bytes] = TokenText(tok, msg.token_ids(i));
      Json top = Json::array();
      for (const v1::TopLogprob& t : l.top()) {
        auto [ttext, tbytes] = TokenText(tok, t.token_id());
        top.push_back({{"token", ttext}, {"logprob", t.logprob()}, {"bytes", tbytes}});
      }
      content.push_back(
          {{"token", text}, {"logprob", l.logprob()}, {"bytes", bytes}, {"top_logprobs", top}});
    }
    for (const Json& c : content) choice.logprobs["content"].push_back(c);
    return {{"content", std::move(content)}};
  }
  Json out = {{"tokens", Json::array()},
              {"token_logprobs", Json::array()},
              {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
  for (int i = 0; i < msg.logprobs_size() && i < msg.token_ids_size(); ++i) {
    const v1::TokenLogprobs& l = msg.logprobs(i);
    const std::string text = TokenText(tok, msg.token_ids(i)).first;
    Json top = Json::object();
    for (const v1::TopLogprob& t : l.top()) {
      const std::string ttext = TokenText(tok, t.token_id()).first;
      if (!top.contains(ttext)) top[ttext] = t.logprob();  // most likely first
    }
    out["tokens"].push_back(text);
    out["token_logprobs"].push_back(l.logprob());
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(choice.text_offset);
    choice.text_offset += static_cast<int64_t>(text.size());
  }
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const Json& x : out[key]) choice.logprobs[key].push_back(x);
  }
  return out;
}

void ResponseBuilder::SetPromptScore(int prompt, const std::vector<int>& ids,
                                     const v1::ScoreResponse& score) {
  const Tokenizer& tok = *model_.tokenizer;
  const int legacy_top = request_.generate.sampling().top_logprobs();
  Json legacy = {{"tokens", Json::array()},
                 {"token_logprobs", Json::array()},
                 {"top_logprobs", Json::array()},
                 {"text_offset", Json::array()}};
  Json vllm = Json::array();
  int64_t offset = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string text = TokenText(tok, ids[i]).first;
    legacy["tokens"].push_back(text);
    legacy["text_offset"].push_back(offset);
    offset += static_cast<int64_t>(text.size());
    const int k = static_cast<int>(i) - 1;      // its entry in `score`
    if (k < 0 || k >= score.logprobs_size()) {  // the first token: nothing before it
      legacy["token_logprobs"].push_back(nullptr);
      legacy["top_logprobs"].push_back(nullptr);
      vllm.push_back(nullptr);
      continue;
    }
    legacy["token_logprobs"].push_back(score.logprobs(k));
    Json top = Json::object();
    Json entry = Json::object();
    entry[std::to_string(ids[i])] = {{"logprob", score.logprobs(k)},
                                     {"rank", k < score.ranks_size() ? score.ranks(k) : 0},
                                     {"decoded_token", text}};
    if (k < score.top_logprobs_size()) {
      const auto& alternatives = score.top_logprobs(k).top();
      for (int j = 0; j < alternatives.size(); ++j) {
        const v1::TopLogprob& t = alternatives[j];
        const std::string ttext = TokenText(tok, t.token_id()).first;
        if (j < legacy_top && !top.contains(ttext)) top[ttext] = t.logprob();  // most likely first
        const std::string id = std::to_string(t.token_id());
        if (j < request_.prompt_logprobs && !entry.contains(id)) {
          entry[id] = {{"logprob", t.logprob()}, {"rank", j + 1}, {"decoded_token", ttext}};
        }
      }
    }
    legacy["top_logprobs"].push_back(std::move(top));
    vllm.push_back(std::move(entry));
  }
  const size_t group = static_cast<size_t>(std::max(1, request_.best_of));
  for (size_t i = prompt * group; i < std::min(choices_.size(), (prompt + 1) * group); ++i) {
    Choice& c = choices_[i];
    if (request_.echo_logprobs) {
      c.prompt_legacy = legacy;
      for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
        for (const Json& x : legacy[key]) c.logprobs[key].push_back(x);
      }
      c.text_offset = offset;
    }
    if (request_.prompt_logprobs >= 0) c.prompt_logprobs = vllm;
  }
}

std::string ResponseBuilder::Add(int index, const v1::GenerateResponse& msg) {
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  if (index < 0 || index >= static_cast<int>(choices_.size())) return "";
  Choice& choice = choices_[index];
  if (id_.empty()) id_ = (chat ? "chatcmpl-" : "cmpl-") + msg.request_id();
  choice.completion_tokens += msg.token_ids_size();
  if (msg.has_usage()) {
    choice.prompt_tokens = msg.usage().prompt_tokens();
    choice.completion_tokens = msg.usage().completion_tokens();
  }
  std::string finish = FinishReasonName(msg.finish_reason());
  // Chat with tools: the text outside <tool_call> blocks is the content; the blocks are calls.
  std::string content = msg.text();
  std::vector<Json> calls;
  if (chat && request_.parse_tool_calls) {
    if (choice.tools == nullptr) {
      choice.tools =
          std::make_unique<ToolCallParser>(absl::StrFormat("%s_%d", msg.request_id(), index));
    }
    content = choice.tools->Add(msg.text());
    if (!finish.empty()) content += choice.tools->Flush();
    calls = choice.tools->TakeCalls();
    for (const Json& c : calls) choice.tool_calls.push_back(c);
    // A model that called tools and stopped waits for their results: OpenAI's "tool_calls".
    if (finish == "stop" && choice.tools->total_calls() > 0) finish = "tool_calls";
  }
  choice.text += content;
  if (!finish.empty()) choice.finish_reason = finish;
  Json logprobs = Logprobs(choice, msg);
  if (!request_.stream) return "";

  std::string events;
  auto emit = [&](const Json& chunk) {
    events += "data: " + chunk.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
  };
  const bool first = !choice.started;
  choice.started = true;
  if (chat) {
    if (first) {
      emit(Chunk({{"index", index},
                  {"delta", {{"role", "assistant"}, {"content", ""}}},
                  {"logprobs", nullptr},
                  {"finish_reason", nullptr}}));
    }
    if (!content.empty() || (!logprobs.is_null() && !logprobs["content"].empty())) {
      emit(Chunk({{"index", index},
                  {"delta", {{"content", content}}},
                  {"logprobs", logprobs},
                  {"finish_reason", nullptr}}));
    }
    const size_t first_call = choice.tool_calls.size() - calls.size();
    for (size_t k = 0; k < calls.size(); ++k) {
      Json delta_call = {{"index", first_call + k}};
      for (const auto& [key, v] : calls[k].items()) delta_call[key] = v;
      emit(Chunk({{"index", index},
                  {"delta", {{"tool_calls", Json::array({std::move(delta_call)})}}},
                  {"logprobs", nullptr},
                  {"finish_reason", nullptr}}));
    }
    if (!finish.empty()) {
      emit(Chunk({{"index", index},
                  {"delta", Json::object()},
                  {"logprobs", nullptr},
                  {"finish_reason", finish}}));
    }
  } else {
    const std::string text = (first ? EchoText(index) : std::string()) + msg.text();
    if (first && !choice.prompt_legacy.is_null() && !logprobs.is_null()) {
      // The echoed prompt's entries come first.
      Json both = choice.prompt_legacy;
      for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
        for (const Json& x : logprobs[key]) both[key].push_back(x);
      }
      logprobs = std::move(both);
    }
    if (!text.empty() || !finish.empty() || msg.token_ids_size() > 0) {
      emit(Chunk({{"index", index},
                  {"text", text},
                  {"logprobs", logprobs},
                  {"finish_reason", Nullable(finish)}}));
    }
  }
  return events;
}

std::string ResponseBuilder::StreamEnd() {
  std::string events;
  if (request_.include_usage) {
    const bool chat = request_.endpoint == Endpoint::kChatCompletions;
    Json c = {{"id", id_},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", model_.id},
              {"choices", Json::array()},
              {"usage", Usage()}};
    events += "data: " + c.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n";
  }
  return events + "data: [DONE]\n\n";
}

std::string ResponseBuilder::StreamError(const ApiError& error) {
  return "data: " + ErrorBody(error) + "\n\n";
}

std::string ResponseBuilder::StreamFailure(const ApiError& error) {
  return StreamError(error) + "data: [DONE]\n\n";
}

namespace {
// The completions' cumulative log-probability: best_of's ranking.
double CumulativeLogprob(const Json& logprobs) {
  double sum = 0;
  if (logprobs.is_object() && logprobs.contains("token_logprobs")) {
    for (const Json& l : logprobs["token_logprobs"]) {
      if (l.is_number()) sum += l.get<double>();  // an echoed prompt's first token has none
    }
  }
  return sum;
}
}  // namespace

std::string ResponseBuilder::Body() const {
  const bool chat = request_.endpoint == Endpoint::kChatCompletions;
  const bool want_logprobs = request_.want_logprobs;
  // The choices returned: all, or with best_of > n the n most likely candidates of each
  // prompt (ties: the earlier one), in order of likelihood.
  std::vector<size_t> order;
  const size_t group = static_cast<size_t>(std::max(1, request_.best_of));
  for (size_t p = 0; p < choices_.size(); p += group) {
    std::vector<size_t> candidates;
    for (size_t i = p; i < std::min(choices_.size(), p + group); ++i) candidates.push_back(i);
    if (request_.best_of > request_.n) {
      std::vector<double> score(choices_.size());
      for (size_t i : candidates) score[i] = CumulativeLogprob(choices_[i].logprobs);
      std::stable_sort(candidates.begin(), candidates.end(),
                       [&](size_t a, size_t b) { return score[a] > score[b]; });
      candidates.resize(std::min(candidates.size(), static_cast<size_t>(request_.n)));
    }
    order.insert(order.end(), candidates.begin(), candidates.end());
  }
  Json choices = Json::array();
  for (size_t out = 0; out < order.size(); ++out) {
    const size_t i = order[out];
    const Choice& c = choices_[i];
    const Json logprobs = want_logprobs ? c.logprobs : Json(nullptr);
    if (chat) {
      Json message = {{"role", "assistant"}, {"content", c.text}};
      if (!c.tool_calls.empty()) {
        if (c.text.find_first_not_of(" \t\r\n") == std::string::npos) message["content"] = nullptr;
        message["tool_calls"] = c.tool_calls;
      }
      choices.push_back({{"index", out},
                         {"message", std::move(message)},
                         {"logprobs", logprobs},
                         {"finish_reason", Nullable(c.finish_reason)}});
    } else {
      choices.push_back({{"index", out},
                         {"text", EchoText(static_cast<int>(i)) + c.text},
                         {"logprobs", logprobs},
                         {"finish_reason", Nullable(c.finish_reason)}});
      if (request_.prompt_logprobs >= 0) choices.back()["prompt_logprobs"] = c.prompt_logprobs;
    }
  }
  Json body = {{"id", id_},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", model_.id},
               {"choices", std::move(choices)},
               {"usage", Usage()}};
  // vLLM's chat response carries the (one) prompt's log-probabilities beside the choices.
  if (chat && request_.prompt_logprobs >= 0) body["prompt_logprobs"] = choices_[0].prompt_logprobs;
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace tandem::openai
