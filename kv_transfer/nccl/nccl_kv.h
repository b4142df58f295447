// The NCCL KV transport: NcclKvSender on the prefill worker, NcclKvReceiver on the decode worker,
// both written against kv_transfer/nccl/communicator.h so the whole state machine runs on the CPU
// against a fake communicator in tests.
//
// Bootstrap (one 2-rank communicator per (prefill, decode) pair, several per pair in the pool):
//   1. the prefill's sender needs a communicator to decode worker D and the pool has none free;
//   2. it calls D's NcclBootstrap RPC (proto/tandem/v1/worker.proto), which runs
//      NcclKvReceiver::Bootstrap: D creates an ncclUniqueId, starts its rank 0 (non-blocking
//      init) and answers the id;
//   3. the sender starts rank 1 with that id; both inits complete once both ranks joined.
// The RPC is reached through NcclBootstrapFn, so the logic does not depend on gRPC.
//
// Watchdog: each side's progress thread polls every communicator with work. A transfer whose
// deadline passes, or a communicator reporting an asynchronous error, aborts the communicator
// (ncclCommAbort through Communicator::Abort): that transfer fails with DEADLINE_EXCEEDED (or
// UNAVAILABLE with the NCCL error), every other transfer queued on the same communicator fails
// with UNAVAILABLE naming the cause, and the communicator leaves the pool, so the next transfer
// to that peer bootstraps a fresh one. Nothing waits on a peer without a deadline.
#ifndef TANDEM_KV_TRANSFER_NCCL_NCCL_KV_H_
#define TANDEM_KV_TRANSFER_NCCL_NCCL_KV_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kv_transfer/nccl/comm_pool.h"
#include "kv_transfer/nccl/communicator.h"
#include "kv_transfer/nccl/framing.h"
#include "kv_transfer/wire.h"

namespace tandem {

// One layer of a transfer: the chunk header (lease fields filled) and its payload, which must
// stay valid until the transfer completes (device memory with the real communicator).
struct NcclKvLayer {
  KvChunkHeader chunk;
  std::span<const char> payload;
};

// The prefill side of the NcclBootstrap RPC: asks decode worker `peer` for a unique id.
using NcclBootstrapFn = std::function<absl::StatusOr<NcclUniqueId>(const std::string& peer)>;

struct NcclKvOptions {
  NcclCommPoolOptions pool;
  uint64_t max_payload_bytes = kDefaultMaxFrameBytes;
  // Payload CRC32C; only with host-visible payloads (the fake). Both sides must agree.
  bool checksum_payload = true;
  // How often the progress thread polls communicators with work.
  absl::Duration poll_interval = absl::Milliseconds(1);
  // Receiver: once a header arrived, its payload must arrive within this.
  absl::Duration payload_timeout = absl::Seconds(10);
  // Receiver: a communicator with nothing received for this long is aborted (the prefill's
  // pool evicts idle ones sooner: pool.idle_timeout should be shorter).
  absl::Duration receiver_idle_timeout = absl::Minutes(10);
  // Receiver: a communicator whose prefill rank has not joined this long after NcclBootstrap
  // is aborted (the prefill failed between the RPC and its init, or never meant to join).
  absl::Duration receiver_init_timeout = absl::Seconds(60);
  // Receiver: NcclBootstrap beyond this many communicators is RESOURCE_EXHAUSTED (each holds
  // NCCL resources on the GPU; senders keep at most pool.max_comms_per_peer per peer).
  int max_receiver_comms = 256;
};

class NcclKvSender {
 public:
  NcclKvSender(CommunicatorFactory* factory, NcclBootstrapFn bootstrap,
               const NcclKvOptions& options);
  ~NcclKvSender();

  // Queues a transfer of `layers` (in order, one group per layer) to decode worker `peer`,
  // bootstrapping a communicator if the pool has none to use. Returns the transfer id.
  // INVALID_ARGUMENT for an empty peer or layer list or a malformed layer (naming it), the
  // bootstrap's error, FAILED_PRECONDITION after Shutdown.
  //
  // With `on_done`, the transfer is not waited for: `on_done` gets its status once it finished
  // (called on the progress thread or in Shutdown, under the sender's lock: it must not call
  // back into the sender) and Wait(id) is NOT_FOUND. It is not called when Submit fails.
  //
  // With `skip`, asked (under the sender's lock) when the transfer is about to post its first
  // layer: a non-OK status finishes it with that status without sending anything (its target
  // was forgotten or already failed, as KvSendTracker::SkipReason says).
  using DoneFn = std::function<void(const absl::Status&)>;
  using SkipFn = std::function<absl::Status()>;
  absl::StatusOr<uint64_t> Submit(const std::string& peer, std::vector<NcclKvLayer> layers,
                                  absl::Time deadline, DoneFn on_done = nullptr,
                                  SkipFn skip = nullptr);

  // Blocks until transfer `id` finished or `wait_deadline` passes. Once finished, returns its
  // status and forgets it; DEADLINE_EXCEEDED from the wait itself leaves it in place (it still
  // has its own deadline). NOT_FOUND for an unknown id.
  absl::Status Wait(uint64_t id, absl::Time wait_deadline = absl::InfiniteFuture());

  // Aborts every communicator and fails every transfer with CANCELLED; joins the thread.
  void Shutdown();

  // The leak check: transfers not yet returned by Wait, communicators pooled.
  size_t num_transfers() const;
  size_t num_comms() const;
  uint64_t bootstraps() const;
  uint64_t aborts() const;

 private:
  struct Transfer {
    uint64_t id = 0;
    std::string peer;
    uint64_t comm_id = 0;
    std::vector<NcclKvLayer> layers;
    std::vector<KvFrameHeader> prepared;   // per layer, without the seq
    std::vector<NcclHeaderBytes> headers;  // per layer, as posted (must outlive the Send)
    absl::Time deadline;
    size_t next_layer = 0;  // layers posted so far
    bool done = false;
    absl::Status status;
    DoneFn on_done;
    SkipFn skip;
  };
  struct Channel {  // per pooled communicator
    std::deque<std::shared_ptr<Transfer>> queue;
    bool posted = false;  // the head's layer next_layer - 1 is in flight
    uint64_t seq = 0;     // layers sent on this communicator
  };

  void Run();
  void Step(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Aborts the communicator, fails its transfers (the head with `cause`, the others with
  // UNAVAILABLE naming it), drops it from the pool.
  void FailComm(uint64_t comm_id, const absl::Status& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(Transfer& t, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CommunicatorFactory* const factory_;
  const NcclBootstrapFn bootstrap_;
  const NcclKvOptions options_;

  mutable absl::Mutex mu_;
  NcclCommPool pool_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Channel> channels_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_transfer_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t aborts_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Where the decode worker puts received layers.
class NcclKvSink {
 public:
  virtual ~NcclKvSink() = default;
  // The buffer (device staging memory on a GPU) for the payload of `h`, exactly
  // h.payload_length bytes; an error refuses the chunk (its bytes are still received, into a
  // scratch buffer, to keep the stream in step, and then dropped).
  virtual absl::StatusOr<std::span<char>> Destination(const KvChunkHeader& h) = 0;
  // The payload arrived (and matched its CRC when checksums are on): unpack it.
  virtual void Deliver(const KvChunkHeader& h, std::span<const char> payload) = 0;
  // The chunk was refused by Destination, failed its checksum, or its communicator broke
  // after Destination; the decode fails the request's lease. `destination` is what Destination
  // gave (empty when it refused): nothing is written into it any more.
  virtual void Failed(const KvChunkHeader& h, std::span<char> destination,
                      const absl::Status& status) = 0;
};

class NcclKvReceiver {
 public:
  NcclKvReceiver(CommunicatorFactory* factory, NcclKvSink* sink, const NcclKvOptions& options);
  ~NcclKvReceiver();

  // The NcclBootstrap RPC handler: a new unique id, rank 0 of a communicator with `peer`
  // (the prefill worker's name, for logs) started on it. FAILED_PRECONDITION after Shutdown,
  // RESOURCE_EXHAUSTED with max_receiver_comms communicators already.
  absl::StatusOr<NcclUniqueId> Bootstrap(const std::string& peer);

  void Shutdown();

  size_t num_comms() const;
  uint64_t chunks_delivered() const;
  uint64_t chunks_failed() const;
  uint64_t aborts() const;

 private:
  enum class Stage { kHeader, kPayload };
  struct Channel {
    std::string peer;
    std::unique_ptr<Communicator> comm;
    Stage stage = Stage::kHeader;
    bool posted = false;
    uint64_t seq = 0;
    NcclHeaderBytes header_buf;
    KvFrameHeader header;
    std::span<char> destination;
    bool refused = false;
    absl::Status refusal;
    std::vector<char> scratch;
    bool initialised = false;   // the prefill rank joined
    absl::Time stage_deadline;  // init, payload, or the idle deadline for a header
  };

  void Run();
  void Step(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Abort(uint64_t id, const absl::Status& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CommunicatorFactory* const factory_;
  NcclKvSink* const sink_;
  const NcclKvOptions options_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t delivered_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t aborts_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_NCCL_NCCL_KV_H_
