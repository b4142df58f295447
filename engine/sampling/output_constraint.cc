#include "engine/sampling/output_constraint.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/sampling/sampler.h"

namespace tandem {

OutputConstraint::OutputConstraint(std::shared_ptr<const structured::JsonSchema> schema,
                                   std::shared_ptr<const structured::TokenMask> mask)
    : schema_(std::move(schema)), mask_(std::move(mask)) {}

void OutputConstraint::Mask(std::span<const int> output, std::span<const int> eos_ids,
                            std::span<float> logits) const {
  structured::JsonMatcher matcher(*schema_);
  bool consistent = true;
  for (int id : output) {
    if (!mask_->Advance(&matcher, id)) {
      consistent = false;
      break;
    }
  }
  std::shared_ptr<const std::vector<uint8_t>> cached;
  thread_local std::vector<uint8_t> only_eos;
  if (consistent) {
    cached = AllowedAfter(matcher, eos_ids);
  } else {
    only_eos.assign(mask_->vocab_size(), 0);
    for (int id : eos_ids) {
      if (id >= 0 && id < mask_->vocab_size()) only_eos[id] = 1;
    }
  }
  const std::vector<uint8_t>& allowed = cached ? *cached : only_eos;
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (i >= allowed.size() || allowed[i] == 0) logits[i] = kNever;
  }
}

std::shared_ptr<const std::vector<uint8_t>> OutputConstraint::AllowedAfter(
    const structured::JsonMatcher& matcher, std::span<const int> eos_ids) const {
  std::string key;
  for (int id : eos_ids) key.append(reinterpret_cast<const char*>(&id), sizeof(id));
  key.push_back('|');
  matcher.AppendKey(&key);
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (auto it = masks_.find(key); it != masks_.end()) {
      ++reused_;
      return it->second;
    }
  }
  // Computed without the lock: another sequence may compute the same mask meanwhile, and both
  // are the same.
  auto allowed = std::make_shared<std::vector<uint8_t>>();
  mask_->Allowed(matcher, eos_ids, allowed.get());
  const size_t bytes = allowed->size() + key.size();
  std::lock_guard<std::mutex> lock(cache_mu_);
  ++computed_;
  if (cached_bytes_ + bytes > kMaskCacheBytes) {
    masks_.clear();
    cached_bytes_ = 0;
  }
  if (masks_.emplace(std::move(key), allowed).second) cached_bytes_ += bytes;
  return allowed;
}

size_t OutputConstraint::masks_computed() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  return computed_;
}

size_t OutputConstraint::masks_reused() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  return reused_;
}

bool OutputConstraint::Completes(std::span<const int> output) const {
  structured::JsonMatcher matcher(*schema_);
  for (int id : output) {
    if (!mask_->Advance(&matcher, id)) return false;
  }
  return matcher.Complete();
}

OutputConstraints::OutputConstraints(std::shared_ptr<const Tokenizer> tokenizer)
    : tokenizer_(std::move(tokenizer)) {}

std::shared_ptr<const structured::TokenMask> OutputConstraints::Vocabulary() {
  // Called with mu_ held.
  if (vocabulary_ == nullptr) {
    vocabulary_ = std::make_shared<structured::TokenMask>(TokenBytes(*tokenizer_));
  }
  return vocabulary_;
}

absl::StatusOr<std::shared_ptr<const OutputConstraint>> OutputConstraints::Cached(
    const std::string& key,
    const std::function<absl::StatusOr<std::shared_ptr<const structured::JsonSchema>>()>& compile) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  auto compiled = compile();
  if (!compiled.ok()) return compiled.status();
  std::lock_guard<std::mutex> lock(mu_);
  auto constraint = std::make_shared<const OutputConstraint>(*compiled, Vocabulary());
  if (cache_.size() >= kCachedSchemas) cache_.clear();
  cache_[key] = constraint;
  return constraint;
}

absl::StatusOr<std::shared_ptr<const OutputConstraint>> OutputConstraints::ForSchema(
    const std::string& schema, const std::string& prefix, const std::string& suffix) {
  return Cached(absl::StrCat(prefix.size(), ":", prefix, suffix.size(), ":", suffix, schema),
                [&] { return structured::JsonSchema::Compile(schema, prefix, suffix); });
}

absl::StatusOr<std::shared_ptr<const OutputConstraint>> OutputConstraints::ForChoice(
    const std::vector<std::string>& choices) {
  // Never a schema's key: those start with a digit.
  std::string key = "choice";
  for (const std::string& c : choices) absl::StrAppend(&key, ":", c.size(), ":", c);
  return Cached(key, [&] { return structured::JsonSchema::Choice(choices); });
}

absl::StatusOr<std::shared_ptr<const OutputConstraint>> OutputConstraints::ForRegex(
    const std::string& pattern) {
  return Cached(absl::StrCat("regex:", pattern),
                [&] { return structured::JsonSchema::Regex(pattern); });
}

absl::Status OutputConstraints::Attach(SamplingParams* p) {
  if (!p->choice.empty()) {
    auto c = ForChoice(p->choice);
    if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat("choice: ", c.status().message()));
    p->constraint = *c;
    return absl::OkStatus();
  }
  if (!p->regex.empty()) {
    auto c = ForRegex(p->regex);
    if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat("regex: ", c.status().message()));
    p->constraint = *c;
    return absl::OkStatus();
  }
  if (p->json_schema.empty()) return absl::OkStatus();
  auto c = ForSchema(p->json_schema, p->json_prefix, p->json_suffix);
  if (!c.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("json_schema: ", c.status().message()));
  }
  p->constraint = *c;
  return absl::OkStatus();
}

absl::Status AttachConstraint(OutputConstraints* constraints, SamplingParams* p) {
  if (!p->constrained()) return absl::OkStatus();
  if (constraints == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        p->constraint_field(), ": this worker has no tokenizer to constrain its output with"));
  }
  return constraints->Attach(p);
}

std::vector<std::string> TokenBytes(const Tokenizer& tokenizer) {
  const std::vector<int> context = tokenizer.Encode("a", /*add_special_tokens=*/false);
  const std::string base = tokenizer.Decode(context);
  std::vector<std::string> out(tokenizer.vocab_size());
  std::vector<int> ids = context;
  ids.push_back(0);
  for (int id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.IsSpecial(id)) continue;
    ids.back() = id;
    std::string text = tokenizer.Decode(ids);
    if (text.size() > base.size() && text.compare(0, base.size(), base) == 0) {
      out[id] = text.substr(base.size());
    }
  }
  return out;
}

}  // namespace tandem
