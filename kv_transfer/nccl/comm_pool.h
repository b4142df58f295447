// Communicators per peer, for the prefill side of the NCCL KV transport. A plain data structure
// (no threads, no locking: its owner, NcclKvSender, guards it): pick a communicator for a peer,
// add a freshly bootstrapped one, invalidate a broken one, evict idle ones.
//
// A peer gets up to max_comms_per_peer communicators: transfers on one communicator run one
// after another (NCCL orders operations on its stream), so a second one lets two transfers to
// the same decode worker overlap. Eviction and invalidation use Abort (ncclCommAbort), which
// never waits for the peer.
#ifndef TANDEM_KV_TRANSFER_NCCL_COMM_POOL_H_
#define TANDEM_KV_TRANSFER_NCCL_COMM_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kv_transfer/nccl/communicator.h"

namespace tandem {

struct NcclCommPoolOptions {
  int max_comms_per_peer = 2;
  int max_comms = 64;  // over all peers
  // A communicator with no transfer for this long is evicted.
  absl::Duration idle_timeout = absl::Minutes(5);
};

class NcclCommPool {
 public:
  struct Entry {
    uint64_t id = 0;
    std::string peer;
    std::unique_ptr<Communicator> comm;
    int active = 0;  // transfers queued or running on it (maintained by the owner)
    absl::Time last_used;
  };

  explicit NcclCommPool(const NcclCommPoolOptions& options) : options_(options) {}
  ~NcclCommPool() { AbortAll(); }

  // The communicator a new transfer to `peer` should use: an idle one of that peer, else a
  // fresh one (nullptr: the caller bootstraps one and calls Add) while the peer and the pool
  // have room, else the peer's least loaded one. RESOURCE_EXHAUSTED when the pool is full of
  // busy communicators of other peers.
  absl::StatusOr<Entry*> Pick(const std::string& peer);

  // Takes a bootstrapped communicator; first evicts idle communicators, least recently used
  // first, to stay within max_comms.
  Entry* Add(const std::string& peer, std::unique_ptr<Communicator> comm, absl::Time now);

  Entry* Find(uint64_t id);
  // Aborts and removes (a broken or timed-out communicator). No-op for an unknown id.
  void Invalidate(uint64_t id);
  // Aborts and removes communicators idle since before now - idle_timeout; returns how many.
  int EvictIdle(absl::Time now);
  void AbortAll();

  std::vector<Entry*> entries();
  size_t size() const { return entries_.size(); }
  size_t size(const std::string& peer) const;
  uint64_t bootstraps() const { return next_id_ - 1; }

 private:
  void EvictLruIdle();

  const NcclCommPoolOptions options_;
  uint64_t next_id_ = 1;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Entry>> entries_;
};

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_NCCL_COMM_POOL_H_
