#include "text/chat_template/chat_template.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/jinja/status_macros.h"
#include "lib/jinja/template_parser.h"
#include "lib/jinja/template_renderer.h"
#include "lib/jinja/value.h"

namespace tandem {
namespace {

using jinja::Value;
using jinja::ValueMap;

// The special tokens transformers passes to templates (its special_tokens_map).
constexpr std::string_view kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                               "pad_token", "cls_token", "mask_token"};

jinja::RenderLimits ToRenderLimits(const ChatTemplateLimits& limits) {
  jinja::RenderLimits out;
  out.max_output_bytes = limits.max_output_bytes;
  out.max_loop_iterations = limits.max_loop_iterations;
  out.max_call_depth = limits.max_call_depth;
  return out;
}

// A special token as the config writes it: "<s>" or {"content": "<s>", ...} (AddedToken).
std::optional<nlohmann::ordered_json> TokenContent(const nlohmann::ordered_json& token) {
  if (token.is_string()) return token;
  if (token.is_object() && token.contains("content") && token["content"].is_string()) {
    return token["content"];
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  jinja::ParseOptions options;
  absl::StatusOr<jinja::Body> body = jinja::ParseTemplate(source, options);
  if (!body.ok()) {
    return absl::Status(body.status().code(),
                        absl::StrCat("chat template: ", body.status().message()));
  }
  return ChatTemplate(std::make_shared<const Body>(std::move(*body)));
}

absl::StatusOr<std::string> ChatTemplate::RenderValue(const Value& context,
                                                      const ChatTemplateLimits& limits) const {
  if (!context.is_dict()) {
    return absl::InvalidArgumentError("chat template: the context must be a JSON object");
  }
  absl::StatusOr<std::string> out =
      jinja::RenderTemplate(*body_, context.as_dict(), ToRenderLimits(limits));
  if (!out.ok() && !IsRaisedByTemplate(out.status())) {
    absl::Status status(out.status().code(),
                        absl::StrCat("chat template: ", out.status().message()));
    return status;
  }
  return out;
}

bool IsRaisedByTemplate(const absl::Status& status) {
  return status.GetPayload(jinja::kRaisedByTemplatePayload).has_value();
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& context,
                                                 const ChatTemplateLimits& limits) const {
  return RenderValue(Value::FromJson(context), limits);
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context,
                                                 const ChatTemplateLimits& limits) const {
  return RenderValue(Value::FromJson(context), limits);
}

absl::StatusOr<TokenizerChatTemplate> TokenizerChatTemplate::FromConfig(
    std::string_view tokenizer_config_json) {
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(
      tokenizer_config_json.begin(), tokenizer_config_json.end(), nullptr,
      /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError("tokenizer_config.json is not a JSON object");
  }
  TokenizerChatTemplate out;
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError("tokenizer_config.json has no chat_template");
  }
  out.source_ = *it;
  if (it->is_string()) {
    out.templates_.emplace("default", ChatTemplate::Parse(it->get<std::string>()));
  } else if (it->is_array()) {
    for (const auto& entry : *it) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
          !entry.contains("template") || !entry["template"].is_string()) {
        return absl::InvalidArgumentError(
            "tokenizer_config.json: chat_template entries must be {\"name\", \"template\"}");
      }
      out.templates_.emplace(entry["name"].get<std::string>(),
                             ChatTemplate::Parse(entry["template"].get<std::string>()));
    }
  } else {
    return absl::InvalidArgumentError(
        "tokenizer_config.json: chat_template must be a string or a list of named templates");
  }
  // The template used without tools must parse; a failure here is the useful error.
  const auto def = out.templates_.find("default");
  if (def == out.templates_.end()) {
    if (out.templates_.size() != 1) {
      return absl::NotFoundError("tokenizer_config.json has no chat_template named \"default\"");
    }
  } else if (!def->second.ok()) {
    return def->second.status();
  }
  for (std::string_view name : kSpecialTokens) {
    const auto token = config.find(std::string(name));
    if (token == config.end()) continue;
    if (std::optional<nlohmann::ordered_json> content = TokenContent(*token)) {
      out.special_tokens_[std::string(name)] = *content;
    }
  }
  if (const auto extra = config.find("additional_special_tokens");
      extra != config.end() && extra->is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& token : *extra) {
      if (std::optional<nlohmann::ordered_json> content = TokenContent(token)) {
        list.push_back(*content);
      }
    }
    out.special_tokens_["additional_special_tokens"] = std::move(list);
  }
  return out;
}

namespace {

// Builds the apply_chat_template context. Json is nlohmann::json or nlohmann::ordered_json.
template <typename Json>
absl::StatusOr<Value> BuildContext(const nlohmann::ordered_json& special_tokens,
                                   const Json& messages, bool add_generation_prompt,
                                   const Json& extra) {
  if (!extra.is_null() && !extra.is_object()) {
    return absl::InvalidArgumentError("chat template: extra variables must be a JSON object");
  }
  ValueMap context;
  context.Set("messages", Value::FromJson(messages));
  context.Set("tools", Value::None());
  context.Set("documents", Value::None());
  context.Set("add_generation_prompt", Value::Bool(add_generation_prompt));
  for (auto it = special_tokens.begin(); it != special_tokens.end(); ++it) {
    context.Set(it.key(), Value::FromJson(it.value()));
  }
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      context.Set(it.key(), Value::FromJson(it.value()));
    }
  }
  return Value::Dict(std::move(context));
}

template <typename Json>
bool HasTools(const Json& extra) {
  return extra.is_object() && extra.contains("tools") && !extra["tools"].is_null();
}

}  // namespace

absl::StatusOr<std::string> TokenizerChatTemplate::ApplyContext(bool has_tools,
                                                                const Value& context) const {
  auto chosen = templates_.end();
  if (has_tools) chosen = templates_.find("tool_use");
  if (chosen == templates_.end()) chosen = templates_.find("default");
  if (chosen == templates_.end()) chosen = templates_.begin();
  if (chosen == templates_.end()) return absl::NotFoundError("no chat template");
  if (!chosen->second.ok()) return chosen->second.status();
  return chosen->second->RenderValue(context, limits);
}

absl::StatusOr<std::string> TokenizerChatTemplate::Apply(
    const nlohmann::ordered_json& messages, bool add_generation_prompt,
    const nlohmann::ordered_json& extra) const {
  CT_ASSIGN_OR_RETURN(Value context,
                      BuildContext(special_tokens_, messages, add_generation_prompt, extra));
  return ApplyContext(HasTools(extra), context);
}

absl::StatusOr<std::string> TokenizerChatTemplate::Apply(const nlohmann::json& messages,
                                                         bool add_generation_prompt,
                                                         const nlohmann::json& extra) const {
  CT_ASSIGN_OR_RETURN(Value context,
                      BuildContext(special_tokens_, messages, add_generation_prompt, extra));
  return ApplyContext(HasTools(extra), context);
}

absl::StatusOr<std::string> ApplyChatTemplate(const std::string& tokenizer_config_json_text,
                                              const nlohmann::json& messages,
                                              bool add_generation_prompt,
                                              const nlohmann::json& extra) {
  CT_ASSIGN_OR_RETURN(TokenizerChatTemplate tmpl,
                      TokenizerChatTemplate::FromConfig(tokenizer_config_json_text));
  return tmpl.Apply(messages, add_generation_prompt, extra);
}

}  // namespace tandem
