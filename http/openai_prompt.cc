#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/sampling/output_constraint.h"
#include "http/json_fields.h"
#include "http/json_limits.h"
#include "http/openai_internal.h"
#include "structured/json_parse.h"
#include "structured/json_schema.h"

namespace tandem::openai {

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

namespace {

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
// block, "<tool_call>\n" {"name": ..., "arguments": {...}}, ending at its value (the closing tag
// would cost tokens the model need not spend; the tool-call parser takes an unterminated last
// block as the call). Each candidate's call is {"name": its name, "arguments": its
// `parameters`} (their $defs and definitions moved to the top, where their references point);
// with several candidates ("required" over several tools) the block is one of those shapes, a
// union told apart by the name, so that the arguments follow the schema of the function named.
// A schema refused names `tools[index].function.parameters`.
absl::Status ForceToolCall(const std::vector<ForcedFunction>& functions, v1::SamplingParams* s) {
  const std::string prefix = std::string(kCallOpen) + "\n";
  const std::string suffix;
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

}  // namespace

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

namespace {

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
      // A backend's fallback changes nothing here, and JSON output is compact whatever
      // disable_any_whitespace says (structured/json_matcher.h); closing every object would
      // change the output.
      if (*b && key == "disable_additional_properties") return Invalid(param, "is not supported");
    } else {
      return Invalid(param, "is not a structured_outputs field Tandem knows");
    }
  }
  return absl::OkStatus();
}

}  // namespace

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

namespace {

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

}  // namespace

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

absl::Status SetChatPrompt(const Json& body, const ServedModel& model, v1::GenerateRequest* out,
                           bool* parse_tool_calls) {
  auto text = RenderChat(body, model, out->mutable_sampling(), parse_tool_calls);
  if (!text.ok()) return text.status();
  const std::vector<int> ids = model.tokenizer->Encode(*text, /*add_special_tokens=*/false);
  if (ids.empty()) return Invalid("messages", "the chat template rendered no tokens");
  out->mutable_tokens()->mutable_ids()->Add(ids.begin(), ids.end());
  return absl::OkStatus();
}

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

}  // namespace tandem::openai
