#include "kv_transfer/lease_table.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "security/cluster_secret.h"

namespace tandem {

uint32_t LeaseTable::NextGeneration() {
  // 0 is never issued, so a zero-initialized target cannot match a live lease.
  if (next_generation_ == 0) next_generation_ = 1;
  return next_generation_++;
}

absl::StatusOr<Lease> LeaseTable::Create(std::vector<int> blocks, int num_tokens, int n_layers,
                                         absl::Time deadline) {
  if (n_layers <= 0) return absl::InvalidArgumentError("lease: n_layers must be positive");
  return Create(std::move(blocks), num_tokens, std::vector<int>(n_layers, 0), deadline);
}

absl::StatusOr<Lease> LeaseTable::Create(std::vector<int> blocks, int num_tokens,
                                         std::vector<int> layer_from, absl::Time deadline) {
  if (num_tokens <= 0) return absl::InvalidArgumentError("lease: num_tokens must be positive");
  if (layer_from.empty()) return absl::InvalidArgumentError("lease: n_layers must be positive");
  for (int f : layer_from) {
    if (f < 0 || f >= num_tokens) {
      return absl::InvalidArgumentError(
          absl::StrFormat("lease: a layer's first token %d outside [0, %d)", f, num_tokens));
    }
  }
  Lease lease;
  do {
    const std::string r = RandomBytes(sizeof(lease.id));
    std::memcpy(&lease.id, r.data(), sizeof(lease.id));
  } while (lease.id == 0 || leases_.contains(lease.id));
  lease.generation = NextGeneration();
  lease.capability = RandomBytes(kKvCapabilityBytes);
  Entry e;
  e.generation = lease.generation;
  e.capability = lease.capability;
  e.blocks = std::move(blocks);
  e.num_tokens = static_cast<uint32_t>(num_tokens);
  e.deadline = deadline;
  e.received.resize(layer_from.size());
  e.layer_from.assign(layer_from.begin(), layer_from.end());
  leases_.emplace(lease.id, std::move(e));
  return lease;
}

absl::StatusOr<std::span<const int>> LeaseTable::CheckChunk(const KvChunkHeader& h) const {
  const uint64_t lease_id = h.lease_id;
  const uint32_t layer = h.layer, token_start = h.token_start, token_count = h.token_count;
  auto it = leases_.find(lease_id);
  // One answer for an unknown lease, a stale generation and a wrong capability: a writer
  // without the lease's capability learns nothing about which leases exist.
  if (it == leases_.end() || h.generation != it->second.generation ||
      !ConstantTimeEquals(h.capability, it->second.capability)) {
    return absl::AbortedError(
        "kv: refused: no live lease matches the chunk's lease, generation and capability");
  }
  const Entry& e = it->second;
  if (layer >= e.received.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("lease %d: layer %d outside [0, %d)", lease_id, layer, e.received.size()));
  }
  const uint32_t from = e.layer_from[layer];
  if (token_count == 0 || token_start < from ||
      uint64_t{token_start} + token_count > e.num_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "lease %d: tokens [%d, %d) of layer %d outside [%d, %d) (the prompt, from the layer's "
        "window)",
        lease_id, token_start, uint64_t{token_start} + token_count, layer, from, e.num_tokens));
  }
  if (e.layers_done == static_cast<int64_t>(e.received.size())) {
    return absl::FailedPreconditionError(absl::StrFormat("lease %d is already complete", lease_id));
  }
  return std::span<const int>(e.blocks);
}

absl::Status LeaseTable::OnChunk(const KvChunkHeader& h) {
  absl::StatusOr<std::span<const int>> ok = CheckChunk(h);
  if (!ok.ok()) return ok.status();
  Entry& e = leases_.find(h.lease_id)->second;
  auto& ranges = e.received[h.layer];
  const uint32_t from = e.layer_from[h.layer];
  const bool was_done =
      ranges.size() == 1 && ranges[0].first == from && ranges[0].second == e.num_tokens;
  // Merge [start, end) with every range it overlaps or touches.
  uint32_t start = h.token_start;
  uint32_t end = h.token_start + h.token_count;
  auto first = std::lower_bound(ranges.begin(), ranges.end(), start,
                                [](const auto& r, uint32_t s) { return r.second < s; });
  auto last = first;
  while (last != ranges.end() && last->first <= end) {
    start = std::min(start, last->first);
    end = std::max(end, last->second);
    ++last;
  }
  first = ranges.erase(first, last);
  ranges.insert(first, {start, end});
  const bool done =
      ranges.size() == 1 && ranges[0].first == from && ranges[0].second == e.num_tokens;
  if (done && !was_done) ++e.layers_done;
  return absl::OkStatus();
}

bool LeaseTable::IsComplete(uint64_t lease_id) const {
  auto it = leases_.find(lease_id);
  return it != leases_.end() &&
         it->second.layers_done == static_cast<int64_t>(it->second.received.size());
}

absl::StatusOr<std::vector<int>> LeaseTable::Release(uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    return absl::NotFoundError(absl::StrFormat("lease %d is not live", lease_id));
  }
  std::vector<int> blocks = std::move(it->second.blocks);
  leases_.erase(it);
  return blocks;
}

std::vector<ExpiredLease> LeaseTable::Expire(absl::Time now) {
  std::vector<ExpiredLease> out;
  for (auto it = leases_.begin(); it != leases_.end();) {
    const Entry& e = it->second;
    if (e.deadline <= now && e.layers_done < static_cast<int64_t>(e.received.size())) {
      out.push_back({Lease{it->first, e.generation, e.capability}, std::move(it->second.blocks)});
      leases_.erase(it++);
    } else {
      ++it;
    }
  }
  // Deterministic order for the owner's logs and tests.
  std::sort(out.begin(), out.end(),
            [](const ExpiredLease& a, const ExpiredLease& b) { return a.lease.id < b.lease.id; });
  return out;
}

}  // namespace tandem
