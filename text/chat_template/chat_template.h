// Chat templates: renders the Jinja2 `chat_template` of a Hugging Face tokenizer_config.json the
// way transformers' apply_chat_template does (jinja2's ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and loopcontrols, a `tojson` that keeps non-ASCII text, and the
// `raise_exception` and `strftime_now` globals), byte for byte.
//
// The Jinja2 engine (lib/jinja, whose README says why it is written here) implements the subset
// that model families ship (Llama 3, Qwen, Mistral, ...). Anything else fails at Parse with
// UNIMPLEMENTED naming the construct and line, never at render time with wrong output.
//
// Key order: Python dicts keep insertion order, so `tools | tojson` prints keys as the client sent
// them. nlohmann::json sorts keys; pass nlohmann::ordered_json to keep the client's order.
#ifndef TANDEM_TEXT_CHAT_TEMPLATE_CHAT_TEMPLATE_H_
#define TANDEM_TEXT_CHAT_TEMPLATE_CHAT_TEMPLATE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

namespace jinja {
struct Node;
class Value;
}  // namespace jinja

// Bounds on one render, so that a hostile or buggy template cannot take the server down.
struct ChatTemplateLimits {
  size_t max_output_bytes = 16 << 20;
  int64_t max_loop_iterations = 1'000'000;  // all loops of one render together
  int max_call_depth = 50;                  // nested macro calls
};

class ChatTemplate {
 public:
  // Parses a template. Errors: INVALID_ARGUMENT for malformed templates (unclosed tags, ...),
  // UNIMPLEMENTED for Jinja2 features this engine lacks; both name the line.
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  // Renders with the variables of `context`, an object such as {"messages": [...],
  // "add_generation_prompt": true, "bos_token": "<s>"}. Errors: INVALID_ARGUMENT for
  // raise_exception() (with the template's message verbatim; see IsRaisedByTemplate) and for
  // runtime errors such as an undefined attribute or a type error (prefixed "chat template: " and
  // naming the line); RESOURCE_EXHAUSTED when a limit is hit.
  absl::StatusOr<std::string> Render(const nlohmann::json& context,
                                     const ChatTemplateLimits& limits = {}) const;
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context,
                                     const ChatTemplateLimits& limits = {}) const;

 private:
  friend class TokenizerChatTemplate;
  using Body = std::vector<std::unique_ptr<jinja::Node>>;
  explicit ChatTemplate(std::shared_ptr<const Body> body) : body_(std::move(body)) {}
  absl::StatusOr<std::string> RenderValue(const jinja::Value& context,
                                          const ChatTemplateLimits& limits) const;

  std::shared_ptr<const Body> body_;
};

// The chat template(s) of a tokenizer_config.json with the special tokens apply_chat_template
// passes to them; parse once, render per request.
class TokenizerChatTemplate {
 public:
  // Reads `chat_template` (a string, or a list of {"name", "template"}) and the special tokens
  // (strings or {"content": ...} objects). NOT_FOUND when the config has no chat template; the
  // parse error when the default template does not parse.
  static absl::StatusOr<TokenizerChatTemplate> FromConfig(std::string_view tokenizer_config_json);

  // Renders as apply_chat_template(messages, add_generation_prompt=..., **extra): the context
  // holds messages, add_generation_prompt, tools=None, documents=None, the special tokens
  // (bos_token, eos_token, ...), then every key of `extra` (an object or null), e.g. "tools",
  // "enable_thinking". With named templates, "tool_use" is used when extra has non-null tools
  // and the config has one, otherwise "default".
  absl::StatusOr<std::string> Apply(const nlohmann::ordered_json& messages,
                                    bool add_generation_prompt,
                                    const nlohmann::ordered_json& extra = nullptr) const;
  absl::StatusOr<std::string> Apply(const nlohmann::json& messages, bool add_generation_prompt,
                                    const nlohmann::json& extra = nullptr) const;

  // The special tokens found in the config, e.g. {"bos_token": "<s>", "eos_token": "</s>"}.
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }
  // The config's chat_template as written: a string, or the list of named templates.
  const nlohmann::ordered_json& source() const { return source_; }

  ChatTemplateLimits limits;

 private:
  absl::StatusOr<std::string> ApplyContext(bool has_tools, const jinja::Value& context) const;

  // By name ("default" for a plain string). A named template that does not parse keeps its error,
  // reported when it is chosen.
  std::map<std::string, absl::StatusOr<ChatTemplate>, std::less<>> templates_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  nlohmann::ordered_json source_;
};

// Whether a Render/Apply error came from the template's raise_exception(); its message is then the
// template's own text (such as "Conversation roles must alternate user/assistant/..."), a fault
// of the request rather than of the server.
bool IsRaisedByTemplate(const absl::Status& status);

// One-shot convenience: TokenizerChatTemplate::FromConfig(config).Apply(...).
absl::StatusOr<std::string> ApplyChatTemplate(const std::string& tokenizer_config_json_text,
                                              const nlohmann::json& messages,
                                              bool add_generation_prompt,
                                              const nlohmann::json& extra = {});

}  // namespace tandem

#endif  // TANDEM_TEXT_CHAT_TEMPLATE_CHAT_TEMPLATE_H_
