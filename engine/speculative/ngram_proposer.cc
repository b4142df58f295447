#include "engine/speculative/ngram_proposer.h"

#include <algorithm>

namespace tandem {

std::vector<int> ProposeNgram(std::span<const int> tokens, int k,
                              const NgramProposerOptions& options) {
  const int len = static_cast<int>(tokens.size());
  if (k <= 0 || !options.valid()) return {};
  for (int n = std::min(options.max_ngram, len - 1); n >= options.min_ngram; --n) {
    const std::span<const int> suffix = tokens.subspan(len - n);
    // The most recent occurrence that ends before the suffix itself does.
    for (int start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int from = start + n;
      const int count = std::min(k, len - from);
      return std::vector<int>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

}  // namespace tandem
