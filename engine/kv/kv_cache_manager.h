// KvCacheManager: a worker's paged KV cache bookkeeping in one place: the block pool
// (block_pool.h), the table layout of the cache's layer groups (block_table.h) and the prefix
// cache over them, keyed by the one block hash (HashBlockTokens). The prefill engine matches and
// publishes prompt prefixes through it; the decode scheduler grows and frees its sequences'
// tables in it. Pure data structure: block ids in, block ids out; no tensors, threads or I/O.
//
// A table holds, per logical block, one pool block for each layer group (interleaved by
// group). A logical block of a prompt is a prefix hit when every group still holds it, each
// after the block the group's previous hit found: BlockPool confirms the tokens and the parent,
// never the hash alone.
#ifndef TANDEM_ENGINE_KV_KV_CACHE_MANAGER_H_
#define TANDEM_ENGINE_KV_KV_CACHE_MANAGER_H_

#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/block_table.h"

namespace tandem {

class KvCacheManager {
 public:
  // `layout.block_size` tokens per block, `num_blocks` pool blocks.
  KvCacheManager(int num_blocks, KvTableLayout layout)
      : pool_(num_blocks), layout_(std::move(layout)) {}

  struct Prefix {
    std::vector<int> blocks;  // the table's first entries (references taken)
    int tokens = 0;           // prompt tokens whose KV they hold
  };
  // The longest prefix of `prompt`'s first `max_blocks` full blocks that the cache holds.
  Prefix MatchPrefix(std::span<const int> prompt, int max_blocks);
  // The same over the blocks `hashes` names: PrefixBlockHashes(prompt, block_size, ...) already
  // computed by the caller (a simulator keeps them per request).
  Prefix MatchPrefix(std::span<const int> prompt, std::span<const uint64_t> hashes);
  // The full blocks of `prompt` that `table` holds (computed) become reusable prefixes; the
  // table keeps its references. With `hashes`, those of the blocks to publish.
  void Publish(std::span<const int> prompt, std::span<const int> table);
  void Publish(std::span<const int> prompt, std::span<const int> table,
               std::span<const uint64_t> hashes);

  // BlockPool's, for whole tables.
  absl::StatusOr<std::vector<int>> Allocate(int n) { return pool_.Allocate(n); }
  absl::Status Free(std::span<const int> blocks) { return pool_.Free(blocks); }

  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }
  const KvTableLayout& layout() const { return layout_; }
  int num_blocks() const { return pool_.num_blocks(); }
  int num_available() const { return pool_.num_available(); }
  // The leak check: no block referenced.
  bool NoneInUse() const { return pool_.NoneInUse(); }

 private:
  BlockPool pool_;
  const KvTableLayout layout_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_KV_KV_CACHE_MANAGER_H_
