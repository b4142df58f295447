#include "engine/speculative/proposer.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>

#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "engine/kv/block_pool.h"
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

absl::Status SpeculativeConfig::Validate(const ModelConfig& target) const {
  if (!enabled()) return absl::OkStatus();
  if (num_tokens < 1 || num_tokens > 64) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--spec-tokens must be in [1, 64], got %d", num_tokens));
  }
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

// Greedy decoding with the draft model, batched over the sequences of a step: one forward call
// catches each sequence's draft KV up with its tokens and gives the first proposal, then one call
// per further proposal. A sequence's draft KV is kept between steps; what the target rejected is
// dropped by comparing the tokens the draft saw with the sequence's.
class DraftProposer final : public Proposer {
 public:
  DraftProposer(const Model* draft, KvCache cache, int num_blocks, int block_size,
                std::vector<int> eos_ids)
      : draft_(draft),
        cache_(std::move(cache)),
        pool_(num_blocks),
        block_size_(block_size),
        eos_ids_(std::move(eos_ids)) {}

  absl::Status Propose(std::span<const ProposalRequest> requests,
                       std::vector<std::vector<int>>* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    out->assign(requests.size(), {});
    std::vector<Active> active;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (std::optional<Active> a = Prepare(requests[i], i)) active.push_back(*a);
    }
    std::vector<SequenceChunk> batch;
    std::vector<float> logits;
    const int vocab = draft_->config().vocab_size;
    for (int round = 0; !active.empty(); ++round) {
      batch.clear();
      for (const Active& a : active) {
        const std::vector<int>& proposed = (*out)[a.index];
        std::span<const int> tokens =
            round == 0 ? a.request->tokens.subspan(a.seq->fed.size())
                       : std::span<const int>(proposed).subspan(proposed.size() - 1);
        // Round r > 0 feeds proposal r - 1 at the position after the sequence's last token + r - 1.
        const int start = round == 0 ? static_cast<int>(a.seq->fed.size())
                                     : static_cast<int>(a.request->tokens.size()) - 1 + round;
        batch.push_back({tokens, start, a.seq->blocks, false});
      }
      if (absl::Status s = draft_->Forward(batch, &cache_, &logits); !s.ok()) {
        for (const Active& a : active) Drop(a.request->id);
        out->assign(requests.size(), {});
        return s;
      }
      std::vector<Active> next;
      for (size_t b = 0; b < active.size(); ++b) {
        Active& a = active[b];
        std::vector<int>& proposed = (*out)[a.index];
        // The draft's KV now covers what was fed this round.
        if (round == 0) {
          a.seq->fed.assign(a.request->tokens.begin(), a.request->tokens.end());
        } else {
          a.seq->fed.push_back(proposed.back());
        }
        const int token = Argmax(std::span<const float>(logits).subspan(b * vocab, vocab));
        proposed.push_back(token);
        const bool eos = std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
        if (!eos && static_cast<int>(proposed.size()) < a.request->max_tokens) next.push_back(a);
      }
      active = std::move(next);
    }
    return absl::OkStatus();
  }

  void Forget(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    Drop(id);
  }

 private:
  struct Seq {
    std::vector<int> fed;     // the tokens whose draft KV is in `blocks`, in order
    std::vector<int> blocks;  // the draft cache's block table
  };
  struct Active {
    const ProposalRequest* request;
    size_t index;
    Seq* seq;
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
    if (last_pos >= draft_->config().max_seq_len) return std::nullopt;
    Seq& s = seqs_[r.id];
    const auto mismatch =
        std::mismatch(s.fed.begin(), s.fed.end(), r.tokens.begin(), r.tokens.end());
    size_t keep = static_cast<size_t>(mismatch.first - s.fed.begin());
    keep = std::min<size_t>(keep, len - 1);
    s.fed.resize(keep);
    const int need = (last_pos + block_size_) / block_size_ - static_cast<int>(s.blocks.size());
    if (need > 0) {
      auto more = pool_.Allocate(need);
      if (!more.ok()) {
        Drop(r.id);
        return std::nullopt;
      }
      s.blocks.insert(s.blocks.end(), more->begin(), more->end());
    }
    return Active{&r, index, &s};
  }

  void Drop(uint64_t id) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) return;
    pool_.Free(it->second.blocks).IgnoreError();  // blocks came from Allocate: cannot fail
    seqs_.erase(it);
  }

  const Model* draft_;
  std::mutex mu_;
  KvCache cache_;
  BlockPool pool_;
  const int block_size_;
  const std::vector<int> eos_ids_;
  // node_hash_map: Active keeps Seq pointers while Prepare inserts further sequences.
  absl::node_hash_map<uint64_t, Seq> seqs_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Proposer>> MakeProposer(const SpeculativeConfig& config,
                                                       const ModelConfig& target, int draft_blocks,
                                                       int block_size) {
  if (absl::Status s = config.Validate(target); !s.ok()) return s;
  switch (config.method) {
    case SpeculativeMethod::kOff:
      return nullptr;
    case SpeculativeMethod::kNgram:
      return std::make_unique<NgramProposer>(config.ngram);
    case SpeculativeMethod::kDraft: {
      const KvCacheSpec spec = KvCacheSpec::For(config.draft->config(), block_size, DType::kF32);
      draft_blocks = static_cast<int>(
          std::min<int64_t>(draft_blocks, spec.BlocksIn(config.max_draft_kv_bytes)));
      if (draft_blocks < 1) {
        return absl::InvalidArgumentError("--draft-kv-bytes: holds no block of the draft's KV");
      }
      auto cache =
          KvCache::Create(config.draft->config(), draft_blocks, block_size, 0, DType::kF32);
      if (!cache.ok()) return cache.status();
      return std::make_unique<DraftProposer>(config.draft, std::move(*cache), draft_blocks,
                                             block_size, target.eos_token_ids);
    }
  }
  return absl::InternalError("unknown speculative method");
}

}  // namespace tandem
