// KV transfer interfaces: a prefill worker's KvSender ships chunks (kv_transfer/wire.h) to the
// KvReceiver of a decode worker, which hands each verified chunk to the decode's KvSink; the
// sink's verdict travels back as an ACK and completes the sender's bookkeeping.
//
// Transports, chosen by kind: "tcp" (host memory over persistent sockets) and "local"
// (in-process, for colocated mode and tests). Endpoints: "tcp://HOST:PORT", "local://NAME".
// "nccl" (GPU to GPU, kv_transfer/nccl/nccl_transport.h) is made by its own factories: it needs
// a communicator library and a bootstrap RPC; its endpoint "nccl://HOST:PORT" names the decode
// worker's gRPC address, where the NcclBootstrap RPC is served.
#ifndef TANDEM_KV_TRANSFER_KV_TRANSFER_H_
#define TANDEM_KV_TRANSFER_KV_TRANSFER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kv_transfer/kv_auth.h"
#include "kv_transfer/wire.h"

namespace tandem {

// Where one request's KV goes: the decode worker's receiver and the lease it admitted.
struct KvTarget {
  std::string endpoint;  // "tcp://127.0.0.1:PORT", "local://NAME" or "nccl://HOST:PORT"
  uint64_t lease_id = 0;
  uint32_t generation = 0;
  std::string capability;  // kKvCapabilityBytes random bytes: what lets a writer in
};
bool operator==(const KvTarget& a, const KvTarget& b);

// Implemented by the decode worker. Called concurrently from the receiver's I/O threads with
// chunks whose header and checksum are already verified. Validates the lease (LeaseTable) and
// scatters the payload (ScatterKv); the returned status is the ACK the sender sees.
class KvSink {
 public:
  virtual ~KvSink() = default;
  // The verdict on a DATA frame's header alone, before its payload is read or any memory is
  // allocated for it: a live lease with this capability, a token range inside it, the width and
  // dtype of the cache. Transports skip the payload of a refused chunk (answering the refusal),
  // so a header that announces more than its lease can hold costs no memory.
  virtual absl::Status CheckHeader(const KvChunkHeader& h) = 0;
  virtual absl::Status Accept(const KvChunkHeader& h, std::span<const char> payload) = 0;
  // Transports without an ACK (nccl) report here a chunk that arrived but could not be
  // delivered (Accept refused it, a checksum or copy failed, its communicator broke mid-payload):
  // the prefill saw its send complete, so the decode fails the lease's request itself.
  virtual void Undeliverable(const KvChunkHeader& h, const absl::Status& why) {}
};

struct KvReceiverOptions {
  uint64_t max_frame_bytes = kDefaultMaxFrameBytes;
  // A peer that stops mid-frame for this long is disconnected (tcp).
  absl::Duration io_timeout = absl::Seconds(30);
  // tcp: who may connect (required) and how long a new connection may take to prove it.
  KvAuth auth;
  absl::Duration handshake_timeout = absl::Seconds(5);
  // tcp: connections at once, in total and per peer host (each has a thread). Prefill workers
  // hold one connection per decode worker, so these bound what strangers can hold.
  int max_connections = 256;
  int max_connections_per_peer = 32;
};

class KvReceiver {
 public:
  virtual ~KvReceiver() = default;
  // What a KvTarget names to reach this receiver, e.g. "tcp://127.0.0.1:40123".
  virtual std::string endpoint() const = 0;
  // Stops accepting, closes every connection and waits for running sink calls; the sink is not
  // called after it returns. Idempotent; also run by the destructor.
  virtual void Shutdown() = 0;
};

struct KvSenderOptions {
  uint64_t max_frame_bytes = kDefaultMaxFrameBytes;
  // tcp: the credentials proven to every decode worker's receiver (required).
  KvAuth auth;
  absl::Duration connect_timeout = absl::Seconds(5);
  // A connection that makes no progress writing for this long is declared lost (tcp).
  absl::Duration io_timeout = absl::Seconds(30);
  // Bound on payload bytes queued and not yet written; Send beyond it is RESOURCE_EXHAUSTED.
  uint64_t max_queued_bytes = uint64_t{4} << 30;

  // Fault injection for tests, by 0-based index of the chunk in Send order across this sender
  // (-1: none). Corrupt flips a payload byte after the checksum is computed, so the receiver
  // reports DATA_LOSS; drop never sends the chunk, so its lease never completes.
  int64_t corrupt_chunk_index = -1;
  int64_t drop_chunk_index = -1;
  // Every N-th chunk (0: none): the soak test's steady trickle of faults.
  int64_t corrupt_every = 0;
  int64_t drop_every = 0;
};

// Thread-safe. Bookkeeping is per KvTarget (endpoint, lease, generation): the same lease id may
// live on two decode workers, or twice on one after a resume.
class KvSender {
 public:
  virtual ~KvSender() = default;

  // Queues one chunk for `target` and returns at once; `header`'s lease_id and generation are
  // taken from `target`. INVALID_ARGUMENT for a malformed header or endpoint of another kind,
  // RESOURCE_EXHAUSTED past max_queued_bytes, and the target's first error if it already
  // failed (so the prefill stops sending to a lease the decode refused).
  virtual absl::Status Send(const KvTarget& target, const KvChunkHeader& header,
                            std::string payload) = 0;

  // OK once every chunk sent to `target` so far was acknowledged OK; otherwise the first error:
  // the sink's refusal, DATA_LOSS for a checksum mismatch, UNAVAILABLE for a lost connection,
  // DEADLINE_EXCEEDED when `deadline` passes first. NOT_FOUND if nothing was sent to `target`.
  virtual absl::Status Wait(const KvTarget& target, absl::Time deadline) = 0;

  // Drops the bookkeeping of `target`; its queued chunks are not sent and late ACKs ignored.
  virtual void Forget(const KvTarget& target) = 0;

  // Targets with bookkeeping (Forget not yet called): the leak check.
  virtual size_t num_targets() const = 0;

  // Fails everything pending with CANCELLED, closes connections, joins threads. Idempotent;
  // also run by the destructor.
  virtual void Shutdown() = 0;
};

// kind: "tcp" or "local".
absl::StatusOr<std::unique_ptr<KvSender>> MakeKvSender(std::string_view kind,
                                                       const KvSenderOptions& options = {});
// tcp: `address` is "HOST:PORT" to listen on (port 0 picks a free one); local: a name unique in
// the process. `sink` must outlive the receiver's Shutdown.
absl::StatusOr<std::unique_ptr<KvReceiver>> MakeKvReceiver(std::string_view kind,
                                                           std::string_view address, KvSink* sink,
                                                           const KvReceiverOptions& options = {});

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_KV_TRANSFER_H_
