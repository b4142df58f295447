// The router's ingress checks: every field of a Generate request (and every prompt, Score's
// too) is checked here, and a bad one is answered with INVALID_ARGUMENT naming it, before any
// worker is involved.
#ifndef TANDEM_ROUTER_INGRESS_H_
#define TANDEM_ROUTER_INGRESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "engine/request.h"
#include "tandem/v1/generation.pb.h"
#include "text/tokenizer.h"

namespace tandem {

struct IngressLimits {
  int max_stop_strings = 16;
  int max_stop_string_bytes = 256;
  int max_request_id_bytes = 256;
  int max_json_schema_bytes = 65536;
  int max_json_text_bytes = 256;  // json_prefix, json_suffix
  int max_text_bytes = 4 << 20;
};

// The one prompt validation, for every request with a prompt (Generate, Score, and the HTTP
// paths, which build those): `text` (non-null: the text input) tokenized with the model's
// special tokens, or `tokens` (the token-id input) checked against the model's vocabulary;
// between bounds.min_tokens and bounds.max_tokens tokens. Errors name the field ("text: ...",
// "tokens.ids: ...", "input: ...").
struct PromptBounds {
  int min_tokens = 1;
  int64_t max_tokens = 0;
};
absl::StatusOr<std::vector<int>> ValidatePrompt(const std::string* text, const v1::TokenIds* tokens,
                                                const ModelConfig& config,
                                                const Tokenizer& tokenizer,
                                                const IngressLimits& limits,
                                                const PromptBounds& bounds);

// The engine request for `req`: the text tokenized (with the model's special tokens) or the
// token ids checked against the vocabulary; the prompt within the context; sampling values;
// max_tokens; stop strings. Errors name the field ("max_tokens: ...", "sampling.top_p: ...").
absl::StatusOr<GenerationRequest> ValidateGenerateRequest(const v1::GenerateRequest& req,
                                                          const ModelConfig& config,
                                                          const Tokenizer& tokenizer,
                                                          const IngressLimits& limits = {});

}  // namespace tandem

#endif  // TANDEM_ROUTER_INGRESS_H_
