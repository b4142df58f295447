#include "engine/kv/block_pool.h"

#include <algorithm>
#include <atomic>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem {

namespace {
std::atomic<BlockHashFunction> g_hash_for_testing{nullptr};
}  // namespace

void SetBlockHashForTesting(BlockHashFunction hash) { g_hash_for_testing.store(hash); }

uint64_t HashBlockTokens(uint64_t parent_hash, std::span<const int> tokens) {
  if (BlockHashFunction f = g_hash_for_testing.load(std::memory_order_relaxed)) {
    return f(parent_hash, tokens);
  }
  // FNV-1a over the parent hash and the token ids, then a final avalanche.
  uint64_t h = 0xcbf29ce484222325ull ^ parent_hash;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  mix(parent_hash);
  mix(tokens.size());
  for (int t : tokens) mix(static_cast<uint32_t>(t));
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

std::vector<uint64_t> PrefixBlockHashes(std::span<const int> tokens, int block_size,
                                        int max_blocks) {
  std::vector<uint64_t> hashes;
  if (block_size <= 0) return hashes;
  uint64_t parent = 0;
  for (int b = 0; b < max_blocks && static_cast<size_t>(b + 1) * block_size <= tokens.size(); ++b) {
    parent =
        HashBlockTokens(parent, tokens.subspan(static_cast<size_t>(b) * block_size, block_size));
    hashes.push_back(parent);
  }
  return hashes;
}

BlockPool::BlockPool(int num_blocks) : num_blocks_(std::max(0, num_blocks)) {}

absl::StatusOr<std::vector<int>> BlockPool::Allocate(int n) {
  if (n < 0) return absl::InvalidArgumentError("BlockPool::Allocate: negative count");
  if (!CanAllocate(n)) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("need %d KV blocks, %d available", n, num_available()));
  }
  std::vector<int> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    int id;
    if (!free_.empty()) {  // the last freed first, then untouched ones, low ids first
      id = free_.back();
      free_.pop_back();
    } else if (touched() < num_blocks_) {
      id = touched();
      blocks_.emplace_back();
    } else {
      id = lru_.front();
      lru_.pop_front();
      DropHash(id);
    }
    Block& b = blocks_[id];
    b.ref_count = 1;
    ++b.generation;
    out.push_back(id);
  }
  return out;
}

absl::Status BlockPool::Free(std::span<const int> ids) {
  for (int id : ids) {
    if (!Touched(id) || blocks_[id].ref_count <= 0) {
      return absl::InternalError(absl::StrFormat("BlockPool::Free: block %d is not in use", id));
    }
  }
  for (int id : ids) {
    Block& b = blocks_[id];
    if (--b.ref_count > 0) continue;
    if (b.hash) {
      b.lru_pos = lru_.insert(lru_.end(), id);
    } else {
      free_.push_back(id);
    }
  }
  return absl::OkStatus();
}

absl::Status BlockPool::AddRef(int id) {
  if (!Touched(id) || blocks_[id].ref_count <= 0) {
    return absl::InternalError(absl::StrFormat("BlockPool::AddRef: block %d is not in use", id));
  }
  ++blocks_[id].ref_count;
  return absl::OkStatus();
}

std::optional<int> BlockPool::Lookup(uint64_t hash, std::span<const int> tokens,
                                     BlockParent parent) {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const int id = it->second;
  Block& b = blocks_[id];
  if (!(b.parent == parent) ||
      !std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin(), tokens.end())) {
    ++hash_mismatches_;
    return std::nullopt;
  }
  if (b.ref_count == 0) lru_.erase(b.lru_pos);  // revive from the cache
  ++b.ref_count;
  return id;
}

void BlockPool::Register(int id, uint64_t hash, std::span<const int> tokens, BlockParent parent) {
  if (!Touched(id)) return;  // never handed out: not in use
  Block& b = blocks_[id];
  if (b.hash || by_hash_.contains(hash)) return;
  b.hash = hash;
  b.tokens.assign(tokens.begin(), tokens.end());
  b.parent = parent;
  by_hash_[hash] = id;
}

void BlockPool::DropHash(int id) {
  Block& b = blocks_[id];
  if (!b.hash) return;
  by_hash_.erase(*b.hash);
  b.hash.reset();
  b.tokens = {};
  b.parent = {};
}

}  // namespace tandem
