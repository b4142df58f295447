#include "engine/speculative/proposer.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>

#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/block_table.h"
#include "engine/model_runner.h"
#include "engine/sampling/sampler.h"

namespace tandem {

absl::StatusOr<SpeculativeMethod> ParseSpeculativeMethod(std::string_view name) {
  if (name == "off") return SpeculativeMethod::kOff;
  if (name == "ngram") return SpeculativeMethod::kNgram;
  if (name == "draft") return SpeculativeMethod::kDraft;
  return absl::InvalidArgumentError(
      absl::StrFormat("--speculative must be off, ngram or draft, not \"%s\"", std::string(name)));
}

std::string_view SpeculativeMethodName(SpeculativeMethod method) {
  switch (method) {
    case SpeculativeMethod::kOff:
      return "off";
    case SpeculativeMethod::kNgram:
      return "ngram";
    case SpeculativeMethod::kDraft:
      return "draft";
  }
  return "?";
}

absl::Status ValidateSpecTokens(int64_t k) {
  if (k >= 1 && k <= kMaxSpecTokens) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("--spec-tokens must be in [1, %d], got %d", kMaxSpecTokens, k));
}

absl::Status SpeculativeConfig::Validate(const ModelConfig& target) const {
  if (!enabled()) return absl::OkStatus();
  if (absl::Status s = ValidateSpecTokens(num_tokens); !s.ok()) return s;
  if (!ngram.valid()) {
    return absl::InvalidArgumentError("--spec-ngram: need 1 <= min <= max");
  }
  if (method == SpeculativeMethod::kDraft) {
    if (draft == nullptr) {
      return absl::InvalidArgumentError("--draft-model: needed by --speculative=draft");
    }
    if (draft->config().vocab_size != target.vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--draft-model: its vocabulary has %d tokens, the model's %d; a draft model must share "
          "the model's tokenizer",
          draft->config().vocab_size, target.vocab_size));
    }
  }
  return absl::OkStatus();
}

int ProposalRoom(int num_tokens, int max_tokens, int generated, int length, int max_seq_len) {
  const int room = std::min(max_tokens - generated, max_seq_len - length);
  return std::max(0, std::min(num_tokens, room - 1));
}

int VerifyProposals(std::span<const int> proposals, absl::FunctionRef<int(int row)> sample,
                    absl::FunctionRef<bool(int token)> emit) {
  int kept = 0;
  for (size_t j = 0; j <= proposals.size(); ++j) {
    const int token = sample(static_cast<int>(j));
    if (emit(token) || j == proposals.size() || token != proposals[j]) break;
    ++kept;
  }
  return kept;
}

namespace {

class NgramProposer final : public Proposer {
 public:
  explicit NgramProposer(NgramProposerOptions options) : options_(options) {}

  absl::Status Propose(std::span<const ProposalRequest> requests,
                       std::vector<std::vector<int>>* out) override {
    out->resize(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      (*out)[i] = ProposeNgram(requests[i].tokens, requests[i].max_tokens, options_);
    }
    return absl::OkStatus();
  }

 private:
  NgramProposerOptions options_;
};

// Greedy decoding with the draft model on its own runner (and KV cache), batched over the
// sequences of a step: forward calls of at most max_step_tokens tokens and max_seqs sequences
// catch each sequence's draft KV up with its tokens (the last call of a sequence gives its first
// proposal), then one call per further proposal. A sequence's draft KV is kept between steps;
// what the target rejected is dropped by comparing the tokens the draft saw with the sequence's.
class DraftProposer final : public Proposer {
 public:
  DraftProposer(std::unique_ptr<ModelRunner> runner, const ModelConfig& draft,
                const DraftRunnerOptions& options, std::vector<int> eos_ids)
      : runner_(std::move(runner)),
        vocab_(draft.vocab_size),
        max_seq_len_(draft.max_seq_len),
        options_(options),
        pool_(runner_->num_blocks()),
        layout_(runner_->kv_spec().table_layout()),
        eos_ids_(std::move(eos_ids)) {}

  absl::Status Propose(std::span<const ProposalRequest> requests,
                       std::vector<std::vector<int>>* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    out->assign(requests.size(), {});
    std::vector<Active> active;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (std::optional<Active> a = Prepare(requests[i], i)) active.push_back(*a);
    }
    absl::Status s = CatchUp(active, out);
    for (int round = 1; s.ok(); ++round) {
      std::vector<Active*> going;
      for (Active& a : active) {
        if (!a.done) going.push_back(&a);
      }
      if (going.empty()) break;
      s = NextProposals(going, round, out);
    }
    if (!s.ok()) {
      for (const Active& a : active) Drop(a.request->id);
      out->assign(requests.size(), {});
    }
    return s;
  }

  void Forget(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    Drop(id);
  }

  bool Idle() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return seqs_.empty() && pool_.NoneInUse();
  }

 private:
  struct Seq {
    std::vector<int> fed;     // the tokens whose draft KV is in `blocks`, in order
    std::vector<int> blocks;  // the draft cache's block table
  };
  struct Active {
    const ProposalRequest* request;
    size_t index;  // into the requests and the proposals
    Seq* seq;
    bool done = false;  // no further proposal: enough of them, or an EOS proposed
  };

  // Readies a request's draft KV for this step: keeps what the draft saw that is still the
  // sequence's prefix (at least one token is fed again, for its logits) and grows the block table
  // to the last proposal's position. Nothing when the request wants no proposal, when the draft's
  // context is too short, or when its cache has no room (the sequence's draft KV is dropped then,
  // and rebuilt by a later step).
  std::optional<Active> Prepare(const ProposalRequest& r, size_t index) {
    const int len = static_cast<int>(r.tokens.size());
    if (r.max_tokens <= 0 || len == 0) return std::nullopt;
    // Proposal k is fed at position len - 1 + k - 1: the last position the cache holds.
    const int last_pos = len + r.max_tokens - 2;
    if (last_pos >= max_seq_len_) return std::nullopt;
    Seq& s = seqs_[r.id];
    const auto mismatch =
        std::mismatch(s.fed.begin(), s.fed.end(), r.tokens.begin(), r.tokens.end());
    const size_t keep = std::min<size_t>(mismatch.first - s.fed.begin(), len - 1);
    s.fed.resize(keep);
    // Every block up to the last proposal (the draft may feed again from any position).
    if (!GrowTable(layout_, &pool_, &s.blocks, 0, last_pos + 1).ok()) {
      Drop(r.id);
      return std::nullopt;
    }
    return Active{&r, index, &s};
  }

  // Appends the draft's greedy token from logit row `row` to a's proposals.
  void TakeProposal(Active& a, int row, std::vector<std::vector<int>>* out) {
    std::vector<int>& proposed = (*out)[a.index];
    const int token =
        Argmax(std::span<const float>(logits_).subspan(static_cast<size_t>(row) * vocab_, vocab_));
    proposed.push_back(token);
    const bool eos = std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
    a.done = eos || static_cast<int>(proposed.size()) >= a.request->max_tokens;
  }

  // Feeds every sequence's unseen tokens, under the step limits; each sequence's last chunk gives
  // its first proposal.
  absl::Status CatchUp(std::vector<Active>& active, std::vector<std::vector<int>>* out) {
    std::vector<Active*> pending;
    for (Active& a : active) pending.push_back(&a);
    while (!pending.empty()) {
      std::vector<SequenceChunk> batch;
      std::vector<Active*> in_batch;
      int budget = options_.max_step_tokens;
      for (Active* a : pending) {
        if (budget == 0 || static_cast<int>(in_batch.size()) == options_.max_seqs) break;
        const int fed = static_cast<int>(a->seq->fed.size());
        const int n = std::min(static_cast<int>(a->request->tokens.size()) - fed, budget);
        batch.push_back({a->request->tokens.subspan(fed, n), fed, a->seq->blocks, false});
        in_batch.push_back(a);
        budget -= n;
      }
      if (absl::Status s = runner_->Forward(batch, &logits_); !s.ok()) return s;
      std::vector<Active*> rest;
      for (size_t b = 0; b < in_batch.size(); ++b) {
        Active& a = *in_batch[b];
        a.seq->fed.insert(a.seq->fed.end(), batch[b].tokens.begin(), batch[b].tokens.end());
        if (a.seq->fed.size() == a.request->tokens.size())
          TakeProposal(a, static_cast<int>(b), out);
      }
      for (Active* a : pending) {
        if (a->seq->fed.size() < a->request->tokens.size()) rest.push_back(a);
      }
      pending = std::move(rest);
    }
    return absl::OkStatus();
  }

  // Round r > 0: feeds each going sequence's proposal r - 1 (at the position after its last
  // token + r - 1) for proposal r, at most max_seqs sequences a call.
  absl::Status NextProposals(const std::vector<Active*>& going, int round,
                             std::vector<std::vector<int>>* out) {
    for (size_t from = 0; from < going.size(); from += options_.max_seqs) {
      const size_t to = std::min(going.size(), from + options_.max_seqs);
      std::vector<SequenceChunk> batch;
      for (size_t i = from; i < to; ++i) {
        const Active& a = *going[i];
        const std::vector<int>& proposed = (*out)[a.index];
        const int start = static_cast<int>(a.request->tokens.size()) - 1 + round;
        batch.push_back({std::span<const int>(proposed).subspan(proposed.size() - 1), start,
                         a.seq->blocks, false});
      }
      if (absl::Status s = runner_->Forward(batch, &logits_); !s.ok()) return s;
      for (size_t i = from; i < to; ++i) {
        Active& a = *going[i];
        a.seq->fed.push_back((*out)[a.index].back());
        TakeProposal(a, static_cast<int>(i - from), out);
      }
    }
    return absl::OkStatus();
  }

  void Drop(uint64_t id) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) return;
    FreeTable(&pool_, &it->second.blocks);
    seqs_.erase(it);
  }

  mutable std::mutex mu_;
  std::unique_ptr<ModelRunner> runner_;
  const int vocab_;
  const int max_seq_len_;
  const DraftRunnerOptions options_;
  BlockPool pool_;
  KvTableLayout layout_;
  const std::vector<int> eos_ids_;
  std::vector<float> logits_;
  // node_hash_map: Active keeps Seq pointers while Prepare inserts further sequences.
  absl::node_hash_map<uint64_t, Seq> seqs_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Proposer>> MakeProposer(const SpeculativeConfig& config,
                                                       const ModelConfig& target,
                                                       const DraftRunnerOptions& draft) {
  if (absl::Status s = config.Validate(target); !s.ok()) return s;
  switch (config.method) {
    case SpeculativeMethod::kOff:
      return nullptr;
    case SpeculativeMethod::kNgram:
      return std::make_unique<NgramProposer>(config.ngram);
    case SpeculativeMethod::kDraft: {
      if (draft.num_blocks < 1 || draft.block_size < 1 || draft.max_seqs < 1 ||
          draft.max_step_tokens < 1) {
        return absl::InvalidArgumentError("draft runner: every capacity must be >= 1");
      }
      const ModelConfig& dc = config.draft->config();
      const KvCacheSpec spec = KvCacheSpec::For(dc, draft.block_size, DType::kF32);
      ModelRunnerOptions ro;
      ro.num_blocks = static_cast<int>(
          std::min<int64_t>(draft.num_blocks, spec.BlocksIn(config.max_draft_kv_bytes)));
      if (ro.num_blocks < 1) {
        return absl::InvalidArgumentError("--draft-kv-bytes: holds no block of the draft's KV");
      }
      ro.block_size = draft.block_size;
      ro.max_batch_tokens = draft.max_step_tokens;
      ro.max_seqs = draft.max_seqs;
      ro.max_logit_rows = draft.max_seqs;
      auto runner = MakeModelRunner(draft.device, config.draft, ro);
      if (!runner.ok()) {
        return absl::Status(runner.status().code(),
                            absl::StrCat("--draft-model: ", runner.status().message()));
      }
      return std::make_unique<DraftProposer>(std::move(*runner), dc, draft, target.eos_token_ids);
    }
  }
  return absl::InternalError("unknown speculative method");
}

}  // namespace tandem
