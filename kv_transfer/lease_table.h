// LeaseTable: the decode worker's record of the KV transfers it is waiting for. Pure data
// structure: no threads, no I/O, time passed in. The owner serializes access (and keeps the
// lock held while scattering a chunk, so a concurrent Release cannot hand the blocks to another
// request mid-copy).
//
// A lease is named by a random 64-bit id and guarded by a random 128-bit capability, both drawn
// from the system's cryptographic source at Create and handed to the prefill worker in the KV
// target (kv_transfer/kv_transfer.h). A chunk must name a live lease with its capability and
// generation (a table-wide increasing counter); otherwise it is refused with one answer whether
// or not the lease exists, so neither a stranger nor a late writer of an earlier attempt (a
// request resumed here gets a new lease) can write into blocks that belong to someone else.
//
// A chunk covers tokens [token_start, token_start + token_count) of one layer. Duplicate or
// overlapping chunks are accepted (idempotent: the same prompt produces the same KV) until the
// lease is complete; after that every chunk is refused (FAILED_PRECONDITION), because the decode
// may already be reading those blocks.
#ifndef TANDEM_KV_TRANSFER_LEASE_TABLE_H_
#define TANDEM_KV_TRANSFER_LEASE_TABLE_H_

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kv_transfer/wire.h"

namespace tandem {

struct Lease {
  uint64_t id = 0;
  uint32_t generation = 0;
  std::string capability;  // kKvCapabilityBytes
};

struct ExpiredLease {
  Lease lease;
  std::vector<int> blocks;  // for the owner to free
};

class LeaseTable {
 public:
  // Opens a lease expecting `num_tokens` tokens of each of `n_layers` layers into `blocks`
  // before `deadline`. INVALID_ARGUMENT if num_tokens or n_layers is not positive.
  absl::StatusOr<Lease> Create(std::vector<int> blocks, int num_tokens, int n_layers,
                               absl::Time deadline);
  // The same, expecting layer l's tokens [layer_from[l], num_tokens) only (a sliding-window
  // layer's window: KvCacheSpec::KeepFrom); chunks before that are refused.
  absl::StatusOr<Lease> Create(std::vector<int> blocks, int num_tokens, std::vector<int> layer_from,
                               absl::Time deadline);

  // Validates a chunk without recording it and returns the lease's blocks (valid until the
  // next call that mutates the table). ABORTED when no live lease has the chunk's id,
  // generation and capability (the same answer for each), INVALID_ARGUMENT for a layer or token
  // range outside the prompt, FAILED_PRECONDITION once the lease is complete.
  absl::StatusOr<std::span<const int>> CheckChunk(const KvChunkHeader& h) const;

  // CheckChunk, then records the range as received.
  absl::Status OnChunk(const KvChunkHeader& h);

  // True when every token of every layer has been received; false for unknown leases.
  bool IsComplete(uint64_t lease_id) const;

  // Ends a lease and returns its blocks to free. NOT_FOUND if it is not live (so a second
  // Release, or a Release after Expire, frees nothing).
  absl::StatusOr<std::vector<int>> Release(uint64_t lease_id);

  // Ends every incomplete lease whose deadline is <= now and returns them with their blocks.
  // Complete leases are the decode's to release and never expire.
  std::vector<ExpiredLease> Expire(absl::Time now);

  size_t size() const { return leases_.size(); }

 private:
  struct Entry {
    uint32_t generation = 0;
    std::string capability;
    std::vector<int> blocks;
    uint32_t num_tokens = 0;
    absl::Time deadline;
    // Per layer: received token ranges [start, end), sorted, disjoint and not touching.
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> received;
    std::vector<uint32_t> layer_from;  // per layer: the first token expected
    int64_t layers_done = 0;           // layers whose single range is [layer_from, num_tokens)
  };

  uint32_t NextGeneration();

  absl::flat_hash_map<uint64_t, Entry> leases_;
  uint32_t next_generation_ = 1;
};

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_LEASE_TABLE_H_
