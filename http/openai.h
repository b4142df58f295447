// The OpenAI-compatible API as plain functions, without a socket: JSON request bodies of
// /v1/completions and /v1/chat/completions become a tandem.v1.GenerateRequest (types checked
// here, values checked by the router's one ingress function), the router's GenerateResponse
// messages become OpenAI's JSON bodies or server-sent-event chunks, and a grpc::Status becomes
// an HTTP status with OpenAI's error shape {"error": {"message", "type", "param", "code"}}.
// /v1/responses (http/responses.h) is mapped onto chat completions. http/http_server.h serves
// these over HTTP.
#ifndef TANDEM_HTTP_OPENAI_H_
#define TANDEM_HTTP_OPENAI_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/generation.pb.h"
#include "text/chat_template/chat_template.h"
#include "text/tokenizer.h"

namespace tandem::openai {

enum class Endpoint { kCompletions, kChatCompletions, kResponses };

// What the HTTP front serves: one model.
struct ServedModel {
  std::string id;       // the `model` clients name ("stories260K")
  int max_context = 0;  // tokens
  // A chat request without max_tokens generates to the end of the context, at most this many:
  // admission reserves KV blocks for every token a request may generate.
  int chat_default_max_tokens = 1024;
  const Tokenizer* tokenizer;  // token strings of logprobs, chat prompts; not null
  // The chat template, or the reason there is none (NOT_FOUND: the model ships none; or the
  // template's parse error). Chat requests are answered with that error.
  absl::StatusOr<TokenizerChatTemplate> chat_template = absl::NotFoundError("no chat template");
};

// vLLM's GET /tokenizer_info: the tokenizer's configuration as tokenizer_config.json has it
// (tokenizer_class, model_max_length, bos/eos/pad tokens as text, add_bos_token, chat_template as
// written), what a client needs to tokenize through /tokenize and render chat prompts itself
// (lm_eval's tokenizer_backend=remote). A special token with no text is null.
nlohmann::ordered_json TokenizerInfoBody(const ServedModel& model);

// Choices one request may ask for: prompts x n.
inline constexpr int kMaxChoices = 64;

// A request body, parsed.
struct Request {
  Endpoint endpoint = Endpoint::kCompletions;
  // The first choice's generation (the first prompt, seed as given); what the errors name.
  v1::GenerateRequest generate;
  // Every choice, in OpenAI's order (prompt-major: index = prompt * n + i); choices[0] is
  // `generate`, choice i of a prompt has seed ChoiceSeed(seed, i) (engine/sampling/sampler.h).
  std::vector<v1::GenerateRequest> choices;
  int n = 1;
  // Completions' best_of: each prompt has this many candidates (choices holds them all), of
  // which the n with the highest cumulative log-probability are returned. best_of == n: all.
  int best_of = 1;
  bool want_logprobs = false;  // the client asked for logprobs (best_of > n computes them anyway)
  bool echo = false;           // completions: the prompt's text before the completion
  // Completions' echo with logprobs: the prompt's tokens come first in each choice's logprobs
  // (OpenAI's legacy format; the first token has none), computed by Router::Score.
  bool echo_logprobs = false;
  // Completions' max_tokens 0 (only with echo): no generation, the prompt alone, scored with
  // logprobs (what lm-evaluation-harness asks for a loglikelihood).
  bool score_only = false;
  // vLLM's prompt_logprobs: each prompt position's log-probability, rank and this many most
  // likely tokens, in vLLM's shape; -1: not asked.
  int prompt_logprobs = -1;
  // Chat with `tools` (and tool_choice "auto"): the output's <tool_call>{...}</tool_call> blocks
  // become OpenAI's tool_calls (ToolCallParser).
  bool parse_tool_calls = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // How the request named max_tokens ("max_tokens" or "max_completion_tokens"), for errors.
  std::string max_tokens_param = "max_tokens";
  // The field that asked for structured output (response_format, guided_json, guided_choice,
  // structured_outputs.json, ...): the router's errors about the schema or choice name it.
  std::string schema_param = "response_format";
  // kResponses: the request's fields that the response object repeats (instructions, tools,
  // tool_choice, temperature, ...), as the response shows them.
  nlohmann::ordered_json response_fields = nlohmann::ordered_json::object();
  // The Responses API: keep the answer (store), and the conversation it answers as chat
  // messages (the stored one it continues, then its input; the instructions left out).
  bool store = false;
  nlohmann::ordered_json conversation = nlohmann::ordered_json::array();
};

// Parses and type-checks a body. Errors are statuses whose message starts with the OpenAI
// parameter name ("temperature: must be a number"): INVALID_ARGUMENT for a malformed body or
// field, NOT_FOUND for a model other than `model.id`. Ranges (temperature >= 0, top_p in (0, 1],
// max_tokens >= 1, ...) are left to the router's ingress, whose errors ToApiError renames.
// `random_seed` is used when the request gives no seed (OpenAI's unseeded requests vary).
// `cancelled` (polled while the body is parsed; CANCELLED once it says so) is the client gone.
absl::StatusOr<Request> ParseRequest(Endpoint endpoint, std::string_view body,
                                     const ServedModel& model, uint64_t random_seed,
                                     const std::function<bool()>& cancelled = {});
// ParseRequest's work after the body parsed (kCompletions or kChatCompletions).
absl::StatusOr<Request> ParseRequestBody(Endpoint endpoint, const nlohmann::ordered_json& body,
                                         const ServedModel& model, uint64_t random_seed);

// A request body as a JSON object, within the JSON limits (http/json_limits.h), parsed in time
// linear in its size; CANCELLED once `cancelled` says so.
absl::StatusOr<nlohmann::ordered_json> ParseJsonBody(std::string_view body,
                                                     const std::function<bool()>& cancelled);
// Logs each field of `body` not in `known`, once per name per process (at most 64 names, each
// cut to 64 printable characters), so that an operator sees what clients send without a log
// line per request.
void LogUnknownFields(const nlohmann::ordered_json& body, std::span<const std::string_view> known);
// The field of a "field: why" message ("tools[0].function.name"), or empty when it has none.
std::string_view FieldPrefix(std::string_view message);

// vLLM's POST /tokenize: {"prompt": TEXT, "add_special_tokens": true} or {"messages": [...],
// "add_generation_prompt": true, "add_special_tokens": false, "chat_template_kwargs", "tools"}
// (messages rendered as chat completions render them), and "return_token_strs"; "model" as in
// ParseRequest. Errors name the field.
struct TokenizeRequest {
  std::string text;
  bool add_special_tokens = true;
  bool return_token_strs = false;
};
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body,
                                                     const ServedModel& model);
// {"count", "max_model_len", "tokens", "token_strs"} (each token's text, or null), handed to
// `write` in pieces of about 64 KiB as it is built: a long prompt's answer (token strings are
// several times the prompt's bytes) is never held whole. False once `write` returns false.
bool WriteTokenizeResponse(std::span<const int> ids, bool token_strs, const ServedModel& model,
                           const std::function<bool(std::string_view)>& write);
// vLLM's POST /detokenize: {"tokens": [ids]}, each in the vocabulary, at most
// max(4 x the context, 65536) of them. The answer is {"prompt": TEXT}.
absl::StatusOr<std::vector<int>> ParseDetokenizeRequest(std::string_view body,
                                                        const ServedModel& model);

// An error as OpenAI reports it.
struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type;   // "invalid_request_error", "authentication_error", "server_error", ...
  std::string param;  // the request field at fault; empty: null
  std::string code;   // empty: null
};

// The one mapping from a status to HTTP: INVALID_ARGUMENT / OUT_OF_RANGE / FAILED_PRECONDITION
// 400, UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404, ALREADY_EXISTS 409,
// RESOURCE_EXHAUSTED 429, CANCELLED 499 (the client left: never sent), UNIMPLEMENTED 501,
// UNAVAILABLE 503, DEADLINE_EXCEEDED 504, anything else 500. A message that starts with a
// field name ("sampling.top_p: ...", the router's ingress) is renamed to the OpenAI parameter of
// `request` ("top_p: ..."), which becomes `param`. `request` may be null (not parsed yet).
ApiError ToApiError(const grpc::Status& status, const Request* request);
ApiError ToApiError(const absl::Status& status, const Request* request);

// {"error": {...}}
std::string ErrorBody(const ApiError& error);

// Finds tool calls in generated text, as Hermes-style chat templates (Qwen2.5, Hermes, SmolLM3,
// ...) ask models to write them: <tool_call>{"name": ..., "arguments": {...}}</tool_call>. Fed
// the text piece by piece, it returns the text outside the blocks as soon as it cannot be the
// start of a tag, and collects each block that parses as OpenAI's tool call
// ({"id", "type": "function", "function": {"name", "arguments": JSON text}}). A block that does
// not parse stays text.
class ToolCallParser {
 public:
  explicit ToolCallParser(std::string id_prefix) : id_prefix_(std::move(id_prefix)) {}
  // The content to show now.
  std::string Add(std::string_view text);
  // At the end: the text held back. An unterminated last block is a call when its body is one
  // (as vLLM's Hermes parser takes it), else text.
  std::string Flush();
  // The calls completed since the last call, and how many there were in all.
  std::vector<nlohmann::ordered_json> TakeCalls();
  int total_calls() const { return total_; }
  // TakeCalls, each call with where it stood in the text the last Add returned (a byte offset:
  // the text before it came before the call, the rest after it).
  struct PlacedCall {
    size_t offset = 0;
    nlohmann::ordered_json call;
  };
  std::vector<PlacedCall> TakePlacedCalls();

 private:
  // Adds the call a block's `body` holds, placed at `offset`; false when it holds none.
  bool TakeCall(const std::string& body, size_t offset);

  std::string id_prefix_;
  std::string pending_;  // text not yet returned: a possible tag start, or an open block's body
  bool in_call_ = false;
  int total_ = 0;
  std::vector<PlacedCall> calls_;
};

// What the HTTP server needs of an answer, whichever the endpoint: the router's streams of
// GenerateResponse messages, one per choice, in; one JSON body or server-sent events out. Not
// thread-safe: callers running choices concurrently serialize Add.
class AnswerBuilder {
 public:
  virtual ~AnswerBuilder() = default;
  // Adds one message of choice `index`'s stream; returns its server-sent events when streaming
  // (may be empty), "" otherwise.
  virtual std::string Add(int index, const v1::GenerateResponse& msg) = 0;
  // The events after the last message of every choice.
  virtual std::string StreamEnd() = 0;
  // The events that end a stream that failed after it began (then StreamEnd is not sent).
  virtual std::string StreamFailure(const ApiError& error) = 0;
  // The non-streaming body, after the last message.
  virtual std::string Body() const = 0;
};

// The answer of /v1/completions and /v1/chat/completions: one JSON body (Body) or server-sent
// events ("data: ...\n\n" lines: Add's return values, then StreamEnd).
class ResponseBuilder : public AnswerBuilder {
 public:
  ResponseBuilder(const Request& request, const ServedModel& model, int64_t created_unix);

  std::string Add(int index, const v1::GenerateResponse& msg) override;
  std::string Add(const v1::GenerateResponse& msg) { return Add(0, msg); }
  // The usage chunk when asked for, then "data: [DONE]".
  std::string StreamEnd() override;
  // StreamError's event, then "data: [DONE]".
  std::string StreamFailure(const ApiError& error) override;
  // An error after the stream began, as one event.
  static std::string StreamError(const ApiError& error);
  std::string Body() const override;
  // The prompt of every choice of prompt `prompt` (choices [prompt * best_of, + best_of)),
  // `ids`, and its Router::Score (`score` empty for a one-token prompt): with echo_logprobs or
  // prompt_logprobs, before any Add of those choices.
  void SetPromptScore(int prompt, const std::vector<int>& ids, const v1::ScoreResponse& score);

 private:
  struct Choice {
    std::string text;  // generated text (chat with tools: outside the tool calls)
    std::string finish_reason;
    int prompt_tokens = 0;
    int completion_tokens = 0;
    bool started = false;     // streaming: its first chunk (chat role, completions echo) sent
    int64_t text_offset = 0;  // completions logprobs: bytes of token text so far
    nlohmann::ordered_json logprobs;
    std::unique_ptr<ToolCallParser> tools;  // with Request::parse_tool_calls
    nlohmann::ordered_json tool_calls = nlohmann::ordered_json::array();
    nlohmann::ordered_json prompt_legacy;    // echo_logprobs: the prompt's entries (SetPromptScore)
    nlohmann::ordered_json prompt_logprobs;  // prompt_logprobs: vLLM's list
  };

  nlohmann::ordered_json Chunk(nlohmann::ordered_json choice) const;
  nlohmann::ordered_json Usage() const;
  // The logprobs of `msg` in this endpoint's shape (null when not asked for), appending to the
  // choice's accumulated ones for Body.
  nlohmann::ordered_json Logprobs(Choice& choice, const v1::GenerateResponse& msg);
  // Completions with echo: the prompt of choice `index` as text.
  std::string EchoText(int index) const;

  const Request& request_;
  const ServedModel& model_;
  int64_t created_;
  std::string id_;
  std::vector<Choice> choices_;
};

// OpenAI's finish_reason for a Tandem one ("stop", "length"; the context limit is "length").
std::string FinishReasonName(v1::FinishReason reason);

}  // namespace tandem::openai

#endif  // TANDEM_HTTP_OPENAI_H_
