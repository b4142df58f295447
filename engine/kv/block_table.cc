#include "engine/kv/block_table.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem {

bool KvTableLayout::windowed() const {
  return std::any_of(group_window.begin(), group_window.end(), [](int w) { return w > 0; });
}

int KvTableLayout::KeepFrom(int g, int pos) const {
  const int w = window(g);
  return w > 0 ? std::max(0, pos - w + 1) : 0;
}

int64_t KvTableLayout::BlocksHeld(int pos, int end) const {
  const int logical = LogicalBlocks(end);
  int64_t n = 0;
  for (int g = 0; g < n_groups(); ++g) n += std::max(0, logical - FirstLive(g, pos));
  return n;
}

int64_t KvTableLayout::PeakBlocks(int64_t tokens) const {
  // A sliding group's cost grows with the sequence until its window is full, then stays within
  // one block of its peak: past the window, t - W = a * bs + r holds a + ceil((r + W) / bs) - a
  // blocks, the most (at r = bs - 1) ceil((W + bs - 1) / bs); a shorter sequence holds fewer. So
  // the cost is the sum over groups of min(logical blocks, the group's peak), nondecreasing.
  const int64_t logical = (tokens + block_size - 1) / block_size;
  int64_t c = 0;
  for (int g = 0; g < n_groups(); ++g) {
    const int64_t peak =
        window(g) == 0 ? logical : (int64_t{window(g)} + 2 * int64_t{block_size} - 2) / block_size;
    c += std::min(logical, peak);
  }
  return c;
}

int64_t KvTableLayout::TokensIn(int64_t num_blocks) const {
  // PeakBlocks is nondecreasing: bisection. With a full-attention group it grows without bound.
  const bool bounded = group_window.empty() ||
                       std::find(group_window.begin(), group_window.end(), 0) != group_window.end();
  constexpr int64_t kUnbounded = int64_t{1} << 40;
  int64_t lo = 0, hi = bounded ? num_blocks * block_size + 1 : kUnbounded;
  if (PeakBlocks(hi) <= num_blocks) return hi;
  while (hi - lo > 1) {  // PeakBlocks(lo) <= num_blocks < PeakBlocks(hi)
    const int64_t mid = lo + (hi - lo) / 2;
    (PeakBlocks(mid) <= num_blocks ? lo : hi) = mid;
  }
  return lo;
}

namespace {

// The first logical block of group g that a step computing from `pos` on may lack: a full group
// holds every block below its table's length (it only ever grows from 0 and shrinks from the
// end), a sliding group may lack any block from its window on. Keeps the per-step work to the
// blocks a step adds, not the sequence's length.
int FirstToFill(const KvTableLayout& layout, std::span<const int> table, int g, int pos) {
  return layout.window(g) == 0 ? static_cast<int>(table.size()) / layout.n_groups()
                               : layout.FirstLive(g, pos);
}

// Calls fn(entry index) for every entry of a block GrowTable(pos, end) would take, in table
// order.
template <typename Fn>
void ForEachMissing(const KvTableLayout& layout, std::span<const int> table, int pos, int end,
                    Fn fn) {
  const int n = layout.n_groups();
  std::vector<int> first(n);
  for (int g = 0; g < n; ++g) first[g] = FirstToFill(layout, table, g, pos);
  const int from = *std::min_element(first.begin(), first.end());
  for (int j = from; j < layout.LogicalBlocks(end); ++j) {
    for (int g = 0; g < n; ++g) {
      const size_t i = static_cast<size_t>(j) * n + g;
      if (j >= first[g] && (i >= table.size() || table[i] == kNoBlock)) fn(i);
    }
  }
}

}  // namespace

int MissingBlocks(const KvTableLayout& layout, std::span<const int> table, int pos, int end) {
  int missing = 0;
  ForEachMissing(layout, table, pos, end, [&](size_t) { ++missing; });
  return missing;
}

absl::Status GrowTable(const KvTableLayout& layout, BlockPool* pool, std::vector<int>* table,
                       int pos, int end) {
  const int missing = MissingBlocks(layout, *table, pos, end);
  if (missing == 0) return absl::OkStatus();
  auto fresh = pool->Allocate(missing);
  if (!fresh.ok()) return fresh.status();
  // The entries to fill, found before the table grows (a grown full group's new entries are
  // kNoBlock until filled).
  std::vector<size_t> entries;
  ForEachMissing(layout, *table, pos, end, [&](size_t i) { entries.push_back(i); });
  const size_t size = static_cast<size_t>(layout.Entries(end));
  if (table->size() < size) table->resize(size, kNoBlock);
  for (size_t k = 0; k < entries.size(); ++k) (*table)[entries[k]] = (*fresh)[k];
  return absl::OkStatus();
}

int TrimTable(const KvTableLayout& layout, BlockPool* pool, std::vector<int>* table, int pos) {
  if (!layout.windowed()) return 0;
  const int n = layout.n_groups();
  const int logical = static_cast<int>(table->size()) / n;
  std::vector<int> freed;
  for (int g = 0; g < n; ++g) {
    if (layout.window(g) == 0) continue;
    // A sliding group's blocks below its window are let go from the bottom up, so walking down
    // from the window stops at the first one already gone.
    for (int j = std::min(layout.FirstLive(g, pos), logical) - 1; j >= 0; --j) {
      int& e = (*table)[static_cast<size_t>(j) * n + g];
      if (e == kNoBlock) break;
      freed.push_back(e);
      e = kNoBlock;
    }
  }
  pool->Free(freed).IgnoreError();  // blocks the table held: cannot fail
  return static_cast<int>(freed.size());
}

void ShrinkTable(const KvTableLayout& layout, BlockPool* pool, std::vector<int>* table,
                 int tokens) {
  const size_t keep = static_cast<size_t>(layout.Entries(tokens));
  if (table->size() <= keep) return;
  std::vector<int> freed;
  for (size_t i = keep; i < table->size(); ++i) {
    if ((*table)[i] != kNoBlock) freed.push_back((*table)[i]);
  }
  table->resize(keep);
  pool->Free(freed).IgnoreError();  // blocks the table held: cannot fail
}

void FreeTable(BlockPool* pool, std::vector<int>* table) {
  std::vector<int> held;
  held.reserve(table->size());
  for (int b : *table) {
    if (b != kNoBlock) held.push_back(b);
  }
  pool->Free(held).IgnoreError();  // blocks the table held: cannot fail
  table->clear();
}

int LiveBlocks(std::span<const int> table) {
  return static_cast<int>(std::count_if(table.begin(), table.end(), [](int b) { return b >= 0; }));
}

std::vector<int> GroupTable(const KvTableLayout& layout, std::span<const int> table, int g) {
  const size_t n = static_cast<size_t>(layout.n_groups());
  std::vector<int> out;
  out.reserve(table.size() / n + 1);
  for (size_t i = static_cast<size_t>(g); i < table.size(); i += n) out.push_back(table[i]);
  return out;
}

uint64_t GroupBlockHash(uint64_t hash, int g) {
  if (g == 0) return hash;
  const int group[1] = {g};
  return HashBlockTokens(hash, group);
}

std::vector<int> ContiguousTable(const KvTableLayout& layout, int tokens) {
  std::vector<int> table(static_cast<size_t>(layout.Entries(tokens)));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int>(i);
  return table;
}

}  // namespace tandem
