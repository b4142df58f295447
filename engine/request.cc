#include "engine/request.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {

std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kContext:
      return "context";
  }
  return "?";
}

absl::Status CheckTokenIds(std::span<const int> ids, int vocab_size, std::string_view field) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: token id %d at index %d is outside the vocabulary [0, %d)", field,
                          ids[i], i, vocab_size));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const GenerationRequest& r, const ModelConfig& config,
                             const Tokenizer* tokenizer) {
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt: must not be empty");
  if (absl::Status s = CheckTokenIds(r.prompt, config.vocab_size, "prompt"); !s.ok()) return s;
  if (static_cast<int64_t>(r.prompt.size()) >= config.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("prompt: %d tokens leave no room in the context length %d", r.prompt.size(),
                        config.max_seq_len));
  }
  if (r.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_tokens: must be >= 1, got %d", r.max_tokens));
  }
  if (absl::Status s = r.sampling.Validate(config.vocab_size); !s.ok()) return s;
  if (r.output_tokens < 0 || r.output_tokens >= static_cast<int64_t>(r.prompt.size())) {
    return absl::InvalidArgumentError(absl::StrFormat("output_tokens: must be in [0, %d), got %d",
                                                      r.prompt.size(), r.output_tokens));
  }
  if (r.sampling.min_tokens > r.max_tokens + r.output_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat("min_tokens: %d is more than max_tokens (%d)",
                                                      r.sampling.min_tokens,
                                                      r.max_tokens + r.output_tokens));
  }
  if (r.sampling.constrained()) {
    const char* what = r.sampling.constraint_field();
    if (r.ignore_eos) {
      return absl::InvalidArgumentError(absl::StrCat("ignore_eos: cannot be combined with ", what));
    }
    if (r.sampling.min_tokens > 0) {
      return absl::InvalidArgumentError(absl::StrCat("min_tokens: cannot be combined with ", what));
    }
    if (r.sampling.constraint == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": not compiled for this model"));
    }
  }
  if (!r.stop_strings.empty() && tokenizer == nullptr) {
    return absl::InvalidArgumentError("stop_strings: need a tokenizer");
  }
  return absl::OkStatus();
}

std::optional<FinishReason> CheckFinish(const ModelConfig& config, const GenerationRequest& r,
                                        int token, int generated, int total_len) {
  if (!r.ignore_eos && std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), token) !=
                           config.eos_token_ids.end()) {
    return FinishReason::kStop;
  }
  if (generated >= r.max_tokens) return FinishReason::kLength;
  if (total_len >= config.max_seq_len) return FinishReason::kContext;
  return std::nullopt;
}

SamplingHistory HistoryOf(std::span<const int> tokens, size_t prompt_tokens,
                          const ModelConfig& config) {
  const size_t prompt = std::min(tokens.size(), prompt_tokens);
  return {tokens.first(prompt), tokens.subspan(prompt), config.eos_token_ids};
}

SamplingHistory HistoryOf(const GenerationRequest& r, std::span<const int> tokens,
                          const ModelConfig& config) {
  return HistoryOf(tokens, r.prompt.size() - r.output_tokens, config);
}

}  // namespace tandem
