// BlockPool: bookkeeping for the blocks of a paged KV cache. Pure data structure: block ids in,
// block ids out; no tensors, threads or I/O.
//
// A block is free, in use (reference count > 0), or cached (count 0 but still holding the KV of
// a full block whose content hash is registered, reusable by a later request with the same
// prefix, evicted in LRU order when a fresh block is needed). Every allocation bumps the block's
// generation, so a writer holding an old (block, generation) pair can be refused.
#ifndef TANDEM_ENGINE_KV_BLOCK_POOL_H_
#define TANDEM_ENGINE_KV_BLOCK_POOL_H_

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace tandem {

// Content hash of a full block of token ids, chained over the hash of the block before it (0
// for the first block), so equal hashes mean equal prefixes.
uint64_t HashBlockTokens(uint64_t parent_hash, std::span<const int> tokens);

class BlockPool {
 public:
  explicit BlockPool(int num_blocks);

  int num_blocks() const { return num_blocks_; }
  // Blocks an Allocate can take now: free ones plus cached ones that may be evicted.
  int num_available() const {
    return static_cast<int>(free_.size() + lru_.size()) + num_blocks_ - touched();
  }
  int num_in_use() const { return num_blocks() - num_available(); }
  int num_cached() const { return static_cast<int>(lru_.size()); }
  bool CanAllocate(int n) const { return n <= num_available(); }

  // Takes `n` blocks (free ones first, then evicting the least recently used cached ones), each
  // with reference count 1 and a new generation. RESOURCE_EXHAUSTED if fewer are available;
  // nothing is taken then.
  absl::StatusOr<std::vector<int>> Allocate(int n);

  // Drops one reference from each block; a block reaching zero becomes cached when it has a
  // registered hash, else free. Freeing a block that is not in use is an internal error.
  absl::Status Free(std::span<const int> blocks);

  // Adds a reference to a block in use.
  absl::Status AddRef(int block);

  // Prefix caching. Lookup finds a block holding `hash` and takes a reference to it (reviving
  // it from the cache if unreferenced). Register records that `block` (in use) now holds the
  // full-block content `hash`; a hash already held by another block is left as it is.
  std::optional<int> Lookup(uint64_t hash);
  void Register(int block, uint64_t hash);

  int ref_count(int block) const { return Touched(block) ? blocks_[block].ref_count : 0; }
  uint32_t generation(int block) const { return Touched(block) ? blocks_[block].generation : 0; }

  // True when no block is referenced: the leak check at the end of every test.
  bool NoneInUse() const { return num_in_use() == 0; }

 private:
  struct Block {
    int ref_count = 0;
    uint32_t generation = 0;
    std::optional<uint64_t> hash;
    std::list<int>::iterator lru_pos;  // valid while cached
  };
  void DropHash(int block);
  // Blocks [0, touched()) have been handed out at least once; the rest are free and untouched,
  // handed out in order once free_ is empty (a pool of millions of blocks costs nothing until
  // it is used: the planner builds one per simulation).
  int touched() const { return static_cast<int>(blocks_.size()); }
  bool Touched(int block) const { return block >= 0 && block < touched(); }

  int num_blocks_;
  std::vector<Block> blocks_;
  std::vector<int> free_;  // stack of freed blocks that hold no hash, and evicted ones
  std::list<int> lru_;     // cached blocks, least recently used first
  absl::flat_hash_map<uint64_t, int> by_hash_;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_KV_BLOCK_POOL_H_
