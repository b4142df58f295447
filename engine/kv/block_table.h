// A sequence's block table when a model's layers keep their KV in groups. Pure functions over
// a table and a BlockPool: no tensors, threads or I/O.
//
// A model that mixes sliding-window and full-attention layers (Gemma 3: five sliding layers to
// one global) keeps its KV in groups of equally many layers, all drawing on one BlockPool (the
// hybrid layout of vLLM v1): a block holds one group's layers for block_size tokens, and a
// sequence has a block per group for each block_size tokens ("logical block"). Every other model
// has one group holding every layer, which is the plain paged cache.
//
// The table is flat, interleaved by logical block: the block of group g for positions
// [j * block_size, (j + 1) * block_size) is table[j * n_groups + g]. A query at position p of a
// sliding group with window W reads positions (p - W, p] only, so once no query at or after the
// next position can reach a block, it goes back to the pool and its entry becomes kNoBlock; a
// sequence never takes such a block in the first place (the KV a decode worker receives for a
// sliding layer starts at the window). Full-attention groups hold every block. A Gemma 3 decode
// worker thus holds about a sixth of the KV of a full cache for a long sequence.
#ifndef TANDEM_ENGINE_KV_BLOCK_TABLE_H_
#define TANDEM_ENGINE_KV_BLOCK_TABLE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv/block_pool.h"

namespace tandem {

// The entry of a block a sequence no longer holds (or never took).
inline constexpr int kNoBlock = -1;

struct KvTableLayout {
  int block_size = 16;
  // Per group: 0 for full attention, else the sliding window (positions a query reads, itself
  // included). Empty: one full-attention group.
  std::vector<int> group_window;

  int n_groups() const { return group_window.empty() ? 1 : static_cast<int>(group_window.size()); }
  int window(int g) const { return group_window.empty() ? 0 : group_window[g]; }
  bool windowed() const;  // some group frees blocks behind its window
  // Logical blocks covering positions [0, tokens).
  int LogicalBlocks(int tokens) const { return (tokens + block_size - 1) / block_size; }
  // The first position group g still reads for queries at `pos` and after.
  int KeepFrom(int g, int pos) const;
  // The first logical block group g holds for queries at `pos` and after.
  int FirstLive(int g, int pos) const { return KeepFrom(g, pos) / block_size; }
  // Pool blocks a table holds to compute positions up to `end` (exclusive) with queries from
  // `pos` (<= end) on: what a sequence of `end` tokens whose next query is `pos` costs.
  int64_t BlocksHeld(int pos, int end) const;
  // Pool blocks of a sequence of `tokens` tokens about to compute its last one: its cost at
  // that length.
  int64_t BlocksAt(int tokens) const { return BlocksHeld(tokens > 0 ? tokens - 1 : 0, tokens); }
  // The most pool blocks a sequence holds at any length up to `tokens` while it decodes one
  // token a step (BlocksAt of every length up to `tokens` is at most this): a sliding group's
  // cost stops growing at its window, within one block.
  int64_t PeakBlocks(int64_t tokens) const;
  // The longest sequence (in tokens) whose PeakBlocks fits in `num_blocks`.
  int64_t TokensIn(int64_t num_blocks) const;
  // Table entries of a sequence of `tokens` tokens.
  int Entries(int tokens) const { return LogicalBlocks(tokens) * n_groups(); }
};

// Blocks GrowTable(layout, table, pos, end) would take.
int MissingBlocks(const KvTableLayout& layout, std::span<const int> table, int pos, int end);

// Gives `table` every block a step computing positions [pos, end) reads or writes: each full
// group's blocks of [0, end), each sliding group's from its window for `pos` on. Entries below
// a window stay kNoBlock. RESOURCE_EXHAUSTED, with nothing taken, when the pool is short.
absl::Status GrowTable(const KvTableLayout& layout, BlockPool* pool, std::vector<int>* table,
                       int pos, int end);

// Frees the blocks of sliding groups that no query at `pos` or after reads (their entries
// become kNoBlock). Returns how many were freed.
int TrimTable(const KvTableLayout& layout, BlockPool* pool, std::vector<int>* table, int pos);

// Frees the blocks of logical blocks past `tokens` tokens and shortens the table.
void ShrinkTable(const KvTableLayout& layout, BlockPool* pool, std::vector<int>* table, int tokens);

// Frees every block of the table and empties it.
void FreeTable(BlockPool* pool, std::vector<int>* table);

// Blocks the table holds (its entries other than kNoBlock).
int LiveBlocks(std::span<const int> table);

// Group g's blocks, by logical block (kNoBlock where it holds none).
std::vector<int> GroupTable(const KvTableLayout& layout, std::span<const int> table, int g);

// The prefix-cache hash of group g's block for the full-block content `hash`
// (HashBlockTokens): `hash` itself for group 0, so a one-group cache keys blocks as before.
uint64_t GroupBlockHash(uint64_t hash, int g);

// The table of a fresh cache that gives a sequence of `tokens` tokens blocks 0, 1, 2, ...
std::vector<int> ContiguousTable(const KvTableLayout& layout, int tokens);

}  // namespace tandem

#endif  // TANDEM_ENGINE_KV_BLOCK_TABLE_H_
