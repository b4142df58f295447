// Speculative decoding, the part both engines share (the Generator of `tandem generate` and the
// decode worker's step loop): what proposes tokens, how many a sequence may propose, and the rule
// that keeps them.
//
// A decoding sequence proposes up to K tokens; one forward pass scores its last token and the
// proposals together (a logit row per input). Row j is sampled with the usual counter-based draw
// (engine/sampling/sampler.h), and the proposal after it is kept while it equals the token
// drawn. Every token emitted is therefore the token plain decoding would have drawn at that
// position, for every sampling setting and seed: the output is identical with and without
// speculation, not only equal in distribution. Rejected proposals' KV rows lie past the
// sequence and are overwritten by later steps.
#ifndef TANDEM_ENGINE_SPECULATIVE_PROPOSER_H_
#define TANDEM_ENGINE_SPECULATIVE_PROPOSER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "engine/kv/kv_cache.h"
#include "engine/model.h"
#include "engine/speculative/ngram_proposer.h"

namespace tandem {

enum class SpeculativeMethod {
  kOff,
  kNgram,  // prompt lookup (engine/speculative/ngram_proposer.h)
  kDraft,  // a small model of the same vocabulary, decoded greedily
};
// "off", "ngram" or "draft" (the --speculative flag); INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<SpeculativeMethod> ParseSpeculativeMethod(std::string_view name);
std::string_view SpeculativeMethodName(SpeculativeMethod method);

// --spec-tokens: K in [1, kMaxSpecTokens]; INVALID_ARGUMENT naming the flag otherwise.
inline constexpr int kMaxSpecTokens = 64;
absl::Status ValidateSpecTokens(int64_t k);

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::kOff;
  int num_tokens = 4;  // K: the most tokens a sequence proposes per step (ValidateSpecTokens)
  NgramProposerOptions ngram;
  const Model* draft = nullptr;  // kDraft: not owned; its vocabulary is the target's
  // kDraft: the most bytes of the draft model's KV cache (f32, where the draft runs).
  int64_t max_draft_kv_bytes = int64_t{1} << 30;

  bool enabled() const { return method != SpeculativeMethod::kOff; }
  // Checks the values, and for kDraft that the draft model is set and has `target`'s
  // vocabulary. INVALID_ARGUMENT naming the flag (--spec-tokens, --draft-model).
  absl::Status Validate(const ModelConfig& target) const;
};

// How many tokens a decoding sequence may propose this step: K, and no more than would fit before
// max_tokens or the context length ends it (the step emits up to one token past its proposals).
// `generated` counts the sequence's generated tokens, `length` its tokens (prompt included).
int ProposalRoom(int num_tokens, int max_tokens, int generated, int length, int max_seq_len);

// The verify rule over one sequence's rows. `proposals` were scored after the sequence's last
// token; sample(j) draws the token of row j, emit(token) appends it to the sequence and returns
// whether the sequence ended there. Row after row: draw, emit, and go on to the next row only
// while the token equals the proposal that row was computed after. Returns the proposals kept
// (0 ... proposals.size()); 1 + that many tokens were emitted unless the sequence ended sooner.
int VerifyProposals(std::span<const int> proposals, absl::FunctionRef<int(int row)> sample,
                    absl::FunctionRef<bool(int token)> emit);

// One sequence's proposal request in a step.
struct ProposalRequest {
  uint64_t id = 0;              // the sequence, stable over its life
  std::span<const int> tokens;  // the sequence so far (prompt and generated)
  int max_tokens = 0;           // the most to propose (ProposalRoom)
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Proposals for each request, at most its max_tokens each, possibly none; out->size() ==
  // requests.size().
  virtual absl::Status Propose(std::span<const ProposalRequest> requests,
                               std::vector<std::vector<int>>* out) = 0;
  // The sequence ended: drop what is kept for it. Unknown ids are ignored.
  virtual void Forget(uint64_t id) {}
  // The leak check: nothing kept for any sequence.
  virtual bool Idle() const { return true; }
};

// Where and how big the draft model runs (SpeculativeMethod::kDraft).
struct DraftRunnerOptions {
  // "cpu", or "cuda" (the device model: matrices in f32 or bf16); an engine gives its own.
  std::string device = "cpu";
  // The draft's KV cache, in blocks of block_size tokens (fewer when they would exceed
  // SpeculativeConfig::max_draft_kv_bytes): the engine's own count gives the draft room for as
  // many tokens as the engine holds. A sequence the draft cache has no room for proposes nothing.
  int num_blocks = 0;
  int block_size = 16;
  int max_seqs = 256;          // sequences in one draft forward call
  int max_step_tokens = 2048;  // tokens in one draft forward call (catching up long prompts)
};

// The proposer `config` names (nullptr when off). INVALID_ARGUMENT naming the flag for a bad
// configuration; a draft model the device cannot run is refused naming --draft-model.
absl::StatusOr<std::unique_ptr<Proposer>> MakeProposer(const SpeculativeConfig& config,
                                                       const ModelConfig& target,
                                                       const DraftRunnerOptions& draft = {});

}  // namespace tandem

#endif  // TANDEM_ENGINE_SPECULATIVE_PROPOSER_H_
