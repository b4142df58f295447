#include "engine/kv/kv_cache_manager.h"

#include <algorithm>

namespace tandem {

KvCacheManager::Prefix KvCacheManager::MatchPrefix(std::span<const int> prompt, int max_blocks) {
  return MatchPrefix(prompt, PrefixBlockHashes(prompt, layout_.block_size, max_blocks));
}

KvCacheManager::Prefix KvCacheManager::MatchPrefix(std::span<const int> prompt,
                                                   std::span<const uint64_t> hashes) {
  const int bs = layout_.block_size;
  const int groups = layout_.n_groups();
  Prefix out;
  std::vector<BlockParent> parents(groups);
  for (size_t b = 0; b < hashes.size(); ++b) {
    const std::span<const int> tokens = prompt.subspan(b * bs, bs);
    std::vector<int> hits;
    for (int g = 0; g < groups; ++g) {
      std::optional<int> hit = pool_.Lookup(GroupBlockHash(hashes[b], g), tokens, parents[g]);
      if (!hit) break;
      hits.push_back(*hit);
    }
    if (static_cast<int>(hits.size()) < groups) {
      pool_.Free(hits).IgnoreError();  // references Lookup took
      break;
    }
    for (int g = 0; g < groups; ++g) parents[g] = pool_.AsParent(hits[g]);
    out.blocks.insert(out.blocks.end(), hits.begin(), hits.end());
  }
  out.tokens = static_cast<int>(out.blocks.size()) / groups * bs;
  return out;
}

void KvCacheManager::Publish(std::span<const int> prompt, std::span<const int> table) {
  const int bs = layout_.block_size;
  Publish(prompt, table, PrefixBlockHashes(prompt, bs, static_cast<int>(prompt.size()) / bs));
}

void KvCacheManager::Publish(std::span<const int> prompt, std::span<const int> table,
                             std::span<const uint64_t> hashes) {
  const int bs = layout_.block_size;
  const int groups = layout_.n_groups();
  const size_t full = std::min({hashes.size(), prompt.size() / static_cast<size_t>(bs),
                                table.size() / static_cast<size_t>(groups)});
  std::vector<BlockParent> parents(groups);
  for (size_t b = 0; b < full; ++b) {
    for (int g = 0; g < groups; ++g) {
      const int block = table[b * groups + g];
      pool_.Register(block, GroupBlockHash(hashes[b], g), prompt.subspan(b * bs, bs), parents[g]);
      parents[g] = pool_.AsParent(block);
    }
  }
}

}  // namespace tandem
