// Structured output on the engine side (OpenAI's response_format json_object / json_schema, and
// vLLM's guided_choice and guided_regex): a JSON Schema (structured/json_schema.h) bound to a
// model's vocabulary, masking the logits where tokens are sampled (engine/sampling/sampler.h
// ProcessLogits) so that the output is one JSON value valid against the schema (or one of the
// choices), followed by EOS.
//
// The constraint keeps no per-request state: each step replays the request's generated tokens
// through the schema's matcher from the start. A request therefore masks the same way on any
// worker, in any batch and after a resume (where the tokens generated before the resume come
// back as part of the output history), which is what makes constrained output identical on
// every path.
#ifndef TANDEM_ENGINE_SAMPLING_OUTPUT_CONSTRAINT_H_
#define TANDEM_ENGINE_SAMPLING_OUTPUT_CONSTRAINT_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "structured/json_schema.h"
#include "structured/token_mask.h"
#include "text/tokenizer.h"

namespace tandem {

struct SamplingParams;  // engine/sampling/sampler.h

// OpenAI's {"type": "json_object"}: any JSON object.
inline constexpr char kJsonObjectSchema[] = R"({"type": "object"})";

class OutputConstraint {
 public:
  OutputConstraint(std::shared_ptr<const structured::JsonSchema> schema,
                   std::shared_ptr<const structured::TokenMask> mask);

  // Sets to -infinity the logits of every token that cannot follow `output` (the request's
  // generated tokens so far), ids past the vocabulary included. The model's `eos_ids` stay only
  // where the value is complete, and are all that stays once nothing more can follow; when
  // `output` itself breaks the schema (it cannot, unless a client sent such tokens back), only
  // they stay.
  void Mask(std::span<const int> output, std::span<const int> eos_ids,
            std::span<float> logits) const;
  // Whether `output` (generated tokens, without the EOS that ended them) is the whole text the
  // schema asks for: its prefix, one complete value, its suffix.
  bool Completes(std::span<const int> output) const;

  const structured::JsonSchema& schema() const { return *schema_; }
  // Token masks are kept per matcher state (structured::JsonMatcher::AppendKey), up to this
  // many bytes per constraint, then the cache starts over: the sequences of an n=64 request, and
  // the steps of one sequence, meet the same few states again and again (a regex's automaton, a
  // schema's keys and punctuation), and a mask over a 50k vocabulary costs milliseconds.
  static constexpr size_t kMaskCacheBytes = size_t{32} << 20;
  // Masks computed, and masks found in the cache (for tests).
  size_t masks_computed() const;
  size_t masks_reused() const;

 private:
  // The allowed tokens after `matcher` (its state reached by a consistent output).
  std::shared_ptr<const std::vector<uint8_t>> AllowedAfter(const structured::JsonMatcher& matcher,
                                                           std::span<const int> eos_ids) const;

  std::shared_ptr<const structured::JsonSchema> schema_;
  std::shared_ptr<const structured::TokenMask> mask_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const std::vector<uint8_t>>> masks_;
  mutable size_t cached_bytes_ = 0;
  mutable size_t computed_ = 0, reused_ = 0;
};

// One per served model: the tokenizer's token bytes (computed on first use) and the schemas
// compiled so far (up to kCachedSchemas, then the cache starts over). Thread-safe.
class OutputConstraints {
 public:
  explicit OutputConstraints(std::shared_ptr<const Tokenizer> tokenizer);

  // INVALID_ARGUMENT (from the schema compiler) naming what is not supported. `prefix` and
  // `suffix`: text around the value (structured/json_schema.h).
  absl::StatusOr<std::shared_ptr<const OutputConstraint>> ForSchema(const std::string& schema,
                                                                    const std::string& prefix = "",
                                                                    const std::string& suffix = "");
  // Exactly one of `choices`, as raw text (structured::JsonSchema::Choice).
  absl::StatusOr<std::shared_ptr<const OutputConstraint>> ForChoice(
      const std::vector<std::string>& choices);
  // Raw text matching `pattern` as a whole (structured::JsonSchema::Regex).
  absl::StatusOr<std::shared_ptr<const OutputConstraint>> ForRegex(const std::string& pattern);
  // Sets p->constraint from p->json_schema (and its prefix and suffix), p->choice or p->regex;
  // nothing when all are empty.
  absl::Status Attach(SamplingParams* p);

  static constexpr size_t kCachedSchemas = 64;

 private:
  std::shared_ptr<const structured::TokenMask> Vocabulary();
  // The cached constraint of `key`, compiled by `compile` on a miss.
  absl::StatusOr<std::shared_ptr<const OutputConstraint>> Cached(
      const std::string& key,
      const std::function<absl::StatusOr<std::shared_ptr<const structured::JsonSchema>>()>&
          compile);

  std::shared_ptr<const Tokenizer> tokenizer_;
  std::mutex mu_;
  std::shared_ptr<const structured::TokenMask> vocabulary_;               // guarded by mu_
  std::map<std::string, std::shared_ptr<const OutputConstraint>> cache_;  // guarded by mu_
};

// Attaches p's constraint with `constraints`: FAILED_PRECONDITION when p asks for structured
// output and the worker has no tokenizer to build one with. Nothing to do otherwise.
absl::Status AttachConstraint(OutputConstraints* constraints, SamplingParams* p);

// The bytes each token adds in the middle of a text: Decode(context + id) less Decode(context)
// for a plain one-letter context, so that leading-space rules apply as they do mid-text. Empty
// for special tokens and for tokens whose text depends on what precedes them otherwise.
std::vector<std::string> TokenBytes(const Tokenizer& tokenizer);

}  // namespace tandem

#endif  // TANDEM_ENGINE_SAMPLING_OUTPUT_CONSTRAINT_H_
