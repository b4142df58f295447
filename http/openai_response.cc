#include <algorithm>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "http/json_fields.h"
#include "http/json_limits.h"
#include "http/openai_internal.h"
#include "structured/json_parse.h"

namespace tandem::openai {

Json Nullable(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

std::pair<std::string, Json> TokenText(const Tokenizer& tok, int id) {
  const std::string raw = tok.Decode(std::span<const int>(&id, 1));
  Json bytes = Json::array();
  for (unsigned char c : raw) bytes.push_back(static_cast<int>(c));
  return {ToValidUtf8(raw), std::move(bytes)};
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
    if (!TakeCall(pending_.substr(0, close), content.size())) {
      content += std::string(kCallOpen) + pending_.substr(0, close + kCallClose.size());  // text
    }
    pending_.erase(0, close + kCallClose.size());
    in_call_ = false;
  }
}

bool ToolCallParser::TakeCall(const std::string& body, size_t offset) {
  // A block over the JSON limits (the model's output is as unbounded as a client's) is text.
  const Json call =
      CheckJsonLimits(body).ok() ? structured::ParseJson(body).value_or(Json()) : Json();
  const Json* name = call.is_object() ? Field(call, "name") : nullptr;
  if (name == nullptr || !name->is_string()) return false;
  const Json* args = Field(call, "arguments");
  if (args == nullptr) args = Field(call, "parameters");
  const std::string arguments = args == nullptr     ? "{}"
                                : args->is_string() ? args->get<std::string>()
                                                    : args->dump();
  calls_.push_back({offset,
                    {{"id", absl::StrFormat("call_%s_%d", id_prefix_, total_++)},
                     {"type", "function"},
                     {"function", {{"name", *name}, {"arguments", arguments}}}}});
  return true;
}

std::string ToolCallParser::Flush() {
  // A last block the output ended inside is a call when its body is one (a model may stop
  // without the closing tag, and a forced call ends at its value), else text.
  std::string rest;
  if (!in_call_) {
    rest = pending_;
  } else if (!TakeCall(pending_, 0)) {
    rest = std::string(kCallOpen) + pending_;
  }
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

nlohmann::ordered_json TokenizerInfoBody(const ServedModel& model) {
  const Tokenizer& tok = *model.tokenizer;
  nlohmann::ordered_json info = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                 {"model_max_length", model.max_context},
                                 {"vocab_size", tok.vocab_size()}};
  auto text_of = [&](int id) -> nlohmann::ordered_json {
    if (id < 0 || id >= tok.vocab_size()) return nullptr;
    const int ids[1] = {id};
    std::string text = tok.Decode(ids);
    if (text.empty()) return nullptr;
    return text;
  };
  const std::vector<int> eos = tok.eos_ids();
  info["bos_token"] = text_of(tok.bos_id());
  info["eos_token"] = eos.empty() ? nlohmann::ordered_json(nullptr) : text_of(eos.front());
  info["pad_token"] = nullptr;
  bool adds_bos = false;
  if (tok.bos_id() >= 0) {
    const std::vector<int> with = tok.Encode("a", /*add_special_tokens=*/true);
    adds_bos = !with.empty() && with.front() == tok.bos_id();
  }
  info["add_bos_token"] = adds_bos;
  if (model.chat_template.ok()) {
    // The config's own special tokens win over the ids' texts.
    for (const auto& [name, value] : model.chat_template->special_tokens().items()) {
      info[name] = value;
    }
    info["chat_template"] = model.chat_template->source();
  }
  return info;
}

}  // namespace tandem::openai
