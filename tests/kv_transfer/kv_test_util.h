// Caches, prompts and a LeaseTable-backed sink shared by the kv_transfer tests.
#ifndef TANDEM_TESTS_KV_TRANSFER_KV_TEST_UTIL_H_
#define TANDEM_TESTS_KV_TRANSFER_KV_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/kv_cache.h"
#include "engine/model_config.h"
#include "kv_transfer/kv_pack.h"
#include "kv_transfer/kv_transfer.h"
#include "kv_transfer/lease_table.h"

namespace tandem::testing {

inline ModelConfig KvShape(int n_layers, int n_kv_heads, int head_dim) {
  ModelConfig c;
  c.n_layers = n_layers;
  c.n_heads = n_kv_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  return c;
}

// A cache whose every byte (and fp8 scale) is 0 (KvCache leaves its memory uninitialized).
inline KvCache MakeCache(const ModelConfig& config, int num_blocks, int block_size,
                         DType dtype = DType::kF32) {
  absl::StatusOr<KvCache> c = KvCache::Create(config, num_blocks, block_size, 0, dtype);
  if (!c.ok()) std::abort();
  const int64_t layer_bytes =
      int64_t{num_blocks} * block_size * c->width() * static_cast<int64_t>(DTypeSize(dtype));
  for (int l = 0; l < c->n_layers(); ++l) {
    std::fill(c->k_bytes(l), c->k_bytes(l) + layer_bytes, 0);
    std::fill(c->v_bytes(l), c->v_bytes(l) + layer_bytes, 0);
    if (float* s = c->scales(l)) std::fill(s, s + int64_t{num_blocks} * 2 * config.n_kv_heads, 0);
  }
  return *std::move(c);
}

// A value unique to (seed, layer, K or V, position, column), exact in float32.
inline float KvValue(int seed, int layer, int is_v, int pos, int col) {
  return static_cast<float>(((seed * 8 + layer) * 2 + is_v) * 4096 + pos) + col / 1024.0f;
}
// A byte for other dtypes, from the same coordinates (byte `b` of the row).
inline char KvByte(int seed, int layer, int is_v, int pos, int b) {
  return static_cast<char>((seed * 131 + layer * 31 + is_v * 17 + pos * 7 + b) & 0xff);
}
// An fp8 scale unique to (seed, layer, K or V, head).
inline float KvScale(int seed, int layer, int is_v, int head) {
  return 0.5f + seed + layer * 0.25f + is_v * 0.125f + head * 0.0625f;
}

inline int64_t RowBytes(const KvCache& c) {
  return int64_t{c.width()} * static_cast<int64_t>(DTypeSize(c.dtype()));
}

inline const char* RowAt(const KvCache& c, int layer, int is_v, std::span<const int> table,
                         int pos) {
  const char* base = is_v ? c.v_bytes(layer) : c.k_bytes(layer);
  const int64_t block = table[pos / c.block_size()];
  return base + (block * c.block_size() + pos % c.block_size()) * RowBytes(c);
}

inline const float* Row(const KvCache& c, int layer, int is_v, std::span<const int> table,
                        int pos) {
  return reinterpret_cast<const float*>(RowAt(c, layer, is_v, table, pos));
}

// Writes KvValue(seed, ...) (float32 caches) or KvByte(seed, ...) (others, with KvScale scales
// in every block of fp8 caches) for positions [0, num_tokens) of every layer.
inline void FillPrompt(KvCache* c, std::span<const int> table, int num_tokens, int seed) {
  const int heads = c->spec().n_kv_heads;
  for (int l = 0; l < c->n_layers(); ++l) {
    for (int is_v = 0; is_v < 2; ++is_v) {
      for (int p = 0; p < num_tokens; ++p) {
        char* row = const_cast<char*>(RowAt(*c, l, is_v, table, p));
        if (c->dtype() == DType::kF32) {
          float* f = reinterpret_cast<float*>(row);
          for (int col = 0; col < c->width(); ++col) f[col] = KvValue(seed, l, is_v, p, col);
        } else {
          for (int64_t b = 0; b < RowBytes(*c); ++b) row[b] = KvByte(seed, l, is_v, p, b);
        }
      }
      if (float* s = c->scales(l)) {
        for (int b = 0; b < (num_tokens + c->block_size() - 1) / c->block_size(); ++b) {
          for (int h = 0; h < heads; ++h) {
            s[(int64_t{table[b]} * 2 + is_v) * heads + h] = KvScale(seed, l, is_v, h);
          }
        }
      }
    }
  }
}

// True when positions [0, num_tokens) of every layer hold what FillPrompt(seed) wrote.
inline bool HoldsPrompt(const KvCache& c, std::span<const int> table, int num_tokens, int seed) {
  const int heads = c.spec().n_kv_heads;
  for (int l = 0; l < c.n_layers(); ++l) {
    for (int is_v = 0; is_v < 2; ++is_v) {
      for (int p = 0; p < num_tokens; ++p) {
        const char* row = RowAt(c, l, is_v, table, p);
        if (c.dtype() == DType::kF32) {
          const float* f = reinterpret_cast<const float*>(row);
          for (int col = 0; col < c.width(); ++col) {
            if (f[col] != KvValue(seed, l, is_v, p, col)) return false;
          }
        } else {
          for (int64_t b = 0; b < RowBytes(c); ++b) {
            if (row[b] != KvByte(seed, l, is_v, p, b)) return false;
          }
        }
      }
      if (const float* s = c.scales(l)) {
        for (int b = 0; b < (num_tokens + c.block_size() - 1) / c.block_size(); ++b) {
          for (int h = 0; h < heads; ++h) {
            if (s[(int64_t{table[b]} * 2 + is_v) * heads + h] != KvScale(seed, l, is_v, h)) {
              return false;
            }
          }
        }
      }
    }
  }
  return true;
}

inline int BlocksFor(int num_tokens, int block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

// The decode side: a block pool, a paged cache and a lease table behind one mutex, held across
// validate + scatter + record so a concurrent Release cannot hand the blocks away mid-copy.
class CacheSink : public KvSink {
 public:
  CacheSink(const ModelConfig& config, int num_blocks, int block_size, DType dtype = DType::kF32)
      : cache_(MakeCache(config, num_blocks, block_size, dtype)), pool_(num_blocks) {}

  // Admits a prompt: blocks (shuffled, so ids are not in order) and a lease.
  KvTarget Admit(const std::string& endpoint, uint64_t request_id, int num_tokens,
                 absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    std::vector<int> blocks = *pool_.Allocate(BlocksFor(num_tokens, cache_.block_size()));
    std::shuffle(blocks.begin(), blocks.end(), rng_);
    tables_[request_id] = blocks;
    Lease lease = *leases_.Create(std::move(blocks), num_tokens, cache_.n_layers(), deadline);
    return KvTarget{endpoint, lease.id, lease.generation, lease.capability};
  }

  absl::Status CheckHeader(const KvChunkHeader& h) override {
    absl::MutexLock lock(&mu_);
    ++checked_headers_;
    absl::StatusOr<std::span<const int>> blocks = leases_.CheckChunk(h);
    if (!blocks.ok()) return blocks.status();
    return CheckKvChunk(h, cache_.spec());
  }

  absl::Status Accept(const KvChunkHeader& h, std::span<const char> payload) override {
    absl::MutexLock lock(&mu_);
    ++accepted_calls_;
    absl::StatusOr<std::span<const int>> blocks = leases_.CheckChunk(h);
    if (!blocks.ok()) return blocks.status();
    if (absl::Status s = ScatterKv(payload, h, *blocks, &cache_); !s.ok()) return s;
    return leases_.OnChunk(h);
  }

  bool IsComplete(uint64_t lease_id) {
    absl::MutexLock lock(&mu_);
    return leases_.IsComplete(lease_id);
  }
  bool Holds(uint64_t request_id, int num_tokens, int seed) {
    absl::MutexLock lock(&mu_);
    return HoldsPrompt(cache_, tables_[request_id], num_tokens, seed);
  }
  absl::Status Release(uint64_t lease_id) {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::vector<int>> blocks = leases_.Release(lease_id);
    if (!blocks.ok()) return blocks.status();
    return pool_.Free(*blocks);
  }
  // Expires and frees; returns how many leases expired.
  int Expire(absl::Time now) {
    absl::MutexLock lock(&mu_);
    std::vector<ExpiredLease> expired = leases_.Expire(now);
    for (const ExpiredLease& e : expired) {
      if (!pool_.Free(e.blocks).ok()) std::abort();
    }
    return static_cast<int>(expired.size());
  }
  // The leak check: no lease live, no block in use.
  bool Clean() {
    absl::MutexLock lock(&mu_);
    return leases_.size() == 0 && pool_.NoneInUse();
  }
  int accepted_calls() {
    absl::MutexLock lock(&mu_);
    return accepted_calls_;
  }
  int checked_headers() {
    absl::MutexLock lock(&mu_);
    return checked_headers_;
  }

 private:
  absl::Mutex mu_;
  KvCache cache_;
  BlockPool pool_;
  LeaseTable leases_;
  std::map<uint64_t, std::vector<int>> tables_;
  std::mt19937 rng_{1234};
  int accepted_calls_ = 0;
  int checked_headers_ = 0;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_KV_TRANSFER_KV_TEST_UTIL_H_
