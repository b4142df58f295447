// BlockPool: bookkeeping for the blocks of a paged KV cache. Pure data structure: block ids in,
// block ids out; no tensors, threads or I/O.
//
// A block is free, in use (reference count > 0), or cached (count 0 but still holding the KV of
// a full block whose content hash is registered, reusable by a later request with the same
// prefix, evicted in LRU order when a fresh block is needed). Every allocation bumps the block's
// generation, so a (block, generation) pair names one content for the block's whole life.
//
// A prefix hit is never trusted on the hash alone: the hash (64 bits, public constants) only
// finds a candidate, which is a hit when it holds the same tokens and was computed after the
// very block (id and generation) the lookup's previous block hit. By induction from the first
// block, a hit holds the KV of exactly the prompt's prefix, whatever hashes collide: a client who
// finds two token blocks of one hash cannot plant KV that another prompt reuses.
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
// for the first block): equal prefixes give equal hashes (the converse is checked, BlockPool).
// Keyed: SipHash-2-4 under a key drawn at random when the process starts, so nobody outside it
// can compute a block's hash, let alone search for two blocks of one hash; no hash leaves the
// process (the router's prefix routing and each worker's cache hash for themselves).
uint64_t HashBlockTokens(uint64_t parent_hash, std::span<const int> tokens);

// The key, and the hash under a given one (tests: different keys give different hashes).
struct BlockHashKey {
  uint64_t k0 = 0, k1 = 0;
};
const BlockHashKey& ProcessBlockHashKey();
uint64_t HashBlockTokens(const BlockHashKey& key, uint64_t parent_hash,
                         std::span<const int> tokens);
// SipHash-2-4 of a byte string (for its reference vectors).
uint64_t SipHash24(const BlockHashKey& key, std::span<const uint8_t> bytes);

// Tests only: HashBlockTokens becomes `hash` (nullptr: the real one again), e.g. one that makes
// chosen blocks collide, to show a forged collision plants nothing.
using BlockHashFunction = uint64_t (*)(uint64_t parent_hash, std::span<const int> tokens);
void SetBlockHashForTesting(BlockHashFunction hash);

// The chained hashes of `tokens`' full blocks of `block_size`, the first `max_blocks` at most.
std::vector<uint64_t> PrefixBlockHashes(std::span<const int> tokens, int block_size,
                                        int max_blocks);

// What a full block's KV was computed after: the block holding the tokens before it, as it was
// then (its id and generation); {-1, 0} for a prompt's first block.
struct BlockParent {
  int block = -1;
  uint32_t generation = 0;
  bool operator==(const BlockParent&) const = default;
};

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

  // Prefix caching. Lookup finds the block registered under `hash` and, when it holds `tokens`
  // computed after `parent`, takes a reference to it (reviving it from the cache if
  // unreferenced); a block under the hash that holds other content is a miss (and counted).
  // Register records that `block` (in use) now holds the full block `tokens` computed after
  // `parent`, under `hash`; a hash already held by another block is left as it is.
  std::optional<int> Lookup(uint64_t hash, std::span<const int> tokens, BlockParent parent);
  void Register(int block, uint64_t hash, std::span<const int> tokens, BlockParent parent);
  // The parent a block's successor names: this block, as it is now.
  BlockParent AsParent(int block) const { return {block, generation(block)}; }
  // Lookups whose hash matched a block of other content (a collision, or a forgery).
  uint64_t hash_mismatches() const { return hash_mismatches_; }

  int ref_count(int block) const { return Touched(block) ? blocks_[block].ref_count : 0; }
  uint32_t generation(int block) const { return Touched(block) ? blocks_[block].generation : 0; }

  // True when no block is referenced: the leak check at the end of every test.
  bool NoneInUse() const { return num_in_use() == 0; }

 private:
  struct Block {
    int ref_count = 0;
    uint32_t generation = 0;
    std::optional<uint64_t> hash;
    std::vector<int> tokens;  // what the registered block holds, and after what
    BlockParent parent;
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
  uint64_t hash_mismatches_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_ENGINE_KV_BLOCK_POOL_H_
