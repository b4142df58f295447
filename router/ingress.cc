#include "router/ingress.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/grpc_util.h"
#include "structured/json_schema.h"

namespace tandem {
namespace {

absl::Status Invalid(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrFormat("%s: %s", field, why));
}

// One definition of well-formed UTF-8 for the whole project (text/tokenizer.h).
bool ValidUtf8(std::string_view s) { return ToValidUtf8(s) == s; }

// sampling.json_schema (with json_prefix and json_suffix), sampling.choice or sampling.regex:
// compiled, within
// the limits, and not combined with what would end the output early or keep it going.
absl::Status CheckStructuredOutput(const v1::GenerateRequest& req, const SamplingParams& s,
                                   const IngressLimits& limits) {
  if (s.json_schema.empty() && !(s.json_prefix.empty() && s.json_suffix.empty())) {
    return Invalid(s.json_prefix.empty() ? "sampling.json_suffix" : "sampling.json_prefix",
                   "needs sampling.json_schema");
  }
  for (const auto& [field, text] :
       {std::pair<const char*, const std::string*>{"sampling.json_prefix", &s.json_prefix},
        {"sampling.json_suffix", &s.json_suffix}}) {
    if (static_cast<int>(text->size()) > limits.max_json_text_bytes) {
      return Invalid(field, absl::StrFormat("longer than %d bytes", limits.max_json_text_bytes));
    }
  }
  if (!s.regex.empty()) {
    if (!s.json_schema.empty() || !s.choice.empty()) {
      return Invalid("sampling.regex", absl::StrCat("cannot be combined with sampling.",
                                                    s.choice.empty() ? "json_schema" : "choice"));
    }
    if (auto re = structured::JsonSchema::Regex(s.regex); !re.ok()) {
      return Invalid("sampling.regex", std::string(re.status().message()));
    }
  } else if (!s.choice.empty()) {
    if (!s.json_schema.empty()) {
      return Invalid("sampling.choice", "cannot be combined with sampling.json_schema");
    }
    if (auto choice = structured::JsonSchema::Choice(s.choice); !choice.ok()) {
      return Invalid("sampling.choice", std::string(choice.status().message()));
    }
  } else if (!s.json_schema.empty()) {
    if (static_cast<int>(s.json_schema.size()) > limits.max_json_schema_bytes) {
      return Invalid("sampling.json_schema",
                     absl::StrFormat("longer than %d bytes", limits.max_json_schema_bytes));
    }
    if (auto schema = structured::JsonSchema::Compile(s.json_schema, s.json_prefix, s.json_suffix);
        !schema.ok()) {
      return Invalid("sampling.json_schema", std::string(schema.status().message()));
    }
  } else {
    return absl::OkStatus();
  }
  const char* what = s.constraint_field();
  if (s.min_tokens > 0) {
    return Invalid("sampling.min_tokens", absl::StrCat("cannot be combined with ", what));
  }
  if (req.ignore_eos())
    return Invalid("ignore_eos", absl::StrCat("cannot be combined with ", what));
  // The output always validates: a stop string would cut the value short and end as "stop".
  if (req.stop_size() > 0) {
    return Invalid(
        "stop", absl::StrCat("cannot be combined with ", what, " (it would cut the value short)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int>> ValidatePrompt(const std::string* text, const v1::TokenIds* tokens,
                                                const ModelConfig& config,
                                                const Tokenizer& tokenizer,
                                                const IngressLimits& limits,
                                                const PromptBounds& bounds) {
  std::vector<int> prompt;
  if (text != nullptr) {
    if (text->empty()) return Invalid("text", "must not be empty");
    if (static_cast<int64_t>(text->size()) > limits.max_text_bytes) {
      return Invalid("text", absl::StrFormat("%d bytes, more than the %d-byte limit", text->size(),
                                             limits.max_text_bytes));
    }
    if (!ValidUtf8(*text)) return Invalid("text", "is not valid UTF-8");
    prompt = tokenizer.Encode(*text, /*add_special_tokens=*/true);
  } else if (tokens != nullptr) {
    if (tokens->ids().empty()) return Invalid("tokens.ids", "must not be empty");
    if (tokens->ids_size() > bounds.max_tokens) {
      return Invalid("tokens.ids", absl::StrFormat("%d tokens; at most %d fit the context",
                                                   tokens->ids_size(), bounds.max_tokens));
    }
    prompt.assign(tokens->ids().begin(), tokens->ids().end());
    for (int i = 0; i < static_cast<int>(prompt.size()); ++i) {
      if (prompt[i] < 0 || prompt[i] >= config.vocab_size) {
        return Invalid("tokens.ids", absl::StrFormat("id %d at index %d is outside [0, %d)",
                                                     prompt[i], i, config.vocab_size));
      }
    }
  } else {
    return Invalid("input", "one of text or tokens is required");
  }
  const char* field = text != nullptr ? "text" : "tokens.ids";
  if (static_cast<int>(prompt.size()) < bounds.min_tokens) {
    return Invalid(field, absl::StrFormat("%d tokens; at least %d are needed", prompt.size(),
                                          bounds.min_tokens));
  }
  if (static_cast<int64_t>(prompt.size()) > bounds.max_tokens) {
    return Invalid(field,
                   absl::StrFormat("the prompt is %d tokens; the context length is %d, of which "
                                   "%d may be prompt",
                                   prompt.size(), config.max_seq_len, bounds.max_tokens));
  }
  return prompt;
}

absl::StatusOr<GenerationRequest> ValidateGenerateRequest(const v1::GenerateRequest& req,
                                                          const ModelConfig& config,
                                                          const Tokenizer& tokenizer,
                                                          const IngressLimits& limits) {
  if (static_cast<int>(req.request_id().size()) > limits.max_request_id_bytes) {
    return Invalid("request_id",
                   absl::StrFormat("longer than %d bytes", limits.max_request_id_bytes));
  }
  GenerationRequest out;
  // Room for at least one generated token.
  absl::StatusOr<std::vector<int>> prompt = ValidatePrompt(
      req.has_text() ? &req.text() : nullptr, req.has_tokens() ? &req.tokens() : nullptr, config,
      tokenizer, limits, {.min_tokens = 1, .max_tokens = config.max_seq_len - 1});
  if (!prompt.ok()) return prompt.status();
  out.prompt = *std::move(prompt);
  out.sampling = FromProto(req.sampling());
  const SamplingParams& s = out.sampling;
  if (!std::isfinite(s.temperature) || s.temperature < 0) {
    return Invalid("sampling.temperature",
                   absl::StrFormat("must be finite and >= 0, got %g", s.temperature));
  }
  if (s.top_k < 0)
    return Invalid("sampling.top_k", absl::StrFormat("must be >= 0, got %d", s.top_k));
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return Invalid("sampling.top_p", absl::StrFormat("must be in (0, 1], got %g", s.top_p));
  }
  if (s.top_logprobs < 0 || s.top_logprobs > kMaxTopLogprobs) {
    return Invalid("sampling.top_logprobs",
                   absl::StrFormat("must be in [0, %d], got %d", kMaxTopLogprobs, s.top_logprobs));
  }
  if (s.top_logprobs > 0 && !s.logprobs) {
    return Invalid("sampling.top_logprobs", "needs sampling.logprobs to be true");
  }
  if (req.max_tokens() < 1) {
    return Invalid("max_tokens", absl::StrFormat("must be >= 1, got %d", req.max_tokens()));
  }
  if (req.max_tokens() > config.max_seq_len) {
    return Invalid("max_tokens", absl::StrFormat("must be <= the context length %d, got %d",
                                                 config.max_seq_len, req.max_tokens()));
  }
  out.max_tokens = req.max_tokens();
  // The logit processors: the engine's checks, named as the request's fields.
  if (absl::Status v = s.Validate(config.vocab_size); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.", v.message()));
  }
  if (s.min_tokens > out.max_tokens) {
    return Invalid("sampling.min_tokens", absl::StrFormat("%d is more than max_tokens (%d)",
                                                          s.min_tokens, out.max_tokens));
  }
  if (absl::Status st = CheckStructuredOutput(req, s, limits); !st.ok()) return st;
  if (req.stop_size() > limits.max_stop_strings) {
    return Invalid("stop", absl::StrFormat("at most %d strings", limits.max_stop_strings));
  }
  for (const std::string& stop : req.stop()) {
    if (stop.empty()) return Invalid("stop", "strings must not be empty");
    if (static_cast<int>(stop.size()) > limits.max_stop_string_bytes) {
      return Invalid("stop",
                     absl::StrFormat("strings of at most %d bytes", limits.max_stop_string_bytes));
    }
    if (!ValidUtf8(stop)) return Invalid("stop", "is not valid UTF-8");
    out.stop_strings.push_back(stop);
  }
  out.ignore_eos = req.ignore_eos();
  out.speculative = !req.disable_speculation();
  return out;
}

}  // namespace tandem
