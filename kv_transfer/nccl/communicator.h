// The seam between the NCCL KV transport's logic and NCCL itself. The transport (pool, framing,
// watchdog) is written against these two interfaces only, so it runs on the CPU against a fake
// (tests/kv_transfer/nccl_fake.h) and against real NCCL through libtandem_nccl.so, which is
// dlopen()ed (nccl_loader.h) so no binary links libnccl or libcuda.
//
// The model is NCCL's non-blocking communicator (ncclConfig_t.blocking = 0): every call returns
// at once; Poll() reports whether everything posted so far has completed, or the communicator's
// asynchronous error (ncclCommGetAsyncError). Abort() is ncclCommAbort: it never blocks on the
// peer, and afterwards every call fails.
#ifndef TANDEM_KV_TRANSFER_NCCL_COMMUNICATOR_H_
#define TANDEM_KV_TRANSFER_NCCL_COMMUNICATOR_H_

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

// NCCL_UNIQUE_ID_BYTES: the opaque bootstrap handle of a communicator.
inline constexpr size_t kNcclUniqueIdBytes = 128;
using NcclUniqueId = std::array<char, kNcclUniqueIdBytes>;

// The two ranks of every KV communicator: the decode side creates the unique id and is rank 0;
// the prefill side receives it (over gRPC) and is rank 1.
inline constexpr int kNcclDecodeRank = 0;
inline constexpr int kNcclPrefillRank = 1;

enum class CommPoll {
  kPending,  // initialisation or posted operations still running
  kIdle,     // initialised and every posted operation completed
};

class Communicator {
 public:
  virtual ~Communicator() = default;  // ncclCommDestroy (or nothing after Abort)

  virtual int rank() const = 0;

  // ncclGroupStart / ncclGroupEnd: the operations posted between them are launched together.
  virtual absl::Status GroupStart() = 0;
  virtual absl::Status GroupEnd() = 0;
  // ncclSend / ncclRecv of raw bytes to or from `peer` on the communicator's stream. The memory
  // must stay valid until Poll() reports kIdle (device memory for the real communicator).
  virtual absl::Status Send(std::span<const char> data, int peer) = 0;
  virtual absl::Status Recv(std::span<char> data, int peer) = 0;

  // kIdle when every operation posted so far completed; the asynchronous error (e.g. a peer
  // that went away, a truncated receive) as a non-OK status.
  virtual absl::StatusOr<CommPoll> Poll() = 0;

  // ncclCommAbort: frees the communicator without waiting for the peer; idempotent.
  virtual void Abort() = 0;
};

class CommunicatorFactory {
 public:
  virtual ~CommunicatorFactory() = default;
  // ncclGetUniqueId (decode side).
  virtual absl::StatusOr<NcclUniqueId> NewUniqueId() = 0;
  // ncclCommInitRankConfig, non-blocking: returns at once; Poll() stays kPending until both
  // ranks joined.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> InitRank(const NcclUniqueId& id, int nranks,
                                                                 int rank) = 0;
};

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_NCCL_COMMUNICATOR_H_
