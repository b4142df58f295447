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
#include "http/openai_internal.h"
#include "structured/json_parse.h"
#include "structured/json_schema.h"

namespace tandem::openai {

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
                                             "priority",
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

// stop (one string or a list), ignore_eos, speculative (false: the request opts out of the
// decode workers' speculative decoding) and priority (vLLM's: its place among its tenant's
// requests waiting for KV room).
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
  if (const Json* v = Field(body, "priority")) {
    auto p = GetInt(*v, "priority", std::numeric_limits<int32_t>::min(),
                    std::numeric_limits<int32_t>::max());
    if (!p.ok()) return p.status();
    g->set_priority(static_cast<int32_t>(*p));
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

bool WriteTokenizeResponse(std::span<const int> ids, bool token_strs, const ServedModel& model,
                           const std::function<bool(std::string_view)>& write) {
  constexpr size_t kPiece = size_t{64} << 10;
  std::string out = absl::StrFormat(R"({"count":%d,"max_model_len":%d,"tokens":[)", ids.size(),
                                    model.max_context);
  auto flush_if_full = [&] {
    if (out.size() < kPiece) return true;
    const bool ok = write(out);
    out.clear();
    return ok;
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    absl::StrAppend(&out, ids[i]);
    if (!flush_if_full()) return false;
  }
  out += R"(],"token_strs":)";
  if (!token_strs) {
    out += "null}";
    return write(out);
  }
  out += '[';
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    // The same escaping as the rest of the body (invalid UTF-8 replaced).
    out += Json(TokenText(*model.tokenizer, ids[i]).first)
               .dump(-1, ' ', false, Json::error_handler_t::replace);
    if (!flush_if_full()) return false;
  }
  out += "]}";
  return write(out);
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

}  // namespace tandem::openai
