// OpenAI's Responses API (POST /v1/responses), the subset the openai SDK's
// `client.responses.create` uses, mapped onto chat completions: the input items become chat
// messages for the same chat template, the function tools chat tools (so tool_choice, the forced
// calls' structured output and the tool-call parser are chat's own), text.format becomes
// response_format. The answer is a response object, or the Responses API's stream of typed
// server-sent events. A response made with `store` (the default) is kept in the router's memory
// (http/response_store.h), read back by GET /v1/responses/{id} and continued by a request naming
// it as previous_response_id; conversations, background runs, built-in tools and anything else
// that would change the answer and is not supported are a 400 naming the field.
#ifndef TANDEM_HTTP_RESPONSES_H_
#define TANDEM_HTTP_RESPONSES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "http/openai.h"
#include "http/response_store.h"
#include "nlohmann/json.hpp"

namespace tandem::openai {

// Parses and type-checks a Responses body into a chat-completions Request whose endpoint is
// kResponses. Errors are ParseRequest's, naming the Responses field ("input[2].call_id: ...",
// "max_output_tokens: ...", "tools[0].parameters: ..."): INVALID_ARGUMENT, or NOT_FOUND for
// another model.
//   input            a string (one user message) or a list of items: messages ({"role":
//                    user | system | developer | assistant, "content": a string or input_text /
//                    output_text parts}; developer reaches the template as system),
//                    function_call items (the assistant's call: call_id, name, arguments as
//                    JSON text; consecutive ones join one assistant turn) and
//                    function_call_output items (the result, a tool turn naming the call)
//   instructions     a system message before the input
//   max_output_tokens, temperature, top_p, stream, tools (function tools), tool_choice,
//   text.format ({"type": "text" | "json_object" | "json_schema", "name", "schema", "strict"})
//   seed, top_k      vLLM's extensions, as on chat completions
//   store            keep the answer (default true, as OpenAI's)
//   previous_response_id  continue a stored response: its conversation (chat messages, from
//                    `previous`) comes before this input, after this request's instructions;
//                    NOT_FOUND naming the field when there is none
using PreviousConversation =
    std::function<std::optional<nlohmann::ordered_json>(const std::string& id)>;
absl::StatusOr<Request> ParseResponsesRequest(std::string_view body, const ServedModel& model,
                                              uint64_t random_seed,
                                              const std::function<bool()>& cancelled = {},
                                              const PreviousConversation& previous = {});

// The answer of a Responses request (one choice): the response object ({"id": "resp_...",
// "object": "response", "status", "output": [message and function_call items], "usage":
// {"input_tokens", "output_tokens", "total_tokens"}, ...}) or, streaming, its events, each
// "event: TYPE\ndata: {...}\n\n" with a sequence_number: response.created,
// response.in_progress; for a message response.output_item.added, response.content_part.added,
// response.output_text.delta..., response.output_text.done, response.content_part.done,
// response.output_item.done; for a call response.output_item.added,
// response.function_call_arguments.delta and .done, response.output_item.done; at the end
// response.completed (or response.incomplete at max_output_tokens, the context's end).
// Generated text between tool calls that is only whitespace makes no message.
class ResponsesBuilder : public AnswerBuilder {
 public:
  ResponsesBuilder(const Request& request, const ServedModel& model, int64_t created_unix);

  std::string Add(int index, const v1::GenerateResponse& msg) override;
  // response.completed or response.incomplete.
  std::string StreamEnd() override;
  // An "error" event, then response.failed.
  std::string StreamFailure(const ApiError& error) override;
  std::string Body() const override;

  const std::string& id() const { return id_; }
  // What the store keeps once the answer is whole: the response object, and the request's
  // conversation followed by the answer as an assistant message (its text and its calls).
  StoredResponse ToStore() const;

 private:
  // "event: TYPE\ndata: JSON\n\n", numbered.
  std::string Event(nlohmann::ordered_json event);
  // The response object with this status (its output and usage so far).
  nlohmann::ordered_json Object(std::string_view status) const;
  // Generated text outside tool calls, and a tool call, in the order they came.
  void AddText(std::string_view text, std::string* events);
  void AddCall(const nlohmann::ordered_json& call, std::string* events);
  // Ends the open message item, if any.
  void CloseMessage(std::string* events);

  const Request& request_;
  const ServedModel& model_;
  int64_t created_;
  std::string id_;
  int sequence_ = 0;
  bool started_ = false;  // response.created sent (streaming) / the first message seen
  std::unique_ptr<ToolCallParser> tools_;  // made with the request id, at the first message
  std::string request_id_;
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();  // finished items
  bool message_open_ = false;  // output_'s last item is a message still growing
  std::string message_text_;
  std::string pending_space_;  // whitespace not shown yet: no message is open
  int items_ = 0;              // items begun, for their ids
  std::string finish_;         // "stop", "length"
  int input_tokens_ = 0;
  int output_tokens_ = 0;
};

}  // namespace tandem::openai

#endif  // TANDEM_HTTP_RESPONSES_H_
