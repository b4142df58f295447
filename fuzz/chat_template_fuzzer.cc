// Fuzzes the Jinja2 chat-template engine (text/chat_template/chat_template.h): the input is a
// template; one that parses is rendered with a small chat (a system, user, assistant and tool
// message, tools, add_generation_prompt) under tight limits. Any error must be a status.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "nlohmann/json.hpp"
#include "text/chat_template/chat_template.h"

namespace {

const nlohmann::ordered_json& Context() {
  static const auto* const context = new nlohmann::ordered_json(nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi <b>there</b> ünïcödé"},
      {"role": "assistant", "content": "Hello!", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"x": 1, "y": [1.5, null]}}}]},
      {"role": "tool", "content": "42"},
      {"role": "user", "content": [{"type": "text", "text": "and?"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "enable_thinking": false
  })"));
  return *context;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto parsed = tandem::ChatTemplate::Parse(source);
  if (!parsed.ok()) return 0;
  tandem::ChatTemplateLimits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_loop_iterations = 20'000;
  limits.max_call_depth = 20;
  (void)parsed->Render(Context(), limits);
  return 0;
}
