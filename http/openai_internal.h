// What the three parts of the OpenAI API's implementation share (http/openai.h is the API):
// the request side (openai.cc), the prompt and its guided decoding (openai_prompt.cc: messages
// through the chat template, tools and structured outputs as constraints) and the response side
// (openai_response.cc). Not for use outside http/.
#ifndef TANDEM_HTTP_OPENAI_INTERNAL_H_
#define TANDEM_HTTP_OPENAI_INTERNAL_H_

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "http/openai.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/generation.pb.h"
#include "text/tokenizer.h"

namespace tandem::openai {

using Json = nlohmann::ordered_json;

// The Hermes/Qwen tool-call block: what a forced tool call emits and ToolCallParser takes out.
inline constexpr std::string_view kCallOpen = "<tool_call>";
inline constexpr std::string_view kCallClose = "</tool_call>";

inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
inline constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();

// openai_prompt.cc: the prompt and what constrains the output.

// Parameters Tandem does not implement: accepted only at their neutral value, so that a client
// never gets an answer computed without what it asked for.
absl::Status CheckUnsupported(const Json& body, Endpoint endpoint);
// response_format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema",
// "json_schema": {"name": ..., "schema": {...}, "strict": ...}} (OpenAI's shapes), on both
// endpoints as vLLM has it. The schema travels as JSON text; the router compiles it.
absl::Status SetResponseFormat(const Json& v, v1::SamplingParams* s);
// The output's constraint from vLLM's guided_json / guided_regex / guided_choice and
// structured_outputs (grammars are refused by name); tools with tool_choice are RenderChat's.
absl::Status SetGuided(const Json& body, Request* r);
// `prompt` of /v1/completions as a list of prompts, each a string or a list of token ids: a
// string, a list of token ids, a list of strings, or a list of lists of token ids.
absl::StatusOr<std::vector<Json>> PromptList(const Json& prompt);
// One prompt of PromptList: a string or a list of token ids.
absl::Status SetPrompt(const Json& prompt, v1::GenerateRequest* out);
// The chat prompt's text: the model's template applied to the messages (and tools, and
// chat_template_kwargs). A forced tool_choice sets `sampling`'s schema; tools to parse out of
// the output set *parse_tool_calls.
absl::StatusOr<std::string> RenderChat(const Json& body, const ServedModel& model,
                                       v1::SamplingParams* sampling, bool* parse_tool_calls);
// The chat prompt: the model's template applied to the messages, tokenized without adding
// special tokens (the template writes them), as transformers' apply_chat_template(tokenize=True).
absl::Status SetChatPrompt(const Json& body, const ServedModel& model, v1::GenerateRequest* out,
                           bool* parse_tool_calls);
// The ingress's field names (router/ingress.cc) as OpenAI parameters of `r`.
std::string OpenAiParam(std::string_view field, const Request* r);

// openai_response.cc.

// `s`, or null when it is empty.
Json Nullable(const std::string& s);
// The text of one token, and its bytes (a token may be part of a UTF-8 character).
std::pair<std::string, Json> TokenText(const Tokenizer& tok, int id);

}  // namespace tandem::openai

#endif  // TANDEM_HTTP_OPENAI_INTERNAL_H_
