// Pieces every KV transport shares: endpoint parsing, the sender's per-target bookkeeping and
// fault plan, and the receiver's verify-then-deliver step. Internal to kv_transfer/.
#ifndef TANDEM_KV_TRANSFER_TRANSPORT_COMMON_H_
#define TANDEM_KV_TRANSFER_TRANSPORT_COMMON_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kv_transfer/kv_transfer.h"
#include "kv_transfer/wire.h"

namespace tandem {

struct KvEndpoint {
  std::string kind;  // "tcp", "local" or "nccl"
  std::string host;  // tcp, nccl
  int port = 0;      // tcp, nccl: in [0, 65535]
  std::string name;  // local; nccl: "HOST:PORT" as written
};
// Parses "tcp://HOST:PORT", "local://NAME" or "nccl://HOST:PORT"; INVALID_ARGUMENT otherwise.
absl::StatusOr<KvEndpoint> ParseKvEndpoint(std::string_view endpoint);
// Parses "HOST:PORT" (a receiver's listen address).
absl::StatusOr<KvEndpoint> ParseTcpAddress(std::string_view address);

// Bookkeeping of one target on the sender.
struct KvTargetState {
  int64_t pending = 0;  // chunks sent and not yet acknowledged (or dropped by fault injection)
  absl::Status first_error;
  bool forgotten = false;
};

enum class KvFault { kNone, kCorrupt, kDrop };

// A chunk accepted by Send, on its way to a transport queue.
struct KvOutgoingChunk {
  std::shared_ptr<KvTargetState> state;
  KvChunkHeader chunk;
  std::string payload;
  KvFault fault = KvFault::kNone;
};

// Per-target counters, the queued-bytes bound and the fault plan; the Wait/Forget half of
// KvSender. Thread-safe.
class KvSendTracker {
 public:
  explicit KvSendTracker(const KvSenderOptions& options) : options_(options) {}

  // Validates the chunk against the options, fills its lease fields from `target`, counts it
  // as pending and as queued bytes, and decides its fault.
  absl::StatusOr<KvOutgoingChunk> Begin(const KvTarget& target, const KvChunkHeader& header,
                                        std::string payload);
  // Begin for a sender of `kind` ("tcp", "local"): `target`'s endpoint must be of that kind.
  // `chunk` is empty for a chunk that fault injection drops (already accounted for).
  struct Started {
    KvEndpoint endpoint;
    std::optional<KvOutgoingChunk> chunk;
  };
  absl::StatusOr<Started> BeginSend(std::string_view kind, const KvTarget& target,
                                    const KvChunkHeader& header, std::string payload);
  // A begun chunk that will not be queued (the sender is shutting down): accounted for, its
  // target failed with `why`, which is returned.
  absl::Status Abandon(const KvOutgoingChunk& chunk, absl::Status why);
  // The chunk's payload left the queue (written, delivered, or abandoned).
  void Dequeued(uint64_t bytes);
  // The chunk's outcome; the first error sticks.
  void Complete(KvTargetState& state, const absl::Status& status);
  // Non-OK when a queued chunk should not be sent: its target was forgotten or already failed.
  absl::Status SkipReason(const KvTargetState& state) const;

  absl::Status Wait(const KvTarget& target, absl::Time deadline);
  void Forget(const KvTarget& target);
  size_t num_targets() const;

 private:
  using Key = std::tuple<std::string, uint64_t, uint32_t>;
  static Key KeyOf(const KvTarget& t) { return {t.endpoint, t.lease_id, t.generation}; }

  const KvSenderOptions options_;
  std::atomic<int64_t> next_chunk_index_{0};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, std::shared_ptr<KvTargetState>> targets_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// Receiver side: checks the payload CRC (DATA_LOSS on mismatch) and hands the chunk to the sink.
absl::Status DeliverKvChunk(KvSink* sink, const KvFrameHeader& h, std::span<const char> payload);

// Applies KvFault::kCorrupt: flips one payload byte (after the CRC was taken).
void CorruptKvPayload(std::string* payload);

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_TRANSPORT_COMMON_H_
