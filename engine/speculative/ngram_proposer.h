// Prompt-lookup proposals for speculative decoding: the tokens that followed an earlier
// occurrence of the sequence's last n tokens. No model is run; text that copies from its prompt
// or repeats itself (summaries, edits, code, extraction) is proposed well.
#ifndef TANDEM_ENGINE_SPECULATIVE_NGRAM_PROPOSER_H_
#define TANDEM_ENGINE_SPECULATIVE_NGRAM_PROPOSER_H_

#include <span>
#include <vector>

namespace tandem {

struct NgramProposerOptions {
  int max_ngram = 4;  // the longest suffix looked up first
  // The shortest tried. Shorter suffixes match by chance in free-form text, and proposals
  // that are mostly rejected cost more than they give.
  int min_ngram = 3;

  bool valid() const { return min_ngram >= 1 && max_ngram >= min_ngram; }
};

// Up to `k` tokens that followed the most recent earlier occurrence of the last n tokens of
// `tokens` (prompt and output so far), for n from max_ngram down to min_ngram; empty when no
// suffix occurs earlier or k <= 0. O(tokens.size() * max_ngram).
std::vector<int> ProposeNgram(std::span<const int> tokens, int k,
                              const NgramProposerOptions& options = {});

}  // namespace tandem

#endif  // TANDEM_ENGINE_SPECULATIVE_NGRAM_PROPOSER_H_
