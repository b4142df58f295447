#include "engine/kv/block_pool.h"

#include <algorithm>
#include <atomic>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem {

namespace {

std::atomic<BlockHashFunction> g_hash_for_testing{nullptr};

// SipHash-2-4 (Aumasson and Bernstein), fed 64-bit little-endian words.
class SipHash {
 public:
  explicit SipHash(const BlockHashKey& key)
      : v0_(key.k0 ^ 0x736f6d6570736575ull),
        v1_(key.k1 ^ 0x646f72616e646f6dull),
        v2_(key.k0 ^ 0x6c7967656e657261ull),
        v3_(key.k1 ^ 0x7465646279746573ull) {}

  void Word(uint64_t m) {
    v3_ ^= m;
    Round();
    Round();
    v0_ ^= m;
    bytes_ += 8;
  }

  // The last 0-7 bytes (`tail`, little-endian, `n` of them), then the finalization.
  uint64_t Finish(uint64_t tail, int n) {
    const uint64_t b = ((bytes_ + static_cast<uint64_t>(n)) << 56) | tail;
    v3_ ^= b;
    Round();
    Round();
    v0_ ^= b;
    v2_ ^= 0xff;
    for (int i = 0; i < 4; ++i) Round();
    return v0_ ^ v1_ ^ v2_ ^ v3_;
  }

 private:
  static uint64_t Rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }
  void Round() {
    v0_ += v1_;
    v1_ = Rotl(v1_, 13);
    v1_ ^= v0_;
    v0_ = Rotl(v0_, 32);
    v2_ += v3_;
    v3_ = Rotl(v3_, 16);
    v3_ ^= v2_;
    v0_ += v3_;
    v3_ = Rotl(v3_, 21);
    v3_ ^= v0_;
    v2_ += v1_;
    v1_ = Rotl(v1_, 17);
    v1_ ^= v2_;
    v2_ = Rotl(v2_, 32);
  }

  uint64_t v0_, v1_, v2_, v3_;
  uint64_t bytes_ = 0;
};

BlockHashKey RandomKey() {
  std::random_device rd;
  auto word = [&rd] { return static_cast<uint64_t>(rd()) << 32 | rd(); };
  BlockHashKey key;
  key.k0 = word();
  key.k1 = word();
  return key;
}

}  // namespace

void SetBlockHashForTesting(BlockHashFunction hash) { g_hash_for_testing.store(hash); }

uint64_t SipHash24(const BlockHashKey& key, std::span<const uint8_t> bytes) {
  SipHash h(key);
  size_t i = 0;
  auto le = [&](size_t at, int n) {
    uint64_t v = 0;
    for (int j = 0; j < n; ++j) v |= static_cast<uint64_t>(bytes[at + j]) << (8 * j);
    return v;
  };
  for (; i + 8 <= bytes.size(); i += 8) h.Word(le(i, 8));
  const int rest = static_cast<int>(bytes.size() - i);
  return h.Finish(le(i, rest), rest);
}

const BlockHashKey& ProcessBlockHashKey() {
  static const BlockHashKey key = RandomKey();
  return key;
}

uint64_t HashBlockTokens(const BlockHashKey& key, uint64_t parent_hash,
                         std::span<const int> tokens) {
  // The message: the parent hash, the token count, then the ids as 32-bit little-endian words.
  SipHash h(key);
  h.Word(parent_hash);
  h.Word(tokens.size());
  size_t i = 0;
  for (; i + 2 <= tokens.size(); i += 2) {
    h.Word(static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) |
           static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32);
  }
  return i < tokens.size() ? h.Finish(static_cast<uint32_t>(tokens[i]), 4) : h.Finish(0, 0);
}

uint64_t HashBlockTokens(uint64_t parent_hash, std::span<const int> tokens) {
  if (BlockHashFunction f = g_hash_for_testing.load(std::memory_order_relaxed)) {
    return f(parent_hash, tokens);
  }
  return HashBlockTokens(ProcessBlockHashKey(), parent_hash, tokens);
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
